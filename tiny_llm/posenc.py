"""Step 14 (the parts): four ways to tell a GPT where each token is, and pictures of them.

Attention on its own is order-blind (step 05). A model learns order only from a position
signal, and there are two places to put one:

- added to the residual stream before the first block: a learned table (step 04's `pos_emb`)
  or the fixed sinusoidal table of "Attention Is All You Need" (`sinusoidal_table`);
- inside attention, where positions meet: RoPE rotates each query and key by an angle that
  grows with its position, ALiBi subtracts a penalty that grows with the distance from the
  query to the key.

The GPT that takes any of them, and the experiment, are in `tiny_llm.posenc_lab`.

Run the check:      uv run python -m tiny_llm.posenc
Draw the pictures:  uv run python -m tiny_llm.posenc_lab --figures steps/images
"""

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from tiny_llm.files import save_figure


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


class LearnedPositionalEncoding(nn.Module):
    """Adds a trained vector per position: (B, T, D) in, (B, T, D) out, T <= max_len."""

    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.pos_emb = nn.Embedding(max_len, d_model)  # row t: the vector of position t
        nn.init.normal_(self.pos_emb.weight, mean=0.0, std=0.02)

    def forward(self, x):
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length T={T} exceeds max_len={self.max_len}: a learned "
                             f"table has no vector for positions {self.max_len} to {T - 1}, "
                             "because no training example ever reached them; use a scheme that "
                             "is a formula of the position (sinusoidal, rope, alibi) or "
                             f"train with max_len >= {T}")
        return x + self.pos_emb.weight[:T]  # (B, T, D) + (T, D) broadcasts over B


class SinusoidalPositionalEncoding(nn.Module):
    """Adds scale · row t of sinusoidal_table: (B, T, D) in, (B, T, D) out, T <= max_len.

    The table is a formula of t, so it lives in a buffer: not trained, not saved with the
    weights, and rebuilt for any max_len.
    """

    def __init__(self, max_len, d_model, scale=1.0):
        super().__init__()
        self.max_len = max_len
        table = scale * sinusoidal_table(max_len, d_model)
        self.register_buffer("table", table, persistent=False)

    def forward(self, x):
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length T={T} exceeds max_len={self.max_len}: build the "
                             f"table longer (SinusoidalPositionalEncoding({T}, d_model)); "
                             "it is a fixed function, so nothing needs retraining")
        return x + self.table[:T]


class RotaryEmbedding(nn.Module):
    """RoPE: turn dimension pair i of a query or key at position t by the angle t·θ_i.

    (B, n_heads, T, head_size) in, same out. θ_i = 10000^(-2i/head_size), the frequencies of
    sinusoidal_table(max_len, head_size), whose sin and cos columns we reuse as the rotations.
    Rotating q by angle a and k by angle b changes q·k exactly as rotating q alone by a - b,
    so the score of a query and a key depends on their offset, not on where they stand.
    """

    def __init__(self, head_size, max_len):
        super().__init__()
        self.max_len = max_len
        table = sinusoidal_table(max_len, head_size)  # columns sin(tθ_0), cos(tθ_0), sin(tθ_1), ...
        self.register_buffer("sin", table[:, 0::2], persistent=False)  # (max_len, head_size/2)
        self.register_buffer("cos", table[:, 1::2], persistent=False)

    def forward(self, x, start=0):
        """`start`: the position of x's first row (a KV cache's length when decoding)."""
        T = x.shape[-2]
        if start + T > self.max_len:
            raise ValueError(f"sequence length T={start + T} exceeds max_len={self.max_len}: "
                             f"build RotaryEmbedding(head_size, {start + T}); the angles are a "
                             "formula of t")
        sin, cos = self.sin[start : start + T], self.cos[start : start + T]  # (T, head_size/2)
        sin, cos = sin.to(x.dtype), cos.to(x.dtype)  # bfloat16 q, k under autocast stay so
        x_even, x_odd = x[..., 0::2], x[..., 1::2]  # the two coordinates of every pair
        turned = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
        return turned.flatten(-2)  # (..., T, head_size/2, 2) -> (..., T, head_size), pairs in place


def alibi_slopes(n_heads):
    """ALiBi's slope per head: 2^(-8·1/n), 2^(-8·2/n), ..., 2^(-8) for a power-of-two n = n_heads.

    >>> alibi_slopes(4)          # 2^-2, 2^-4, 2^-6, 2^-8
    tensor([0.2500, 0.0625, 0.0156, 0.0039])
    Any other n: the n0 slopes of the power of two n0 below n, then the first n - n0 of every
    other slope of 2·n0 (the ALiBi authors' rule), so the heads still span steep to flat.
    """
    if not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive int, got {n_heads!r}")

    def geometric(n):
        return [2 ** (-8 * i / n) for i in range(1, n + 1)]

    below = 2 ** math.floor(math.log2(n_heads))
    extra = geometric(2 * below)[0::2][: n_heads - below]  # empty when n_heads is a power of two
    return torch.tensor(geometric(below) + extra)


def alibi_bias(n_heads, T):
    """(n_heads, T, T) float: -slope_h · (i - j) for key j <= query i, and -inf for j > i.

    >>> alibi_bias(1, 3)         # slope 2^-8 = 0.0039
    tensor([[[ 0.0000,    -inf,    -inf],
             [-0.0039,  0.0000,    -inf],
             [-0.0078, -0.0039,  0.0000]]])
    """
    pos = torch.arange(T)
    offset = pos.view(1, T) - pos.view(T, 1)  # (T, T): key j minus query i, <= 0 where j <= i
    bias = alibi_slopes(n_heads).view(-1, 1, 1) * offset  # (n_heads, T, T)
    return bias.masked_fill(offset > 0, float("-inf"))  # the causal mask, folded in


# ---------------------------------------------------------------------------------------------
# Pictures (matplotlib is imported inside each: only drawing needs it)


def plot_signals(path, T=128, d_model=64, n_heads=4):
    """Each scheme's position signal as a heat map over positions t."""
    from matplotlib.figure import Figure  # imported here: only the pictures need it

    torch.manual_seed(0)
    learned = LearnedPositionalEncoding(T, d_model).pos_emb.weight.detach()  # (T, D)
    panels = [("learned, before training", learned.T, "dimension", "RdBu"),
              ("sinusoidal", sinusoidal_table(T, d_model).T, "dimension", "RdBu"),
              ("RoPE: cos(t·θ_i) per pair", RotaryEmbedding(d_model // n_heads, T).cos.T,
               "pair i of a head", "RdBu"),
              ("ALiBi: bias of key t, query T-1", alibi_bias(n_heads, T)[:, -1, :], "head",
               "viridis")]
    fig = Figure(figsize=(14, 3.2), layout="constrained")
    for ax, (title, image, ylabel, cmap) in zip(fig.subplots(1, 4), panels, strict=True):
        limit = image.abs().max().item() if cmap == "RdBu" else None
        shown = ax.imshow(image.numpy(), aspect="auto", origin="lower", cmap=cmap,
                          interpolation="nearest", vmin=-limit if limit else None, vmax=limit)
        ax.set(title=title, xlabel="position t", ylabel=ylabel)
        ax.yaxis.get_major_locator().set_params(integer=True)
        fig.colorbar(shown, ax=ax)
    return save_figure(fig, path)


def plot_similarity(path, T=128, d_model=64, n_heads=4):
    """How alike positions p and q are, as a matrix and as a function of the distance."""
    from matplotlib.figure import Figure

    def cosine(rows):  # (T, D) -> (T, T) cosine similarity of every pair of rows
        rows = rows / rows.norm(dim=1, keepdim=True)
        return rows @ rows.T

    torch.manual_seed(0)
    sinus = cosine(sinusoidal_table(T, d_model))
    learned = cosine(LearnedPositionalEncoding(T, d_model).pos_emb.weight.detach())
    head_size = d_model // n_heads
    ones = torch.ones(1, 1, T, head_size)  # the same vector at every position, then rotated
    rope = cosine(RotaryEmbedding(head_size, T)(ones)[0, 0])
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    matrix, curves = fig.subplots(1, 2, width_ratios=(2, 3))
    shown = matrix.imshow(sinus.numpy(), cmap="RdBu", vmin=-1, vmax=1, origin="lower")
    matrix.set(title="sinusoidal: cos(p, q)", xlabel="position q", ylabel="position p")
    fig.colorbar(shown, ax=matrix)
    k = np.arange(T)
    curves.plot(k, sinus[0].numpy(), label=f"sinusoidal (d_model {d_model})")
    curves.plot(k, rope[0].numpy(), label=f"RoPE, q = k = ones (head size {head_size})")
    curves.plot(k, learned[0].numpy(), label="learned, before training", alpha=0.7)
    for h, slope in enumerate(alibi_slopes(n_heads).tolist()):
        curves.plot(k, np.exp(-slope * k), "--", label=f"ALiBi head {h}: exp(-k/{1 / slope:g})")
    curves.set(title="similarity of positions p and p + k", xlabel="distance k",
               ylabel="cosine, or ALiBi's weight factor")
    curves.legend(fontsize=8, loc="center left", bbox_to_anchor=(1, 0.5))
    return save_figure(fig, path)


def plot_alibi(path, T=12, n_heads=4):
    """ALiBi's bias matrix for each head: 0 on the diagonal, falling linearly with distance."""
    from matplotlib.figure import Figure

    bias = alibi_bias(n_heads, T)
    fig = Figure(figsize=(3.2 * n_heads, 3.3), layout="constrained")
    for h, ax in enumerate(fig.subplots(1, n_heads)):
        shown = bias[h].masked_fill(bias[h].isinf(), float("nan"))  # NaN: drawn blank
        image = ax.imshow(shown.numpy(), cmap="viridis")
        slope = alibi_slopes(n_heads)[h].item()
        ax.set(title=f"head {h}: slope 1/{1 / slope:g}", xlabel="key j", ylabel="query i")
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle("ALiBi bias -slope·(i - j) added to the scores (blank: masked, j > i)")
    return save_figure(fig, path)


def plot_rope(path, head_size=16, T=8):
    """RoPE turns each pair of a query or key; q·k then depends only on the offset."""
    from matplotlib.figure import Figure

    rope = RotaryEmbedding(head_size, 128)
    fig = Figure(figsize=(12, 4), layout="constrained")
    axes = fig.subplots(1, 3)
    vector = torch.tensor([1.0, 0.4]).repeat(head_size // 2)  # every pair starts at (1, 0.4)
    turned = rope(vector.expand(1, 1, T, head_size))[0, 0]  # (T, head_size)
    for ax, pair in zip(axes[:2], (0, 2), strict=True):
        theta = 10000 ** (-2 * pair / head_size)
        for t in range(T):
            x, y = turned[t, 2 * pair].item(), turned[t, 2 * pair + 1].item()
            ax.annotate("", (x, y), (0, 0), arrowprops={"arrowstyle": "->", "color": f"C{t}"})
            ax.text(1.12 * x, 1.12 * y, f"t={t}", ha="center", va="center", fontsize=8)
        ax.set(xlim=(-1.4, 1.4), ylim=(-1.4, 1.4), aspect="equal",
               xlabel=f"dimension {2 * pair}", ylabel=f"dimension {2 * pair + 1}",
               title=f"pair {pair}: θ = {theta:.3g} rad per step")
    torch.manual_seed(0)
    q, k = torch.randn(2, head_size)
    q_at = rope(q.expand(1, 1, 128, head_size))[0, 0]  # the same query at every position
    k_at = rope(k.expand(1, 1, 128, head_size))[0, 0]
    offsets = torch.arange(0, 40)
    for p, width in ((40, 6), (80, 3.5), (120, 1.2)):  # thinner on top, so all three show
        axes[2].plot(offsets.numpy(), (q_at[p] * k_at[p - offsets]).sum(-1).numpy(), lw=width,
                     label=f"query at {p}, key at {p} - offset")
    axes[2].set(title="q·k after RoPE: the curves coincide", xlabel="offset", ylabel="q·k")
    axes[2].legend(fontsize=8)
    return save_figure(fig, path)


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


def draw_figures(folder):
    """Draw the chapter's five pictures into `folder`; return their paths."""
    folder = Path(folder)
    return [plot_sinusoidal(folder / "14-sinusoidal.png"),
            plot_signals(folder / "14-position-signals.png"),
            plot_similarity(folder / "14-similarity.png"),
            plot_alibi(folder / "14-alibi-bias.png"),
            plot_rope(folder / "14-rope-rotation.png")]


def main():
    torch.manual_seed(1337)
    T, d_model, head_size = 64, 64, 16
    table = SinusoidalPositionalEncoding(T, d_model)(torch.zeros(1, T, d_model))[0]
    t, i = torch.arange(T).view(T, 1), torch.arange(d_model // 2)
    angle = t / torch.pow(10000.0, 2 * i / d_model)  # the paper's form, without the log/exp
    closed_form = torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(1)
    error = (table - closed_form).abs().max().item()
    print(f"{'sinusoidal':<12} equals sin, cos of t / 10000^(2i/d) within 1e-5: {error < 1e-5}")
    rope = RotaryEmbedding(head_size, T)
    q, k = torch.randn(2, 1, 1, 1, head_size).expand(2, 1, 1, T, head_size)
    q_at, k_at = rope(q)[0, 0], rope(k)[0, 0]  # one q and one k, placed at every position
    change = (q_at.norm(dim=-1) - q[0].norm(dim=-1)).abs().max().item()
    print(f"{'rope':<12} |q| is the same at every position within 1e-5: {change < 1e-5}")
    scores = " ".join(f"{(q_at[p + 5] @ k_at[p]).item():+.4f}" for p in (0, 20, 40, 58))
    print(f"{'rope':<12} q·k at offset 5, p = 0, 20, 40, 58: {scores}")
    for n in (4, 6, 8):
        slopes = " ".join(f"1/{1 / s:g}" for s in alibi_slopes(n).tolist())
        print(f"{'alibi':<12} {n} heads: slopes {slopes}")
    try:
        LearnedPositionalEncoding(T, d_model)(torch.zeros(1, T + 1, d_model))
    except ValueError as error:
        print(f"{'learned':<12} T={T + 1}: ValueError: {str(error).split(':')[0]}")


if __name__ == "__main__":
    main()
