"""Step 04: from token ids to vectors.

A token id is only a name: 17 is not "more" than 16. The model needs a vector per token that it
can learn, and a vector per position, because attention (step 05) cannot tell order on its own.
`Embed` looks both up and adds them; the input checks it calls are given, in `tiny_llm.checks`.
Step 14 compares learned positions with the fixed sinusoidal table, RoPE and ALiBi.

Run the check:  uv run python -m tiny_llm.embed
"""

import argparse
import math

import torch
import torch.nn as nn

from tiny_llm.checks import check_batch, check_length, check_sizes, check_vocab
from tiny_llm.device import seed_everything


class Embed(nn.Module):
    """Token embedding plus learned absolute position embedding, added.

    (B, T) int64 ids in, (B, T, d_model) float out:  out[b, t] = tok_emb[idx[b, t]] + pos_emb[t].
    With learned_positions=False there is no pos_emb (positions come in attention, step 14).
    """

    def __init__(self, vocab_size, d_model, max_seq_len, learned_positions=True):
        check_sizes(vocab_size=vocab_size, d_model=d_model, max_seq_len=max_seq_len)  # given
        super().__init__()
        self.vocab_size, self.d_model, self.max_seq_len = vocab_size, d_model, max_seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)  # row i: the vector of token i
        self.pos_emb = nn.Embedding(max_seq_len, d_model) if learned_positions else None
        # PyTorch starts embeddings at N(0, 1); we use N(0, 0.02²) (nanoGPT's and Hugging Face's
        # GPT-2 init) so every input starts small and alike, and training decides what differs.
        for table in (self.tok_emb, self.pos_emb):
            if table is not None:
                nn.init.normal_(table.weight, mean=0.0, std=0.02)

    def forward(self, idx, start=0):
        """(B, T) int ids -> (B, T, d_model). `start` is the position of idx[:, 0]: 0, except
        when a KV cache (step 12) already holds the positions before it."""
        T = check_batch(idx)  # dtype and rank: read off the tensor, no wait for the device
        check_length(start + T, self.max_seq_len)
        check_vocab(idx, self.vocab_size)  # every id in the table: read on a CPU only
        x = self.tok_emb(idx)  # (B, T, C): row idx[b, t] of the table
        if self.pos_emb is None:
            return x
        pos = torch.arange(start, start + T, device=idx.device)  # (T,) = start, ..., start + T - 1
        return x + self.pos_emb(pos)  # (B, T, C) + (T, C) broadcasts over B


def hand_sized():
    """(Embed, idx) of the chapter's example: vocab 10, context 5, 3 dims, weights set by hand."""
    emb = Embed(vocab_size=10, d_model=3, max_seq_len=5)
    with torch.no_grad():
        emb.tok_emb.weight.copy_(torch.arange(30.0).view(10, 3) / 10)  # [3v, 3v+1, 3v+2] / 10
        emb.pos_emb.weight.copy_(torch.arange(15.0).view(5, 3) / 100)  # [3t, 3t+1, 3t+2] / 100
    return emb, torch.tensor([[3, 1, 4, 1, 5]])


def worked_example():
    """Print the hand-sized example, row by row: tok + pos = out."""
    emb, idx = hand_sized()
    with torch.no_grad():
        out = emb(idx)
    for t, v in enumerate(idx[0].tolist()):
        row = [emb.tok_emb.weight[v], emb.pos_emb.weight[t], out[0, t]]
        tok, pos, total = ("[" + ", ".join(f"{x:.2f}" for x in r) + "]" for r in row)
        print(f"t={t}  id={v}   tok {tok} + pos {pos} = {total}")


def draw_tables(path):
    """Draw the hand-sized example's two lookups and their sum; save a PNG."""
    from tiny_llm.course.diagrams import embed_diagram
    from tiny_llm.files import save_figure

    emb, idx = hand_sized()
    tok, pos = emb.tok_emb.weight.detach().numpy(), emb.pos_emb.weight.detach().numpy()
    return save_figure(embed_diagram(tok, pos, idx[0].numpy()), path, dpi=90)


def show_dependence(emb):
    """Print that one token moves with its position, and that different tokens differ."""
    same = emb(torch.full((1, 4), 42))[0]  # token 42 at positions 0, 1, 2, 3
    for t in range(4):
        first = " ".join(f"{v:+.4f}" for v in same[t, :4])
        print(f"{f'token 42, t={t}':<16} {first} ...")
    gaps = " ".join(f"{(same[t] - same[0]).norm():.3f}" for t in (1, 2, 3))
    print(f"{'same token':<16} |x(t) - x(0)| for t = 1, 2, 3: {gaps}")
    other = emb(torch.tensor([[42], [7], [1000], [4095]]))[:, 0]  # four tokens at position 0
    gaps = " ".join(f"{(other[i] - other[0]).norm():.3f}" for i in (1, 2, 3))
    print(f"{'other tokens':<16} |x(v) - x(42)| at t=0 for v = 7, 1000, 4095: {gaps}")


def main():
    parser = argparse.ArgumentParser(description="Step 04: token and position embeddings.")
    parser.add_argument("--worked-example", action="store_true",
                        help="print only the chapter's hand-sized example")
    parser.add_argument("--diagram", metavar="PNG", help="draw the two lookups there and stop")
    args = parser.parse_args()
    if args.worked_example:
        return worked_example()
    if args.diagram:
        print(f"{'diagram':<16} {draw_tables(args.diagram)}")
        return

    seed_everything(1337)
    emb = Embed(vocab_size=4096, d_model=128, max_seq_len=64)
    idx = torch.randint(0, 4096, (4, 64))
    with torch.no_grad():
        x = emb(idx)
        n_params = sum(p.numel() for p in emb.parameters())
        print(f"{'params':<16} {n_params:,} = tok_emb 4096 x 128 + pos_emb 64 x 128")
        print(f"{'input':<16} {tuple(idx.shape)} {str(idx.dtype).removeprefix('torch.')}")
        print(f"{'output':<16} {tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}")
        print(f"{'mean':<16} {x.mean():.4f}")
        print(f"{'std':<16} {x.std():.4f}   two N(0, 0.02²) added: "
              f"sqrt(0.02² + 0.02²) = {math.sqrt(2) * 0.02:.4f}")
        one_hot = nn.functional.one_hot(idx, 4096).float()  # (B, T, V)
        error = (one_hot @ emb.tok_emb.weight - emb.tok_emb(idx)).abs().max()
        print(f"{'one-hot @ W':<16} equals the row lookup tok_emb(idx): max error {error:.1e}")
        show_dependence(emb)
        try:
            emb(torch.zeros(1, 65, dtype=torch.long))
        except ValueError as error:
            print(f"{'T=65':<16} ValueError: {error}")


if __name__ == "__main__":
    main()
