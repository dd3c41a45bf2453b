"""Smoke test: real tokens through the first steps of the model, printing each shape.

prepared data -> get_batch (step 03) -> Embed (step 04) -> CausalSelfAttention (step 05).
If no data is prepared yet it prepares it first (TinyStories when reachable, else the offline
sample corpus), so the first run takes longer.

Run it:  uv run python scripts/smoke_test.py
"""

import torch

from tiny_llm.attention import CausalSelfAttention
from tiny_llm.data import DATA_DIR, ensure_data, get_batch, load_token_array
from tiny_llm.device import seed_everything
from tiny_llm.embed import Embed
from tiny_llm.tokenize import VOCAB_SIZE


def main():
    meta = ensure_data(DATA_DIR)
    data = load_token_array(DATA_DIR / "valid.bin")
    print(f"{'valid.bin':<10} {len(data):,} tokens ({meta['source']})")

    seed_everything(0)
    x, y = get_batch(data, batch_size=2, seq_len=12)
    print(f"{'get_batch':<10} x {tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}")

    # The course's vocabulary is 4096 (the sample corpus's tokenizer uses only its first 1,300).
    embed = Embed(VOCAB_SIZE, d_model=64, max_seq_len=64)
    attn = CausalSelfAttention(d_model=64, max_seq_len=64)
    with torch.no_grad():
        h = embed(x)
        print(f"{'Embed':<10} {tuple(h.shape)} {str(h.dtype).removeprefix('torch.')}")
        out = attn(h)
        print(f"{'attention':<10} {tuple(out.shape)} {str(out.dtype).removeprefix('torch.')}")
    assert x.shape == y.shape == (2, 12) and out.shape == (2, 12, 64)
    print("smoke test OK")


if __name__ == "__main__":
    main()
