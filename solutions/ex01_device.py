"""Solutions to the exercises of step 01 (steps/01-setup.md).

Run them:  uv run python -m solutions.ex01_device
"""

import torch

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


if __name__ == "__main__":
    print("exercise 1:", f"{exercise_1_matmul_flops(512):,} FLOPs for n = 512")
    print("exercise 2:", "same seed equal, other seed equal =", exercise_2_same_seed_same_numbers())
    for n, rate in exercise_3_gflops_by_size().items():
        print("exercise 3:", f"n = {n:<4} {rate:8.1f} GFLOP/s")
