"""Step 11: how good is the model?

Training printed a loss on a few random batches. Here we score a checkpoint properly: every
token of valid.bin predicted once, from left to right, in windows of max_seq_len tokens. The
mean cross-entropy (nats per token) becomes two friendlier numbers: perplexity, the number of
equally likely tokens the model is as unsure as, and bits per byte, the size the model could
compress the text to, which does not depend on the tokenizer. A plot of the run's log.jsonl
shows how the loss got there, and a few seeded samples show what the numbers sound like.

Run the check:  uv run python -m tiny_llm.evaluate --checkpoint runs/tiny/ckpt.pt
"""

import argparse
import math
import os
import re
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from tiny_llm.checkpoint import model_from_checkpoint, read_log  # read_log: log.jsonl's records
from tiny_llm.data import load_meta, load_token_array
from tiny_llm.device import pick_device
from tiny_llm.files import check_writable, save_figure
from tiny_llm.generate import DEFAULTS, generate
from tiny_llm.judge import GRADES, JudgeRecord, judge_request
from tiny_llm.loss import evaluate_loss
from tiny_llm.paths import DATA_DIR
from tiny_llm.plots import plot_attention_maps, plot_loss_gap, plot_positions, write_gap_csv
from tiny_llm.tokenize import load_tokenizer


def bits_per_byte(loss, tokens, n_bytes):
    """Nats per token -> bits per byte of text: loss · tokens / bytes / ln 2.

    2.0 nats/token at 4 bytes/token -> 2.0 / 4 / 0.693 = 0.72 bits per byte.
    """
    return loss * tokens / n_bytes / math.log(2)


def plot_loss_curve(records, path, title="training run"):
    """Draw train loss at every step and validation loss where it was measured; save a PNG."""
    from matplotlib.figure import Figure  # no pyplot: nothing global, no window

    train = [(r["step"], r["train_loss"]) for r in records if "train_loss" in r]
    valid = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    if train:
        ax.plot(*zip(*train, strict=True), lw=1, alpha=0.8, label="train (one batch per step)")
    if valid:
        ax.plot(*zip(*valid, strict=True), "o-", label="validation (fixed batches)")
    ax.set(xlabel="step", ylabel="loss (nats per token)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path, dpi=80)
    return Path(path)


def samples(model, tokenizer, n, seed, max_new_tokens=40, prompt="Once upon a time"):
    """`n` stories from one seeded generator, with generate's default sampling settings."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    idx = torch.tensor([tokenizer.encode(prompt).ids], device=device)
    return [tokenizer.decode(generate(model, idx, max_new_tokens, generator=generator,
                                      **DEFAULTS)[0].tolist()) for _ in range(n)]


def ngrams(words, n):
    """The word n-grams of a list of words, in order: (a b c), n=2 -> [(a, b), (b, c)]."""
    return list(zip(*(words[i:] for i in range(n)), strict=False))


def repeated_share(items):
    """The share of items equal to one before them: [a, b, a, a] -> 0.5; [] -> 0.0."""
    return (len(items) - len(set(items))) / len(items) if items else 0.0


def story_grades(text):
    """Grades that need no judge, each in [0, 1]: the share of word 4-grams and of sentences
    that repeat an earlier one (a loop scores high), and distinct-1 and distinct-2, the share
    of words and word pairs that differ (a loop scores low).
    'The cat sat. The cat sat. The cat sat.' -> repeated sentences 0.67, distinct-1 0.33"""
    words = re.findall(r"[a-z']+", text.lower())
    sentences = [s.strip().lower() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]
    return {"repeated 4-grams": repeated_share(ngrams(words, 4)),
            "repeated sentences": repeated_share(sentences),
            "distinct-1": 1 - repeated_share(words) if words else 0.0,
            "distinct-2": 1 - repeated_share(ngrams(words, 2)) if len(words) > 1 else 0.0}


def mean_spread(values):
    """(mean, standard deviation) of a list of numbers; (nan, nan) for none."""
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


# A later step lends its own prompts by name, as the checkpoint's model table does: step 17's
# requests (a story for a request, graded on the words it used). Step 11 never imports it.
PROMPT_MAKERS = [("tiny_llm.instruct", "graded_requests")]


def story_prompts(ckpt, n, seed):
    """n (prompt, grade(story) -> {name: number} or None): a later step's, where one knows
    this checkpoint, else "Once upon a time" with no extra grades."""
    import importlib
    import importlib.util

    for module, attr in PROMPT_MAKERS:
        if importlib.util.find_spec(module) is not None:
            made = getattr(importlib.import_module(module), attr)(ckpt, n, seed)
            if made:
                return made
    return [("Once upon a time", None)] * n


def graded_stories(model, ckpt, tokenizer, n, seed, max_new_tokens):
    """n stories (without their prompts) for the grades, from one seeded generator, and each
    story's grades: story_grades' and a later step's (words used)."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for prompt, extra in story_prompts(ckpt, n, seed):
        idx = torch.tensor([tokenizer.encode(prompt).ids], device=device)
        out = generate(model, idx, max_new_tokens, generator=generator, **DEFAULTS)
        story = tokenizer.decode(out[0, idx.shape[1]:].tolist())
        rows.append((prompt, story, {**story_grades(story), **(extra(story) if extra else {})}))
    return rows


def grades_table(graded, judged):
    """Print one row per checkpoint: each grade's mean ± spread over its stories; with a judge,
    its four grades and the answers it gave that could not be read (counted, then shown)."""
    names = list(next(iter(graded.values()))[0][2])
    heads = names + (list(GRADES) + ["unreadable"] if judged else [])
    print(f"{'grades':<16} " + " ".join(f"{h:>18}" for h in heads))
    for name, rows in graded.items():
        cells = []
        for key in names:
            mean, spread = mean_spread([r[2][key] for r in rows if r[2].get(key) is not None])
            cells.append(f"{mean:.2f} ± {spread:.2f}")
        if judged:
            marks = judged[name]
            read = [g for g, _ in marks if g is not None]
            for key in GRADES:
                mean, spread = mean_spread([g[key] for g in read])
                cells.append(f"{mean:.2f} ± {spread:.2f}")
            cells.append(f"{len(marks) - len(read)} of {len(marks)}")
        print(f"{name:<16} " + " ".join(f"{c:>18}" for c in cells))
    for name, marks in (judged or {}).items():
        for i, (grades, answer) in enumerate(marks, start=1):
            if grades is None:
                print(f"{'unreadable':<16} {name}, story {i}: {answer[:100]!r}")


def parse_args():
    parser = argparse.ArgumentParser(description="Step 11: score a checkpoint on valid.bin.")
    parser.add_argument("--checkpoint", type=Path, required=True, action="append",
                        help="e.g. runs/small/ckpt.pt; several are graded side by side")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help=f"default: {DATA_DIR}")
    parser.add_argument("--max-batches", type=int, default=None,
                        help="score only this many batches (default: all of valid.bin)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--plot", type=Path, default=None,
                        help="the loss curve's PNG (default: loss.png beside the checkpoint)")
    parser.add_argument("--gap-plot", type=Path, help="also draw train vs validation loss per "
                        "evaluation to this PNG (and a .csv of the numbers beside it)")
    parser.add_argument("--attention-plot", type=Path,
                        help=f"also draw every head's attention on {SENTENCE!r} to this PNG")
    parser.add_argument("--positions-plot", type=Path,
                        help="also draw the learned position table (pos_emb) to this PNG")
    parser.add_argument("--samples", type=int, default=2, help="stories to print")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    parser.add_argument("--stories", type=int, default=4,
                        help="stories written for the grades (the same prompts and seed for each)")
    parser.add_argument("--story-tokens", type=int, default=100, help="the longest one")
    parser.add_argument("--judge", default=None, help="an OpenAI-compatible server that grades "
                        "the stories: http://127.0.0.1:11434 (Ollama), :8080 (llama-server)")
    parser.add_argument("--judge-model", default=None, help="the judge's model: qwen2.5:1.5b")
    parser.add_argument("--judge-key-env", default=None,
                        help="the environment variable that holds the judge's API key, if any")
    parser.add_argument("--judge-dir", type=Path, default=None, help="where judge.jsonl keeps "
                        "every request and answer (default: beside each checkpoint)")
    args = parser.parse_args()
    if args.judge and not args.judge_model:
        parser.error("--judge needs --judge-model, the name of a model it serves "
                     "(`ollama list` shows yours)")
    if args.stories < 0 or args.story_tokens < 1:
        parser.error(f"--stories must be >= 0 and --story-tokens >= 1, got {args.stories} and "
                     f"{args.story_tokens}")
    if args.judge_key_env and not os.environ.get(args.judge_key_env):
        parser.error(f"--judge-key-env {args.judge_key_env}: that environment variable is "
                     "not set (export it first)")
    for name in ("max_batches", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.samples < 0 or args.seed < 0:
        parser.error(f"--samples and --seed must be >= 0, got {args.samples} and {args.seed}")
    return args


def check_picture_folders(args):
    """Raise, naming the flag, if a picture asked for (or the loss curve, which goes beside the
    checkpoint by default) would land in a folder that cannot be written."""
    beside = args.checkpoint.parent
    loss_curve = args.plot or (beside / "loss.png" if (beside / "log.jsonl").is_file() else None)
    wanted = [("--plot", loss_curve),
              ("--gap-plot", args.gap_plot), ("--attention-plot", args.attention_plot),
              ("--positions-plot", args.positions_plot)]
    for flag, path in wanted:
        if path is not None:
            check_writable(Path(path).parent, f"the folder of the {flag} picture (pass "
                           f"{flag} PATH to save it elsewhere)")


def report(args):
    """Evaluate, plot and sample as the command line asks; print the aligned table."""
    check_picture_folders(args)  # before the scoring: a picture that cannot be saved fails now
    device = pick_device(args.device)
    model, ckpt = model_from_checkpoint(args.checkpoint, device, data_dir=args.data_dir)
    meta, c = load_meta(args.data_dir), model.config
    data = load_token_array(args.data_dir / "valid.bin")
    result = evaluate_loss(model, data, args.batch_size, args.max_batches, device)
    loss, valid = result["loss"], meta["valid"]
    print(f"{'checkpoint':<16} {args.checkpoint} (step {ckpt['step']:,})")
    print(f"{'model':<16} d_model={c.d_model} n_layers={c.n_layers} n_heads={c.n_heads} "
          f"max_seq_len={c.max_seq_len}, {model.num_params():,} parameters")
    print(f"{'valid.bin':<16} {valid['stories']:,} stories, {valid['tokens']:,} tokens, "
          f"{valid['bytes']:,} bytes (prepared from {meta['source']})")
    print(f"{'scored':<16} {result['targets']:,} targets in {result['windows']:,} windows")
    print(f"{'val loss':<16} {loss:.4f} nats per token")
    print(f"{'perplexity':<16} {math.exp(loss):.2f}")
    print(f"{'bits per token':<16} {loss / math.log(2):.3f}")
    print(f"{'bits per byte':<16} {bits_per_byte(loss, valid['tokens'], valid['bytes']):.4f}")
    uniform = math.log(c.vocab_size)  # a model that knows nothing: every token 1/vocab_size
    print(f"{'uniform guess':<16} {uniform:.4f} nats, perplexity {c.vocab_size:,}, "
          f"{bits_per_byte(uniform, valid['tokens'], valid['bytes']):.4f} bits per byte")
    log = args.checkpoint.parent / "log.jsonl"
    if log.is_file():
        records = read_log(log)
        path = plot_loss_curve(records, args.plot or args.checkpoint.parent / "loss.png",
                               title=f"{args.checkpoint.parent.name}: {len(records) - 1} steps")
        print(f"{'loss curve':<16} {path} ({len(records):,} log records)")
    else:
        print(f"{'loss curve':<16} no {log}: nothing to plot")
    tokenizer = load_tokenizer(args.data_dir / "tokenizer.json")
    for i, text in enumerate(samples(model, tokenizer, args.samples, args.seed), start=1):
        print(f"{f'sample {i}':<16} {text!r}")
    draw_pictures(args, model, tokenizer, log)
    return model, ckpt, tokenizer


def grade(args, checkpoints):
    """The grades of every checkpoint (a path -> (model, ckpt, tokenizer)), side by side: the
    same prompts and seed for each; with --judge, graded by it too."""
    graded, judged = {}, {}
    key = os.environ.get(args.judge_key_env) if args.judge_key_env else None
    for path, (model, ckpt, tokenizer) in checkpoints.items():
        name = path.parent.name or str(path)
        rows = graded[name] = graded_stories(model, ckpt, tokenizer, args.stories, args.seed,
                                             args.story_tokens)
        if args.judge:
            record = JudgeRecord((args.judge_dir or path.parent) / "judge.jsonl")
            judged[name] = [record.grade(args.judge, judge_request(
                args.judge_model, prompt, story, args.seed), key) for prompt, story, _ in rows]
    print(f"{'stories':<16} {args.stories} for each checkpoint, up to {args.story_tokens} "
          f"tokens, seed {args.seed}" + (f", graded by {args.judge_model}" if args.judge else ""))
    grades_table(graded, judged)


SENTENCE = "Lily had a red ball. She gave the ball to her little brother, and he smiled."


def loss_gap(records):
    """One row per evaluation: (step, mean train loss since the last one, validation loss).

    The mean over ~eval_interval steps smooths the one-batch noise of the train loss, so the
    two columns compare like with like. Rounded to 4 decimals, as the .csv keeps them.
    """
    rows, since = [], []
    for r in records:
        if "train_loss" in r:
            since.append(r["train_loss"])
        if r.get("val_loss") is not None:
            rows.append((r["step"], round(sum(since) / len(since), 4), round(r["val_loss"], 4)))
            since = []
    return rows


@torch.no_grad()
def attention_maps(model, idx):
    """Every head's attention weights on one (1, T) sequence: (n_layers, n_heads, T, T).

    Every model of the course (step 08's GPT, step 14's lab models, step 15's ModernGPT) attends
    through F.scaled_dot_product_attention, which never stores the weights. For one forward it
    is wrapped: each call also computes softmax(q kᵀ · scale + mask) from the q and k the layer
    passed (after its RoPE, QK-norm or ALiBi), in layer order, as step 06's explicit path does.
    """
    maps, me = [], threading.get_ident()
    real = F.scaled_dot_product_attention

    def keeping(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        if threading.get_ident() == me:  # not another thread's forward (the studio's stories)
            maps.append(attention_weights(q, k, attn_mask, is_causal, scale)[0])
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, **kw)

    with _ATTENTION_HOOK:  # one wrapped forward at a time: the wrapper is global to the process
        F.scaled_dot_product_attention = keeping
        try:
            model.eval()(idx)
        finally:
            F.scaled_dot_product_attention = real
    if len(maps) != len(model.blocks):
        raise ValueError(f"{type(model).__name__} attended {len(maps)} times for its "
                         f"{len(model.blocks)} layers: its attention does not go through "
                         "F.scaled_dot_product_attention, so its weights cannot be read here")
    return torch.stack(maps).cpu()


_ATTENTION_HOOK = threading.Lock()


def attention_weights(q, k, attn_mask=None, is_causal=False, scale=None):
    """What scaled_dot_product_attention weighs v by: q (B, H, Tq, hs), k (B, Hkv, Tk, hs) ->
    (B, H, Tq, Tk), each row summing to 1. Hkv < H: each k head serves H // Hkv query heads."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q @ k.transpose(-2, -1)).float() * (scale or 1 / math.sqrt(q.shape[-1]))
    if attn_mask is not None:  # a bool mask (True: may look) or an additive one (ALiBi)
        scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                  else scores + attn_mask)
    if is_causal:  # query i sees keys 0..i
        Tq, Tk = scores.shape[-2:]
        causal = torch.ones(Tq, Tk, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    return torch.softmax(scores, dim=-1)


def draw_pictures(args, model, tokenizer, log):
    """The --gap-plot, --attention-plot and --positions-plot pictures that were asked for."""
    name = args.checkpoint.parent.name
    if args.gap_plot and log.is_file():
        rows = loss_gap(read_log(log))
        write_gap_csv(rows, args.gap_plot.with_suffix(".csv"))
        plot_loss_gap(rows, args.gap_plot, f"{name}: train vs validation loss")
        print(f"{'gap plot':<16} {args.gap_plot} ({len(rows)} evaluations, last gap "
              f"{rows[-1][2] - rows[-1][1]:.2f} nats)")
    if args.attention_plot:
        ids = tokenizer.encode(SENTENCE).ids
        device = next(model.parameters()).device
        maps = attention_maps(model, torch.tensor([ids], device=device))
        tokens = [tokenizer.decode([i]) for i in ids]
        plot_attention_maps(maps, tokens, args.attention_plot, f"{name}: attention of every head")
        print(f"{'attention plot':<16} {args.attention_plot} ({len(ids)} tokens)")
    if args.positions_plot:
        if getattr(model.embed, "pos_emb", None) is None:  # RoPE or ALiBi: no table to draw
            print(f"{'positions plot':<16} none: this {type(model).__name__} has no learned "
                  "position table (its positions are in the attention, RoPE or ALiBi)")
            return
        table = model.embed.pos_emb.weight.detach().cpu()
        plot_positions(table, args.positions_plot, f"{name}: learned positions after training")
        print(f"{'positions plot':<16} {args.positions_plot} {tuple(table.shape)}")


def main():
    args = parse_args()
    try:
        checkpoints = {}
        for path in args.checkpoint:
            checkpoints[path] = report(argparse.Namespace(**{**vars(args), "checkpoint": path}))
        if args.stories:
            grade(args, checkpoints)
    except (OSError, ValueError) as err:  # OSError: a missing file, a folder not writable
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
