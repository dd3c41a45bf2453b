"""Step 18: rewarding what was asked.

Step 17 showed the model requests beside stories that fulfil them, and it learned to imitate
them. Nothing checked what it wrote. Here a program checks every story (step 17's score_story)
and the model learns from the checks, with GRPO (group relative policy optimization):

    for each request, sample a group of G stories from the model itself
    score each: the reward is the mean of the score_story fields the request asks for
    advantage = (reward - the group's mean) / the group's standard deviation
    loss = -mean over story tokens of advantage · log p(token) + kl_coef · KL(model || start)

A story that beat its siblings becomes more likely, one that lost less likely; the KL term
keeps the model near where it started, so that it goes on writing stories.

Run the check:  uv run python -m tiny_llm.reward
Train:          uv run python -m tiny_llm.reward --init-from runs/requests/ckpt.pt \
                    --time-budget 5m --out runs/reward
Measure one:    uv run python -m tiny_llm.reward write --checkpoint runs/reward/ckpt.pt \
                    --words kite,beach,happy --measure
"""

import argparse
import math
import re
import shlex
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

from tiny_llm.budget import parse_duration
from tiny_llm.checkpoint import (
    check_tokenizer,
    class_path,
    load_checkpoint,
    model_from_state,
    save_checkpoint,
)
from tiny_llm.data import ensure_data, load_token_array
from tiny_llm.device import pick_device, pick_threads
from tiny_llm.evaluate import story_grades
from tiny_llm.files import file_sha256, save_figure
from tiny_llm.flags import check_resume_settings
from tiny_llm.generate import generate
from tiny_llm.generate import main as write_command
from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.instruct import (
    RequestWriting,
    derived_records,
    parse_record,
    render_request,
    request_row,
    takes_requests,
)
from tiny_llm.kvcache import fresh_cache
from tiny_llm.loop_shell import LoopShell, check_run_length, refuse_non_finite
from tiny_llm.paths import DATA_DIR
from tiny_llm.processes import hold_run_folder
from tiny_llm.request_data import (
    free_request,
    in_a_sentence,
    is_pile,
    measure_line,
    story_sentences,
    uses_word,
)
from tiny_llm.tokenize import EOT, load_tokenizer


def reward_parts(request, story):
    """What the reward is made of: the share of asked-for words used in a sentence of the story
    (request_data.in_a_sentence: not in a pile of them, not over and over), the sentence and
    Dialogue where asked (None where not: leaving quotes out earns nothing), and two penalties,
    the share of repeated word 4-grams and of the story's sentences that are piles. A request
    with no words is refused: a story cannot fail it, so it would teach nothing."""
    words = request["words"]
    if not words:
        raise ValueError("the request asks for no words: the reward scores the words a story "
                         "uses, so give at least one (--words dog,moon,brave)")
    sentences = story_sentences(story)
    asked = "Dialogue" in request["features"]
    return {"words": sum(in_a_sentence(story, w, words) for w in words) / len(words),
            "sentence": float(request["sentence"] in story) if request["sentence"] else None,
            "dialogue": float(bool(re.search(r"\"[^\"]+\"", story))) if asked else None,
            "repetition": story_grades(story)["repeated 4-grams"],
            "piles": sum(is_pile(s, words) for s in sentences) / max(1, len(sentences))}


def reward(request, story):
    """One number in [0, 1]: the mean of the parts the request asks for, less the penalties.
    Words dog, moon, brave: 'The dog looked at the moon and smiled.' -> 2/3 = 0.667;
    'Dog moon brave.' -> 0 (no sentence uses them; the only sentence is a pile: -1)."""
    parts = reward_parts(request, story)
    scores = [parts[k] for k in ("words", "sentence", "dialogue") if parts[k] is not None]
    return max(0.0, sum(scores) / len(scores) - parts["repetition"] - parts["piles"])


def advantages(rewards):
    """(N, G) rewards, G stories for each of N requests -> (N, G) advantages: each reward minus
    its group's mean, over its group's standard deviation (of the G values, not of a sample);
    a group whose stories all scored the same teaches nothing: 0.
    [[1.0, 0.0, 0.5, 0.5]] -> [[1.414, -1.414, 0.0, 0.0]]"""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    spread = rewards.std(dim=1, correction=0, keepdim=True)
    return torch.where(spread > 1e-6, centred / spread.clamp_min(1e-6), 0.0)


@torch.no_grad()
def sample_group(model, prompt, group_size, max_new_tokens, generator, eot_id=0):
    """group_size stories for one prompt (a list of ids), written together by step 09's
    generate at temperature 1, one row each, through one step-12 cache of group_size rows:
    a list of (story ids, ended with EOT or not)."""
    idx = torch.tensor([prompt] * group_size, device=next(model.parameters()).device)
    rows = generate(model, idx, max_new_tokens, generator=generator, eot_id=eot_id,
                    cache=fresh_cache(model, group_size))[:, len(prompt):].tolist()
    return [(row[:row.index(eot_id)], True) if eot_id in row else (row, False) for row in rows]


def rollout_rows(prompt, group, eot_id, seq_len):
    """x, y (G, seq_len) for a group, made by step 17's request_row: y is -1 on the request and
    the padding. A story that ran out of tokens never wrote its EOT: that target is -1 too."""
    x, y = (torch.stack(t) for t in zip(*(request_row(prompt, s, eot_id, seq_len)
                                          for s, _ in group), strict=True))
    for i, (story, ended) in enumerate(group):
        if not ended:  # the prompt plus the story fit (max_new_tokens saw to it)
            y[i, len(prompt) + len(story) - 1] = -1
    return x, y


def grpo_loss(model, reference, x, y, advantage, kl_coef):
    """The loss of a batch of stories: x, y (B, T), advantage (B,). Over the story tokens
    (y != -1): -advantage · log p(token), plus kl_coef times the KL divergence from the
    reference model's next-token distribution to the model's. Returns (loss, mean KL)."""
    mask = (y != -1).float()  # (B, T)
    logp = F.log_softmax(model(x)[0].float(), dim=-1)  # (B, T, V)
    with torch.no_grad():
        ref_logp = F.log_softmax(reference(x)[0].float(), dim=-1)
    taken = logp.gather(-1, y.clamp_min(0).unsqueeze(-1)).squeeze(-1)  # (B, T) log p(target)
    kl = (logp.exp() * (logp - ref_logp)).sum(dim=-1)  # (B, T), exact over the vocabulary
    n = mask.sum().clamp_min(1.0)
    policy = -(advantage[:, None] * taken * mask).sum() / n
    kl_mean = (kl * mask).sum() / n
    return policy + kl_coef * kl_mean, kl_mean.item()


def reward_step(model, reference, optimizer, prompts, score, cfg, generator, eot_id=0, step=0):
    """One GRPO update on `prompts` (lists of ids): cfg.group_size stories each, scored by
    score(i, story ids) -> [0, 1]. Returns the log's numbers: the mean reward, full (the share
    of stories that did all they were asked: reward 1) and the KL to the reference. A loss
    that is not finite is refused before the update (`step`: the updates made, for the error)."""
    model.eval()  # no dropout: the log-probabilities are those the stories were drawn from
    rows, rewards = [], []
    for i, prompt in enumerate(prompts):
        new = max(0, min(cfg.max_new_tokens, model.config.max_seq_len - len(prompt)))
        group = sample_group(model, prompt, cfg.group_size, new, generator, eot_id)
        rows.append(rollout_rows(prompt, group, eot_id, model.config.max_seq_len))
        rewards.append([score(i, story) for story, _ in group])
    rewards = torch.tensor(rewards)  # (N, G)
    device = next(model.parameters()).device
    x, y = (torch.cat(t).to(device) for t in zip(*rows, strict=True))  # (N·G, T)
    loss, kl = grpo_loss(model, reference, x, y, advantages(rewards).flatten().to(device),
                         cfg.kl_coef)
    refuse_non_finite(loss.item(), step, f"Try a lower --lr (now {cfg.lr:g}) or a larger "
                      f"--kl-coef (now {cfg.kl_coef:g})")  # before the update (loop_shell.py)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return {"reward": rewards.mean().item(), "full": (rewards == 1).float().mean().item(),
            "kl": kl}


@dataclass
class RewardConfig:
    """A reward run's settings; the checkpoint keeps them, so --resume needs none again."""

    # what --resume may not change (flags.check_resume_settings): the run's updates depend on it
    fixed_on_resume: ClassVar[tuple] = ("group_size", "requests_per_step", "max_new_tokens",
                                        "lr", "kl_coef", "free_share", "seed")
    # what budget.Budget reads of a run: no warmup to fit, no evaluations, no "too few" advice
    warmup_steps: ClassVar[int] = 0
    eval_interval: ClassVar[int] = 1
    useful_steps: ClassVar[int] = 0

    init_from: str = ""  # the model to start from: a checkpoint fine-tuned on requests
    out: str = "runs/reward"  # folder of ckpt.pt
    time_budget: float = 300.0  # seconds of updates (0: no budget; --max-steps ends the run)
    max_steps: int = 0  # updates (0: as many as fit the time budget)
    group_size: int = 8  # stories sampled for each request
    requests_per_step: int = 2  # requests (groups) in one update
    max_new_tokens: int = 96  # the longest story (less if the request leaves less room)
    lr: float = 1e-4  # AdamW's learning rate, constant
    kl_coef: float = 0.1  # the KL term's weight: 0 lets the model drift as far as it likes
    free_share: float = 0.5  # the share of requests drawn from COMMON_WORDS, the rest derived
    save_interval: int = 20  # save a checkpoint every this many updates (and at the end)
    seed: int = 1337
    device: str | None = None  # cuda, mps or cpu (default: the best available)
    data_dir: str = str(DATA_DIR)
    resume: bool = False  # continue the run saved in out/ckpt.pt

    def __post_init__(self):
        if self.group_size < 2 or self.requests_per_step < 1 or not 0 <= self.free_share <= 1:
            raise ValueError(f"--group-size must be >= 2 (an advantage needs siblings), "
                             f"--requests-per-step >= 1, --free-share in [0, 1]; got "
                             f"{self.group_size}, {self.requests_per_step}, {self.free_share}")
        if not 0 <= self.kl_coef < math.inf:  # nan fails every comparison
            raise ValueError(f"--kl-coef must be a number >= 0 (0: no KL term; the default "
                             f"0.1 keeps the model near its start): got {self.kl_coef}")
        if not 0 < self.lr < 1:
            raise ValueError(f"--lr must be between 0 and 1 (the default 1e-4 suits GRPO): got "
                             f"{self.lr}")
        if self.max_new_tokens < 1 or self.save_interval < 1 or self.max_steps < 0:
            raise ValueError(f"--max-new-tokens must be >= 1 (a story of no tokens teaches "
                             f"nothing; the default is 96), --save-interval >= 1 update and "
                             f"--max-steps >= 0; got {self.max_new_tokens}, "
                             f"{self.save_interval}, {self.max_steps}")
        check_run_length(self.max_steps, self.time_budget)  # something must end the run


def scorer(requests, tokenizer):
    """score(i, story ids) for reward_step: the reward of the story written for request i."""
    return lambda i, ids: reward(requests[i], tokenizer.decode(ids))


def draw_requests(records, cfg, generator):
    """cfg.requests_per_step requests: free ones (three COMMON_WORDS) with probability
    cfg.free_share, else the derived request of a random training story."""
    requests = []
    for _ in range(cfg.requests_per_step):
        pick, i = torch.rand(1, generator=generator).item(), torch.randint(10**9, (1,),
                                                                          generator=generator)
        request = (free_request(i.item(), cfg.seed) if pick < cfg.free_share
                   else records[i.item() % len(records)][0])
        while not request["words"]:  # a story of names and stop words: the next one's
            i += 1
            request = records[i.item() % len(records)][0]
        requests.append(request)
    return requests


def save(path, model, optimizer, generators, step, cfg, start, records):
    """An ordinary checkpoint (generate, evaluate, the studio and export read it) that keeps
    the starting model's record (`start`: its tokenizer, data source, training settings, and
    the start file's fingerprint), plus what a reward run resumes from."""
    save_checkpoint(path, {
        "model": model.state_dict(), "config": asdict(model.config), "step": step,
        "model_class": class_path(model), "tokenizer_sha256": start["tokenizer_sha256"],
        "data_source": start["data_source"],
        "train_config": start["train_config"],  # what it learned to read: requests
        "reward": {"config": asdict(cfg), "optimizer": optimizer.state_dict(),
                   "generators": [g.get_state() for g in generators], "records": records,
                   "start": start["fingerprint"]}})


def start_record(ckpt, path):
    """What a reward run keeps of its start: the entries its checkpoint copies, and the start
    file's fingerprint (sha256 and size), read when the run begins."""
    return {"tokenizer_sha256": ckpt["tokenizer_sha256"],
            "data_source": ckpt.get("data_source", "unknown"),
            "train_config": ckpt.get("train_config", {}),
            "fingerprint": {"path": str(path), "sha256": file_sha256(path),
                            "bytes": Path(path).stat().st_size}}


def resumed_run(ckpt_path, cfg, given):
    """(the saved checkpoint, cfg as the run saved it with the flags `given` over it) for
    --resume; refuses a folder with no reward run and a change to a setting the run fixed.
    given: the names of the flags given (None: every field of cfg)."""
    if not ckpt_path.is_file():
        raise FileNotFoundError(
            f"no reward run to resume in {ckpt_path.parent} (no ckpt.pt): start one with "
            f"--init-from a checkpoint fine-tuned on requests (step 17) --out {cfg.out}")
    saved = load_checkpoint(ckpt_path)
    if "reward" not in saved:
        raise ValueError(f"{ckpt_path} is not a reward run (no 'reward' entry; it was saved by "
                         f"`{saved.get('command', 'tiny_llm.train')}`): pass the --out of a "
                         "reward run, or start one from it with --init-from")
    given = {f.name for f in fields(cfg)} if given is None else set(given)
    settings = {n: getattr(cfg, n) for n in given if n not in ("resume", "out")}
    merged = replace(RewardConfig(**saved["reward"]["config"]), **settings, resume=True,
                     out=cfg.out)
    check_resume_settings(merged, saved["reward"]["config"], ckpt_path)
    check_tokenizer(saved, merged.data_dir, ckpt_path)  # the data folder it will read
    return saved, merged


def checked_start(cfg, saved):
    """The start checkpoint, read from cfg.init_from; on --resume, only if it is the very file
    the run started from (its fingerprint), since the KL term measures from it."""
    was = saved["reward"].get("start") if saved else None
    if was and not Path(cfg.init_from).is_file():
        raise FileNotFoundError(
            f"the reward run in {cfg.out} started from {cfg.init_from}, which is not there any "
            f"more: put it back, or pass --init-from where it is now (the same file: sha256 "
            f"{was['sha256'][:12]}..., {was['bytes']:,} bytes)")
    start = load_checkpoint(cfg.init_from, data_dir=cfg.data_dir)
    record = start_record(start, cfg.init_from)
    now = record["fingerprint"]
    if was and now["sha256"] != was["sha256"]:
        raise ValueError(
            f"{cfg.init_from} is not the file the reward run in {cfg.out} started from: that "
            f"was sha256 {was['sha256'][:12]}... ({was['bytes']:,} bytes, {was['path']}), this "
            f"is sha256 {now['sha256'][:12]}... ({now['bytes']:,} bytes); was step 17 run again "
            "into its folder? The KL term measures from the start, so a resumed run needs the "
            "same one: put the old file back and pass it with --init-from, or start a new "
            "reward run with another --out")
    if saved:  # the record the run began with, never rewritten from a file read later
        record = {"tokenizer_sha256": saved["tokenizer_sha256"],
                  "data_source": saved.get("data_source", "unknown"),
                  "train_config": saved.get("train_config", {}), "fingerprint": was or now}
    return start, record


def train_reward(cfg, given=None):
    """Run (or with cfg.resume, continue) GRPO from cfg.init_from; returns the log records."""
    return run_reward(cfg, given)[0]


def run_reward(cfg, given=None):
    """train_reward, with what the command says at the end: (records, {"interrupted": the
    signal that stopped it or None, "plan": the updates made against the budget's plan}).
    The run holds its folder's lock throughout (processes.py), as step 10's runs do."""
    with hold_run_folder(Path(cfg.out)):
        return reward_in_folder(cfg, given)


def reward_in_folder(cfg, given):
    """run_reward, once the folder is ours: set up, then update inside step 10's loop shell
    (loop_shell.py: stop signals, the busy watch, the budget, finite weights)."""
    ckpt_path = Path(cfg.out) / "ckpt.pt"
    saved = None
    if cfg.resume:
        saved, cfg = resumed_run(ckpt_path, cfg, given)
    elif ckpt_path.exists():
        raise FileExistsError(f"{ckpt_path} already holds a run: continue it with --resume, "
                              "or pass another --out")
    start, record = checked_start(cfg, saved)
    if not takes_requests(start):
        print(f"note: {cfg.init_from} was not trained on requests: GRPO starts from the stories "
              "it writes zero-shot, which rarely use a requested word", file=sys.stderr)
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    threads, why = pick_threads()
    print(f"{'threads':<12} {threads} ({why})", file=sys.stderr)
    model = model_from_state(saved or start).to(device)
    reference = model_from_state(start).to(device).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    # one generator draws the requests (on the CPU), one the stories (where the model is)
    generator, sampler = (torch.Generator(d).manual_seed(cfg.seed) for d in ("cpu", device))
    records = []
    if saved:
        optimizer.load_state_dict(saved["reward"]["optimizer"])
        for g, state in zip((generator, sampler), saved["reward"]["generators"], strict=True):
            g.set_state(state)
        records = saved["reward"]["records"]
    tokenizer = load_tokenizer(Path(cfg.data_dir) / "tokenizer.json")
    ensure_data(Path(cfg.data_dir))  # the first million tokens (5,000 stories) ask enough
    stories = load_token_array(Path(cfg.data_dir) / "train.bin")[:1_000_000]
    words = record["train_config"].get("request_words", "any")  # as it learned them
    records_of_stories = derived_records(stories, tokenizer, model.config.max_seq_len, cfg.seed,
                                         words)
    eot_id = tokenizer.token_to_id(EOT)
    clock = time.perf_counter() - (records[-1]["time_s"] if records else 0.0)
    step = saved_at = len(records)
    shell = LoopShell(cfg, records, step, threads, device.type == "cpu")
    with shell.running() as stop:
        while step < shell.end(cfg):
            requests = draw_requests(records_of_stories, cfg, generator)
            prompts = [tokenizer.encode(render_request(**r)).ids for r in requests]
            score = scorer(requests, tokenizer)
            log = reward_step(model, reference, optimizer, prompts, score, cfg, sampler, eot_id,
                              step)
            step += 1
            records.append({"step": step, **log, "time_s": time.perf_counter() - clock})
            print(f"{'step ' + str(step):<12} reward {log['reward']:.3f}  full {log['full']:.2f}  "
                  f"kl {log['kl']:.4f}", flush=True)
            cfg = shell.after_update(cfg, step, records)  # the busy watch, the budget's plan
            if step % cfg.save_interval == 0 or step >= shell.end(cfg) or stop.is_set():
                shell.check_weights(model, step)  # never a diverged model over a good save
                save(ckpt_path, model, optimizer, (generator, sampler), step, cfg, record,
                     records)
                saved_at = step
            if stop.is_set():  # the update is finished and saved: stop here
                break
    if saved_at != step or not ckpt_path.exists():  # a run that made no update still saves
        save(ckpt_path, model, optimizer, (generator, sampler), step, cfg, record, records)
    return records, {"interrupted": stop.reason, "plan": shell.summary(step)}


def toy_run(steps=60, kl_coef=0.05, seed=0):
    """The check's demo: a tiny GPT over 8 tokens, asked with a one-token prompt [r] for r in
    1..3, rewarded by the share of its 8-token story equal to r. Returns (reward before, after,
    the KL to the start at the end), each a mean over the updates' groups."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=8, max_seq_len=16, d_model=32, n_layers=1, n_heads=2))
    reference = GPT(model.config).eval().requires_grad_(False)
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    cfg = replace(RewardConfig(), group_size=8, max_new_tokens=8, kl_coef=kl_coef)
    generator = torch.Generator().manual_seed(seed)
    prompts = [[1], [2], [3]]
    score = lambda i, ids: sum(t == prompts[i][0] for t in ids) / 8  # noqa: E731
    logs = [reward_step(model, reference, optimizer, prompts, score, cfg, generator)
            for _ in range(steps)]
    return logs[0]["reward"], logs[-1]["reward"], logs[-1]["kl"]


def parts_line(request, story):
    """The reward of a story and its parts, as the check and `reward score` print them."""
    parts = ", ".join(f"{k} {v:.2f}" for k, v in reward_parts(request, story).items()
                      if v is not None)
    return f"{'reward':<12} {reward(request, story):.3f} ({parts})"


def check():
    """The step's check: the reward's rules, the advantages of a group, the toy run."""
    request = {"words": ("dog", "moon", "brave"), "features": (), "sentence": None,
               "summary": None}
    print(f"{'request':<12} {render_request(**request)!r}")
    for story in ("The brave dog looked at the moon and smiled.", "Dog moon brave.",
                  "The dog and the moon. The dog and the moon. The dog and the moon."):
        print(f"{parts_line(request, story)}  {story!r}")
    a = advantages(torch.tensor([[1.0, 0.75, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]])).tolist()
    print(f"{'advantages':<12} {[round(x, 3) for x in a[0]]} and {a[1]} (a group that agrees)")
    for kl_coef in (0.05, 1.0):  # a strong KL term holds the model where it started
        before, after, kl = toy_run(kl_coef=kl_coef)
        print(f"{'toy run':<12} kl_coef {kl_coef}: reward {before:.3f} -> {after:.3f} in 60 "
              f"updates, KL to the start {kl:.3f}")


def score_command(argv):
    """`reward score --words dog,moon,brave --story "Dog moon brave."`: a story's reward and
    its parts, to try the reward by hand."""
    parser = argparse.ArgumentParser(description="Score a story as step 18's reward does.")
    parser.add_argument("--words", required=True, help="the request's words: dog,moon,brave")
    parser.add_argument("--features", default="", help="Dialogue, ...")
    parser.add_argument("--sentence", default=None, help="a sentence the story must hold")
    parser.add_argument("--story", required=True, help="the story, in quotes")
    args = parser.parse_args(argv)
    split = lambda text: tuple(w.strip() for w in text.split(",") if w.strip())  # noqa: E731
    request = {"words": split(args.words), "features": split(args.features),
               "sentence": args.sentence, "summary": None}
    try:
        print(f"{'request':<12} {render_request(**request)!r}")
        print(parts_line(request, args.story))
    except ValueError as err:
        parser.error(str(err))


def plot_rewards(records, path):
    """Draw a run's reward curve (each update's mean reward, and the mean of the last 10)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, rewards = [r["step"] for r in records], [r["reward"] for r in records]
    smooth = [sum(rewards[max(0, i - 9): i + 1]) / min(i + 1, 10) for i in range(len(rewards))]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(steps, rewards, color="lightgrey", label="each update's stories")
    ax.plot(steps, smooth, color="tab:blue", label="mean of the last 10 updates")
    ax.set_xlabel("update")
    ax.set_ylabel("reward")
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)


class WordBoost:
    """A steer for step 09's sampler: raises the score of the token that begins each requested
    word the story has not used yet, as the tokenizer spells it after a space (" kite"), and
    once a word is begun, of the token that goes on with it: by `strength`, and at least to
    `strength` below the row's best score. Adding alone cannot act where the model is sure: a
    trained model puts " kite" 10 or more below the 50th token, top-k 50 cut it with or without
    +3, and the story came out byte for byte the same. The model is not changed; the sampler
    leans towards the words it was asked for, and stops once a word is in the story (step
    17's uses_word: "kites" counts)."""

    def __init__(self, tokenizer, words, strength, prompt_length):
        self.tokenizer, self.strength, self.start = tokenizer, strength, prompt_length
        self.spellings = {w: tokenizer.encode(" " + w).ids for w in words}
        # a word the tokenizer never learned (emoji, Cyrillic, CJK in an English vocabulary)
        # is spelled in byte pieces: boosting its first byte writes stray characters
        self.bytes_only = [w for w, ids in self.spellings.items()
                           if any("\ufffd" in tokenizer.decode([i]) for i in ids)]

    def __call__(self, idx, logits):
        logits = logits.clone()
        for row, ids in enumerate(idx[:, self.start:].tolist()):
            story = self.tokenizer.decode(ids)
            floor = logits[row].max() - self.strength  # top-k and top-p keep what reaches it
            for word, spelling in self.spellings.items():
                if not uses_word(story, word):  # how much of it the story ends with: 0, 1, ...
                    begun = max((j for j in range(1, len(spelling))
                                 if ids[-j:] == spelling[:j]), default=0)
                    t = spelling[begun]
                    logits[row, t] = torch.maximum(logits[row, t] + self.strength, floor)
        return logits


class RewardWriting(RequestWriting):
    """Step 17's write command (its --boost is this step's WordBoost); with --measure, what the
    story did and its reward."""

    def add_flags(self, parser):
        super().add_flags(parser)
        parser.add_argument("--measure", action="store_true", help="print the story's reward")

    def prompt(self, args):
        if args.measure and not args.words.replace(",", "").strip():
            raise ValueError("--measure scores a story against its request: give --words "
                             "(and --features, --sentence)")
        return super().prompt(args)

    def written(self, args, story):
        if args.measure:
            request = parse_record(args.prompt + story)[0]  # the request, as rendered
            print(measure_line(request, story))
            print(parts_line(request, story))


def parse_args(argv):
    """(RewardConfig, the names of the flags given) from the command line: every field is a
    flag (--time-budget 5m); --resume takes the saved run's settings for those not given."""
    parser = argparse.ArgumentParser(description="Step 18: GRPO on requests.",
                                     argument_default=argparse.SUPPRESS)
    for f in fields(RewardConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type is bool or isinstance(f.default, bool):
            parser.add_argument(flag, action="store_true")
        else:
            kind = {"time_budget": parse_duration, "device": str}.get(f.name, type(f.default))
            parser.add_argument(flag, type=kind, help=f"default: {f.default}")
    given = vars(parser.parse_args(argv))
    if not given.get("init_from") and not given.get("resume"):
        parser.error("--init-from a checkpoint fine-tuned on requests (step 17) is needed")
    try:
        return RewardConfig(**given), set(given)
    except ValueError as err:
        parser.error(str(err))


def plot_command(argv):
    """--out RUN --plot PNG: draw a reward run's curve."""
    plot = argparse.ArgumentParser(description="Draw a reward run's curve.")
    plot.add_argument("--out", default=RewardConfig.out)
    plot.add_argument("--plot", type=Path, required=True)
    args = plot.parse_args(argv)
    path = Path(args.out) / "ckpt.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no reward run in {args.out} (no ckpt.pt) to plot: pass the "
                                "--out of a reward run")
    ckpt = load_checkpoint(path)
    if not ckpt.get("reward", {}).get("records"):
        raise ValueError(f"{path} is not a reward run with updates to plot (it has no reward "
                         "log: step 10 and 17 runs have their own, drawn by uv run python -m "
                         "tiny_llm.evaluate --plot): pass the --out of a reward run")
    print(f"{'saved':<12} {plot_rewards(ckpt['reward']['records'], args.plot)}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        return check()
    if argv[0] == "write":  # a story for a request, measured with --measure
        return write_command(argv[1:], RewardWriting())
    if argv[0] == "score":  # a story of your own, scored
        return score_command(argv[1:])
    try:
        if "--plot" in argv:
            return plot_command(argv)
        cfg, given = parse_args(argv)
        records, run = run_reward(cfg, given)
    except (OSError, ValueError, FloatingPointError) as err:  # OSError: files, folders, disks
        raise SystemExit(f"error: {err}") from None
    except KeyboardInterrupt:  # before the loop, or a second Ctrl-C
        raise SystemExit("interrupted at once: nothing new was saved (a checkpoint saved "
                         "before, if any, is whole)") from None
    path = Path(cfg.out) / "ckpt.pt"
    if run["interrupted"]:
        raise SystemExit(f"stopped by {run['interrupted']} at step {len(records)}, saved {path}; "
                         f"continue with:\n  uv run python -m tiny_llm.reward --resume --out "
                         f"{shlex.quote(cfg.out)}")
    print(f"{'saved':<12} {path} (step {len(records)})")
    if run["plan"]:  # a budgeted run: the updates it made against its plan
        print(f"{'updates':<12} {run['plan']}")


if __name__ == "__main__":
    main()
