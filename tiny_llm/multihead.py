"""Step 06: multi-head attention.

Step 05 built one attention head: every position asks one question (a query) and gets one
weighted mix of values back. Here the model dimension is cut into `n_heads` slices of
`head_size = d_model // n_heads`, and each slice attends on its own, so one position can look
for a noun with one head and for the previous token with another. The heads' outputs are put
side by side again and mixed by one output projection.

Two ways to compute the same thing: the attention math written out (scores, causal mask,
softmax) and PyTorch's fused `F.scaled_dot_product_attention`, which never stores the
(T, T) score matrix. `use_sdpa` picks one; the check shows they agree. `attend` is the fused
path as a function of q, k and v alone, so that every attention of the course calls the same
few lines.

Run the check:  uv run python -m tiny_llm.multihead
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from tiny_llm.checks import check_activations, check_heads, check_sizes
from tiny_llm.device import seed_everything


def attend(q, k, v, dropout_p=0.0, bias=None):
    """Causal attention of queries q over keys k and values v: the heart of every layer.

    q (B, H, Tq, hs); k, v (B, Hkv, Tk, hs) -> (B, H, Tq, hs). Query i sees keys 0..i.
    Tq == 1: one new query after a cache of keys (step 12) sees them all.
    `bias` (step 14's ALiBi): an additive float mask broadcastable to (B, H, Tq, Tk), -inf
    where a query must not look; it replaces the built-in causal mask.
    Hkv < H (grouped-query attention, step 15): each key/value head serves H // Hkv query heads.
    """
    gqa = {}
    if k.shape[1] != q.shape[1]:  # each key/value head serves q.shape[1] // k.shape[1] queries
        if "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or ""):  # PyTorch 2.5 and on
            gqa = {"enable_gqa": True}  # the kernel reads each head for its group: no copies
        else:  # (B, Hkv, Tk, hs) -> (B, H, Tk, hs): a copy of each head per query head
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if bias is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, **gqa)
    Tq, Tk = q.shape[2], k.shape[2]
    if Tq != Tk and Tq != 1:  # is_causal aligns the mask top-left: right only for these two
        raise ValueError(f"attend: {Tq} queries after {Tk - Tq} cached keys; only a prefill of "
                         "an empty cache (Tq == Tk) or one new token (Tq == 1) is supported")
    # Tq == Tk: a prefill, causal (one query over one key is the same either way). A bool even
    # while torch.onnx.export traces (step 19), where Tq == Tk holds for every length
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p,
                                          is_causal=bool(Tq == Tk), **gqa)


class MultiHeadAttention(nn.Module):
    """Causal self-attention with `n_heads` heads of size `d_model // n_heads`.

    (B, T, d_model) float in, (B, T, d_model) float out, T <= max_seq_len. Output position t
    depends on input positions 0..t only.
    """

    def __init__(self, d_model, n_heads, max_seq_len, dropout=0.0):
        check_sizes(d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len)  # given
        check_heads(d_model, n_heads, dropout)  # n_heads divides d_model; 0 <= dropout < 1
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_size = d_model // n_heads
        self.max_seq_len = max_seq_len
        self.dropout = dropout
        self.use_sdpa = True  # False: the explicit path below, same numbers, more memory
        self.qkv = nn.Linear(d_model, 3 * d_model)  # q, k and v of every head in one matmul
        self.proj = nn.Linear(d_model, d_model)  # mixes the heads' outputs back together
        self.proj.residual_output = True  # added onto the residual stream: step 07's init_weights
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        # mask[i, j] is True where query i may look at key j (j <= i). Not saved with the
        # weights (persistent=False): it is rebuilt from max_seq_len.
        mask = torch.tril(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x, cache=None, layer=0):
        """(B, T, d_model) -> (B, T, d_model).

        With a `cache` (step 12), x holds only the new positions; their keys and values are
        stored as layer `layer`'s, and the queries attend over every position kept so far.
        """
        B, T, C = check_activations(x, self.d_model, self.max_seq_len)
        q, k, v = self.qkv(x).split(C, dim=2)  # each (B, T, C)
        # (B, T, C) -> (B, T, n_heads, head_size) -> (B, n_heads, T, head_size):
        # the head becomes a batch dimension, so every head attends independently.
        q = q.view(B, T, self.n_heads, self.head_size).transpose(1, 2)
        k = k.view(B, T, self.n_heads, self.head_size).transpose(1, 2)
        v = v.view(B, T, self.n_heads, self.head_size).transpose(1, 2)
        q, k = self.position(q, k, cache.length if cache is not None else 0)
        if cache is not None:
            k, v = cache.append(layer, k, v)  # (B, n_heads, length + T, head_size)
        if self.use_sdpa or cache is not None:
            y = attend(q, k, v, self.dropout if self.training else 0.0, self.bias(T, k.shape[2]))
        else:
            y = self.explicit_attention(q, k, v)
        # (B, n_heads, T, head_size) -> (B, T, n_heads, head_size) -> (B, T, C): heads side by side
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.proj(y))

    def position(self, q, k, start):
        """Where a variant tells q and k their positions (step 14's RoPE); here they carry none:
        step 04's embedding added the positions to x already."""
        return q, k

    def bias(self, n_queries, n_keys):
        """An additive score bias for `attend` (step 14's ALiBi), or None: the plain causal mask."""
        return None

    def explicit_attention(self, q, k, v):
        """softmax(q kᵀ / √head_size, causal) v for (B, n_heads, T, head_size) q, k, v."""
        T = q.size(2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_size)  # (B, n_heads, T, T)
        scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))  # no looking ahead
        weights = self.attn_dropout(F.softmax(scores, dim=-1))  # each row sums to 1
        return weights @ v  # (B, n_heads, T, head_size)


def draw_heads(path, batch_size=2, seq_len=16, d_model=64, n_heads=4):
    """Draw how (B, T, C) becomes (B, heads, T, head_size) and back, at the check's sizes."""
    from tiny_llm.course.diagrams import heads_diagram
    from tiny_llm.files import save_figure

    sizes = {"B": batch_size, "T": seq_len, "d": d_model, "heads": n_heads}
    return save_figure(heads_diagram(sizes), path, dpi=90)


def why_heads(steps=200):
    """Learn to name two tokens at every position, the first one and the previous one, with 1, 2
    and 4 heads of the same 32 dimensions: the same parameters, the same steps."""
    from tiny_llm.attention import learn_pattern  # step 05's short fit

    def first_and_previous(idx):
        return [idx[:, :1].expand_as(idx), idx.roll(1, dims=1)]

    print(f"{'task':<8} name the first token and the one before each position: 16 random "
          f"tokens, 8 positions, {steps} Adam steps")
    print(f"{'heads':<8} {'params':<8} {'loss':<6} {'first named right':<19} previous named right")
    for n_heads in (1, 2, 4):
        seed_everything(0)
        attn = MultiHeadAttention(d_model=32, n_heads=n_heads, max_seq_len=8)
        params = sum(p.numel() for p in attn.parameters())
        loss, (first, previous) = learn_pattern(attn, first_and_previous, steps)
        print(f"{n_heads:<8} {params:<8,} {loss:<6.2f} {first:<19.2f} {previous:.2f}")


def main():
    parser = argparse.ArgumentParser(description="Step 06: multi-head attention.")
    parser.add_argument("--diagram", metavar="PNG", help="draw the heads' reshape there and stop")
    parser.add_argument("--why", choices=("heads",), help="one head against several on a task "
                        "that needs two patterns at once, the same parameters and steps")
    args = parser.parse_args()
    if args.diagram:
        print(f"{'diagram':<28} {draw_heads(args.diagram)}")
        return
    if args.why:
        torch.set_num_threads(1)  # matrices this small: one thread is fastest
        return why_heads()
    seed_everything(1337)
    d_model, n_heads, max_seq_len = 64, 4, 32
    attn = MultiHeadAttention(d_model, n_heads, max_seq_len).eval()
    x = torch.randn(2, 16, d_model)  # (B, T, C)

    attn.use_sdpa = False
    y_explicit = attn(x)
    attn.use_sdpa = True
    y_sdpa = attn(x)

    x_changed = x.clone()
    x_changed[:, 10:] = torch.randn(2, 6, d_model)  # change positions 10..15 only
    y_changed = attn(x_changed)
    largest = (y_sdpa - y_explicit).abs().max().item()
    params = sum(p.numel() for p in attn.parameters())
    B, T = x.shape[:2]

    print(f"{'input':<28} {tuple(x.shape)}")
    print(f"{'heads x head_size':<28} {n_heads} x {attn.head_size} = {d_model}")
    print(f"{'output':<28} {tuple(y_sdpa.shape)}")
    print(f"{'max |sdpa - explicit|':<28} {largest:.1e}")
    print(f"{'paths agree within 1e-6':<28} {largest < 1e-6}")
    print(f"{'positions 0..9 unchanged':<28} {torch.equal(y_changed[:, :10], y_sdpa[:, :10])}")
    print(f"{'positions 10..15 changed':<28} {not torch.equal(y_changed[:, 10:], y_sdpa[:, 10:])}")
    print(f"{'score matrix (explicit)':<28} {B * n_heads * T * T:,} floats = B x heads x T x T")
    print(f"{'parameters':<28} {params:,}")
    print(f"{'4·d² + 4·d':<28} {4 * d_model**2 + 4 * d_model:,}")


if __name__ == "__main__":
    main()
