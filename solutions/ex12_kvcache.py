"""Solutions to the exercises of step 12 (steps/12-kvcache.md).

Run them:  uv run python -m solutions.ex12_kvcache
"""

import torch

from tiny_llm.gpt import GPT, PRESETS


def exercise_1_cache_bytes(n_layers, max_seq_len, d_model, bytes_per_number, batch_size=1):
    """Keys and values (2) for every layer, position and channel: 2·L·B·T·d numbers.

    GPT-2 small (12 layers, 1024 positions, d_model 768) in 16-bit floats: 37,748,736 bytes,
    36 MiB for one sequence; a server holding 100 conversations needs 3.6 GB just for caches.
    """
    return 2 * n_layers * batch_size * max_seq_len * d_model * bytes_per_number


def exercise_2_positions(prompt_len, new_tokens, max_seq_len):
    """Positions pushed through the model to write `new_tokens` after a prompt.

    Returns (uncached, cached). Uncached: the whole (cropped) context for every new token.
    Cached: the prompt once, then one position per token until the window is full, after
    which every token recomputes the last max_seq_len positions.
    """
    uncached = sum(min(prompt_len + i, max_seq_len) for i in range(new_tokens))
    length = min(prompt_len, max_seq_len)
    cached = length
    for _ in range(new_tokens - 1):  # the last new token is never fed back in
        if length < max_seq_len:
            length += 1
            cached += 1
        else:
            cached += max_seq_len
    return uncached, cached


@torch.no_grad()
def exercise_3_keys_move_with_the_window(seed=0):
    """Why the cache cannot just drop its oldest entry: the first layer's key of one token
    when it sits at position 5 and, after the window slid by one, at position 4.
    Returns the largest difference between the two keys: far from 0."""
    torch.manual_seed(seed)
    model = GPT(PRESETS["tiny"]).eval()
    block = model.blocks[0]
    ids = torch.randint(0, model.config.vocab_size, (1, 8))

    def keys(idx):  # (1, T, C) keys of block 0: qkv of ln_1 of the embedding
        return block.attn.qkv(block.ln_1(model.embed(idx))).split(model.config.d_model, 2)[1]

    return (keys(ids)[0, 5] - keys(ids[:, 1:])[0, 4]).abs().max().item()


if __name__ == "__main__":
    print("exercise 1:", f"small preset {exercise_1_cache_bytes(4, 256, 128, 4):,} bytes; "
          f"GPT-2 small in 16 bits {exercise_1_cache_bytes(12, 1024, 768, 2):,} bytes")
    slow, fast = exercise_2_positions(4, 200, 256)
    print("exercise 2:", f"4-token prompt, 200 new tokens: {slow:,} positions uncached, "
          f"{fast:,} cached ({slow / fast:.0f}x fewer)")
    print("exercise 3:", f"the same token's key at position 5 and 4 differs by up to "
          f"{exercise_3_keys_move_with_the_window():.3f}")
