"""Step 17: a storyteller that takes requests.

A base model continues text. To make it write what it is asked, fine-tune it on records of a
request and the story that fulfils it, in TinyStories-Instruct's format:

    Features: Dialogue
    Words: dog, moon, brave
    Random sentence: The moon was big and round.
    Story:
    Once upon a time ...<|endoftext|>

The loss counts only the story and its closing <|endoftext|>: the request's targets carry the
ignore index (-1), so the model learns to answer requests, not to invent them. Each row starts
at a record's beginning, so the request is always in view. LoRA trains two small matrices beside
each frozen projection, W + (alpha / r)·B·A, and merges them into W for saving.

Step 17 plugs into the commands of steps 09 and 10 (their WriteHooks and TrainHooks), so they
never import it; its own command runs them with requests:

Run the check:  uv run python -m tiny_llm.instruct
Fine-tune:      uv run python -m tiny_llm.instruct train --init-from runs/cpu/ckpt.pt \
                    --requests derived --time-budget 3m --lr 1e-3 --out runs/requests
Ask for one:    uv run python -m tiny_llm.instruct write --checkpoint runs/requests/ckpt.pt \
                    --words dog,moon,brave
"""

import argparse
import functools
import importlib
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from tiny_llm.checkpoint import load_checkpoint, model_from_state
from tiny_llm.data import ensure_data, load_token_array
from tiny_llm.generate import DEFAULTS, PROMPT, WriteHooks, complete
from tiny_llm.generate import main as write_command
from tiny_llm.gpt import GPT, PRESETS
from tiny_llm.kvcache import fresh_cache
from tiny_llm.paths import DATA_DIR
from tiny_llm.request_data import (  # noqa: F401 (FIELDS, parse_record: step 17's names too)
    FEATURES,
    FIELDS,
    MixedRows,
    RequestRows,
    check_request,
    check_request_config,
    derived_records,
    free_request,
    init_from_flags,
    instruct_records,
    learned_requests,
    parse_record,
    score_story,
    takes_requests,
    word_grades,
)
from tiny_llm.scale import main as ranks_command
from tiny_llm.tokenize import EOT, load_tokenizer
from tiny_llm.train import TrainConfig, TrainHooks
from tiny_llm.train import main as train_command


def render_request(words=(), features=(), sentence=None, summary=None):
    """The prompt for a request, exactly as training renders it, ending where the story begins.
    render_request(["dog", "moon"], ["Dialogue"])
    -> 'Features: Dialogue\\nWords: dog, moon\\nStory:\\n'
    Fields come in one fixed order and an empty field is left out."""
    unknown = [f for f in features if f not in FEATURES]
    if unknown:
        raise ValueError(f"unknown features {unknown}: choose from {', '.join(FEATURES)}")
    lines = []
    if features:
        lines.append("Features: " + ", ".join(features))
    if words:
        lines.append("Words: " + ", ".join(words))
    if sentence:
        lines.append("Random sentence: " + sentence)
    if summary:
        lines.append("Summary: " + summary)
    return "".join(line.replace("\n", " ") + "\n" for line in lines) + "Story:\n"


# ----- requests as training rows -----


def request_row(request_ids, story_ids, eot_id, seq_len):
    """One row of request + story + EOT, cut or padded to seq_len + 1 tokens, as x and y (T,).
    y is -1 (the ignore index) where the target is a request token or padding: the loss counts
    only the story and its closing EOT. x is padded with EOT.
    request [7, 8], story [5, 6], eot 0, seq_len 5: ids 7 8 5 6 0 | x [7, 8, 5, 6, 0],
    y [-1, 5, 6, 0, -1]"""
    ids = (list(request_ids) + list(story_ids) + [eot_id])[: seq_len + 1]
    targets = [-1] * (len(request_ids) - 1) + ids[len(request_ids):]
    x = ids[:-1] + [eot_id] * (seq_len + 1 - len(ids))
    y = (targets + [-1] * seq_len)[:seq_len]
    return torch.tensor(x), torch.tensor(y)


def request_rows(cfg, train_data, valid_data, seq_len):
    """Step 10's loop calls this when --requests is set: RequestRows for train and valid.
    --requests derived reads requests off the prepared stories; anything else is a
    TinyStories-Instruct source (instruct_records). --request-share below 1: MixedRows."""
    tokenizer = load_tokenizer(Path(cfg.data_dir) / "tokenizer.json")
    if cfg.requests == "derived":
        records = {split: derived_records(data, tokenizer, seq_len, cfg.seed, cfg.request_words,
                                          cfg.requests_per_story if split == "train" else 1)
                   for split, data in (("train", train_data), ("valid", valid_data))}
    else:
        records = instruct_records(cfg.requests, tokenizer)
    rows = tuple(rows_of(records[split], tokenizer, seq_len) for split in ("train", "valid"))
    if cfg.request_share < 1:  # requests from the first token: plain windows beside them
        return MixedRows(rows[0], train_data, cfg.request_share), valid_data
    return rows


def rows_of(records, tokenizer, seq_len):
    """RequestRows from (request, story ids) records; requests are rendered and tokenized apart
    from their stories, as generate renders them."""
    requests = tokenizer.encode_batch([render_request(**r) for r, _ in records])
    for number, (q, (request, _)) in enumerate(zip(requests, records, strict=True), start=1):
        if len(q.ids) >= seq_len:  # not one story token would be in the row
            raise ValueError(f"request {number} is {len(q.ids)} tokens and a row holds {seq_len}: "
                             f"no story would be trained behind it. Shorten it (its summary?) "
                             f"or remove it: {render_request(**request)[:120]!r}")
    eot_id = tokenizer.token_to_id(EOT)
    pairs = [request_row(q.ids, s, eot_id, seq_len) for q, (_, s) in zip(requests, records,
                                                                         strict=True)]
    cut = sum(max(0, len(q.ids) + len(s) + 1 - (seq_len + 1))
              for q, (_, s) in zip(requests, records, strict=True))
    return RequestRows(torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs]), cut)


# ----- LoRA -----


class LoRALinear(nn.Linear):
    """A frozen nn.Linear plus a trainable low-rank change: y = x W^T + b + (alpha/r)·x A^T B^T.
    A (r, in) starts small and random, B (out, r) at zero, so training starts from the base
    model exactly. weight and bias keep their names, so merged() is a plain Linear's state."""

    def __init__(self, linear, rank, alpha):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None)
        self.weight, self.bias = linear.weight, linear.bias  # the same tensors, frozen
        self.lora_a = nn.Parameter(torch.randn(rank, linear.in_features) / linear.in_features**0.5)
        self.lora_b = nn.Parameter(torch.zeros(linear.out_features, rank))
        self.register_buffer("lora_scale", torch.tensor(alpha / rank))

    def forward(self, x):
        low_rank = x @ self.lora_a.T @ self.lora_b.T  # (..., in) -> (..., r) -> (..., out)
        return F.linear(x, self.weight, self.bias) + low_rank * self.lora_scale


def add_lora(model, rank, alpha, state=None):
    """Freeze every weight of `model` and put LoRALinear in place of each nn.Linear inside its
    blocks (attention and MLP projections; the output head stays); `state`, a resumed run's
    unmerged weights and adapters, is loaded into the result. Returns the model."""
    if not isinstance(rank, int) or rank < 1 or not alpha > 0:
        raise ValueError(f"LoRA needs --lora-rank >= 1 and --lora-alpha > 0, got {rank}, {alpha}")
    heads = {id(m) for m in model.children()}
    narrowest = min((min(m.in_features, m.out_features) for m in model.modules()
                     if type(m) is nn.Linear and id(m) not in heads), default=rank)
    if rank > narrowest:  # B·A would hold more than the whole matrix it changes
        raise ValueError(f"--lora-rank {rank} is more than the narrowest matrix it adapts, "
                         f"{narrowest} wide: a rank that high changes every weight and costs "
                         f"more than full fine-tuning. Take a few (4 to 16), at most {narrowest}")
    model.requires_grad_(False)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and id(child) not in heads:
                setattr(parent, name, LoRALinear(child, rank, alpha))
    if state is not None:
        model.load_state_dict(state)
    return model


def merged(state):
    """A state_dict with LoRA adapters folded in: W + scale·B·A for each adapted weight, the
    lora_* entries gone, so it loads into the plain model (generate, evaluate, export)."""
    plain = {k: v for k, v in state.items() if not k.rsplit(".", 1)[-1].startswith("lora_")}
    for key in state:
        if key.endswith(".lora_a"):
            stem = key[: -len("lora_a")]
            delta = state[stem + "lora_b"] @ state[key] * state[stem + "lora_scale"]
            plain[stem + "weight"] = state[stem + "weight"] + delta.to(state[stem + "weight"].dtype)
    return plain


def trainable(model):
    """The number of weights that train (requires_grad)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ----- measuring -----


def measure(model, tokenizer, requests, max_new_tokens=200, seed=0, plain=False):
    """Write a story for each request and score it; returns the mean of each score_story field
    over the requests that ask for it, and the stories. plain=True prompts "Once upon a time"
    instead of the request (the base model's chance rate)."""
    generator = torch.Generator().manual_seed(seed)
    cache = fresh_cache(model)
    scores, stories = [], []
    for request in requests:
        prompt = PROMPT if plain else render_request(**request)
        text = complete(model, tokenizer, prompt, max_new_tokens, generator, cache=cache,
                        **DEFAULTS)
        story = text[len(prompt):] if not plain else text
        scores.append(score_story(request, story))
        stories.append(story)
    means = {k: [s[k] for s in scores if s[k] is not None] for k in scores[0]}
    return {k: sum(v) / len(v) if v else None for k, v in means.items()}, stories


def graded_requests(ckpt, n, seed=0):
    """Step 11's grades lent this step's prompts (evaluate.PROMPT_MAKERS): n free requests
    for a checkpoint tuned on requests, each with word_grades for its story; else None."""
    if not takes_requests(ckpt):
        return None
    words = [free_request(i, seed)["words"] for i in range(n)]
    return [(render_request(words=w), functools.partial(word_grades, words=w)) for w in words]


# ----- plugging into steps 09 and 10 -----


@dataclass
class RequestConfig(TrainConfig):
    """Step 10's settings plus fine-tuning's: where it starts, its rows, its adapters."""

    command: ClassVar[str] = "tiny_llm.instruct train"
    fixed_on_resume: ClassVar[tuple] = ("init_from", "requests", "lora_rank", "lora_alpha",
                                        "request_words", "requests_per_story")
    init_from: str | None = None  # start from this checkpoint's weights
    requests: str | None = None  # request rows: derived, or a TinyStories-Instruct source
    lora_rank: int = 0  # > 0 trains LoRA adapters of this rank, the model frozen
    lora_alpha: float = 16.0  # the adapters' scale is lora_alpha / lora_rank
    request_share: float = 1.0  # the share of rows with a request; below 1, plain windows too
    request_words: str = "any"  # derived requests' words: any of a story's, or rare (likelier)
    requests_per_story: int = 1  # derived requests read off each training story

    @classmethod
    def given_flags(cls, given):
        """The flags given, with --init-from's model filled in (request_data.init_from_flags)."""
        return init_from_flags(given)

    def __post_init__(self):
        super().__post_init__()
        check_request_config(self)  # a clear error for a setting that cannot work (request_data)


class RequestHooks(TrainHooks):
    """Step 10's loop, fine-tuning: from a trained model, with LoRA, on request rows."""

    def new_model(self, cfg, meta):
        if cfg.init_from:
            return model_from_state(load_checkpoint(cfg.init_from, data_dir=cfg.data_dir))
        return super().new_model(cfg, meta)

    def adapt(self, model, cfg, ckpt):
        if cfg.lora_rank:  # adapters train, the model is frozen
            add_lora(model, cfg.lora_rank, cfg.lora_alpha, ckpt and ckpt["adapters"])
        return model

    def rows(self, cfg, train_data, valid_data, seq_len):
        if cfg.requests:
            return request_rows(cfg, train_data, valid_data, seq_len)
        return train_data, valid_data

    def saved(self, model_state, cfg):
        if cfg.lora_rank:  # plain merged weights for every command, the adapters to resume
            return merged(model_state), {"adapters": model_state}
        return model_state, {}


# A steer a later step lends the write command, by name: step 17 never imports step 18 (the
# checkpoint's model table works the same way). "boost": WordBoost(tokenizer, words, strength,
# prompt_length).
STEERS = {"boost": ("tiny_llm.reward", "WordBoost")}


class RequestWriting(WriteHooks):
    """Step 09's generate command with a request in place of the prompt, and step 12's cache."""

    def add_flags(self, parser):
        parser.add_argument("--words", default="", help="a request's words: dog,moon,brave")
        parser.add_argument("--features", default="", help="Dialogue, Twist, ...")
        parser.add_argument("--sentence", default=None, help="a sentence the story must hold")
        parser.add_argument("--boost", type=float, default=0.0, help="lean the sampler towards "
                            "--words not used yet by this much (3; step 18's word boost)")

    def prompt(self, args):
        if (args.boost and not args.words) or not 0 <= args.boost <= 20:
            raise ValueError(f"--boost leans the sampler towards --words, by 0 to 20 (3 is "
                             f"plenty): got --boost {args.boost} with --words {args.words!r}")
        if not (args.words or args.features or args.sentence):
            return args.prompt
        if args.prompt is not None:
            raise ValueError("--prompt and a request (--words, --features, --sentence) both say "
                             "what to write from: give one of them")
        split = lambda text: tuple(w.strip() for w in text.split(",") if w.strip())  # noqa: E731
        args.request = {"words": split(args.words), "features": split(args.features),
                        "sentence": args.sentence}
        if args.words and not args.request["words"]:
            raise ValueError(f"--words {args.words!r} names no word: give words separated by "
                             "commas, --words dog,moon,brave")
        return render_request(**args.request)

    def steer(self, args, tokenizer):
        if not args.boost:
            return None
        module, name = STEERS["boost"]
        boost = getattr(importlib.import_module(module), name)(
            tokenizer, args.request["words"], args.boost, len(tokenizer.encode(args.prompt).ids))
        if boost.bytes_only:
            print(f"note: --boost: this tokenizer spells {', '.join(boost.bytes_only)} in byte "
                  "pieces (it never saw the word): the boost leans only towards its first "
                  "byte, and the story may show stray characters", file=sys.stderr)
        return boost

    def cache(self, model):
        return fresh_cache(model)

    def check(self, args, ckpt, model, prompt_tokens):
        if not getattr(args, "request", None):
            return
        if ckpt:  # only what the model was taught (or a note: zero-shot)
            check_request(ckpt, args.request, args.checkpoint)
        if prompt_tokens > model.config.max_seq_len:  # cut at its start, it would lose fields
            raise ValueError(f"the request is {prompt_tokens:,} tokens and the model reads at "
                             f"most {model.config.max_seq_len}: shorten --sentence (or --words)")


def main(argv=None):
    """`train ...`: fine-tune (under torchrun too); `write ...`: a story for a request; no
    command: the step's check."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:
        sys.argv = [f"{sys.argv[0]} train", *argv[1:]]  # step 10's parser reads sys.argv
        if "WORLD_SIZE" in os.environ:  # torchrun ... -m tiny_llm.instruct train: step 16's
            return ranks_command(RequestConfig, RequestHooks())
        return train_command(RequestConfig, RequestHooks())
    if argv[:1] == ["write"]:
        return write_command(argv[1:], RequestWriting())
    check(argv)


def check(argv):
    parser = argparse.ArgumentParser(description="Step 17: requests, masked rows and LoRA "
                                     "(commands: train ..., write ...).")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    ensure_data(args.data_dir)
    tokenizer = load_tokenizer(args.data_dir / "tokenizer.json")
    valid = load_token_array(args.data_dir / "valid.bin")
    request, ids = derived_records(valid, tokenizer, 128, seed=0)[0]
    prompt = render_request(**request)
    print("a request read off the first validation story:")
    print(prompt, end="")
    q = tokenizer.encode(prompt).ids
    x, y = request_row(q, ids, 0, 128)
    print(f"{'row':<12} {len(q)} request tokens (targets -1), {int((y >= 0).sum())} story "
          f"targets, {int((y == -1).sum()) - len(q) + 1} padding")
    print(f"{'round trip':<12} {parse_record(prompt + 'Once.') == (request, 'Once.')}")
    torch.manual_seed(0)
    model = GPT(replace(PRESETS["cpu"], vocab_size=tokenizer.get_vocab_size()))
    full = trainable(model)
    add_lora(model, 8, 16.0)
    for m in model.modules():  # pretend training moved B, so the merge has something to do
        if isinstance(m, LoRALinear):
            nn.init.normal_(m.lora_b, std=0.02)
    plain = GPT(model.config)
    plain.load_state_dict(merged(model.state_dict()))
    idx = torch.randint(model.config.vocab_size, (2, 16))
    gap = (plain(idx)[0] - model(idx)[0]).abs().max().item()
    print(f"{'trainable':<12} full {full:,}, LoRA rank 8 {trainable(model):,} "
          f"({trainable(model) / full:.1%})")
    print(f"{'merge':<12} plain model vs adapted: max |logit difference| {gap:.1e}")
    scores = score_story(request, tokenizer.decode(ids.tolist()))
    print(f"{'scores':<12} {scores} (the story itself)")


if __name__ == "__main__":
    main()
