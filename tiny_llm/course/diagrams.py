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

    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h,
                                boxstyle="round,pad=0,rounding_size=0.08",
                                facecolor=COLORS[kind], edgecolor="#444444", lw=1,
                                linestyle="--" if dashed else "-"))
    ax.text(x, y, text, ha="center", va="center", fontsize=size)
    return (x - w / 2, y - h / 2, w, h)


def arrow(ax, start, end, text=None, size=8, side="right", style="-|>", color="#333333", **kw):
    """An arrow from `start` to `end`; `text` beside its middle (side: right/left/above/below)."""
    ax.annotate("", xy=end, xytext=start,
                arrowprops=dict(arrowstyle=style, lw=1.2, color=color, shrinkA=0, shrinkB=0, **kw))
    if text:
        mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
        dx, dy, ha, va = {"right": (0.08, 0, "left", "center"),
                          "left": (-0.08, 0, "right", "center"),
                          "above": (0, 0.06, "center", "bottom"),
                          "below": (0, -0.06, "center", "top")}[side]
        ax.text(mx + dx, my + dy, text, ha=ha, va=va, fontsize=size, color="#222222")


def plus(ax, x, y, r=0.14):
    """The residual addition: a circle with a + in it."""
    from matplotlib.patches import Circle

    ax.add_patch(Circle((x, y), r, facecolor="white", edgecolor="#444444", lw=1.2))
    ax.text(x, y, "+", ha="center", va="center", fontsize=11)


def matrix(ax, x, y, values, cell=0.16, cmap="Blues", vmin=0.0, vmax=1.0):
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
            color = "#f2f2f2" if masked else colors(0.05 + 0.9 * (v - vmin) / (vmax - vmin))
            ax.add_patch(Rectangle((x + c * cell, y - (r + 1) * cell), cell, cell, lw=0.4,
                                   edgecolor="#888888", hatch="////" if masked else None,
                                   facecolor=color))
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
    ax.text(4.1, 9.1, f"GPT ({s['name']}), {s['total']:,} parameters\n{s['layers']} blocks, "
            f"d_model {d}, {s['heads']} heads, context {T}, vocabulary {s['V']:,}", fontsize=10,
            weight="bold", ha="center", va="center")
    box(ax, x, 8.45, f"token ids idx  (B, T) = ({B}, {T})", "tensor", w=3.2, h=0.42)
    box(ax, 2.6, 7.45, f"tok_emb  {s['V']:,} × {d}\n{s['tok_emb']:,} parameters", "embed",
        w=2.3, h=0.62)
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
    box(ax, x, 2.2, f"lm_head  Linear {d} → {s['V']:,}, no bias\nits weight is tok_emb's matrix",
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


def embed_diagram(tok, pos, idx):
    """Step 04's two lookups, added: ids pick rows of tok_emb, positions pick rows of pos_emb,
    and out[t] = tok_emb[idx[t]] + pos_emb[t]. tok (V, C), pos (T_max, C), idx (T,): numpy
    arrays of the hand-sized example (see embed.draw_tables)."""
    from matplotlib.patches import Rectangle

    fig, ax = canvas(11.0, 5.4)
    (V, C), T, cell = tok.shape, len(idx), 0.24
    out = tok[idx] + pos[:T]
    colors = [HEADS[t] + "66" for t in range(T)]  # one colour per position, light
    ax.text(5.5, 5.15, f"Embed, hand-sized: vocabulary {V}, max_seq_len {len(pos)}, d_model {C};"
            f" ids {' '.join(str(int(v)) for v in idx)}: out[t] = tok_emb[idx[t]] + pos_emb[t]",
            fontsize=10, weight="bold", ha="center")

    def table(x, top, values, title, picked):
        """A table with its rows numbered and written out, each picked row outlined in its
        position's colour; returns the y of the middle of each row."""
        matrix(ax, x, top, values, cell, "Greens", 0.0, values.max() * 1.6)
        mids = [top - (r + 0.5) * cell for r in range(values.shape[0])]
        for r, y in enumerate(mids):
            ax.text(x - 0.08, y, str(r), ha="right", va="center", fontsize=7)
            for c in range(values.shape[1]):
                ax.text(x + (c + 0.5) * cell, y, f"{values[r, c]:.2f}", ha="center",
                        va="center", fontsize=5.5)
        for t, r in picked:
            ax.add_patch(Rectangle((x, top - (r + 1) * cell), values.shape[1] * cell, cell,
                                   fill=False, edgecolor=HEADS[t], lw=2))
        ax.text(x + values.shape[1] * cell / 2, top + 0.06, title, ha="center", va="bottom",
                fontsize=8)
        return mids

    def column(x, mid, labels, title):
        """The T ids or positions as a column of cells; returns each cell's right middle."""
        ends = []
        for t, label in enumerate(labels):
            y = mid + (T / 2 - t - 0.5) * 0.34
            ax.add_patch(Rectangle((x, y - 0.17), 0.34, 0.34, facecolor=colors[t],
                                   edgecolor="#555555", lw=0.8))
            ax.text(x + 0.17, y, label, ha="center", va="center", fontsize=9)
            ends.append((x + 0.34, y))
        ax.text(x + 0.17, mid + T * 0.17 + 0.08, title, ha="center", va="bottom", fontsize=8)
        return ends

    ids = column(0.9, 3.65, [str(int(v)) for v in idx], "idx: the ids")
    ts = column(0.9, 1.3, [str(t) for t in range(T)], "t = arange(T)")
    tok_rows = table(3.4, 4.85, tok, f"tok_emb ({V}, {C})", list(enumerate(int(v) for v in idx)))
    pos_rows = table(3.4, 1.9, pos, f"pos_emb ({len(pos)}, {C})", [(t, t) for t in range(T)])
    for t, v in enumerate(idx):  # one arrow per lookup, in the position's colour
        arrow(ax, ids[t], (3.15, tok_rows[int(v)]), color=HEADS[t])
        arrow(ax, ts[t], (3.15, pos_rows[t]), color=HEADS[t])
    ax.text(2.25, 2.45, "row idx[t]\nof tok_emb", ha="center", fontsize=8)
    ax.text(2.25, 0.2, "row t of pos_emb", ha="center", fontsize=8)
    plus(ax, 5.3, 2.75)
    arrow(ax, (4.2, 3.6), (5.2, 2.85))
    arrow(ax, (4.2, 1.3), (5.2, 2.65))
    arrow(ax, (5.44, 2.75), (6.3, 2.75))
    top = 2.75 + T * cell / 2
    rows = table(6.6, top, out, f"out ({T}, {C}): (T, d_model)", [(t, t) for t in range(T)])
    for t, (v, y) in enumerate(zip(idx, rows, strict=True)):
        ax.text(6.6 + C * cell + 0.12, y, f"t={t}: row {int(v)} of tok_emb + row {t} of pos_emb",
                va="center", fontsize=7)
    return fig


def qkv_diagram(scores, weights, s):
    """Step 05's one head: x -> q, k, v -> scores -> weights -> out. scores and weights are
    (T, T) arrays of one sequence (NaN above the diagonal); `s`: B, T, d (attention.draw_flow)."""
    fig, ax = canvas(12.6, 4.3)
    B, T, d = s["B"], s["T"], s["d"]
    ax.text(6.3, 4.05, f"One attention head at the check's sizes: B = {B} sequences, T = {T} "
            f"positions, C = d_model = {d}; the two grids are sequence 0's real numbers",
            fontsize=10, weight="bold", ha="center")
    rows = {"q": 3.3, "k": 2.1, "v": 0.7}
    mid = (rows["q"] + rows["k"]) / 2
    box(ax, 0.9, rows["k"], f"x\n(B, T, C)\n= ({B}, {T}, {d})", "tensor", w=1.4, h=0.9)
    roles = [("query", "q", "what t looks for"), ("key", "k", "what s offers"),
             ("value", "v", "what s hands over")]
    for name, short, role in roles:
        y = rows[short]
        arrow(ax, (1.6, rows["k"]), (2.15, y))
        box(ax, 2.95, y, f"{name}\nLinear {d} → {d}", "attn", w=1.6, h=0.55)
        arrow(ax, (3.75, y), (4.05, y))
        box(ax, 4.95, y, f"{short}  ({B}, {T}, {d})\n{role}", "tensor", w=1.8, h=0.55)
    box(ax, 6.75, mid, f"q @ kᵀ / √{d}\nevery t with\nevery s", "attn", w=1.3, h=0.8)
    arrow(ax, (5.85, rows["q"]), (6.1, mid + 0.3))
    arrow(ax, (5.85, rows["k"]), (6.1, mid - 0.3))
    cell = 0.2
    top, side = mid + T * cell / 2, T * cell
    finite = scores[~np.isnan(scores)]
    arrow(ax, (7.4, mid), (7.65, mid))
    matrix(ax, 7.65, top, scores, cell, "PuOr", finite.min(), finite.max())
    arrow(ax, (7.65 + side + 0.05, mid), (9.55, mid))
    box(ax, 10.05, mid, "softmax\nalong\neach row", "attn", w=1.0, h=0.8)
    arrow(ax, (10.55, mid), (10.8, mid))
    matrix(ax, 10.8, top, np.where(np.isnan(scores), np.nan, weights), cell, "Blues")
    notes = [(7.65, f"scores ({B}, {T}, {T})", "row t: query t, column s: key s; orange\nhigh, "
              "purple low; hatched s > t: −∞"),
             (10.8, f"weights ({B}, {T}, {T})", "each row sums to 1;\nfuture weights are 0")]
    for x, title, note in notes:
        ax.text(x + side / 2, top + 0.06, title, ha="center", va="bottom", fontsize=8)
        ax.text(x + side / 2, top - side - 0.06, note, ha="center", va="top", fontsize=7.5)
    y = rows["v"]
    box(ax, 8.5, y, f"weights @ v\n({B}, {T}, {d})", "attn", w=1.5, h=0.55)
    arrow(ax, (5.85, y), (7.75, y), "a weighted mix of the values", side="above")
    arrow(ax, (10.8 + side / 2, top - side - 0.45), (9.1, y + 0.28))
    box(ax, 10.35, y, f"proj\nLinear {d} → {d}", "attn", w=1.4, h=0.55)
    arrow(ax, (9.25, y), (9.65, y))
    box(ax, 11.85, y, f"out\n({B}, {T}, {d})", "tensor", w=1.1, h=0.55)
    arrow(ax, (11.05, y), (11.3, y))
    return fig


def slab(ax, x, top, rows, width, row_h, color, label=None):
    """A (rows, width) tensor as a coloured rectangle with a thin line between rows."""
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, top - rows * row_h), width, rows * row_h, facecolor=color,
                           edgecolor="#333333", lw=0.9))
    for r in range(1, rows):
        ax.plot([x, x + width], [top - r * row_h] * 2, color="white", lw=0.5)
    if label:
        ax.text(x + width / 2, top + 0.05, label, ha="center", va="bottom", fontsize=8)


def heads_diagram(s):
    """Step 06's reshape of q (likewise k, v) into heads and back. `s`: B, T, d, heads."""
    fig, ax = canvas(12.4, 5.0)
    B, T, d, H = s["B"], s["T"], s["d"], s["heads"]
    hs = d // H
    col, row_h, top = 2.7 / d, 0.1, 3.9  # inches per feature column and per position row
    ax.text(6.2, 4.75, f"Splitting d_model = {d} into {H} heads of {hs} (the check's sizes: "
            f"B = {B}, T = {T}); one sequence drawn, every colour is one head's slice",
            fontsize=10, weight="bold", ha="center")
    for h in range(H):  # (T, C): each row is one position, the heads' columns side by side
        slab(ax, 0.4 + h * hs * col, top, T, hs * col, row_h, HEADS[h], f"head {h}")
    ax.text(1.75, top - T * row_h - 0.1, f"q  (B, T, C) = ({B}, {T}, {d})\nrow t: position t, "
            f"{d} features", ha="center", va="top", fontsize=8)
    arrow(ax, (3.2, top - 0.8), (4.25, top - 0.8), f".view(B, T, {H}, {hs})", side="above")
    for h in range(H):  # the same numbers, the last axis cut in H pieces of hs
        slab(ax, 4.35 + h * (hs * col + 0.12), top, T, hs * col, row_h, HEADS[h], f"head {h}")
    ax.text(6.05, top - T * row_h - 0.1, f"(B, T, heads, head_size) = ({B}, {T}, {H}, {hs})\n"
            "no data moves: each row cut in pieces", ha="center", va="top", fontsize=8)
    arrow(ax, (7.65, top - 0.8), (8.45, top - 0.8), ".transpose(1, 2)", side="above")
    for h in reversed(range(H)):  # a deck: the head is now a batch axis in front of T
        slab(ax, 8.6 + h * 0.32, top - h * 0.16, T, hs * col, row_h, HEADS[h])
        ax.text(8.6 + h * 0.32 + hs * col + 0.05, top - h * 0.16 - 0.08, f"head {h}", fontsize=7)
    ax.text(9.6, top - T * row_h - 0.6, f"(B, heads, T, head_size) = ({B}, {H}, {T}, {hs})\n"
            f"{H} separate ({T}, {hs}) matrices per sequence", ha="center", va="top", fontsize=8)
    y = 0.75
    box(ax, 1.6, y, f"attend(q, k, v)\neach head: ({T}, {T}) scores\nas in step 05", "attn",
        w=2.2, h=0.75)
    arrow(ax, (9.6, top - T * row_h - 1.05), (2.7, y + 0.3), "q, k and v, each split like this",
          side="above")
    arrow(ax, (2.7, y), (3.4, y))
    box(ax, 4.35, y, f"y  ({B}, {H}, {T}, {hs})", "tensor", w=1.9, h=0.45)
    arrow(ax, (5.3, y), (5.9, y))
    box(ax, 7.45, y, f".transpose(1, 2).view(B, T, {d})\nthe heads side by side again",
        "attn", w=3.1, h=0.6)
    arrow(ax, (9.0, y), (9.4, y))
    box(ax, 10.1, y, f"proj\nLinear {d} → {d}", "attn", w=1.4, h=0.55)
    arrow(ax, (10.8, y), (11.1, y))
    box(ax, 11.7, y, f"out\n({B}, {T}, {d})", "tensor", w=1.1, h=0.55)
    return fig


def cache_diagram(s):
    """Step 12: prefill reads the prompt at once and fills the cache; each decode step reads one
    token and appends one key and value. `s`: prompt and next (lists of str), layers, T_max, d,
    nbytes (see kvcache.draw_cache)."""
    fig, ax = canvas(12.6, 5.0)
    prompt, n, cell, shown = s["prompt"], len(s["prompt"]), 0.36, 10
    ax.text(6.3, 4.75, f"Generating with a KV cache ({s['name']}: {s['layers']} layers, "
            f"max_seq_len {s['T_max']}, d_model {s['d']}); one layer's cache drawn",
            fontsize=10, weight="bold", ha="center")
    new, kept, empty = "#f58518", "#9ecae1", "#ffffff"
    rows = [(3.35, f"prefill: the {n}-token prompt in one forward", prompt,
             f"positions 0..{n - 1}"),
            (1.25, "decode: each later token alone", s["next"][:1], f"position {n}")]
    for row, (y, title, tokens, where) in enumerate(rows):
        ax.text(0.2, y + 0.8, title, fontsize=9.5, weight="bold")
        strip(ax, 0.3, y, len(tokens), 0.62, [new] * len(tokens), tokens, size=11)
        ax.text(0.3, y - 0.42, where, fontsize=7.5)
        arrow(ax, (0.3 + 0.62 * len(tokens) + 0.1, y), (3.05, y))
        box(ax, 3.85, y, f"model(idx, cache)\n{len(tokens)} position{'s' * (row == 0)} "
            f"per layer", "attn", w=1.6, h=0.6, size=8)
        if row:
            ax.text(3.85, y - 0.42, f"without a cache: all {n + 1} again", ha="center",
                    va="top", fontsize=7.5)
        arrow(ax, (4.65, y), (5.05, y))
        # which keys each query reads: the causal triangle, then one row over every kept key
        q_rows, n_keys, cw = (n, n, 0.22) if row == 0 else (1, n + 1, 0.22)
        pattern = np.full((q_rows, n_keys), np.nan)
        for t in range(q_rows):
            pattern[t, : t + 1 if row == 0 else n_keys] = 0.6
        matrix(ax, 5.1, y + q_rows * cw / 2, pattern, cw, "Blues")
        ax.text(5.1 + n_keys * cw / 2, y - q_rows * cw / 2 - 0.08, f"scores {q_rows} × {n_keys}",
                ha="center", va="top", fontsize=7.5)
        x0, filled = 7.1, n + row
        colors = [empty if i >= filled else new if row == 0 or i == n else kept
                  for i in range(shown)]
        for dy, name in ((0.25, "k"), (-0.25, "v")):
            ax.text(x0 - 0.1, y + dy, name, ha="right", va="center", fontsize=9)
            strip(ax, x0, y + dy, shown, cell, colors,
                  [str(i) if i < filled else "" for i in range(shown)], size=6.5)
            ax.text(x0 + shown * cell + 0.1, y + dy, f"… {s['T_max']}", va="center", fontsize=8)
        arrow(ax, (6.35, y), (x0 - 0.3, y), style="<|-|>")
        note = (f"stores k, v of positions 0..{n - 1}" if row == 0 else
                f"appends k, v of position {n}; reads 0..{n - 1} back")
        ax.text(x0, y - 0.6, note, fontsize=8)
        arrow(ax, (11.4, y), (11.75, y))
        ax.text(11.8, y, f"next\ntoken\n{s['next'][row].strip()!r}", fontsize=8, va="center")
    ax.text(0.2, 0.2, f"Cache memory: 2 (k and v) × {s['layers']} layers × {s['T_max']} "
            f"positions × {s['d']} numbers × 4 bytes = {s['nbytes']:,} bytes per sequence.   "
            "Orange: computed in this forward; blue: read from the cache.", fontsize=8.5)
    return fig


# The chapter pictures that no step's own check draws:
# `uv run python -m tiny_llm.course.diagrams DIR`.

MERGES_PHRASE = "Once upon a time, there was a little dog."
MERGES_SHOWN = (0, 15, 60, 150, 400, 1000)  # after how many merges a row shows the phrase


def merges_diagram(rows, merges_learned):
    """Step 02: one phrase after more and more merges. `rows`: [(n_merges, [token bytes])]."""
    cell, x0 = 0.15, 2.35
    width = x0 + cell * sum(len(t) for t in rows[0][1]) + 0.3
    fig, ax = canvas(width, 0.75 + 0.55 * len(rows))
    ax.text(width / 2, 0.45 + 0.55 * len(rows), "BPE merges build tokens out of bytes (the "
            f"sample stories, {merges_learned:,} merges learned)", ha="center", fontsize=10,
            weight="bold")
    for r, (n, tokens) in enumerate(rows):
        y, x = 0.05 + 0.55 * (len(rows) - r) - 0.15, x0
        ax.text(0.15, y, f"{n:>5,} merges: {len(tokens)} tokens", va="center", fontsize=9,
                family="monospace")
        for token in tokens:
            w = cell * len(token)
            kind = "tensor" if len(token) > 1 else "plain"
            box(ax, x + w / 2, y, token.decode("utf-8", "replace").replace(" ", "·"), kind,
                w=w - 0.02, h=0.38, size=8)
            x += w
    return fig


def draw_merges(path):
    """Train step 02's BytePairEncoder on 300 sample stories; draw MERGES_PHRASE after each of
    MERGES_SHOWN merges (the earliest merges first, as encoding applies them)."""
    from tiny_llm.bpe import BytePairEncoder  # a helper of step 02, only for this picture
    from tiny_llm.files import save_figure
    from tiny_llm.sample_stories import generate_stories

    bpe = BytePairEncoder()
    bpe.train(" ".join(generate_stories(300)), 256 + max(MERGES_SHOWN))
    learned, rows = dict(bpe.merges), []
    for n in MERGES_SHOWN:
        if n > len(learned):
            continue
        bpe.merges, bpe.cache = dict(list(learned.items())[:n]), {}
        rows.append((n, [bpe.vocab[i] for i in bpe.encode(MERGES_PHRASE)]))
    return save_figure(merges_diagram(rows, len(learned)), path, dpi=90)


# Step 13: one float32 training step of the small preset, one thread, on the course's 2-core
# machine (docs/records/13-levers-one-thread.md): the stopwatch's parts, in ms, and the
# profiler's operators, in % of the profiled time.
STEP_PARTS = {"forward": 242, "backward": 430, "optimizer": 12}
STEP_OPERATORS = {"matmuls": 44.1, "attention": 12.9, "log_softmax": 13.1, "var": 5.2,
                  "fill_": 4.3}


def step_time_diagram(parts, operators):
    """Two bars: a step split by the stopwatch (parts, ms) and by operator (operators, %)."""
    fig, ax = canvas(9.0, 3.4)
    ax.text(4.5, 3.15, "Where a training step's time goes (small preset, float32, one CPU "
            "thread)", ha="center", fontsize=10, weight="bold")
    total, x0, scale = sum(parts.values()), 0.3, 7.6
    kinds = {"forward": "attn", "backward": "mlp", "optimizer": "norm"}
    x = x0
    ax.text(x0, 2.55, f"the stopwatch: {total} ms per step", fontsize=9)
    for name, ms in parts.items():
        w = scale * ms / total
        box(ax, x + w / 2, 2.1, f"{name}\n{ms} ms" if w > 0.6 else "", kinds[name], w=w, h=0.6,
            size=8.5)
        x += w
    ax.text(x + 0.05, 2.1, "optimizer\n12 ms", fontsize=7.5, va="center")
    rest = 100 - sum(operators.values())
    ax.text(x0, 1.3, "the profiler: share of the time by operator", fontsize=9)
    x = x0
    colors = ["attn", "attn", "loss", "norm", "cache"]
    for (name, share), kind in zip([*operators.items(), ("everything else", rest)],
                                   [*colors, "plain"], strict=True):
        w = scale * share / 100
        box(ax, x + w / 2, 0.85, f"{name}\n{share:.0f}%", kind, w=w, h=0.6, size=7.5)
        x += w
    ax.text(x0, 0.3, "Matmuls and attention are 57%. The loss's log_softmax over (B, T, 4096) "
            "logits, LayerNorm's var and fill_ of new memory\nare elementwise work and "
            "memory traffic: what fusing (torch.compile) and reusing freed memory attack.",
            fontsize=8, va="center")
    return fig


def draw_step_time(path):
    """Step 13's picture, from the record's numbers (STEP_PARTS, STEP_OPERATORS)."""
    from tiny_llm.files import save_figure

    return save_figure(step_time_diagram(STEP_PARTS, STEP_OPERATORS), path, dpi=90)


def blocks_diagram():
    """Step 15: GPT-2's block (steps 07 and 08) beside the LLaMA-style block, part by part."""
    fig, ax = canvas(10.0, 6.3)
    columns = (
        (0.9, "GPT-2 block (steps 07, 08)", "x = tok_emb + pos_emb\n(learned positions)",
         ("LayerNorm: mean, var,\ngain and bias",
          "attention: n_heads heads\nq, k, v, proj with biases"),
         ("LayerNorm", "MLP: d → 4d → GELU → d\nwith biases")),
        (5.9, "LLaMA-style block (step 15)", "x = tok_emb\n(no position table)",
         ("RMSNorm: gain only,\nno mean, no bias",
          "attention: RoPE turns q, k;\nfewer k/v heads, no biases"),
         ("RMSNorm", "SwiGLU: w2(silu(w1·x) · w3·x)\nno biases")),
    )
    for xs, title, top, (norm_1, attn), (norm_2, mlp) in columns:
        ax.text(xs + 1.6, 6.0, title, ha="center", fontsize=10, weight="bold")
        box(ax, xs, 5.35, top, "embed", w=1.7, h=0.6, size=8)
        join_1 = branch(ax, xs, xs + 2.5, 4.55, norm_1, attn, ("norm", "attn"))
        join_2 = branch(ax, xs, xs + 2.5, join_1 - 0.45, norm_2, mlp, ("norm", "mlp"))
        ax.plot([xs, xs], [5.05, join_1 + 0.14], color="#333333", lw=2.2)
        ax.plot([xs, xs], [join_1 - 0.14, join_2 + 0.14], color="#333333", lw=2.2)
        arrow(ax, (xs, join_2 - 0.14), (xs, 0.75))
        box(ax, xs, 0.5, "out (B, T, d)", "tensor", w=1.7, h=0.42, size=8)
    ax.text(5.0, 0.12, "The same residual stream and the same two branches; what changes is "
            "inside them: the norm, where positions enter, the attention's heads, the MLP.",
            ha="center", fontsize=8.5)
    return fig


def draw_blocks(path):
    """Step 15's picture of the two blocks."""
    from tiny_llm.files import save_figure

    return save_figure(blocks_diagram(), path, dpi=90)


PICTURES = {"02-merges.png": draw_merges, "13-step-time.png": draw_step_time,
            "15-blocks.png": draw_blocks}


def main(argv=None):
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description="Draw the chapter pictures no step's check "
                                     "draws (" + ", ".join(PICTURES) + ").")
    parser.add_argument("folder", help="where to write them, e.g. steps/images")
    args = parser.parse_args(argv)
    for name, draw in PICTURES.items():
        print(f"{name:<16} {draw(Path(args.folder) / name)}")


if __name__ == "__main__":
    main()
