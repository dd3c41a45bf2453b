"""Solutions to the exercises of step 15 (steps/15-modern.md).

Run them:  uv run python -m solutions.ex15_modern
"""

import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from tiny_llm.block import LayerNorm
from tiny_llm.gpt import GPT
from tiny_llm.gpt import PRESETS as GPT_PRESETS
from tiny_llm.modern import (
    PRESETS,
    ModernGPT,
    RMSNorm,
    RotaryEmbedding,
    kv_bytes_per_token,
    pairs_to_halves,
)


def exercise_1_layernorm_is_rmsnorm_of_the_centred_vector(seed=0):
    """LayerNorm(x) = RMSNorm(x - mean(x)) · gain + bias: the variance of x is the mean square
    of x - mean(x). Returns the largest difference between the two sides (float rounding)."""
    torch.manual_seed(seed)
    x = torch.randn(4, 10, 32) * 2 + 3
    ln, rms = LayerNorm(32), RMSNorm(32)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
        rms.weight.copy_(ln.weight)
        centred = rms(x - x.mean(dim=-1, keepdim=True)) + ln.bias
        return (ln(x) - centred).abs().max().item()


def exercise_2_llama_d_ff(d_model=4096, multiple_of=256):
    """LLaMA's rule: 2/3 of 4·d_model, rounded up to a multiple of `multiple_of`.
    4096 -> 2/3 · 16384 = 10922.7 -> 11008, the intermediate size of LLaMA 7B."""
    hidden = int(2 * 4 * d_model / 3)
    return multiple_of * math.ceil(hidden / multiple_of)


def exercise_3_kv_cache_70b(tokens=4096, bytes_per_number=2):
    """A 70B-class model (80 layers, 64 query heads of 128, 8 k/v heads) in bfloat16:
    bytes per token and per `tokens`-token sequence, with GQA and with 64 k/v heads.
    Per token: 2 (k and v) · n_layers · k/v heads · head_size numbers."""
    gqa, mha = (2 * 80 * kv_heads * 128 * bytes_per_number for kv_heads in (8, 64))
    return {"gqa_per_token": gqa, "mha_per_token": mha,
            "gqa_per_sequence_GB": gqa * tokens / 1e9, "mha_per_sequence_GB": mha * tokens / 1e9}


def rope_halves(x, rope):
    """RoPE the Hugging Face way: dimension i turns with dimension i + hs/2, by pair i's angle."""
    T, half = x.shape[-2], x.shape[-1] // 2
    sin, cos = rope.sin[:T], rope.cos[:T]
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)


def exercise_4_the_two_rope_layouts_agree(head_size=8, T=6, seed=0):
    """Reorder a head's dimensions from pairs to halves, turn by halves; that equals turning by
    pairs first and reordering after. Returns the largest difference (float rounding)."""
    torch.manual_seed(seed)
    rope, x = RotaryEmbedding(head_size, T), torch.randn(1, 1, T, head_size)
    order = pairs_to_halves(torch.arange(head_size).view(-1, 1), 1).flatten()  # 0, 2, .., 1, 3, ..
    by_halves = rope_halves(x[..., order], rope)
    by_pairs = rope(x)[..., order]
    return (by_halves - by_pairs).abs().max().item()


def exercise_5_multi_query(name="small"):
    """n_kv_heads = 1 (multi-query attention): parameters and KV cache bytes per token against
    the preset's grouped-query attention and against full multi-head attention."""
    base = PRESETS[name]
    sizes = {}
    for kv in (base.n_heads, base.n_kv_heads, 1):
        config = replace(base, n_kv_heads=kv)
        sizes[kv] = (ModernGPT(config).num_params(), kv_bytes_per_token(config))
    return sizes


def exercise_6_swiglu_gate():
    """silu(g) · u: where the gate g is very negative the unit is shut (silu(-6) ≈ -0.015),
    where it is large the up value passes almost unchanged (silu(6) ≈ 5.985). Returns both."""
    g = torch.tensor([-6.0, 6.0])
    return F.silu(g).tolist()


def main():
    print(f"1. max |LayerNorm - (RMSNorm(x - mean) + bias)|: "
          f"{exercise_1_layernorm_is_rmsnorm_of_the_centred_vector():.1e}")
    print(f"2. LLaMA d_ff for d_model 4096: {exercise_2_llama_d_ff():,}")
    kv = exercise_3_kv_cache_70b()
    print(f"3. 70B KV cache per token: GQA {kv['gqa_per_token']:,} B, MHA {kv['mha_per_token']:,}"
          f" B; per 4,096 tokens {kv['gqa_per_sequence_GB']:.2f} GB vs "
          f"{kv['mha_per_sequence_GB']:.2f} GB")
    print(f"4. max |halves(reordered) - reordered(pairs)|: "
          f"{exercise_4_the_two_rope_layouts_agree():.1e}")
    for kv_heads, (params, nbytes) in exercise_5_multi_query().items():
        print(f"5. small, {kv_heads} k/v heads: {params:,} parameters, {nbytes:,} B per token")
    print(f"6. silu(-6), silu(6): {', '.join(f'{v:.3f}' for v in exercise_6_swiglu_gate())}")
    print(f"   step 08's GPT small: {GPT(GPT_PRESETS['small']).num_params():,} parameters")


if __name__ == "__main__":
    main()
