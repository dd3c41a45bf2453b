"""Solutions to the exercises of step 06 (steps/06-multihead.md).

Run them:  uv run python -m solutions.ex06_multihead
"""

import torch

from tiny_llm.attention import CausalSelfAttention
from tiny_llm.device import seed_everything
from tiny_llm.multihead import MultiHeadAttention


def exercise_1_parameters(d_model):
    """qkv: d·3d weights + 3d biases; proj: d·d + d. Total 4·d² + 4·d, whatever n_heads is."""
    formula = 4 * d_model**2 + 4 * d_model
    counted = {
        n_heads: sum(p.numel() for p in MultiHeadAttention(d_model, n_heads, 8).parameters())
        for n_heads in (1, 2, 4)
    }
    return formula, counted


def exercise_2_one_head_is_step_05(d_model=32, T=10, seed=0):
    """Copy step 05's query, key, value and proj into a 1-head MultiHeadAttention; compare.

    The fused qkv weight is the three (d, d) weights stacked: rows 0..d-1 make q, d..2d-1 make
    k, 2d..3d-1 make v, exactly the order in which forward() splits them. Returns the largest
    difference between the two outputs.
    """
    seed_everything(seed)
    single = CausalSelfAttention(d_model, max_seq_len=T)
    multi = MultiHeadAttention(d_model, n_heads=1, max_seq_len=T)
    with torch.no_grad():
        parts = (single.query, single.key, single.value)
        multi.qkv.weight.copy_(torch.cat([p.weight for p in parts], dim=0))  # (3d, d)
        multi.qkv.bias.copy_(torch.cat([p.bias for p in parts]))  # (3d,)
        multi.proj.load_state_dict(single.proj.state_dict())
        x = torch.randn(2, T, d_model)
        return (multi(x) - single(x)).abs().max().item()


def exercise_3_head_size_one(T=12, seed=0):
    """n_heads = d_model: every head has head_size 1, so q and k are single numbers.

    The score q_t·k_s of a head is then a number times a number, and for a query with q_t > 0
    the largest k_s wins, for q_t < 0 the smallest: every query of a head ranks the keys the
    same way (or reversed). Returns the fraction of (head, query) rows whose favourite key is
    the largest or smallest k among the keys it may see: 1.0.
    """
    seed_everything(seed)
    d_model = 8
    attn = MultiHeadAttention(d_model, n_heads=d_model, max_seq_len=T)
    x = torch.randn(1, T, d_model)
    with torch.no_grad():
        q, k, _ = attn.qkv(x).split(d_model, dim=2)  # (1, T, C); head h is column h
        scores = q[0].T.unsqueeze(2) * k[0].T.unsqueeze(1)  # (heads, T, T): q_t · k_s
    hits = 0
    for h in range(d_model):
        for t in range(T):
            favourite = scores[h, t, : t + 1].argmax().item()  # keys 0..t only (causal)
            seen = k[0, : t + 1, h]
            hits += favourite in (seen.argmax().item(), seen.argmin().item())
    return hits / (d_model * T)


def exercise_4_score_memory(batch_size=16, n_heads=4, T=256, n_layers=4, bytes_per_float=4):
    """The explicit path stores a (B, heads, T, T) score matrix and its softmax per layer.

    Training keeps both for the backward pass. Returns MiB per layer, MiB for all layers, and
    how that grows when T doubles (4x: it is quadratic in T).
    """
    one = batch_size * n_heads * T * T * bytes_per_float * 2 / 2**20
    return {"MiB per layer": one, "MiB all layers": one * n_layers, "T doubled": 4 * one}


if __name__ == "__main__":
    formula, counted = exercise_1_parameters(64)
    print("exercise 1:", f"4·d² + 4·d = {formula:,}; counted by n_heads: {counted}")
    gap = exercise_2_one_head_is_step_05()
    print("exercise 2:", f"1 head vs step 05: max difference {gap:.1e}")
    print("exercise 3:", f"rows whose favourite key is the largest/smallest k: "
          f"{exercise_3_head_size_one():.2f}")
    for name, value in exercise_4_score_memory().items():
        print("exercise 4:", f"{name:<16} {value:.1f}")
