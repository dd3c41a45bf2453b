"""Solutions to the exercises of step 14 (steps/14-positional-encoding-lab.md).

Run them:  uv run python -m solutions.ex14_posenc_lab [--plot PATH]
(exercise 6 trains two small lab models on the prepared data, the sample corpus if none: seconds)
"""

import argparse
import math
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tiny_llm.data import DATA_DIR, ensure_data, load_token_array  # noqa: E402
from tiny_llm.posenc import (  # noqa: E402
    LearnedPositionalEncoding,
    RotaryEmbedding,
    alibi_slopes,
    sinusoidal_table,
)
from tiny_llm.posenc_lab import (  # noqa: E402
    QUICK,
    LabConfig,
    LabGPT,
    rebuilt_longer,
    train_scheme,
)


def exercise_1_slowest_wavelength(d_model=64):
    """The last sin/cos pair, i = d/2 - 1, turns by θ = 10000^(-(d-2)/d) per position, so it
    repeats every 2π / θ = 2π · 10000^((d-2)/d) positions: 47,117 for d_model = 64. Returns
    (that formula, the same read back from the table: θ = asin of its sin column at t = 1).
    """
    formula = 2 * math.pi * 10000 ** ((d_model - 2) / d_model)
    theta = math.asin(sinusoidal_table(2, d_model)[1, d_model - 2].item())
    return formula, 2 * math.pi / theta


def exercise_2_rope_depends_on_offset(head_size=16, offset=5, seed=0):
    """Rotations compose: R(a)ᵀ R(b) = R(b - a), so (R(p) q)·(R(p') k) = q·R(p' - p) k.

    Returns the scores of one q and one k placed `offset` apart at several positions p: all
    equal up to float rounding, whatever p is.
    """
    torch.manual_seed(seed)
    q, k = torch.randn(2, head_size)
    rope = RotaryEmbedding(head_size, 256)
    q_at = rope(q.expand(1, 1, 256, head_size))[0, 0]  # (256, head_size): q at every position
    k_at = rope(k.expand(1, 1, 256, head_size))[0, 0]
    return [(q_at[p + offset] @ k_at[p]).item() for p in (0, 10, 100, 250 - offset)]


def exercise_3_alibi_slopes_for_6_heads():
    """6 is not a power of two. The power of two below is 4: slopes 2^-2, 2^-4, 2^-6, 2^-8.
    The two missing heads take every other slope of 8 heads (2^-1, 2^-3, 2^-5, 2^-7), the first
    two of them: 2^-1 and 2^-3. So 1/4, 1/16, 1/64, 1/256, 1/2, 1/8.
    """
    return alibi_slopes(6).tolist()


def exercise_4_untrained_rows(max_len=16, trained_len=8, steps=20, seed=0):
    """A learned row gets a gradient only when its position occurs in a batch. Train a table
    on sequences of `trained_len` and count the rows that moved: rows past the trained length
    are still their random start, so a longer input would read noise (hence the error instead).
    Returns (rows that changed, rows that did not).
    """
    torch.manual_seed(seed)
    pos = LearnedPositionalEncoding(max_len, 4)
    before = pos.pos_emb.weight.detach().clone()
    optimizer = torch.optim.SGD(pos.parameters(), lr=0.1)
    for _ in range(steps):
        x = torch.randn(2, trained_len, 4)
        loss = pos(x).pow(2).mean()  # any loss will do: what matters is which rows it reaches
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    moved = (pos.pos_emb.weight.detach() != before).any(dim=1)
    return int(moved.sum()), int((~moved).sum())


def exercise_4_adamw_rows(max_len=16, trained_len=8, steps=20, seed=0):
    """The same with step 10's AdamW (lr 0.1, weight decay 0.1): weight decay shrinks every row,
    gradient or not, by (1 - lr · wd) a step, so all rows change, but the untrained ones only
    shrink: 0.99^20 = 0.818 of their start. Returns (rows that changed, the untrained rows'
    size relative to their start)."""
    torch.manual_seed(seed)
    pos = LearnedPositionalEncoding(max_len, 4)
    before = pos.pos_emb.weight.detach().clone()
    optimizer = torch.optim.AdamW(pos.parameters(), lr=0.1, weight_decay=0.1)
    for _ in range(steps):
        loss = pos(torch.randn(2, trained_len, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = pos.pos_emb.weight.detach()
    moved = (after != before).any(dim=1)
    shrink = (after[trained_len:] / before[trained_len:]).mean().item()  # the same for every entry
    return int(moved.sum()), shrink


def exercise_5_position_from_the_causal_mask(T=6):
    """With no positions at all, a causal model can still count. If every score is equal,
    position t averages its t + 1 visible values; a marker value 1 at position 0 (the others 0)
    comes out as 1 / (t + 1): a position signal made by the mask alone.
    """
    values = torch.zeros(T)
    values[0] = 1.0
    weights = torch.tril(torch.ones(T, T))
    weights = weights / weights.sum(dim=1, keepdim=True)  # the softmax of equal scores
    return (weights @ values).tolist()


@torch.no_grad()
def exercise_6_loss_by_position(model, data, T, n_tokens):
    """The lab's score, kept apart by position in the window: (T,) mean loss at t = 0..T-1.

    Its mean is evaluate_loss(model, data[: n_tokens + 1], seq_len=T)["loss"]. Run it on a
    trained model at 4x its length to see where a scheme starts to struggle: the loss should
    fall with t (more context) and, for a scheme that does not extrapolate, turn up again past
    the trained length.
    """
    n = n_tokens // T
    tokens = torch.from_numpy(data[: n * T + 1].astype(np.int64))
    x, y = tokens[:-1].view(n, T), tokens[1:].view(n, T)
    logits, _ = model(x)  # (n, T, V)
    losses = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # (n, T)
    return losses.mean(dim=0)


# the lab's --quick model trained 4 times longer, and scored on more tokens so that each
# position's mean settles: about 20 s on two CPU cores
EXERCISE_6 = replace(QUICK, steps=400, eval_tokens=65_536)


def exercise_6_curves(data_dir, schemes=("sinusoidal", "alibi"), exp=EXERCISE_6):
    """Train each scheme as the lab does (train_scheme), then score it at 4x its trained length,
    position by position: {scheme: (4·seq_len,) loss at t = 0..4·seq_len-1}.

    Both models see the same batches from the same seed, and both are scored on the same
    `exp.eval_tokens` validation tokens, so the curves differ only by the position scheme."""
    meta = ensure_data(data_dir)
    train = load_token_array(Path(data_dir) / "train.bin")
    valid = load_token_array(Path(data_dir) / "valid.bin")
    T = 4 * exp.seq_len
    n_tokens = min(exp.eval_tokens, len(valid) - 1) // T * T  # whole windows that valid.bin holds
    curves = {}
    for pos in schemes:
        model, _ = train_scheme(pos, exp, train, meta["vocab_size"], torch.device("cpu"))
        curves[pos] = exercise_6_loss_by_position(rebuilt_longer(model, T), valid, T, n_tokens)
    return curves


def plot_curves(curves, trained_len, path):
    """Loss against position in the window, one line per scheme, the trained length marked."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    smooth = torch.ones(1, 1, 5) / 5  # a mean over 5 neighbouring positions: less noise to read
    for pos, losses in curves.items():
        smoothed = F.conv1d(losses.view(1, 1, -1), smooth)[0, 0]  # positions 2 .. T-3
        ax.plot(range(2, len(losses) - 2), smoothed, label=pos)
    ax.axvline(trained_len - 0.5, color="gray", linestyle="--", label="trained length")
    ax.set(xlabel="position in the window", ylabel="validation loss (nats)",
           title=f"Loss by position at 4x the trained length ({4 * trained_len} tokens)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def demo_model(pos="alibi", T=32, seed=0):
    """An untrained LabGPT small enough for the exercises' demonstrations."""
    torch.manual_seed(seed)
    config = LabConfig(vocab_size=100, max_seq_len=T, d_model=32, n_layers=1, n_heads=4, pos=pos)
    return LabGPT(config).eval()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Step 14 exercises.")
    parser.add_argument("--plot", help="draw exercise 6's curves to this PNG file")
    parser.add_argument("--data-dir", default=str(DATA_DIR), help="prepared data (default data/)")
    args = parser.parse_args()
    formula, measured = exercise_1_slowest_wavelength()
    print("exercise 1:", f"slowest wavelength {formula:,.0f} positions, "
          f"{measured:,.0f} read from the table")
    print("exercise 2:", "scores at offset 5:", " ".join(f"{s:.4f}" for s in
                                                       exercise_2_rope_depends_on_offset()))
    print("exercise 3:", "slopes for 6 heads:", exercise_3_alibi_slopes_for_6_heads())
    print("exercise 4:", "SGD: rows moved, rows untouched =", exercise_4_untrained_rows())
    moved, shrink = exercise_4_adamw_rows()
    print("exercise 4:", f"AdamW: {moved} rows moved; the untrained ones are {shrink:.3f} x "
          "their start")
    print("exercise 5:", " ".join(f"{v:.3f}" for v in exercise_5_position_from_the_causal_mask()))
    curves = exercise_6_curves(Path(args.data_dir))
    T = EXERCISE_6.seq_len
    spans = "".join(f"{f'{k * T}-{(k + 1) * T - 1}':>8}" for k in range(4))
    print("exercise 6:", f"{'mean loss at positions':<24}{spans}")
    for pos, losses in curves.items():
        means = "".join(f"{m:>8.3f}" for m in losses.view(4, T).mean(dim=1).tolist())
        print("exercise 6:", f"{pos:<24}{means}")
    if args.plot:
        print("exercise 6:", "saved", plot_curves(curves, T, args.plot))
