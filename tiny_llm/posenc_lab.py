"""Step 14: the positional encoding lab.

`LabGPT` is step 08's GPT with a choice of position scheme, `LabConfig.pos`: no positions at all,
a learned table, the sinusoidal table, RoPE or ALiBi (the parts and their pictures are in
tiny_llm/posenc.py). The experiment trains one of each from the same seed on the same batches
for the same number of steps, then scores them on valid.bin at the length they were trained on
and at 2x and 4x that length, lengths that no training batch ever had.

Run the experiment:  uv run python -m tiny_llm.posenc_lab            (about 10 minutes on 2 cores)
A quick run:         uv run python -m tiny_llm.posenc_lab --quick    (seconds)
Draw the pictures:   uv run python -m tiny_llm.posenc_lab --figures steps/images
"""

import argparse
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from tiny_llm.block import Block, LayerNorm, init_weights
from tiny_llm.data import DATA_DIR, ensure_data, load_token_array
from tiny_llm.device import pick_device, seed_everything
from tiny_llm.embed import check_ids
from tiny_llm.gpt import GPTConfig
from tiny_llm.multihead import MultiHeadAttention
from tiny_llm.posenc import (
    LearnedPositionalEncoding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_bias,
    draw_figures,
)
from tiny_llm.train import TrainConfig, lr_at, param_groups, update

SCHEMES = ("none", "learned", "sinusoidal", "rope", "alibi")
# sin and cos have an RMS of 1/√2, 35 times the 0.02 of a token embedding at init: added as
# they are, they drown the tokens out. Scaled by this, the table starts as big as a learned one.
SINUSOIDAL_SCALE = 0.02 * math.sqrt(2)


@dataclass
class LabConfig(GPTConfig):
    """A GPTConfig plus `pos`, the position scheme: one of SCHEMES."""

    pos: str = "learned"
    sinusoidal_scale: float = SINUSOIDAL_SCALE  # what the sinusoidal table is multiplied by

    def __post_init__(self):
        super().__post_init__()
        if self.pos not in SCHEMES:
            raise ValueError(f"LabConfig.pos must be one of {SCHEMES}, got {self.pos!r}")
        if self.pos == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError(f"rope turns pairs of dimensions, so the head size must be even; "
                             f"got d_model // n_heads = {self.d_model // self.n_heads}")


class LabAttention(MultiHeadAttention):
    """Step 06's attention, plus RoPE on q and k or ALiBi on the scores when `pos` asks: it
    overrides only step 06's two hooks, `position` and `bias`.

    (B, T, d_model) in, (B, T, d_model) out, T <= max_seq_len.
    """

    def __init__(self, d_model, n_heads, max_seq_len, pos, dropout=0.0):
        super().__init__(d_model, n_heads, max_seq_len, dropout)
        self.pos = pos
        if pos == "rope":
            self.rope = RotaryEmbedding(self.head_size, max_seq_len)
        if pos == "alibi":
            self.register_buffer("alibi", alibi_bias(n_heads, max_seq_len), persistent=False)

    def position(self, q, k, start):
        if self.pos == "rope":  # v carries content only: it is not turned
            return self.rope(q, start), self.rope(k, start)
        return q, k

    def bias(self, n_queries, n_keys):
        if self.pos != "alibi":
            return None  # the plain causal mask
        return self.alibi[:, n_keys - n_queries : n_keys, :n_keys]  # the rows of the new queries


class LabBlock(Block):
    """Step 07's block with LabAttention in place of MultiHeadAttention."""

    def __init__(self, config):
        c = config
        super().__init__(c.d_model, c.n_heads, c.max_seq_len, c.dropout)
        self.attn = LabAttention(c.d_model, c.n_heads, c.max_seq_len, c.pos, c.dropout)


def additive_positions(config):
    """The part added to the residual stream: a table for learned/sinusoidal, else nothing."""
    if config.pos == "learned":
        return LearnedPositionalEncoding(config.max_seq_len, config.d_model)
    if config.pos == "sinusoidal":
        return SinusoidalPositionalEncoding(config.max_seq_len, config.d_model,
                                            scale=config.sinusoidal_scale)
    return nn.Identity()  # none, rope, alibi: the blocks see tokens only


class LabGPT(nn.Module):
    """Step 08's GPT with a choice of position scheme: (B, T) ids -> (B, T, vocab_size) logits."""

    def __init__(self, config):
        super().__init__()
        if not isinstance(config, LabConfig):
            raise TypeError(f"LabGPT expects a LabConfig, got {type(config).__name__}")
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList([LabBlock(c) for _ in range(c.n_layers)])
        self.ln_f = LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied, as in step 08
        init_weights(self, c.n_layers)
        # Made last, so that under one seed every scheme starts from the same other weights.
        self.pos = additive_positions(c)

    def forward(self, idx, targets=None):
        """(B, T) ids -> (logits (B, T, V), mean cross-entropy against `targets` or None)."""
        check_ids(idx, self.config.vocab_size, math.inf)  # each scheme checks T itself
        x = self.drop(self.pos(self.tok_emb(idx)))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)


def stretch(model, max_seq_len):
    """The same trained weights in a LabGPT built for sequences up to `max_seq_len`.

    Every buffer (causal mask, sinusoidal table, RoPE angles, ALiBi biases) is a formula of the
    position and not saved (persistent=False), so the longer model recomputes them. A learned
    table cannot grow this way: its new rows were never trained.
    """
    if model.config.pos == "learned":
        raise ValueError(f"learned positions cannot be stretched past max_seq_len="
                         f"{model.config.max_seq_len}: the table has no trained rows beyond it")
    device = next(model.parameters()).device
    longer = LabGPT(replace(model.config, max_seq_len=max_seq_len)).to(device)
    longer.load_state_dict(model.state_dict())
    return longer.train(model.training)


@dataclass
class Experiment:
    """What every scheme shares: the model's size, the training budget, the evaluation."""

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 64  # the trained length; scored at 1x, 2x and 4x
    steps: int = 1200
    batch_size: int = 16
    lr: float = 3e-3
    eval_tokens: int = 65_536  # targets scored at every length: the same tokens each time
    seed: int = 1337
    schemes: tuple = SCHEMES
    sinusoidal_scale: float = SINUSOIDAL_SCALE


DEFAULT = Experiment()
QUICK = Experiment(d_model=32, seq_len=32, steps=100, batch_size=8, eval_tokens=4096)
LENGTHS = (1, 2, 4)  # evaluation lengths, in multiples of the trained length


def train_scheme(pos, exp, data, vocab_size, device):
    """Train one LabGPT with position scheme `pos`; return (model, loss of every step)."""
    cfg = TrainConfig(max_steps=exp.steps, batch_size=exp.batch_size, lr=exp.lr,
                      min_lr=exp.lr / 10, warmup_steps=max(1, exp.steps // 10),
                      dtype="float32", seed=exp.seed)
    seed_everything(exp.seed)  # the same first weights for every scheme (see LabGPT)
    config = LabConfig(vocab_size=vocab_size, max_seq_len=exp.seq_len, d_model=exp.d_model,
                       n_layers=exp.n_layers, n_heads=exp.n_heads, pos=pos,
                       sinusoidal_scale=exp.sinusoidal_scale)
    model = LabGPT(config).to(device)
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr,
                                  betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(exp.seed)  # the same batches for every scheme
    losses = []
    for step in tqdm(range(cfg.max_steps), desc=pos, leave=False):  # step 10's loop, in short
        lr = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.max_steps)
        losses.append(update(model, optimizer, data, cfg, device, generator, lr, step))
    return model.eval(), losses


@torch.no_grad()
def valid_loss(model, data, T, n_tokens, batch_size=16):
    """Mean loss over the first `n_tokens` targets of `data`, read as n_tokens / T windows of T.

    Every T sees the same targets; only how much context precedes each of them changes.
    """
    n = n_tokens // T
    tokens = torch.from_numpy(data[: n * T + 1].astype(np.int64))
    x, y = tokens[:-1].view(n, T), tokens[1:].view(n, T)  # y = x shifted by one token
    device = next(model.parameters()).device
    total = 0.0
    for i in range(0, n, batch_size):
        xb, yb = x[i : i + batch_size].to(device), y[i : i + batch_size].to(device)
        total += model(xb, yb)[1].item() * len(xb)
    return total / n


def score_lengths(model, data, exp):
    """{T: loss, or the error text when the model cannot read T tokens} for T = 1x, 2x, 4x."""
    scores = {}
    for T in (k * exp.seq_len for k in LENGTHS):
        try:
            if T > exp.seq_len and model.config.pos != "learned":
                model = stretch(model, T)  # a formula: rebuild its buffers for length T
            scores[T] = valid_loss(model, data, T, exp.eval_tokens)
        except ValueError as error:  # a learned table refuses, in its own words
            scores[T] = f"{type(error).__name__}: {error}"
    return scores


def run_lab(exp, data_dir, device):
    """Train and score every scheme: (exp as run, meta, {scheme: {params, losses, scores}})."""
    meta = ensure_data(data_dir)
    train_data = load_token_array(Path(data_dir) / "train.bin")
    valid_data = load_token_array(Path(data_dir) / "valid.bin")
    longest = LENGTHS[-1] * exp.seq_len  # score a multiple of it, so every length sees the same
    exp = replace(exp, eval_tokens=min(exp.eval_tokens, len(valid_data) - 1) // longest * longest)
    if exp.eval_tokens == 0:
        raise ValueError(f"valid.bin holds {len(valid_data):,} tokens, fewer than one window of "
                         f"{longest}: prepare a larger validation split")
    results = {}
    for pos in exp.schemes:
        model, losses = train_scheme(pos, exp, train_data, meta["vocab_size"], device)
        results[pos] = {"params": sum(p.numel() for p in model.parameters()), "losses": losses,
                        "scores": score_lengths(model, valid_data, exp)}
    return exp, meta, results


def print_report(exp, meta, results, seconds):
    """The setup, then one row per scheme: train loss, valid loss (bits per byte) at each T."""
    bits = meta["valid"]["tokens"] / meta["valid"]["bytes"] / math.log(2)  # nats/token -> bits/byte
    print(f"{'data':<10} {meta['source']}: {meta['train']['tokens']:,} train tokens, "
          f"{meta['valid']['tokens']:,} valid tokens")
    print(f"{'model':<10} d_model {exp.d_model}, {exp.n_layers} layers, {exp.n_heads} heads, "
          f"trained at T = {exp.seq_len}, seed {exp.seed}")
    print(f"{'budget':<10} {exp.steps:,} steps x {exp.batch_size} x {exp.seq_len} = "
          f"{exp.steps * exp.batch_size * exp.seq_len:,} tokens per scheme")
    print(f"{'eval':<10} the same {exp.eval_tokens:,} valid tokens at each T; "
          f"bits per byte = loss x {bits:.4f}\n")
    print(f"{'':<10} {'':>7} {'train':>6}   valid loss (bits per byte) at")
    print(f"{'scheme':<10} {'params':>7} {'loss':>6}"
          + "".join(f"   {f'T={k * exp.seq_len}':<14}" for k in LENGTHS))
    errors = []
    for pos, r in results.items():
        cells = [f"{s:.3f} ({s * bits:.3f})" if isinstance(s, float) else "cannot"
                 for s in r["scores"].values()]
        errors += [f"{pos} at T={T}: {s}" for T, s in r["scores"].items() if isinstance(s, str)]
        train = sum(r["losses"][-10:]) / len(r["losses"][-10:])  # the last 10 steps
        print(f"{pos:<10} {r['params']:>7,} {train:>6.3f}" + "".join(f"   {c:<14}" for c in cells))
    print("\n" + "\n".join(errors + [f"{'time':<10} {seconds:.0f} s"]))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Step 14: positional encodings side by side.")
    parser.add_argument("--quick", action="store_true", help="a tiny budget that runs in seconds")
    parser.add_argument("--steps", type=int, help="training steps per scheme (default 1200)")
    parser.add_argument("--schemes", nargs="+", choices=SCHEMES, help="default: all five")
    parser.add_argument("--sinusoidal-scale", type=float, help=f"default {SINUSOIDAL_SCALE:.4f}")
    parser.add_argument("--figures", metavar="DIR", help="draw the pictures into DIR and stop")
    parser.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    parser.add_argument("--data-dir", default=str(DATA_DIR), help="prepared data")
    args = parser.parse_args(argv)
    if args.figures:
        for path in draw_figures(args.figures):
            print(f"{'picture':<10} {path}")
        return
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    exp = QUICK if args.quick else DEFAULT
    given = {"steps": args.steps, "sinusoidal_scale": args.sinusoidal_scale,
             "schemes": tuple(args.schemes) if args.schemes else None}
    exp = replace(exp, **{k: v for k, v in given.items() if v is not None})
    start = time.perf_counter()
    exp, meta, results = run_lab(exp, Path(args.data_dir), pick_device(args.device))
    print_report(exp, meta, results, time.perf_counter() - start)


if __name__ == "__main__":
    main()
