"""Step 15: the modern model, LLaMA style.

The open models since GPT-2 (LLaMA, Mistral, Qwen) keep step 08's skeleton, pre-norm blocks on
a residual stream, and change five parts: RMSNorm instead of LayerNorm (no mean, no bias); RoPE
in every attention instead of a learned position table; a gated SwiGLU feed-forward instead of
the GELU MLP; no biases; and grouped-query attention (n_kv_heads < n_heads: each key/value head
serves a group of query heads, so step 12's KV cache shrinks by n_heads / n_kv_heads).

`ModernGPT` is step 08's GPT with these parts swapped in, so it trains, saves, evaluates and
decodes through the same code. Inside a block the names are those of Meta's LLaMA code
(blocks[i].attention.wq, blocks[i].feed_forward.w1, ...), so LLaMA weights map one to one.

Run the check:  uv run python -m tiny_llm.modern
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from tiny_llm import posenc
from tiny_llm.block import LayerNorm
from tiny_llm.device import seed_everything
from tiny_llm.embed import Embed
from tiny_llm.generate import generate
from tiny_llm.gpt import GPT
from tiny_llm.gpt import PRESETS as GPT_PRESETS
from tiny_llm.kvcache import KVCache, generate_cached
from tiny_llm.multihead import attend
from tiny_llm.tokenize import VOCAB_SIZE


class RMSNorm(nn.Module):
    """x / RMS(x) · weight, RMS(x) = √(mean(x²) + eps) over the last dim; (..., d) -> (..., d).

    LayerNorm without subtracting the mean and without the bias: [3., 4.] -> [3, 4] / √12.5 =
    [0.8485, 1.1314] (weight 1, eps 0)."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # the gain; no bias

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class SwiGLU(nn.Module):
    """Gated feed-forward: w2(silu(w1(x)) · w3(x)); (B, T, d_model) -> (B, T, d_model).

    w1 (the gate) decides, per hidden unit, how much of w3's value (the up projection) passes;
    w2 brings the result back down. d_ff = 8/3·d_model: the 8·d_model² weights of step 07's MLP."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)  # gate
        self.w3 = nn.Linear(d_model, d_ff, bias=False)  # up
        self.w2 = nn.Linear(d_ff, d_model, bias=False)  # down
        self.w2.residual_output = True  # step 07's init_weights starts it smaller

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class ReLU2(nn.Module):
    """Squared-ReLU feed-forward: w2(relu(w1(x))²); (B, T, d_model) -> (B, T, d_model).

    Two matrices 4·d_model wide hold the weights and FLOPs of SwiGLU's three at 8/3·d_model.
    The square keeps ReLU's zeros and grows fast above them, a sharper choice of units than
    SwiGLU's gate (So et al., Primer, 2021; modded-nanogpt and nanochat use it)."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)  # up
        self.w2 = nn.Linear(d_ff, d_model, bias=False)  # down
        self.w2.residual_output = True

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)).square())


def swiglu_size(d_model, multiple_of=8):
    """The SwiGLU width with a 4·d GELU MLP's weights, rounded up: 128 -> 344, 384 -> 1024."""
    return multiple_of * math.ceil(8 * d_model / 3 / multiple_of)


class RotaryEmbedding(posenc.RotaryEmbedding):
    """Step 14's RoPE with a base `theta`: pair i turns by θ_i = theta^(-2i/head_size) a step.

    (B, heads, T, head_size) in, same out; forward(x, start) is step 14's (start: cache.length)."""

    def __init__(self, head_size, max_seq_len, theta=10000.0):
        super().__init__(head_size, max_seq_len)  # step 14's tables are for theta = 10000
        inv_freq = theta ** (-torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)
        angle = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
        self.sin, self.cos = angle.sin().float(), angle.cos().float()  # replace the buffers


@dataclass
class ModernConfig:
    """The size and shape of a ModernGPT. Every field is checked when the config is made."""

    vocab_size: int = VOCAB_SIZE
    max_seq_len: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4  # query heads; head size = d_model // n_heads
    n_kv_heads: int = 2  # key/value heads; each serves n_heads // n_kv_heads query heads
    d_ff: int = 344  # SwiGLU width, swiglu_size(d_model)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True  # the output layer lm_head reuses tok_emb, as step 08 does
    dropout: float = 0.0  # the main job passes it; LLaMA trains without, and so does this model
    # The speedrunners' parts (step 15's last section); off, the model is LLaMA's.
    mlp: str = "swiglu"  # or "relu2": w2(relu(w1(x))²), two matrices, d_ff = 4·d_model
    qk_norm: bool = False  # RMSNorm (no gain) on every query and key head before the scores
    value_embeds: bool = False  # a table per layer whose row for the token is added to v
    x0_mix: bool = False  # each block reads λ·x + μ·x0, x0 the embedded input; λ, μ learned
    logit_softcap: float = 0.0  # cap·tanh(logits / cap) if > 0: no logit beyond ±cap

    def __post_init__(self):
        for name in ("vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads",
                     "n_kv_heads", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModernConfig.{name} must be a positive int, got {value!r}")
        if self.d_model % (2 * self.n_heads) or self.n_heads % self.n_kv_heads:
            raise ValueError(f"need d_model={self.d_model} to split into n_heads={self.n_heads}"
                             " heads of an even size (RoPE turns pairs), and n_heads to be a "
                             f"multiple of n_kv_heads={self.n_kv_heads} (whole groups)")
        if self.dropout != 0:
            raise ValueError(f"ModernGPT has no dropout (LLaMA trains without it), got "
                             f"dropout={self.dropout}: leave --dropout at 0")
        if self.mlp not in ("swiglu", "relu2"):
            raise ValueError(f"ModernConfig.mlp must be swiglu or relu2, got {self.mlp!r}")
        if not self.logit_softcap >= 0:
            raise ValueError(f"logit_softcap must be 0 (off) or a cap > 0, got "
                             f"{self.logit_softcap}")
        if not (self.rope_theta > 0 and self.norm_eps > 0):
            raise ValueError(f"rope_theta and norm_eps must be > 0, got {self.rope_theta}, "
                             f"{self.norm_eps}")


# Step 08's sizes, SwiGLU at equal MLP weights (d_ff = swiglu_size(d_model)), half the k/v heads.
PRESETS = {
    "tiny": ModernConfig(max_seq_len=64, d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=176),
    "cpu": ModernConfig(max_seq_len=128, d_model=128, n_layers=4, n_heads=4, n_kv_heads=4,
                        d_ff=344),  # the 10-minute CPU recipe (step 15): 128 tokens, no GQA
    "small": ModernConfig(max_seq_len=256, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2,
                          d_ff=344),
    "medium": ModernConfig(max_seq_len=256, d_model=384, n_layers=6, n_heads=6, n_kv_heads=2,
                           d_ff=1024),
    "gpu": ModernConfig(max_seq_len=512, d_model=512, n_layers=8, n_heads=8, n_kv_heads=4,
                        d_ff=1368),
}


class Attention(nn.Module):
    """Grouped-query attention with RoPE and no biases: (B, T, d_model) -> (B, T, d_model)."""

    def __init__(self, c):
        super().__init__()
        self.n_heads, self.n_kv_heads = c.n_heads, c.n_kv_heads
        self.head_size = hs = c.d_model // c.n_heads
        self.wq = nn.Linear(c.d_model, c.n_heads * hs, bias=False)
        self.wk = nn.Linear(c.d_model, c.n_kv_heads * hs, bias=False)  # fewer heads for k, v
        self.wv = nn.Linear(c.d_model, c.n_kv_heads * hs, bias=False)
        self.wo = nn.Linear(c.n_heads * hs, c.d_model, bias=False)
        self.wo.residual_output = True  # step 07's init_weights starts it smaller
        self.rope = RotaryEmbedding(hs, c.max_seq_len, c.rope_theta)
        self.qk_norm = c.qk_norm

    def forward(self, x, cache=None, layer=0, ve=None):
        B, T, C = x.shape
        start = 0 if cache is None else cache.length
        # (B, T, heads·hs) -> (B, heads, T, hs), as in step 06
        q = self.wq(x).view(B, T, self.n_heads, self.head_size).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_size).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_size).transpose(1, 2)
        if ve is not None:  # value embeddings: the token's own row, added to its values
            v = v + ve.view(B, T, self.n_kv_heads, self.head_size).transpose(1, 2)
        if self.qk_norm:  # every head's q and k at RMS 1: a score is at most √head_size
            q, k = F.rms_norm(q, (self.head_size,)), F.rms_norm(k, (self.head_size,))
        q, k = self.rope(q, start), self.rope(k, start)  # v carries content: not turned
        if cache is not None:
            k, v = cache.append(layer, k, v)  # (B, n_kv_heads, start + T, hs)
        y = attend(q, k, v)  # (B, n_heads, T, hs)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))


class TransformerBlock(nn.Module):
    """Pre-norm block, as in step 07: (B, T, d_model) -> (B, T, d_model)."""

    def __init__(self, c):
        super().__init__()
        self.attention_norm = RMSNorm(c.d_model, c.norm_eps)
        self.attention = Attention(c)
        self.ffn_norm = RMSNorm(c.d_model, c.norm_eps)
        self.feed_forward = (ReLU2 if c.mlp == "relu2" else SwiGLU)(c.d_model, c.d_ff)

    def forward(self, x, cache=None, layer=0, ve=None):
        x = x + self.attention(self.attention_norm(x), cache, layer, ve)
        return x + self.feed_forward(self.ffn_norm(x))


class ModernGPT(GPT):
    """A LLaMA-style decoder: (B, T) token ids -> (B, T, vocab_size) next-token logits.

    Step 08's GPT with other parts: the embedding without a position table (RoPE is in every
    attention), TransformerBlock, RMSNorm. Its forward, KV cache guard and counting are GPT's."""

    config_class = ModernConfig  # what a checkpoint's "config" dict is rebuilt into
    presets = PRESETS

    def make_embed(self, c):
        return Embed(c.vocab_size, c.d_model, c.max_seq_len, learned_positions=False)

    def make_block(self, c):
        return TransformerBlock(c)

    def make_norm(self, c):
        return RMSNorm(c.d_model, c.norm_eps)

    def __init__(self, config):
        super().__init__(config)
        c = config
        if c.value_embeds:  # start at 0: the model starts as it would without them
            self.value_embeds = nn.ModuleList(
                nn.Embedding(c.vocab_size, c.n_kv_heads * (c.d_model // c.n_heads))
                for _ in range(c.n_layers))
            for table in self.value_embeds:
                nn.init.zeros_(table.weight)
        if c.x0_mix:  # block i reads x_scale[i]·x + x0_scale[i]·x0; it starts reading x alone
            self.x_scale = nn.Parameter(torch.ones(c.n_layers))
            self.x0_scale = nn.Parameter(torch.zeros(c.n_layers))

    def transform(self, x, idx, cache=None):
        """Step 08's transform with the speedrunners' parts (each off unless its config says):
        the embedded input x0 mixed back in before every block, value embeddings looked up
        from idx, and logits soft-capped."""
        c, x0 = self.config, x
        for layer, block in enumerate(self.blocks):
            if c.x0_mix:
                x = self.x_scale[layer] * x + self.x0_scale[layer] * x0
            ve = self.value_embeds[layer](idx) if c.value_embeds else None
            x = block(x, cache, layer, ve)
        logits = self.lm_head(self.ln_f(x))
        if c.logit_softcap:  # ≈ logits while small; never beyond ±cap
            logits = c.logit_softcap * torch.tanh(logits / c.logit_softcap)
        return logits

    # Meta's names for the parts outside the blocks, as read-only aliases: model.layers[0] is
    # model.blocks[0]. The state_dict keeps step 08's names (embed.tok_emb, blocks.N, ln_f,
    # lm_head); inside a block the names are Meta's (attention.wq, feed_forward.w1, ...).
    tok_emb = property(lambda self: self.embed.tok_emb)
    layers = property(lambda self: self.blocks)
    norm = property(lambda self: self.ln_f)
    output = property(lambda self: self.lm_head)


# ---------------------------------------------------------------------------------------------
# RoPE's two layouts: Meta's LLaMA code turns adjacent pairs (0, 1), (2, 3), ... as we do; Hugging
# Face's turns (i, i + head_size/2). Reordering wq's and wk's rows per head converts between them.


def pairs_to_halves(w, n_heads):
    """Reorder a wq/wk weight's rows, per head, from adjacent pairs (ours) to halves (Hugging
    Face's): a head's rows 0, 1, 2, 3, 4, 5 -> 0, 2, 4, 1, 3, 5."""
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def halves_to_pairs(w, n_heads):
    """The inverse of pairs_to_halves: a head's rows 0, 1, 2, 3, 4, 5 -> 0, 3, 1, 4, 2, 5."""
    rows, cols = w.shape
    return w.view(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


# ---------------------------------------------------------------------------------------------
# The check


def kv_bytes_per_token(config):
    """Bytes one token takes in step 12's KVCache: 2 · n_layers · kv heads · head size · 4."""
    return KVCache(config).nbytes() // config.max_seq_len


def compare(gpt, modern):
    """Print step 08's GPT and ModernGPT side by side: parameters by part, loss, KV cache."""
    def count(model, prefixes):  # parameters whose names start with one of prefixes
        return sum(p.numel() for n, p in model.named_parameters() if n.startswith(prefixes))

    idx, targets = torch.randint(0, gpt.config.vocab_size, (2, 4, gpt.config.max_seq_len))
    rows = {"parameters": (gpt.num_params(), modern.num_params()),
            "  token embedding": (count(gpt, "embed.tok_emb"), count(modern, "embed.tok_emb")),
            "  position table": (count(gpt, "embed.pos_emb"), 0),
            "  attention, per layer": (count(gpt, "blocks.0.attn."),
                                       count(modern, "blocks.0.attention.")),
            "  MLP, per layer": (count(gpt, "blocks.0.mlp."), count(modern, "blocks.0.feed_")),
            "  norms, per layer": (count(gpt, "blocks.0.ln_"),
                                   count(modern, ("blocks.0.attention_", "blocks.0.ffn_"))),
            "  biases, all layers": tuple(sum(p.numel() for n, p in m.named_parameters()
                                              if n.endswith("bias")) for m in (gpt, modern)),
            "k/v heads per layer": (gpt.config.n_heads, modern.config.n_kv_heads),
            "KV cache bytes per token": (kv_bytes_per_token(gpt.config),
                                         kv_bytes_per_token(modern.config))}
    print(f"{'':<26} {'GPT small':>12} {'ModernGPT small':>16}")
    for label, (a, b) in rows.items():
        print(f"{label:<26} {a:>12,} {b:>16,}")
    a, b = (m(idx, targets)[1].item() for m in (gpt, modern))
    print(f"{'initial loss':<26} {a:>12.3f} {b:>16.3f}   ln(vocab_size) = "
          f"{math.log(gpt.config.vocab_size):.3f}")


def main():
    seed_everything(1337)
    modern = ModernGPT(PRESETS["small"]).eval()
    with torch.no_grad():
        compare(GPT(GPT_PRESETS["small"]).eval(), modern)
        x = torch.randn(4, 16, 128) * 3 + 1  # far from mean 0, rms 1 on purpose
        rms, ln = RMSNorm(128)(x), LayerNorm(128)(x)
        error = (rms - F.rms_norm(x, (128,), eps=1e-5)).abs().max().item()
    print()
    print(f"{'RMSNorm = F.rms_norm (1e-6)':<30} {error < 1e-6}")
    print(f"{'LayerNorm out: mean, rms':<30} {abs(ln.mean().item()):+.3f}, "
          f"{ln.pow(2).mean().sqrt().item():.3f}")
    print(f"{'RMSNorm out: mean, rms':<30} {rms.mean().item():+.3f}, "
          f"{rms.pow(2).mean().sqrt().item():.3f}")
    c = PRESETS["gpu"]
    mha, gqa = kv_bytes_per_token(GPT_PRESETS["gpu"]), kv_bytes_per_token(c)
    print(f"{'gpu preset, KV cache':<30} {mha:,} bytes per token with {c.n_heads} k/v heads, "
          f"{gqa:,} with {c.n_kv_heads}: {mha * c.max_seq_len / 2**20:.0f} MiB vs "
          f"{gqa * c.max_seq_len / 2**20:.0f} MiB per sequence of {c.max_seq_len}")
    prompt = torch.zeros(1, 1, dtype=torch.long)  # greedy, 40 tokens, without and with a cache
    same = torch.equal(*(fn(modern, prompt, 40, temperature=0, eot_id=None)
                         for fn in (generate, generate_cached)))
    print(f"{'greedy, KV cache vs none':<30} the same 40 tokens: {same}")
    print(f"{'the ablation':<30} uv run python scripts/ablate_modern.py (steps/15-modern.md)")


if __name__ == "__main__":
    main()
