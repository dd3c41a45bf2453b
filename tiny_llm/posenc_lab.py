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

import torch
from tqdm import tqdm

from tiny_llm.block import Block
from tiny_llm.data import DATA_DIR, ensure_data, load_token_array
from tiny_llm.device import pick_device, seed_everything
from tiny_llm.embed import Embed
from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.loss import evaluate_loss
from tiny_llm.multihead import MultiHeadAttention
from tiny_llm.posenc import RotaryEmbedding, alibi_bias, draw_figures, sinusoidal_table
from tiny_llm.train import TrainConfig, lr_at, param_groups, update_weights

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


class LabEmbed(Embed):
    """Step 04's Embed with the scheme's additive positions: a learned table (pos_emb), a fixed
    sinusoidal one, or none (RoPE and ALiBi work inside attention). (B, T) -> (B, T, C)."""

    def __init__(self, c):
        super().__init__(c.vocab_size, c.d_model, c.max_seq_len,
                         learned_positions=c.pos == "learned")
        table = c.sinusoidal_scale * sinusoidal_table(c.max_seq_len, c.d_model)
        # a formula of the position: rebuilt for any length, never saved (persistent=False)
        self.register_buffer("sinusoidal", table if c.pos == "sinusoidal" else None,
                             persistent=False)

    def forward(self, idx, start=0):
        x = super().forward(idx, start)  # tok_emb, plus pos_emb if learned
        if self.sinusoidal is None:
            return x
        return x + self.sinusoidal[start : start + idx.shape[1]]


class LabGPT(GPT):
    """Step 08's GPT with a choice of position scheme: (B, T) ids -> (B, T, vocab_size) logits.

    It overrides only what it builds differently: the embedding and the attention. Training,
    checkpoints, step 11's evaluation and step 12's cache take it as they take GPT."""

    config_class = LabConfig
    presets = {}  # built by the lab from an Experiment, not by name

    def make_embed(self, c):
        return LabEmbed(c)

    def make_block(self, c):
        attn = LabAttention(c.d_model, c.n_heads, c.max_seq_len, c.pos, c.dropout)
        return Block(c.d_model, c.n_heads, c.max_seq_len, c.dropout, attn=attn)


def rebuilt_longer(model, max_seq_len):
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
    seed_everything(exp.seed)  # every scheme starts from the same seed
    config = LabConfig(vocab_size=vocab_size, max_seq_len=exp.seq_len, d_model=exp.d_model,
                       n_layers=exp.n_layers, n_heads=exp.n_heads, pos=pos,
                       sinusoidal_scale=exp.sinusoidal_scale)
    model = LabGPT(config).to(device)
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr,
                                  betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(exp.seed)  # the same batches for every scheme
    losses = []
    # step 10's loop, in short; disable=None draws the bar on a terminal only, not into a pipe
    for step in tqdm(range(cfg.max_steps), desc=pos, leave=False, disable=None):
        lr = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.max_steps)
        losses.append(update_weights(model, optimizer, data, cfg, device, generator, lr, step))
    return model.eval(), losses


def score_lengths(model, data, exp):
    """{T: loss, or the error text when the model cannot read T tokens} for T = 1x, 2x, 4x."""
    scores = {}
    for T in (k * exp.seq_len for k in LENGTHS):
        try:
            if T > exp.seq_len and model.config.pos != "learned":
                model = rebuilt_longer(model, T)  # a formula: rebuild its buffers for length T
            # the first eval_tokens targets, in windows of T: the same targets at every T
            scores[T] = evaluate_loss(model, data[: exp.eval_tokens + 1], seq_len=T,
                                      device=next(model.parameters()).device)["loss"]
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
