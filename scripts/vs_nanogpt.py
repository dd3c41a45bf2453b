"""The course against nanoGPT, on your machine: the comparison chapters 10 and 15 quote.

The repository ships none of nanoGPT's code. Clone it next to this repository, once:

  git clone https://github.com/karpathy/nanoGPT ../nanoGPT

and this script imports its `model.py` (its GPT and GPTConfig) from the path you give it:

  uv run python scripts/vs_nanogpt.py --nanogpt ../nanoGPT quality --seconds 600 \
      --checkpoint runs/cpu/ckpt.pt
      nanoGPT's README recipe for a CPU (4 layers, 4 heads, width 128, context 64, batches of
      12, AdamW at 1e-3 with betas (0.9, 0.99) and weight decay 0.1, 100 warmup steps, then a
      cosine to 1e-4, gradient clipping at 1.0, float32), trained for --seconds of wall time on
      the prepared train.bin, its cosine sized to end with the time; then scored on the whole
      valid.bin by the course's own evaluator (step 11), in bits per byte. With --checkpoint,
      a model of ours is scored on the same valid.bin and the two are put side by side.

  uv run python scripts/vs_nanogpt.py --nanogpt ../nanoGPT speed --seq-len 128 --batch-size 16
      Training tokens per second of nanoGPT's GPT and step 08's GPT at the same size, both in
      float32 eager with the same AdamW, timed in turns (A B A B ...); the medians and their ratio.

The data is the prepared data folder, as for every step: data/, or TINY_LLM_DATA_DIR (or
--data-dir). Use the folder the checkpoint was trained on, so that both models read the same
text with the same tokenizer and are scored on the same validation stories.
"""

import argparse
import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from tiny_llm.checkpoint import model_from_checkpoint
from tiny_llm.data import get_batch, load_meta, load_token_array
from tiny_llm.evaluate import bits_per_byte
from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.loss import evaluate_loss
from tiny_llm.paths import DATA_DIR

CLONE = "git clone https://github.com/karpathy/nanoGPT"

# nanoGPT's README: "a baby GPT" on a CPU, with the shakespeare_char settings it starts from
RECIPE = {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12,
          "lr": 1e-3, "min_lr": 1e-4, "warmup": 100, "betas": (0.9, 0.99),
          "weight_decay": 0.1, "grad_clip": 1.0}
REPLAN_EVERY = 50  # steps between re-estimates of how many steps fit the time left


def load_nanogpt(path):
    """nanoGPT's model.py, imported from a clone at `path`: the module with GPT and GPTConfig."""
    model_py = Path(path) / "model.py"
    if not model_py.is_file():
        raise FileNotFoundError(f"no model.py in {path}: --nanogpt must be a clone of nanoGPT; "
                                f"make one with `{CLONE} {path}`")
    spec = importlib.util.spec_from_file_location("nanogpt_model", model_py)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    missing = [name for name in ("GPT", "GPTConfig") if not hasattr(module, name)]
    if missing:
        raise ImportError(f"{model_py} has no {' or '.join(missing)}: is it nanoGPT's model.py? "
                          f"({CLONE})")
    return module


def nanogpt_lr(step, total_steps):
    """nanoGPT's schedule: linear warmup over RECIPE['warmup'] steps, then a cosine from lr to
    min_lr that ends at total_steps. step 0 -> 1e-3/101, step 100 -> 1e-3, the end -> 1e-4."""
    lr, low, warmup = RECIPE["lr"], RECIPE["min_lr"], RECIPE["warmup"]
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return low + 0.5 * (1 + math.cos(math.pi * progress)) * (lr - low)


def steps_that_fit(done, elapsed, seconds):
    """How many steps a run of `seconds` makes at the pace so far (done steps in elapsed s)."""
    return max(done + 1, int(done * seconds / elapsed))


def train_nanogpt(ng, train_data, vocab_size, seconds, seed=1337, progress_every=0.1):
    """Train nanoGPT's recipe on train_data for `seconds` of wall time; return (model, summary).

    The step count is re-estimated from the pace every REPLAN_EVERY steps, so the cosine ends
    when the time does even if the machine slows down; a progress line every tenth of the time."""
    torch.manual_seed(seed)
    config = ng.GPTConfig(block_size=RECIPE["block_size"], vocab_size=vocab_size,
                          n_layer=RECIPE["n_layer"], n_head=RECIPE["n_head"],
                          n_embd=RECIPE["n_embd"], dropout=0.0, bias=False)
    model = ng.GPT(config)
    optimizer = model.configure_optimizers(RECIPE["weight_decay"], RECIPE["lr"], RECIPE["betas"],
                                           "cpu")
    generator = torch.Generator().manual_seed(seed)
    step, total, next_report = 0, None, progress_every * seconds
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds and step != total:
        if step % REPLAN_EVERY == 0 and step > 0:
            total = steps_that_fit(step, elapsed, seconds)
        lr = nanogpt_lr(step, total or 10**9)  # unknown total: still in warmup, which ignores it
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(train_data, RECIPE["batch_size"], RECIPE["block_size"], None, generator)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), RECIPE["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if elapsed >= next_report:
            plan = f"{total:,}" if total else "?"
            print(f"{'nanoGPT':<12} step {step:,} of {plan}  loss {loss.item():.3f}  "
                  f"lr {lr:.2e}  {elapsed:,.0f} of {seconds:,.0f} s", flush=True)
            next_report += progress_every * seconds
    wall = time.perf_counter() - start
    tokens = step * RECIPE["batch_size"] * RECIPE["block_size"]
    return model, {"steps": step, "seconds": wall, "tokens": tokens}


class ContiguousTargets(torch.nn.Module):
    """nanoGPT's forward flattens the targets with .view, which needs a contiguous tensor; step
    11's windows are slices of one array, so they are copied into place first."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        return self.model(idx.contiguous(), targets.contiguous())


def score(model, valid_data, meta, seq_len):
    """Loss (nats per token) and bits per byte over the whole of valid.bin, step 11's way."""
    result = evaluate_loss(ContiguousTargets(model), valid_data, seq_len=seq_len)
    valid = meta["valid"]
    return result["loss"], bits_per_byte(result["loss"], valid["tokens"], valid["bytes"])


def quality(args, ng):
    meta = load_meta(args.data_dir)
    train_data = load_token_array(args.data_dir / "train.bin")
    valid_data = load_token_array(args.data_dir / "valid.bin")
    print(f"{'data':<12} {args.data_dir} ({meta['source']}), {len(train_data):,} train tokens, "
          f"{meta['valid']['bytes']:,} valid bytes, vocabulary {meta['vocab_size']:,}")
    print(f"{'training':<12} nanoGPT's README CPU recipe for {args.seconds:,.0f} s", flush=True)
    model, run = train_nanogpt(ng, train_data, meta["vocab_size"], args.seconds, args.seed)
    loss, bpb = score(model, valid_data, meta, RECIPE["block_size"])
    print(f"{'nanoGPT':<12} {run['steps']:,} steps, {run['tokens']:,} tokens in "
          f"{run['seconds']:,.0f} s: val loss {loss:.4f} nats per token, {bpb:.4f} bits per byte")
    result = {"nanogpt_bpb": bpb, **run}
    if args.checkpoint:
        ours, ckpt = model_from_checkpoint(args.checkpoint, "cpu", data_dir=args.data_dir)
        our_loss, our_bpb = score(ours, valid_data, meta, ours.config.max_seq_len)
        print(f"{'tiny_llm':<12} {args.checkpoint} (step {ckpt['step']:,}): val loss "
              f"{our_loss:.4f} nats per token, {our_bpb:.4f} bits per byte")
        print(f"{'ratio':<12} {our_bpb / bpb:.3f} (ours / nanoGPT's bits per byte: below 1 is "
              f"better)")
        result.update(ours_bpb=our_bpb, ratio=our_bpb / bpb)
    return result


def timed_step(model, optimizer, x, y):
    """One forward, backward and AdamW update; returns its seconds."""
    t0 = time.perf_counter()
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def tokens_per_second(model, optimizer, x, y, seconds):
    """Training tokens per second over about `seconds` of steps, after two warm-up steps."""
    timed_step(model, optimizer, x, y)
    timed_step(model, optimizer, x, y)
    spent, steps = 0.0, 0
    while spent < seconds or steps == 0:
        spent += timed_step(model, optimizer, x, y)
        steps += 1
    return steps * x.numel() / spent


def speed(args, ng):
    B, T, V = args.batch_size, args.seq_len, args.vocab_size
    torch.manual_seed(0)
    theirs = ng.GPT(ng.GPTConfig(block_size=T, vocab_size=V, n_layer=args.n_layers,
                                 n_head=args.n_heads, n_embd=args.d_model, dropout=0.0, bias=True))
    ours = GPT(GPTConfig(vocab_size=V, max_seq_len=T, d_model=args.d_model,
                         n_layers=args.n_layers, n_heads=args.n_heads))
    x, y = torch.randint(V, (2, B, T), generator=torch.Generator().manual_seed(0))
    runs = {"nanoGPT": theirs, "tiny_llm": ours}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, m in runs.items()}
    rates = {name: [] for name in runs}
    print(f"{'size':<12} {args.n_layers} layers, d_model {args.d_model}, {args.n_heads} heads, "
          f"batches of {B} x {T} tokens, vocabulary {V:,}; float32 eager, AdamW")
    for round_ in range(1, args.rounds + 1):  # in turns, so a busier minute hits both
        for name, model in runs.items():
            rates[name].append(tokens_per_second(model, optimizers[name], x, y, args.seconds))
        print(f"{'round ' + str(round_):<12} " + "  ".join(
            f"{name} {rates[name][-1]:,.0f}" for name in runs) + " tokens/s", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, value in medians.items():
        print(f"{name:<12} {value:,.0f} tokens/s (median of {args.rounds})")
    ratio = medians["tiny_llm"] / medians["nanoGPT"]
    print(f"{'ratio':<12} {ratio:.2f} (ours / nanoGPT's tokens per second: above 1 is faster)")
    return {**medians, "ratio": ratio}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nanogpt", type=Path, required=True,
                        help=f"a clone of nanoGPT (made with `{CLONE} PATH`)")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help=f"default: {DATA_DIR}")
    parser.add_argument("--seed", type=int, default=1337)
    what = parser.add_subparsers(dest="what", required=True)
    q = what.add_parser("quality", help="train nanoGPT's CPU recipe for a time; bits per byte")
    q.add_argument("--seconds", type=float, default=600.0, help="wall time of training")
    q.add_argument("--checkpoint", type=Path, help="a checkpoint of ours to score beside it")
    s = what.add_parser("speed", help="training tokens per second, nanoGPT's GPT and ours")
    for name, default in (("batch-size", 16), ("seq-len", 128), ("d-model", 128),
                          ("n-layers", 4), ("n-heads", 4), ("vocab-size", 4096), ("rounds", 3)):
        s.add_argument(f"--{name}", type=int, default=default)
    s.add_argument("--seconds", type=float, default=6.0, help="per model and round")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error(f"--seconds must be more than 0, got {args.seconds}")
    if not (args.nanogpt / "model.py").is_file():
        parser.error(f"no model.py in {args.nanogpt}: --nanogpt must be a clone of nanoGPT; "
                     f"make one with `{CLONE} {args.nanogpt}`")
    return args


def main(argv=None):
    """Run the comparison the command line asks for; return its figures as a dict."""
    args = parse_args(argv)
    try:
        ng = load_nanogpt(args.nanogpt)
        return quality(args, ng) if args.what == "quality" else speed(args, ng)
    except (FileNotFoundError, ImportError) as error:  # no clone, no prepared data: say which
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
