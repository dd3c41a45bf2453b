"""Shared helper: boxes, arrows and little tensors for the chapters' diagrams.

A diagram is drawn on a canvas whose units are inches, so a box 1.6 wide is 1.6 inches on the
page at any dpi. Each step module computes the real sizes of its own objects (shapes, parameter
counts) and passes them to one of the layouts at the end of this file; this module imports no
step, so every step may use it. Pictures are saved with `files.save_figure`.

    fig, ax = canvas(4, 2)
    box(ax, 1, 1, "LayerNorm(128)", kind="norm")
    arrow(ax, (1.8, 1), (3, 1), "(B, T, 128)")
"""

import numpy as np

COLORS = {  # one colour per kind of thing, the same in every diagram
    "tensor": "#fff4cc",  # data: ids, activations, logits
    "embed": "#d8ecd2",  # embedding tables
    "attn": "#d6e6f7",  # attention
    "mlp": "#f7dccb",  # the feed-forward network
    "norm": "#e6e0f2",  # LayerNorm
    "loss": "#f4cccc",  # the loss and what uses the output
    "cache": "#e2e2e2",  # the KV cache's memory
    "plain": "#ffffff",
}
HEADS = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b", "#9d755d"]


def canvas(width, height):
    """A blank (Figure, Axes) of width x height inches whose data units are inches."""
    from matplotlib.figure import Figure  # no pyplot: nothing global, no window

    fig = Figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set(xlim=(0, width), ylim=(0, height))
    ax.axis("off")
    return fig, ax


def box(ax, x, y, text, kind="plain", w=1.6, h=0.5, size=9, dashed=False):
    """A rounded box centred on (x, y) with `text` inside; returns its (left, bottom, w, h)."""
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.08",
                                facecolor=COLORS[kind], edgecolor="#444444", lw=1,
                                linestyle="--" if dashed else "-"))
    ax.text(x, y, text, ha="center", va="center", fontsize=size)
    return (x - w / 2, y - h / 2, w, h)


def arrow(ax, start, end, text=None, size=8, side="right", style="-|>", color="#333333", **kw):
    """An arrow from `start` to `end`, with `text` beside its middle (side: right/left/above/below)."""
    ax.annotate("", xy=end, xytext=start,
                arrowprops=dict(arrowstyle=style, lw=1.2, color=color, shrinkA=0, shrinkB=0, **kw))
    if text:
        mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
        dx, dy, ha, va = {"right": (0.08, 0, "left", "center"), "left": (-0.08, 0, "right", "center"),
                          "above": (0, 0.06, "center", "bottom"),
                          "below": (0, -0.06, "center", "top")}[side]
        ax.text(mx + dx, my + dy, text, ha=ha, va=va, fontsize=size, color="#222222")


def plus(ax, x, y, r=0.14):
    """The residual addition: a circle with a + in it."""
    from matplotlib.patches import Circle

    ax.add_patch(Circle((x, y), r, facecolor="white", edgecolor="#444444", lw=1.2))
    ax.text(x, y, "+", ha="center", va="center", fontsize=11)


def matrix(ax, x, y, values, cell=0.16, cmap="Blues", vmax=1.0):
    """Draw a 2-D array as coloured cells, top-left corner at (x, y); NaN cells are hatched.

    Row 0 is at the top, as when a matrix is printed. Returns (width, height) in inches.
    """
    import matplotlib
    from matplotlib.patches import Rectangle

    colors = matplotlib.colormaps[cmap]
    rows, cols = values.shape
    for r in range(rows):
        for c in range(cols):
            v = values[r, c]
            masked = np.isnan(v)
            ax.add_patch(Rectangle((x + c * cell, y - (r + 1) * cell), cell, cell, lw=0.4,
                                   edgecolor="#888888", hatch="////" if masked else None,
                                   facecolor="#f2f2f2" if masked else colors(0.08 + 0.92 * v / vmax)))
    return cols * cell, rows * cell


def strip(ax, x, y, n, cell, colors, labels=None, size=7):
    """A row of n cells, left edge at x, centred on y: one token, cache slot or position each."""
    from matplotlib.patches import Rectangle

    for i in range(n):
        ax.add_patch(Rectangle((x + i * cell, y - cell / 2), cell, cell, facecolor=colors[i],
                               edgecolor="#555555", lw=0.8))
        if labels and labels[i]:
            ax.text(x + (i + 0.5) * cell, y, labels[i], ha="center", va="center", fontsize=size)


def model_diagram(s):
    """Step 08's whole GPT, top to bottom. `s`: B, T, V, d, layers, heads, and the parameter
    counts tok_emb, pos_emb, block, ln_f, total (see gpt.draw_model)."""
    fig, ax = canvas(8.2, 9.4)
    x, d, B, T = 3.9, s["d"], s["B"], s["T"]
    ax.text(4.1, 9.1, f"GPT ({s['name']}), {s['total']:,} parameters: {s['layers']} blocks, d_model {d}, "
            f"{s['heads']} heads, context {T}, vocabulary {s['V']:,}", fontsize=10,
            weight="bold", ha="center")
    box(ax, x, 8.45, f"token ids idx  (B, T) = ({B}, {T})", "tensor", w=3.2, h=0.42)
    box(ax, 2.6, 7.45, f"tok_emb  {s['V']:,} × {d}\n{s['tok_emb']:,} parameters", "embed", w=2.3, h=0.62)
    box(ax, 5.3, 7.45, f"pos_emb  {T} × {d}\n{s['pos_emb']:,} parameters", "embed", w=2.3, h=0.62)
    arrow(ax, (x - 0.8, 8.24), (2.7, 7.76), "look up each id", side="left")
    arrow(ax, (x + 0.8, 8.24), (5.1, 7.76), f"positions 0 .. {T - 1}", side="right")
    plus(ax, x, 6.75)
    arrow(ax, (2.6, 7.14), (x - 0.12, 6.84))
    arrow(ax, (5.3, 7.14), (x + 0.12, 6.84))
    arrow(ax, (x, 6.61), (x, 6.06), f"x  (B, T, C) = ({B}, {T}, {d})")
    for i in reversed(range(4)):  # shadows behind the first block say "repeated"
        box(ax, x + 0.08 * i, 4.95 - 0.08 * i, "", "plain", w=4.4, h=2.2)
    ax.text(x - 2.05, 5.85, "Block (step 07)", fontsize=9, weight="bold", va="center")
    box(ax, x, 5.3, f"x = x + attention(LayerNorm(x))\n{s['heads']} heads × {d // s['heads']}",
        "attn", w=3.6, h=0.6)
    box(ax, x, 4.4, f"x = x + MLP(LayerNorm(x))\n{d} → {4 * d} → GELU → {d}", "mlp", w=3.6, h=0.6)
    arrow(ax, (x, 4.99), (x, 4.71))
    ax.text(x + 2.55, 4.95, f"× {s['layers']} blocks,\n{s['block']:,}\nparameters\neach",
            fontsize=9, va="center")
    arrow(ax, (x, 3.6), (x, 3.4), f"({B}, {T}, {d})")
    box(ax, x, 3.15, f"ln_f  LayerNorm({d}), {s['ln_f']:,} parameters", "norm", w=3.6, h=0.5)
    arrow(ax, (x, 2.9), (x, 2.55))
    box(ax, x, 2.2, f"head  Linear {d} → {s['V']:,}, no bias\nits weight is tok_emb's matrix",
        "embed", w=3.6, h=0.66)
    arrow(ax, (x - 1.8, 2.2), (1.45, 7.45), style="<|-|>", linestyle="--",
          connectionstyle="arc3,rad=-0.3")
    ax.text(0.1, 4.7, "tied:\nthe same\n(V, C)\nmatrix,\ncounted\nonce", fontsize=8, va="center")
    arrow(ax, (x, 1.87), (x, 1.55))
    box(ax, x, 1.33, f"logits  (B, T, V) = ({B}, {T}, {s['V']:,})", "tensor", w=3.2, h=0.42)
    box(ax, 2.3, 0.45, f"training: cross-entropy with\ntargets ({B}, {T}) → one loss",
        "loss", w=2.9, h=0.62)
    box(ax, 5.7, 0.45, "generating: softmax of the\nlast position → next token (09)", "loss",
        w=2.9, h=0.62)
    arrow(ax, (x - 0.6, 1.12), (2.6, 0.76))
    arrow(ax, (x + 0.6, 1.12), (5.4, 0.76))
    return fig


def branch(ax, x_stream, x, y_tap, top_text, bottom_text, kinds):
    """A residual branch: leave the stream at y_tap, two boxes down the column x, add the result
    back 1.4 inches lower; returns that height."""
    y2, y_join = y_tap - 0.85, y_tap - 1.4
    arrow(ax, (x_stream, y_tap), (x - 1.3, y_tap))
    box(ax, x, y_tap, top_text, kinds[0], w=2.6, h=0.44)
    arrow(ax, (x, y_tap - 0.22), (x, y2 + 0.3))
    box(ax, x, y2, bottom_text, kinds[1], w=2.6, h=0.6)
    ax.plot([x, x], [y2 - 0.3, y_join], color="#333333", lw=1.2)
    arrow(ax, (x, y_join), (x_stream + 0.14, y_join))
    plus(ax, x_stream, y_join)
    return y_join


def block_diagram(s):
    """Step 07's pre-norm block. `s`: B, T, d, heads, and the parameter counts ln, attn, mlp,
    total (see block.draw_block)."""
    fig, ax = canvas(8.0, 5.6)
    xs, d, shape = 1.4, s["d"], f"({s['B']}, {s['T']}, {s['d']})"
    ax.text(4.0, 5.3, f"One pre-norm block: {s['total']:,} parameters, d_model {d}, "
            f"{s['heads']} heads", fontsize=10, weight="bold", ha="center")
    box(ax, xs, 4.75, f"x  {shape}", "tensor", w=2.0, h=0.42)
    join_1 = branch(ax, xs, 3.8, 4.2, f"ln_1  LayerNorm({d}), {s['ln']} params",
                    f"attn  {s['heads']} heads × {d // s['heads']}\n{s['attn']:,} parameters "
                    "(step 06)", ("norm", "attn"))
    join_2 = branch(ax, xs, 3.8, join_1 - 0.45, f"ln_2  LayerNorm({d}), {s['ln']} params",
                    f"mlp  {d} → {4 * d} → GELU → {d}\n{s['mlp']:,} parameters", ("norm", "mlp"))
    ax.plot([xs, xs], [4.54, join_1 + 0.14], color="#333333", lw=2.2)
    ax.plot([xs, xs], [join_1 - 0.14, join_2 + 0.14], color="#333333", lw=2.2)
    ax.text(xs - 0.22, join_1, "the residual stream: only additions", rotation=90, fontsize=8,
            ha="center", va="center")
    arrow(ax, (xs, join_2 - 0.14), (xs, 0.52))
    box(ax, xs, 0.3, f"out  {shape}", "tensor", w=2.0, h=0.42)
    ax.text(5.3, 3.35, "x = x + attn(ln_1(x))", fontsize=9, family="monospace", va="center")
    ax.text(5.3, join_1 - 1.3, "x = x + mlp(ln_2(x))", fontsize=9, family="monospace", va="center")
    ax.text(5.3, 0.45, "Each branch reads a normalised\ncopy and adds its result back;\n"
            "the stream itself is never\nnormalised inside the block.", fontsize=8, va="center")
    return fig
