"""Solutions to the exercises of step 01 (steps/01-setup.md).

Run them:  uv run python -m solutions.ex01_device
"""

import torch

from tiny_llm.autograd import softmax_grad_size, three_gradients
from tiny_llm.device import matmul_gflops, pick_device, seed_everything


def exercise_1_matmul_flops(n):
    """An (n, n) @ (n, n) matmul: n² outputs, each n multiplies and n adds -> 2·n³ FLOPs."""
    return 2 * n**3


def exercise_2_same_seed_same_numbers(seed=7):
    """Seeding twice with the same number replays the same draws; another seed does not."""
    seed_everything(seed)
    first = torch.randn(5)
    seed_everything(seed)
    again = torch.randn(5)
    seed_everything(seed + 1)
    other = torch.randn(5)
    return torch.equal(first, again), torch.equal(first, other)


def exercise_3_gflops_by_size(sizes=(32, 128, 512)):
    """Small matmuls are dominated by fixed overhead, so GFLOP/s climbs with the size."""
    device = pick_device("cpu")
    return {n: matmul_gflops(device, n=n, repeats=20) for n in sizes}


def exercise_4_gradient_rows_sum_to_zero():
    """Each row of the cross-entropy's gradient is (softmax - one_hot) / N: the softmax sums to
    1 and so does the one-hot row, so every row sums to 0. Raising all of a row's scores by the
    same amount changes no probability, so the loss cannot change along that direction."""
    logits = torch.tensor([[2.0, 1.0, 0.1, -1.0, 0.5], [0.0, 0.0, 0.0, 0.0, 0.0],
                           [5.0, -3.0, 1.0, 1.0, 0.0]])
    grads = three_gradients(logits, torch.tensor([0, 2, 4]))
    return grads["autograd"].sum(dim=-1)


def exercise_5_where_the_softmax_saturates(step=0.5):
    """The first scale (on a grid of `step`) at which the gradient through the softmax falls
    under 1% of its size at scale 1: between 8 and 16 for the check's four scores."""
    at_one, scale = softmax_grad_size(1.0), 1.0
    while softmax_grad_size(scale) >= 0.01 * at_one:
        scale += step
    return scale


if __name__ == "__main__":
    print("exercise 1:", f"{exercise_1_matmul_flops(512):,} FLOPs for n = 512")
    print("exercise 2:", "same seed equal, other seed equal =", exercise_2_same_seed_same_numbers())
    for n, rate in exercise_3_gflops_by_size().items():
        print("exercise 3:", f"n = {n:<4} {rate:8.1f} GFLOP/s")
    print("exercise 4:", "gradient row sums", exercise_4_gradient_rows_sum_to_zero().tolist())
    scale = exercise_5_where_the_softmax_saturates()
    print("exercise 5:", f"under 1% of scale 1's gradient from scale {scale}")
