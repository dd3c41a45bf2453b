"""Shared helper: plots of a trained model's numbers, for step 11's pictures and the chapters.

The numbers come in as plain lists and tensors (step 11 computes them from a checkpoint and its
log.jsonl); each function draws one figure and saves it with `files.save_figure`, so the same
numbers always give the same PNG bytes.
"""

from pathlib import Path

from tiny_llm.files import save_figure


def write_gap_csv(rows, path):
    """Save loss_gap's rows as step,train,val lines: a small record of a run, kept in a repo."""
    Path(path).write_text("step,train,val\n" + "".join(f"{s},{t},{v}\n" for s, t, v in rows))


def read_gap_csv(path):
    """The rows write_gap_csv saved: [(step, train, val), ...]."""
    lines = Path(path).read_text().splitlines()[1:]
    return [(int(s), float(t), float(v)) for s, t, v in (line.split(",") for line in lines)]


def plot_loss_gap(rows, path, title="train vs validation"):
    """Train (mean per interval) and validation loss, the gap between them shaded; save a PNG."""
    from matplotlib.figure import Figure

    steps, train, valid = zip(*rows, strict=True)
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    ax.plot(steps, train, "-", label="train (mean of the batches since the last evaluation)")
    ax.plot(steps, valid, "o-", ms=3, label="validation (fixed batches)")
    ax.fill_between(steps, train, valid, where=[v > t for t, v in zip(train, valid, strict=True)],
                    color="tab:red", alpha=0.15, label="the gap: what does not carry over")
    ax.annotate(f"gap {valid[-1] - train[-1]:.2f} nats", (steps[-1], (train[-1] + valid[-1]) / 2),
                xytext=(-10, 0), textcoords="offset points", ha="right", va="center")
    top = max(valid[1:] + train[1:]) if len(rows) > 1 else max(valid)
    ax.set(xlabel="step", ylabel="loss (nats per token)", title=title,
           ylim=(min(train) - 0.2, top + 0.2))
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path, dpi=80)


def plot_attention_maps(maps, tokens, path, title="attention"):
    """One heat map per (layer, head) with the tokens on the axes; save a PNG."""
    from matplotlib.figure import Figure

    L, H, T, _ = maps.shape
    fig = Figure(figsize=(2.6 * H + 1, 2.6 * L + 1.4), layout="constrained")
    axes = fig.subplots(L, H, squeeze=False)
    for layer in range(L):
        for head in range(H):
            ax = axes[layer, head]
            ax.imshow(maps[layer, head].numpy(), cmap="Blues", vmin=0, vmax=1)
            ax.set_xticks(range(T), tokens if layer == L - 1 else [], rotation=90, fontsize=7)
            ax.set_yticks(range(T), tokens if head == 0 else [], fontsize=7)
            ax.set_title(f"layer {layer}, head {head}", fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, path, dpi=80)


def plot_positions(table, path, title="learned position table"):
    """A (T, C) position table as a heat map, and the cosine similarity of its rows; save a PNG."""
    from matplotlib.figure import Figure

    rows = table / table.norm(dim=1, keepdim=True)
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    limit = table.abs().quantile(0.99).item()  # a few large entries would wash out the rest
    image = left.imshow(table.numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
    left.set(xlabel="dimension", ylabel="position", title="pos_emb.weight")
    fig.colorbar(image, ax=left)
    image = right.imshow((rows @ rows.T).numpy(), cmap="RdBu_r", vmin=-1, vmax=1)
    right.set(xlabel="position q", ylabel="position p", title="cosine similarity of rows p and q")
    fig.colorbar(image, ax=right)
    fig.suptitle(title)
    return save_figure(fig, path, dpi=80)


def plot_ladder(rows, uniform, path, title="the ladder"):
    """Bits per byte of each rung of step 11's ladder (dicts with rung, step, bpb), the uniform
    guess as a line; save a PNG."""
    from matplotlib.figure import Figure

    labels = [f"{r['step']:02d} {r['rung']}" for r in rows]
    fig = Figure(figsize=(7, 0.5 * len(rows) + 1.6), layout="constrained")
    ax = fig.subplots()
    bars = ax.barh(labels, [r["bpb"] for r in rows], color="tab:blue")
    ax.bar_label(bars, fmt="%.3f", padding=3)
    ax.axvline(uniform, color="gray", ls=":", label=f"uniform guess: {uniform:.2f}")
    ax.invert_yaxis()  # the first rung on top
    ax.set(xlabel="bits per byte on valid.bin (lower is better)", xlim=(0, uniform * 1.1),
           title=title)
    ax.legend(loc="lower right")
    return save_figure(fig, path, dpi=80)
