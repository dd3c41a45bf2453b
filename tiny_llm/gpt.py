"""Step 08: the whole GPT.

Everything is in place: step 04 turns ids into vectors, step 07's blocks transform them, and
now a final LayerNorm and an output layer turn each position's vector into one score (a logit)
per vocabulary entry: the model's guess for the next token. The output layer reuses the token
embedding matrix (weight tying), and `forward` can also score the guesses with cross-entropy.

Run the check:  uv run python -m tiny_llm.gpt
"""

import argparse
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from tiny_llm.block import Block, LayerNorm, init_weights
from tiny_llm.checks import check_config_type
from tiny_llm.device import seed_everything
from tiny_llm.embed import Embed


@dataclass
class GPTConfig:
    """The size of a GPT. Every field is checked when the config is made."""

    vocab_size: int = 4096  # how many different token ids (step 02's tokenizer.VOCAB_SIZE)
    max_seq_len: int = 256  # the longest context the model can read (position table size)
    d_model: int = 128  # width of the residual stream
    n_layers: int = 4  # how many blocks
    n_heads: int = 4  # attention heads per block; head size = d_model // n_heads
    dropout: float = 0.0  # off; 0.1 helps when a run sees the same text many times

    def __post_init__(self):
        for name in ("vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"GPTConfig.{name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"GPTConfig.{name} must be at least 1, got {value}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"GPTConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                f"pick n_heads from the divisors of {self.d_model} (head size = d_model // n_heads)"
            )
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be a number in [0, 1), got {self.dropout!r}")


# Named sizes; steps/08-gpt.md has their parameter counts and measured speeds.
PRESETS = {
    "tiny": GPTConfig(max_seq_len=64, d_model=64, n_layers=2, n_heads=2),  # tests: seconds on CPU
    # the main job on a CPU: screenings found 128 tokens best in 10 minutes (docs/records/10-*)
    "cpu": GPTConfig(max_seq_len=128, d_model=128, n_layers=4, n_heads=4),
    "small": GPTConfig(max_seq_len=256, d_model=128, n_layers=4, n_heads=4),  # a 256-token context
    "medium": GPTConfig(max_seq_len=256, d_model=384, n_layers=6, n_heads=6),  # a laptop GPU
    "gpu": GPTConfig(max_seq_len=512, d_model=512, n_layers=8, n_heads=8),  # one data-centre GPU
}
DEFAULT_PRESET = "small"


class GPT(nn.Module):
    """A decoder-only transformer: (B, T) token ids -> (B, T, vocab_size) next-token logits.

    A variant (step 14's position schemes, step 15's modern model) is a subclass that overrides
    the parts it builds differently; forward is this one.
    """

    config_class = GPTConfig  # what a checkpoint's "config" dict is rebuilt into
    presets = PRESETS

    def __init__(self, config):
        check_config_type(self, config)  # a GPTConfig, not a dict of one
        super().__init__()
        self.config = c = config
        self.embed = self.make_embed(c)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList([self.make_block(c) for _ in range(c.n_layers)])
        self.ln_f = self.make_norm(c)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)  # the output layer
        if getattr(c, "tie_embeddings", True):
            # Weight tying: the output layer scores token v by a dot product with token v's own
            # embedding, so reading and writing a token share one (vocab_size, d_model) matrix.
            self.lm_head.weight = self.embed.tok_emb.weight
        init_weights(self, c.n_layers)

    def make_embed(self, c):
        return Embed(c.vocab_size, c.d_model, c.max_seq_len)  # step 04: tok_emb + pos_emb

    def make_block(self, c):
        return Block(c.d_model, c.n_heads, c.max_seq_len, c.dropout)  # step 07

    def make_norm(self, c):
        return LayerNorm(c.d_model)

    def forward(self, idx, targets=None, cache=None):
        """(B, T) int ids -> (logits (B, T, vocab_size), loss or None).

        With `targets` (B, T) int ids (the next token at each position), loss is the mean
        cross-entropy over every position; positions whose target is -1 are left out.
        With a `cache` (step 12's KVCache; eval mode only), idx holds only the tokens that
        follow the cache.length positions it already holds.
        """
        check_targets(idx, targets, self.config.vocab_size, values=idx.device.type == "cpu")
        start = 0 if cache is None else self._check_cache(cache, idx)
        x = self.drop(self.embed(idx, start))  # (B, T, C); Embed checks dtype, rank, length
        logits = self.transform(x, idx, cache)  # (B, T, V)
        if cache is not None:
            cache.length += idx.shape[1]  # every layer has stored the new keys and values
        if targets is None:
            return logits, None
        # cross_entropy wants (N, V) scores and (N,) targets: flatten batch and time together
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss

    def transform(self, x, idx, cache=None):
        """The embedded input (B, T, C) -> logits (B, T, V): the blocks, ln_f, the output layer.
        idx, the ids, is for step 15's speedrun model, whose transform also reads them."""
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer)
        return self.lm_head(self.ln_f(x))

    def num_params(self, non_embedding=False):
        """Count parameters; the tied embedding/output matrix is one tensor and counts once.

        non_embedding=True leaves out the embedding tables (tok_emb, which is also the output
        layer, and pos_emb) and returns what the blocks and ln_f hold; for step 08's GPT
        n_layers·(12·d_model² + 13·d_model) + 2·d_model.
        """
        total = sum(p.numel() for p in self.parameters())  # parameters() yields a shared one once
        if non_embedding:
            total -= sum(p.numel() for p in self.embed.parameters())
            if self.lm_head.weight is not self.embed.tok_emb.weight:  # untied (step 15)
                total -= self.lm_head.weight.numel()
        return total

    def _check_cache(self, cache, idx):
        """The first position of idx when it follows a cache; errors that would corrupt one."""
        if self.training:
            raise ValueError("a KV cache needs model.eval(): dropout would store random keys")
        T, start = idx.shape[-1], cache.length
        if start + T > self.config.max_seq_len:
            raise ValueError(f"positions {start}..{start + T - 1} do not fit max_seq_len="
                             f"{self.config.max_seq_len}: reset the cache and read the last "
                             f"{self.config.max_seq_len} tokens again")
        if start > 0 and T > 1:
            raise ValueError(f"{T} new tokens after a cache of {start}: feed a prompt to an "
                             "empty cache, then one token at a time")
        return start


def check_targets(idx, targets, vocab_size, values=True):
    """Raise a clear error unless `targets` are next-token ids for `idx`: int64, same shape, at
    least one of them, each in [0, vocab_size) or -1 (left out of the loss), not all -1; None
    (no loss wanted) passes. values=False skips the checks that read the ids (min, max), which
    make a GPU stop and wait (and break a compiled graph, step 13: they are skipped there too)."""
    if targets is None:
        return
    if not torch.is_tensor(targets) or targets.dtype != torch.long:
        kind = targets.dtype if torch.is_tensor(targets) else type(targets).__name__
        raise TypeError(f"targets must be integer token ids, got {kind}: cross_entropy takes "
                        "int64 (torch.long); use y from get_batch, or targets.long()")
    if targets.shape != idx.shape:
        raise ValueError(f"targets shape {tuple(targets.shape)} does not match idx shape "
                         f"{tuple(idx.shape)}: targets[b, t] is the token that follows idx[b, t]")
    if targets.numel() == 0:
        raise ValueError(f"the batch is empty (targets of shape {tuple(targets.shape)}): the mean "
                         "loss over no token is nan; pass at least one window")
    if not values or torch.compiler.is_compiling():  # a compiled graph reads no values either
        return
    low, high = (int(v) for v in torch.aminmax(targets))  # on a CPU: no device to wait for
    if low < -1 or high >= vocab_size:
        raise ValueError(f"targets must be token ids in [0, {vocab_size}) or -1 (ignored), "
                         f"got values from {low} to {high}")
    if high == -1:
        raise ValueError("every target is -1 (ignored): the mean loss over no token is nan; "
                         "leave at least one target unmasked")


def draw_model(path, preset="cpu", batch_size=16):
    """Draw the whole GPT of `preset` with its real shapes and parameter counts; save a PNG."""
    from tiny_llm.course.diagrams import model_diagram
    from tiny_llm.files import save_figure

    c = PRESETS[preset]
    model = GPT(c)
    sizes = {"name": f"{preset} preset", "B": batch_size, "T": c.max_seq_len,
             "V": c.vocab_size, "d": c.d_model, "layers": c.n_layers, "heads": c.n_heads,
             "total": model.num_params(),
             "tok_emb": model.embed.tok_emb.weight.numel(),
             "pos_emb": model.embed.pos_emb.weight.numel(),
             "block": sum(p.numel() for p in model.blocks[0].parameters()),
             "ln_f": sum(p.numel() for p in model.ln_f.parameters())}
    return save_figure(model_diagram(sizes), path, dpi=90)


def main():
    parser = argparse.ArgumentParser(description="Step 08: build a GPT, count it, score it.")
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS))
    parser.add_argument("--diagram", metavar="PNG", help="draw the preset's diagram there and stop")
    args = parser.parse_args()
    if args.diagram:
        print(f"{'diagram':<26} {draw_model(args.diagram, args.preset)}")
        return

    seed_everything(1337)
    config = PRESETS[args.preset]
    model = GPT(config).eval()
    d, V = config.d_model, config.vocab_size
    idx = torch.randint(0, V, (4, config.max_seq_len))  # random ids: nothing to predict
    targets = torch.randint(0, V, (4, config.max_seq_len))
    with torch.no_grad():
        logits, loss = model(idx, targets)

    print(f"{'preset':<26} {args.preset}")
    print(f"{'config':<26} " + " ".join(f"{k}={v}" for k, v in asdict(config).items()))
    print(f"{'parameters':<26} {model.num_params():,}")
    print(f"{'  without embeddings':<26} {model.num_params(non_embedding=True):,}")
    print(f"{'  L·(12·d² + 13·d) + 2·d':<26} {config.n_layers * (12 * d * d + 13 * d) + 2 * d:,}")
    print(f"{'  tok_emb = lm_head':<26} {V * d:,} (counted once)")
    print(f"{'  pos_emb':<26} {config.max_seq_len * d:,}")
    tied = model.lm_head.weight.data_ptr() == model.embed.tok_emb.weight.data_ptr()
    print(f"{'lm_head shares tok_emb':<26} {tied}")
    print(f"{'idx, logits':<26} {tuple(idx.shape)} -> {tuple(logits.shape)}")
    print(f"{'initial loss':<26} {loss.item():.3f}")
    print(f"{'ln(vocab_size)':<26} {math.log(V):.3f}")


if __name__ == "__main__":
    main()
