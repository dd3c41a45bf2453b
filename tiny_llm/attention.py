"""Step 05: one head of causal self-attention.

Each position asks a question (its query), every position offers a label (its key) and a
message (its value). Position t takes a weighted average of the messages of positions 0..t,
weighted by how well each key answers its query. The causal mask hides positions after t, so a
model trained to predict token t+1 cannot peek at it.

Run the check:  uv run python -m tiny_llm.attention
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from tiny_llm.checks import check_activations, check_sizes
from tiny_llm.device import seed_everything
from tiny_llm.embed import Embed
from tiny_llm.files import save_figure
from tiny_llm.paths import RUNS_DIR


class CausalSelfAttention(nn.Module):
    """A single attention head: (B, T, C) float in, (B, T, C) float out.

    With return_weights=True it also returns the (B, T, T) attention weights: row t says how
    much position t takes from each position, and sums to 1.
    """

    def __init__(self, d_model, max_seq_len):
        check_sizes(d_model=d_model, max_seq_len=max_seq_len)  # given, in tiny_llm/checks.py
        super().__init__()
        self.d_model, self.max_seq_len = d_model, max_seq_len
        self.query = nn.Linear(d_model, d_model)  # what position t is looking for
        self.key = nn.Linear(d_model, d_model)  # what position s offers to be found by
        self.value = nn.Linear(d_model, d_model)  # what position s hands over when chosen
        self.proj = nn.Linear(d_model, d_model)  # mixes the result back into the model's space
        # mask[t, s] is True where position t may look at position s, that is s <= t.
        # A buffer: it follows .to(device) with the weights, but it is not learned.
        mask = torch.tril(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x, return_weights=False, causal=True):
        """causal=False lets every position see every other one (GPT never does; the check does)."""
        B, T, C = check_activations(x, self.d_model, self.max_seq_len)  # given: rank, C, T
        q, k, v = self.query(x), self.key(x), self.value(x)  # each (B, T, C)
        # scores[b, t, s] = q_t · k_s / sqrt(C): dividing keeps their spread near 1 whatever C
        # is, so the softmax below starts soft instead of picking one position
        scores = q @ k.transpose(-2, -1) / math.sqrt(C)  # (B, T, C) @ (B, C, T) -> (B, T, T)
        if causal:
            scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))  # exp(-inf) = 0
        weights = F.softmax(scores, dim=-1)  # (B, T, T), every row sums to 1
        out = self.proj(weights @ v)  # (B, T, T) @ (B, T, C) -> (B, T, C)
        return (out, weights) if return_weights else out


def plot_weights(weights, path):
    """Draw one (T, T) attention map with each weight written in its cell; save a PNG."""
    from matplotlib.figure import Figure  # imported here: only the check draws pictures

    weights = weights.numpy()
    T = weights.shape[0]
    fig = Figure(figsize=(5, 4.4), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(weights, cmap="Blues", vmin=0, vmax=1)
    for t in range(T):
        for s in range(t + 1):
            color = "white" if weights[t, s] > 0.6 else "black"
            ax.text(s, t, f"{weights[t, s]:.2f}", ha="center", va="center", fontsize=7, color=color)
    ax.set(xlabel="key position s (looked at)", ylabel="query position t (looking)",
           title="causal attention weights, untrained head", xticks=range(T), yticks=range(T))
    fig.colorbar(image, ax=ax)
    save_figure(fig, path, dpi=100)
    return path


def order_checks(attn, T=8):
    """Show what attention alone knows about order, and what adding positions changes."""
    x = torch.randn(1, T, attn.d_model)  # stands in for T embedded tokens, no positions yet
    perm = torch.randperm(T)
    moved = (attn(x[:, perm], causal=False) - attn(x, causal=False)[:, perm]).abs().max()
    print(f"{'no mask':<16} attn(x[:, perm]) = attn(x)[:, perm]: max error {moved:.6f}")

    # one vector per position, as pos_emb holds, drawn at x's scale (its own generator, so the
    # numbers after this stay as they were) so that the effect shows before any training
    pos = torch.randn(T, attn.d_model, generator=torch.Generator().manual_seed(0))
    shuffle = torch.cat([torch.randperm(T - 1), torch.tensor([T - 1])])  # the last stays last
    for name, f in (("causal", attn), ("causal + pos", lambda x: attn(x + pos))):
        change = (f(x[:, shuffle])[:, -1] - f(x)[:, -1]).abs().max()
        print(f"{name:<16} shuffle t = 0..{T - 2}: output at t = {T - 1} changes by {change:.6f}")


def why_scale(C=64, T=8, rows=2000):
    """Print how much gradient reaches the scores through the softmax as their spread grows: the
    "no gradient" half of dividing by sqrt(C), measured with autograd on random q and k."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(rows, T, C, generator=g), torch.randn(rows, T, C, generator=g)
    upstream = torch.randn(rows, T, T, generator=g)  # what some loss sends back to the weights
    print(f"{'score spread':<24} {'largest weight':<16} {'rows one-hot':<14} gradient to scores")
    notes = {1: "÷ √C, as we do", 8: "no ÷ √C, C = 64", 16: "no ÷ √C, C = 256"}
    for spread in (1, 2, 4, 8, 16):
        scores = (q @ k.transpose(-2, -1) * spread / math.sqrt(C)).requires_grad_()
        weights = scores.softmax(dim=-1)  # (rows, T, T)
        (weights * upstream).sum().backward()  # autograd: d(loss)/d(scores) in scores.grad
        largest = weights.detach().amax(dim=-1)  # (rows, T): 1/T is even, 1 is one-hot
        label = f"{spread:<3}{notes.get(spread, '')}"
        print(f"{label:<24} {largest.mean():<16.2f} "
              f"{(largest > 0.99).float().mean():<14.2f} {scores.grad.abs().mean():.4f}")


def learn_pattern(attn, targets, steps=200, vocab_size=16, T=8):
    """Train Embed -> attn -> one Linear readout per target, with Adam, on random tokens; return
    (the last loss, per target the share of positions 1.. it names right on new tokens).
    `targets(idx)` -> [(B, T) ids]: what each readout must name at each position."""
    emb, d = Embed(vocab_size, attn.d_model, T), attn.d_model
    readouts = nn.ModuleList(nn.Linear(d, vocab_size) for _ in targets(torch.zeros(1, T)))
    params = [*emb.parameters(), *attn.parameters(), *readouts.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-2)
    for step in range(steps + 1):
        idx = torch.randint(0, vocab_size, (32 if step < steps else 512, T))
        out = attn(emb(idx))[:, 1:]  # position 0 has no token before it: left out
        losses = [F.cross_entropy(r(out).flatten(0, 1), want[:, 1:].flatten())
                  for r, want in zip(readouts, targets(idx), strict=True)]
        if step == steps:  # new tokens, no update: how often each readout is right
            return sum(losses).item(), [(r(out).argmax(-1) == want[:, 1:]).float().mean().item()
                                        for r, want in zip(readouts, targets(idx), strict=True)]
        optimizer.zero_grad()
        sum(losses).backward()
        optimizer.step()


def why_maps(steps=200):
    """Learn "name the previous token" with the three maps, and with q = k = x."""
    print(f"{'task':<16} name the token before each position: 16 random tokens, 8 positions, "
          f"{steps} Adam steps")
    for name, same in (("q, k, v maps", False), ("q = k = x", True)):
        seed_everything(0)
        attn = CausalSelfAttention(d_model=32, max_seq_len=8)
        if same:
            attn.query = attn.key = nn.Identity()  # no maps: score(t, s) = x_t · x_s
        loss, (right,) = learn_pattern(attn, lambda idx: [idx.roll(1, dims=1)], steps)
        print(f"{name:<16} loss {loss:.2f}   previous token named right {right:.2f}")


def draw_flow(path):
    """Draw x -> q, k, v -> scores -> weights -> out with the check's head and input; save a PNG."""
    from tiny_llm.course.diagrams import qkv_diagram

    seed_everything(1337)
    attn = CausalSelfAttention(d_model=64, max_seq_len=64)
    x = torch.randn(2, 8, 64)  # the check's input, drawn from the same seed
    with torch.no_grad():
        q, k = attn.query(x[0]), attn.key(x[0])  # sequence 0: (T, C) each
        scores = (q @ k.T / math.sqrt(64)).masked_fill(~attn.mask[:8, :8], float("nan"))
        weights = attn(x, return_weights=True)[1][0]  # (T, T)
    sizes = {"B": x.shape[0], "T": x.shape[1], "d": x.shape[2]}
    return save_figure(qkv_diagram(scores.numpy(), weights.numpy(), sizes), path, dpi=90)


def main():
    parser = argparse.ArgumentParser(description="Step 05: one head of causal self-attention.")
    parser.add_argument("--out", default=str(RUNS_DIR / "attention" / "weights.png"),
                        help="where to write the picture of the attention weights")
    parser.add_argument("--diagram", metavar="PNG", help="draw q, k, v and the weights there, stop")
    parser.add_argument("--why", choices=("scale", "maps"), help="take a piece away and measure: "
                        "the division by sqrt(C), or the query and key maps")
    args = parser.parse_args()
    if args.diagram:
        print(f"{'diagram':<16} {draw_flow(args.diagram)}")
        return
    if args.why:
        torch.set_num_threads(1)  # matrices this small: one thread is fastest
        return why_scale() if args.why == "scale" else why_maps()

    seed_everything(1337)
    attn = CausalSelfAttention(d_model=64, max_seq_len=64)
    x = torch.randn(2, 8, 64)
    with torch.no_grad():
        out, weights = attn(x, return_weights=True)
        n_params = sum(p.numel() for p in attn.parameters())
        print(f"{'params':<16} {n_params:,} = 4 x (64 x 64 weights + 64 biases)")
        print(f"{'input':<16} {tuple(x.shape)}")
        print(f"{'output':<16} {tuple(out.shape)}")
        print(f"{'weights':<16} {tuple(weights.shape)}")
        sums = weights.sum(dim=-1)
        print(f"{'row sums':<16} min {sums.min():.6f} max {sums.max():.6f}")
        future = weights.masked_select(~attn.mask[:8, :8]).abs().max()
        print(f"{'future weight':<16} max weight above the diagonal {future:.6f}")

        changed = x.clone()
        changed[:, 5] = torch.randn(2, 64)  # replace the vector at position 5 only
        diff = (attn(changed) - out).abs().amax(dim=(0, 2))  # (T,) largest change per position
        print(f"{'causality':<16} change x[:, 5]: max |out change| at t < 5: "
              f"{diff[:5].max():.6f}, at t >= 5: {diff[5:].max():.6f}")
        order_checks(attn)
    print(f"{'attention map':<16} drawn to {plot_weights(weights[0], args.out)}")


if __name__ == "__main__":
    main()
