"""Step 11's ladder: what each piece of the GPT buys, measured.

Chapters 04 to 08 build the GPT one piece at a time, and only step 10 sees it learn. Here the
GPT's ancestors, each one piece short of the next, train with step 10's loop on the same text
for the same number of steps (or seconds), and step 11's evaluation scores each in bits per
byte on valid.bin:

    embedding   no block (n_layers=0): the next token from this token and its position
                alone, through step 08's ln_f and tied output layer: a bigram model    step 04
    one-head    + one block of attention alone, with one head                          step 05
    heads       the same block, its width cut into the preset's heads                  step 06
    one-block   + the MLP and its LayerNorm: step 07's Block                           step 07
    gpt         the preset's n_layers blocks: step 08's GPT                            step 08

Run the check:  uv run python -m tiny_llm.ladder         (--seconds 60: a CPU minute a rung)
"""
import argparse
import io
import math
import tempfile
from contextlib import redirect_stdout
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch.nn as nn

from tiny_llm.block import Block, init_weights
from tiny_llm.checkpoint import model_from_checkpoint
from tiny_llm.data import ensure_data, load_meta, load_token_array
from tiny_llm.device import pick_device
from tiny_llm.evaluate import bits_per_byte, samples
from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.gpt import PRESETS as GPT_PRESETS
from tiny_llm.loss import evaluate_loss
from tiny_llm.paths import DATA_DIR
from tiny_llm.plots import plot_ladder
from tiny_llm.tokenize import load_tokenizer
from tiny_llm.train import TrainConfig, train


@dataclass
class RungConfig(GPTConfig):
    """A GPT with pieces left out: n_layers may be 0 (no block at all), and attention_only
    blocks have no MLP. Every other field is checked as step 08 checks it."""

    attention_only: bool = False  # True: each block is x + attn(ln_1(x)), without its MLP

    def __post_init__(self):
        if type(self.n_layers) is int and self.n_layers == 0:  # step 08 wants a block:
            replace(self, n_layers=1)  # check every other field on a one-block copy
        else:
            super().__post_init__()
        if not isinstance(self.attention_only, bool):
            raise TypeError(f"RungConfig.attention_only must be True or False, got "
                            f"{self.attention_only!r}")


class AttentionBlock(Block):
    """Step 07's Block without its MLP: x + attn(ln_1(x)), (B, T, d_model) -> (B, T, d_model)."""

    def __init__(self, d_model, n_heads, max_seq_len, dropout=0.0):
        super().__init__(d_model, n_heads, max_seq_len, dropout)
        del self.ln_2, self.mlp  # the piece this rung goes without

    def forward(self, x, *passed):  # passed: what the GPT hands every block (step 12: a cache)
        return x + self.attn(self.ln_1(x), *passed)


# rung: (the chapter whose piece it adds, what it changes in a preset of step 08)
RUNGS = {
    "embedding": (4, dict(n_layers=0)),
    "one-head": (5, dict(n_layers=1, n_heads=1, attention_only=True)),
    "heads": (6, dict(n_layers=1, attention_only=True)),
    "one-block": (7, dict(n_layers=1)),
    "gpt": (8, {}),
}


class RungGPT(GPT):
    """Step 08's GPT with the blocks a RungConfig asks for: (B, T) ids -> (B, T, vocab_size).

    Step 08 builds a GPT of at least one block; the rung puts its own blocks in their place
    (none, attention alone, or step 07's) and initialises them as step 08 does. Forward, loss,
    training, checkpoints and evaluation are GPT's."""

    config_class = RungConfig
    # "tiny-embedding" ... "gpu-gpt": what step 10's train() builds, by preset, as for any model
    presets = {f"{size}-{rung}": RungConfig(**{**asdict(config), **changes})
               for size, config in GPT_PRESETS.items() for rung, (_, changes) in RUNGS.items()}

    def __init__(self, config):
        super().__init__(replace(config, n_layers=max(1, config.n_layers)))
        self.config = c = config
        block = AttentionBlock if c.attention_only else Block
        self.blocks = nn.ModuleList([block(c.d_model, c.n_heads, c.max_seq_len, c.dropout)
                                     for _ in range(c.n_layers)])
        init_weights(self.blocks, max(1, c.n_layers))


MODEL = "tiny_llm.ladder.RungGPT"  # the name train() and checkpoints know the class by


def describe(c):
    """A rung's blocks in words: '1 block of attention, 1 head', '2 blocks, 2 heads'."""
    if c.n_layers == 0:
        return "none: a bigram model"
    blocks = f"{c.n_layers} block{'s' * (c.n_layers > 1)}"
    heads = f"{c.n_heads} head{'s' * (c.n_heads > 1)}"
    return f"{blocks} of attention, {heads}" if c.attention_only else f"{blocks}, {heads}"


def climb(preset="tiny", steps=200, seconds=0.0, batch_size=8, data_dir=DATA_DIR, seed=1337,
          device=None, sample_tokens=24):
    """Train every rung of `preset` with step 10's train() for `steps` updates of `batch_size`
    windows (or `seconds` of training each, when given) on the same data with the same seed;
    score each on all of valid.bin. Yields a dict a rung: rung, step (the chapter of its piece),
    describe, params, steps, loss, bpb (bits per byte) and sample."""
    data_dir = Path(data_dir)
    length = dict(time_budget=seconds, max_steps=0) if seconds else dict(time_budget=0,
                                                                         max_steps=steps)
    with tempfile.TemporaryDirectory(prefix="ladder-") as runs:  # nothing left in the repo
        for rung, (chapter, _) in RUNGS.items():
            cfg = TrainConfig(model=MODEL, preset=f"{preset}-{rung}", **length,
                              batch_size=batch_size, warmup_steps=10, eval_iters=5,
                              eval_interval=10**9,  # one evaluation: at the end
                              seed=seed, device=device, data_dir=str(data_dir),
                              out=f"{runs}/{rung}")
            with redirect_stdout(io.StringIO()):  # train's own lines: the ladder prints a row
                result = train(cfg)
            model, _ = model_from_checkpoint(result["checkpoint"], pick_device(device), data_dir)
            yield {"rung": rung, "step": chapter, "describe": describe(model.config),
                   "params": model.num_params(), "steps": result["step"],
                   **score(model, data_dir, seed, sample_tokens)}


def score(model, data_dir, seed, sample_tokens):
    """Step 11's scorecard of a model: loss and bits per byte on valid.bin, and one sample."""
    meta = load_meta(data_dir)
    valid = load_token_array(data_dir / "valid.bin")
    device = next(model.parameters()).device
    loss = evaluate_loss(model, valid, device=device)["loss"]
    tokenizer = load_tokenizer(data_dir / "tokenizer.json")
    text = samples(model, tokenizer, 1, seed, sample_tokens)[0]
    return {"loss": loss, "bpb": bits_per_byte(loss, meta["valid"]["tokens"],
                                               meta["valid"]["bytes"]), "sample": text}


def parse_args():
    parser = argparse.ArgumentParser(description="Step 11: what each piece of the GPT buys.")
    parser.add_argument("--preset", default="tiny", choices=sorted(GPT_PRESETS),
                        help="the size every rung takes its width and context from")
    parser.add_argument("--steps", type=int, default=200, help="updates for every rung")
    parser.add_argument("--seconds", type=float, default=0.0,
                        help="train every rung this long instead (step 10's --time-budget)")
    parser.add_argument("--batch-size", type=int, default=8,
                        help="windows per step (half of step 10's 16: the check stays quick)")
    parser.add_argument("--plot", type=Path, help="draw the ladder to this PNG")
    parser.add_argument("--sample-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help=f"default: {DATA_DIR}")
    args = parser.parse_args()
    if min(args.steps, args.batch_size) < 1 or min(args.seconds, args.sample_tokens) < 0:
        parser.error(f"--steps and --batch-size must be at least 1, --seconds and "
                     f"--sample-tokens at least 0; got {args.steps}, {args.batch_size}, "
                     f"{args.seconds:g} and {args.sample_tokens}")
    return args


def print_row(rung, step, describe, params, steps, loss, bpb, sample=None):
    """One rung of the table (and its sample on the next line): aligned, as the chapter shows."""
    print(f"{rung:<10} {step:>4}  {describe:<30} {params:>10} {steps:>6} {loss:>9} {bpb:>10}")
    if sample is not None:
        print(f"{'':<10} {sample!r}", flush=True)


def main():
    args = parse_args()
    length = (f"{args.seconds:g} s of training" if args.seconds else f"{args.steps} steps") + \
        f" of {args.batch_size} windows"
    try:
        meta = ensure_data(args.data_dir)  # prepared first if the folder is empty, as train does
        print(f"{'ladder':<10} {args.preset} preset, {length} each, seed {args.seed}, "
              f"{meta['source']} corpus")
        print_row("rung", "step", "blocks", "parameters", "steps", "val loss", "bits/byte")
        nats = math.log(meta["vocab_size"])  # a guess that knows nothing: 1/vocab_size each
        uniform = bits_per_byte(nats, meta["valid"]["tokens"], meta["valid"]["bytes"])
        print_row("uniform", "", "a guess that knows nothing", "", "", f"{nats:.3f}",
                  f"{uniform:.3f}")
        rows = []
        for r in climb(args.preset, args.steps, args.seconds, args.batch_size, args.data_dir,
                       args.seed, args.device, args.sample_tokens):
            rows.append(r)
            print_row(r["rung"], f"{r['step']:02d}", r["describe"], f"{r['params']:,}",
                      r["steps"], f"{r['loss']:.3f}", f"{r['bpb']:.3f}", r["sample"])
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    if args.plot:
        title = f"{args.preset} preset, {length} each, {meta['source']} corpus"
        print(f"{'plot':<10} {plot_ladder(rows, uniform, args.plot, title)}")


if __name__ == "__main__":
    main()
