"""Step 04: from token ids to vectors.

A token id is only a name: 17 is not "more" than 16. The model needs a vector per token that it
can learn, and a vector per position, because attention (step 05) cannot tell order on its own.
`Embed` looks both up and adds them. `sinusoidal_table` is the fixed alternative to learned
positions; step 14 compares the two with RoPE and ALiBi.

Run the check:  uv run python -m tiny_llm.embed
"""

import argparse
import math

import torch
import torch.nn as nn

from tiny_llm.device import seed_everything
from tiny_llm.files import save_figure
from tiny_llm.paths import RUNS_DIR


class Embed(nn.Module):
    """Token embedding plus learned absolute position embedding, added.

    (B, T) int64 ids in, (B, T, d_model) float out:  out[b, t] = tok_emb[idx[b, t]] + pos_emb[t].
    With learned_positions=False there is no pos_emb (positions come in attention, step 14).
    """

    def __init__(self, vocab_size, d_model, max_seq_len, learned_positions=True):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model),
                            ("max_seq_len", max_seq_len)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
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
        try:
            x = self.tok_emb(idx)  # (B, T, C): row idx[b, t] of the table
        except IndexError:  # an id outside the table: only now look for it, to name it
            check_ids(idx, self.vocab_size, self.max_seq_len)
            raise
        if self.pos_emb is None:
            return x
        pos = torch.arange(start, start + T, device=idx.device)  # (T,) = start, ..., start + T - 1
        return x + self.pos_emb(pos)  # (B, T, C) + (T, C) broadcasts over B


def check_batch(idx):
    """Raise a clear error unless `idx` is a (B, T) tensor of integer ids; return T.

    Only the dtype and the shape are read: free, so every forward can afford it."""
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"token ids must be a torch.Tensor, got {type(idx).__name__}: "
                        "use torch.tensor(ids) or the batches from get_batch")
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise TypeError(f"token ids must be integers, got dtype {idx.dtype}: pass the ids "
                        "themselves (int64), e.g. idx.long() if they are whole numbers")
    if idx.dim() != 2:
        raise ValueError(f"expected a (B, T) batch of token ids, got shape {tuple(idx.shape)}: "
                         "for one sequence use idx.unsqueeze(0)")
    return idx.shape[1]


def check_ids(idx, vocab_size, max_seq_len):
    """check_batch, the length, and every id in [0, vocab_size): for ids from outside.

    Called where ids enter (a prompt, a data file) and when a lookup fails: min() and max()
    wait for the device, so they run once per input, not in every training step."""
    check_length(check_batch(idx), max_seq_len)
    if idx.numel() > 0:
        low, high = idx.min().item(), idx.max().item()
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size}): "
                             "use the tokenizer the model was built for (same vocab_size)")


def check_length(T, max_seq_len):
    """Raise a clear error if T positions do not fit a table of max_seq_len; free to call."""
    if T > max_seq_len:
        raise ValueError(f"sequence length T={T} exceeds max_seq_len={max_seq_len}: there is no "
                         f"position vector past {max_seq_len - 1}; keep the last {max_seq_len} "
                         f"tokens (idx[:, -{max_seq_len}:]) or build with a larger max_seq_len")


def sinusoidal_table(max_len, d_model):
    """The fixed positions of "Attention Is All You Need": (max_len, d_model) float32.

    Columns 2i and 2i+1 hold sin and cos of pos / 10000^(2i / d_model): one wavelength per
    pair, from 2π at i = 0 growing towards 10000·2π.
    >>> sinusoidal_table(2, 4)   # pos 1: sin(1), cos(1), sin(1/100), cos(1/100)
    tensor([[0.0000, 1.0000, 0.0000, 1.0000],
            [0.8415, 0.5403, 0.0100, 0.9999]])
    """
    if not isinstance(d_model, int) or d_model < 2 or d_model % 2:
        raise ValueError(f"d_model must be a positive even int (sin and cos come in pairs), "
                         f"got {d_model!r}")
    pos = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # (max_len, 1)
    # 1 / 10000^(2i/d) written as exp(-2i · ln(10000) / d), a habit (10000^(2i/d) <= 1e4 is safe)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # (d_model/2,) = 0, 2, 4, ...
    inv_freq = torch.exp(two_i * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * inv_freq)  # (max_len, 1) * (d/2,) -> (max_len, d/2)
    table[:, 1::2] = torch.cos(pos * inv_freq)
    return table


class SinusoidalPositions(nn.Module):
    """Fixed positions: adds row t of sinusoidal_table to x[:, t]. (B, T, C) in, (B, T, C) out.

    The table is a buffer, not a parameter: it moves with .to(device) but no optimizer changes it.
    """

    def __init__(self, max_seq_len, d_model):
        super().__init__()
        self.max_seq_len = max_seq_len
        # persistent=False: the table is recomputed from two numbers, no need to save it
        self.register_buffer("table", sinusoidal_table(max_seq_len, d_model), persistent=False)

    def forward(self, x):
        T = x.shape[1]
        if T > self.max_seq_len:
            raise ValueError(f"sequence length T={T} exceeds max_seq_len={self.max_seq_len}: "
                             "build SinusoidalPositions with a larger max_seq_len")
        return x + self.table[:T]


def worked_example():
    """The chapter's hand-sized example: vocab 10, context 5, 3 dims, weights set by hand."""
    emb = Embed(vocab_size=10, d_model=3, max_seq_len=5)
    with torch.no_grad():
        emb.tok_emb.weight.copy_(torch.arange(30.0).view(10, 3) / 10)  # [3v, 3v+1, 3v+2] / 10
        emb.pos_emb.weight.copy_(torch.arange(15.0).view(5, 3) / 100)  # [3t, 3t+1, 3t+2] / 100
        idx = torch.tensor([[3, 1, 4, 1, 5]])
        out = emb(idx)
    for t, v in enumerate(idx[0].tolist()):
        row = [emb.tok_emb.weight[v], emb.pos_emb.weight[t], out[0, t]]
        tok, pos, total = ("[" + ", ".join(f"{x:.2f}" for x in r) + "]" for r in row)
        print(f"t={t}  id={v}   tok {tok} + pos {pos} = {total}")


def plot_sinusoidal(path, max_len=256, d_model=128):
    """Draw sinusoidal_table as a heat map and a few of its columns as curves; save a PNG."""
    from matplotlib.figure import Figure  # imported here: only the check draws pictures

    table = sinusoidal_table(max_len, d_model).numpy()
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    heat, curves = fig.subplots(1, 2, width_ratios=(3, 2))
    image = heat.imshow(table.T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower")
    heat.set(xlabel="position t", ylabel="dimension",
             title=f"sinusoidal_table({max_len}, {d_model})")
    fig.colorbar(image, ax=heat)
    for col in [2 * round(d_model * f / 2) for f in (1 / 32, 1 / 8, 1 / 4, 3 / 8)]:
        wavelength = 2 * math.pi * 10000 ** (col / d_model)
        curves.plot(table[:128, col], label=f"dim {col} (wavelength {wavelength:.0f})")
    curves.set(xlabel="position t", ylabel="value", title="sin columns: slower as dim grows")
    curves.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2, fontsize=8)
    save_figure(fig, path, dpi=80)
    return path


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
    parser.add_argument("--out", default=str(RUNS_DIR / "embed" / "sinusoidal.png"),
                        help="where to write the picture of the sinusoidal table")
    parser.add_argument("--worked-example", action="store_true",
                        help="print only the chapter's hand-sized example")
    args = parser.parse_args()
    if args.worked_example:
        return worked_example()

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
    print(f"{'sinusoidal':<16} table (256, 128) drawn to {plot_sinusoidal(args.out)}")


if __name__ == "__main__":
    main()
