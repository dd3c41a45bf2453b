"""Solutions to the exercises of step 16 (steps/16-scale-out.md).

Run them:  uv run python -m solutions.ex16_scale
The ring all-reduce picture:  uv run python -m solutions.ex16_scale --plot steps/images/16-ring.png
"""

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from tiny_llm.files import save_figure  # noqa: E402
from tiny_llm.gpt import GPT, PRESETS  # noqa: E402
from tiny_llm.scale import crossover_tokens, ring_bytes  # noqa: E402


def exercise_1_small_on_4_ranks():
    """The small preset (1,350,400 parameters with the 4,096-token vocabulary) in float32 is
    5.4 MB of gradients; a ring of 4 sends 2·3/4 = 1.5 times that from each rank: 8.1 MB."""
    with torch.device("meta"):
        n = GPT(PRESETS["small"]).num_params()
    return n * 4, round(ring_bytes(n, 4))


def exercise_2_two_halves_average_to_the_whole():
    """What DDP relies on: the mean of two ranks' gradients, each of the mean loss over 4 windows,
    is the gradient of the mean loss over all 8. Returns the largest difference (rounding)."""
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    x = torch.randint(0, model.config.vocab_size, (8, 32))
    y = torch.roll(x, -1, dims=1)
    model(x, y)[1].backward()
    whole = [p.grad.clone() for p in model.parameters()]
    halves = []
    for rows in (slice(0, 4), slice(4, 8)):  # rank 0's rows, then rank 1's
        model.zero_grad()
        model(x[rows], y[rows])[1].backward()
        halves.append([p.grad.clone() for p in model.parameters()])
    return max((w - (a + b) / 2).abs().max().item()
               for w, a, b in zip(whole, *halves, strict=True))


def ring_all_reduce(values):
    """Sum `values` (one list of n chunks per rank, n ranks) around a ring, as NCCL and gloo do.

    Returns (the final chunks of every rank, the chunks each rank sent, the states after every
    step). Reduce-scatter: at step s rank r sends chunk (r - s) mod n to rank r + 1, which adds
    it to its own. After n - 1 steps rank r holds the whole sum of chunk (r + 1) mod n.
    All-gather: n - 1 more steps pass those finished chunks on around the ring."""
    n = len(values)
    chunks = [list(v) for v in values]
    states, sent = [[list(c) for c in chunks]], 0
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(n - 1):
            shift = s if phase == "reduce-scatter" else s - 1
            outgoing = [(r, (r - shift) % n, chunks[r][(r - shift) % n]) for r in range(n)]
            for r, c, value in outgoing:  # every rank sends at once: read all, then write
                nxt = (r + 1) % n
                chunks[nxt][c] = chunks[nxt][c] + value if phase == "reduce-scatter" else value
            sent += 1
            states.append([list(c) for c in chunks])
    return chunks, sent, states


def exercise_3_ring_by_hand(n=4):
    """Each rank holds n chunks of its own gradient; after the ring every rank holds the sum.
    Each rank sent 2·(n-1) chunks of 1/n of the gradients: 2·(n-1)/n of them."""
    values = [[10 * r + c for c in range(n)] for r in range(n)]
    chunks, sent, _ = ring_all_reduce(values)
    total = [sum(values[r][c] for r in range(n)) for c in range(n)]
    return all(chunks[r] == total for r in range(n)), sent


def exercise_4_crossover(n=8, flops_per_s=400e12, bytes_per_s=25e9):
    """8 GPUs at 400 TFLOP/s behind a 200 Gb/s (25 GB/s) network: below about 18,700 tokens per
    GPU per step, sending the gradients takes longer than computing them."""
    return crossover_tokens(n, flops_per_s, bytes_per_s)


def plot_ring(path, n=4):
    """Each panel: ranks (rows) by chunks (columns), how many ranks' gradients each chunk sums."""
    ones = [[1] * n for _ in range(n)]
    _, _, states = ring_all_reduce(ones)
    fig, axes = plt.subplots(1, len(states), figsize=(2.0 * len(states), 2.6))
    for i, (ax, state) in enumerate(zip(axes, states, strict=True)):
        ax.imshow(state, vmin=1, vmax=n, cmap="Blues")
        for r in range(n):
            for c in range(n):
                ax.text(c, r, state[r][c], ha="center", va="center",
                        color="white" if state[r][c] == n else "black")
        phase = "start" if i == 0 else ("reduce-scatter" if i < n else "all-gather")
        ax.set_title(f"{phase}\nstep {i}" if i else phase, fontsize=9)
        ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)], fontsize=7)
    fig.suptitle(f"ring all-reduce on {n} ranks: how many ranks' gradients each chunk holds")
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


def main():
    parser = argparse.ArgumentParser(description="Step 16 exercises.")
    parser.add_argument("--plot", help="draw the ring all-reduce to this PNG file")
    args = parser.parse_args()
    if args.plot:
        plot_ring(args.plot)
        print(f"saved {args.plot}")
        return
    grads, sent = exercise_1_small_on_4_ranks()
    print(f"1. small preset: {grads / 1e6:.1f} MB of gradients, {sent / 1e6:.1f} MB sent per rank")
    print(f"2. two halves vs the whole batch: largest difference "
          f"{exercise_2_two_halves_average_to_the_whole():.1e}")
    ok, sends = exercise_3_ring_by_hand()
    print(f"3. ring of 4: every rank holds the sum: {ok}; chunks sent per rank: {sends}")
    print(f"4. crossover, 8 GPUs behind 25 GB/s: {exercise_4_crossover():,.0f} tokens per GPU")


if __name__ == "__main__":
    main()
