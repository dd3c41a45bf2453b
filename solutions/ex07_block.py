"""Solutions to the exercises of step 07 (steps/07-block.md).

Run them:  uv run python -m solutions.ex07_block
"""

import torch

from tiny_llm.block import MLP, Block, LayerNorm, residual_stds


def exercise_1_block_parameters(d_model):
    """Attention 4·d² + 4·d, MLP 8·d² + 5·d (d·4d + 4d, then 4d·d + d), two LayerNorms 2·2d."""
    parts = {
        "attn": 4 * d_model**2 + 4 * d_model,
        "mlp": 8 * d_model**2 + 5 * d_model,
        "ln_1 + ln_2": 4 * d_model,
    }
    parts["total = 12·d² + 13·d"] = sum(parts.values())
    counted = sum(p.numel() for p in Block(d_model, n_heads=4, max_seq_len=8).parameters())
    mlp_counted = sum(p.numel() for p in MLP(d_model).parameters())
    return parts, counted, mlp_counted


def exercise_2_flops_per_token(d_model=128, T=256):
    """Forward FLOPs per token (2 per multiply-add) of one block, and where attention catches up.

    qkv and proj: 2·(3d² + d²) = 8·d². Scores q·k for T keys: 2·T·d; weights times values: 2·T·d.
    MLP: 2·(4d² + 4d²) = 16·d². The T-dependent part equals the MLP when 4·T·d = 16·d², at
    T = 4·d. (Computed without the causal saving; a fused kernel skips about half the scores.)
    """
    d = d_model
    flops = {
        "attention projections": 8 * d * d,
        "attention scores + mix": 4 * T * d,
        "mlp": 16 * d * d,
    }
    return flops, 4 * d  # the second value: the T at which scores + mix cost as much as the MLP


def exercise_3_why_eps(d_model=8):
    """A constant vector has variance 0: with eps the output is the bias (finite), without NaN."""
    x = torch.full((1, d_model), 3.0)
    with_eps = LayerNorm(d_model)(x)
    without = LayerNorm(d_model, eps=0.0)(x)
    return bool(torch.isfinite(with_eps).all()), bool(torch.isnan(without).any())


def exercise_4_depth(depths=(3, 12, 48), d_model=64):
    """Final residual std after n blocks for plain and scaled init, for several depths.

    Plain init adds about the same variance per block, so its std keeps growing like √depth;
    the scaled init divides the per-block variance by 2·n_layers, so the total stays put.
    """
    return {
        n: (residual_stds(n, scaled=False, d_model=d_model, seq_len=32)[-1],
            residual_stds(n, scaled=True, d_model=d_model, seq_len=32)[-1])
        for n in depths
    }


if __name__ == "__main__":
    parts, counted, mlp_counted = exercise_1_block_parameters(128)
    for name, value in parts.items():
        print("exercise 1:", f"{name:<24} {value:>9,}")
    print("exercise 1:", f"{'counted in a Block':<24} {counted:>9,} (MLP alone {mlp_counted:,})")
    flops, crossover = exercise_2_flops_per_token()
    for name, value in flops.items():
        print("exercise 2:", f"{name:<24} {value:>9,} FLOPs per token (d=128, T=256)")
    print("exercise 2:", f"scores + mix cost as much as the MLP at T = 4·d = {crossover}")
    finite, nan = exercise_3_why_eps()
    print("exercise 3:", f"constant input: finite with eps {finite}, NaN without eps {nan}")
    for n, (plain, scaled) in exercise_4_depth().items():
        print("exercise 4:", f"{n:>2} blocks: final std plain {plain:.3f}, scaled {scaled:.3f}")
