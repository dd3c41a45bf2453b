"""Solutions to the exercises of step 05 (steps/05-attention.md).

Run them:  uv run python -m solutions.ex05_attention
"""

import torch

from tiny_llm.attention import CausalSelfAttention


def exercise_1_shapes_and_parameters(d_model=64, batch=2, seq_len=12):
    """Four d_model x d_model Linear layers with biases; the scores are (B, T, T).

    Returns (parameters, shape of the scores, floats in the scores of one 1024-token sequence).
    """
    attn = CausalSelfAttention(d_model, max_seq_len=1024)
    n_params = sum(p.numel() for p in attn.parameters())
    assert n_params == 4 * (d_model * d_model + d_model)
    with torch.no_grad():
        _, weights = attn(torch.randn(batch, seq_len, d_model), return_weights=True)
    return n_params, tuple(weights.shape), 1024 * 1024


def exercise_2_order_blindness(seed=0):
    """Seen from the final ".", are "the dog bit the man ." and "the man bit the dog ." alike?

    The tokens are stand-in vectors (one per word); the final position sees the same set of
    words in both sentences, so without positions its output is the same: attention alone reads
    a bag of words. Adding a vector per position (random here, as pos_emb starts) tells the
    two apart.
    Returns (largest output difference without positions, with positions).
    """
    torch.manual_seed(seed)
    words = {w: torch.randn(32) for w in ("the", "dog", "bit", "man", ".")}
    a = torch.stack([words[w] for w in "the dog bit the man .".split()]).unsqueeze(0)  # (1, 6, 32)
    b = torch.stack([words[w] for w in "the man bit the dog .".split()]).unsqueeze(0)
    attn = CausalSelfAttention(32, max_seq_len=16)
    pos = torch.randn(6, 32)  # one vector per position, at the words' scale
    with torch.no_grad():
        without = (attn(a)[0, -1] - attn(b)[0, -1]).abs().max()
        with_pos = (attn(a + pos)[0, -1] - attn(b + pos)[0, -1]).abs().max()
    return without.item(), with_pos.item()


def exercise_3_too_long(max_seq_len=64):
    """The mask is a (max_seq_len, max_seq_len) buffer, so a longer input is refused.

    A model generating text keeps only the last max_seq_len tokens as its context.
    """
    attn = CausalSelfAttention(16, max_seq_len)
    try:
        attn(torch.randn(1, max_seq_len + 1, 16))
    except ValueError as error:
        return str(error)


def exercise_4_why_scale_by_sqrt_c(sizes=(16, 64, 256), seed=0):
    """The std of q·k for unit-variance q and k grows as sqrt(C); dividing by sqrt(C) undoes it.

    Returns {C: (std of q·k, std of q·k / sqrt(C))} over 10,000 random pairs.
    """
    torch.manual_seed(seed)
    result = {}
    for C in sizes:
        q, k = torch.randn(10_000, C), torch.randn(10_000, C)
        dots = (q * k).sum(dim=-1)
        result[C] = (dots.std().item(), (dots / C**0.5).std().item())
    return result


def exercise_5_the_mask_stops_leaks(seed=0):
    """Change the last token: with the mask, position 0's output stays; without it, it moves.

    Returns the largest change of the output at position 0, (causal, causal=False).
    """
    torch.manual_seed(seed)
    attn = CausalSelfAttention(16, max_seq_len=8)
    x = torch.randn(1, 8, 16)
    changed = x.clone()
    changed[0, -1] = torch.randn(16)
    with torch.no_grad():
        masked = (attn(changed)[0, 0] - attn(x)[0, 0]).abs().max().item()
        unmasked = (attn(changed, causal=False)[0, 0] - attn(x, causal=False)[0, 0]).abs().max()
    return masked, unmasked.item()


if __name__ == "__main__":
    n_params, shape, floats = exercise_1_shapes_and_parameters()
    print("exercise 1:", f"{n_params:,} parameters; weights {shape};",
          f"one 1024-token sequence has {floats:,} scores per head")
    without, with_pos = exercise_2_order_blindness()
    print("exercise 2:", f"dog/man swapped, output at '.' changes by {without:.6f} without"
          f" positions, {with_pos:.6f} with")
    print("exercise 3:", exercise_3_too_long())
    for C, (raw, scaled) in exercise_4_why_scale_by_sqrt_c().items():
        print("exercise 4:", f"C = {C:<4} std of q·k {raw:6.2f}, divided by sqrt(C) {scaled:.2f}")
    masked, unmasked = exercise_5_the_mask_stops_leaks()
    print("exercise 5:", f"last token changed: output at t = 0 moves {masked:.6f} with the mask,"
          f" {unmasked:.6f} without")
