"""Solutions to the exercises of step 04 (steps/04-embed.md).

Run them:  uv run python -m solutions.ex04_embed
"""

import torch
import torch.nn.functional as F

from tiny_llm.embed import Embed


def exercise_1_parameter_count(vocab_size, d_model, max_seq_len):
    """One row of d_model numbers per token and one per position: (V + T_max) · C."""
    return vocab_size * d_model + max_seq_len * d_model


def exercise_2_untrained_cosines(seed=0, token=42, others=(7, 1000, 4095)):
    """Cosine of token 42 with itself and with three other tokens, before any training.

    Random vectors in 128 dimensions are nearly orthogonal: the cosines are small numbers of
    either sign (spread about 1/sqrt(128) = 0.09) that say nothing about the tokens yet.
    """
    torch.manual_seed(seed)
    emb = Embed(4096, 128, 64)
    table = emb.tok_emb.weight.detach()
    same = F.cosine_similarity(table[token], table[token], dim=0).item()
    cosines = [F.cosine_similarity(table[token], table[v], dim=0).item() for v in others]
    return same, cosines


def exercise_3_one_hot_is_a_lookup(seed=0):
    """one_hot(ids) @ W picks rows of W: the same numbers as W[ids], at V·C multiply-adds a token.

    Returns the largest difference between the two ways, and the multiply-adds per token that
    the row lookup saves (for V = 4096, C = 128).
    """
    torch.manual_seed(seed)
    emb = Embed(4096, 128, 64)
    ids = torch.randint(0, 4096, (2, 16))
    with torch.no_grad():
        by_matmul = F.one_hot(ids, 4096).float() @ emb.tok_emb.weight  # (2, 16, 4096) @ (4096, 128)
        by_lookup = emb.tok_emb(ids)  # (2, 16, 128)
    return (by_matmul - by_lookup).abs().max().item(), 4096 * 128


def exercise_4_add_versus_concatenate(d_model=128, seed=0):
    """Adding keeps the width C; concatenating makes it 2C for every layer after it.

    Adding is also a special case of concatenating: [tok, pos] @ [[I], [I]] = tok + pos, so a
    model fed the concatenation could learn to add, but pays for twice the width everywhere.
    Returns (width after adding, width after concatenating, largest difference of the identity).
    """
    torch.manual_seed(seed)
    tok, pos = torch.randn(5, d_model), torch.randn(5, d_model)
    added = tok + pos
    concatenated = torch.cat([tok, pos], dim=-1)  # (5, 2C)
    stacked_identities = torch.cat([torch.eye(d_model), torch.eye(d_model)], dim=0)  # (2C, C)
    error = (concatenated @ stacked_identities - added).abs().max().item()
    return added.shape[-1], concatenated.shape[-1], error


def exercise_5_too_long(max_seq_len=64):
    """A learned table has rows 0..max_seq_len-1 only, so T = max_seq_len + 1 must be refused.

    The fix the message names, keeping the last max_seq_len tokens, is what step 09 does.
    Returns the error message and the output's shape once the input is cropped.
    """
    emb = Embed(4096, 128, max_seq_len)
    idx = torch.zeros(1, max_seq_len + 1, dtype=torch.long)
    try:
        emb(idx)
    except ValueError as error:
        message = str(error)
    return message, tuple(emb(idx[:, -max_seq_len:]).shape)


if __name__ == "__main__":
    print("exercise 1:", f"{exercise_1_parameter_count(4096, 128, 64):,} parameters;",
          f"GPT-2 small (50257, 768, 1024): {exercise_1_parameter_count(50257, 768, 1024):,}")
    same, cosines = exercise_2_untrained_cosines()
    print("exercise 2:", f"cos(42, 42) = {same:.3f};",
          "cos(42, v) for v = 7, 1000, 4095:", " ".join(f"{c:+.3f}" for c in cosines))
    error, saved = exercise_3_one_hot_is_a_lookup()
    print("exercise 3:", f"max |one-hot @ W - W[ids]| = {error}; the lookup skips {saved:,}"
          " multiply-adds per token")
    added, concatenated, error = exercise_4_add_versus_concatenate()
    print("exercise 4:", f"width {added} when added, {concatenated} when concatenated;"
          f" [tok, pos] @ [I; I] - (tok + pos) = {error}")
    message, shape = exercise_5_too_long()
    print("exercise 5:", message)
    print("exercise 5:", f"cropped to the last 64 tokens, the output has shape {shape}")
