"""Step 01: the machine we train on.

Three things every later step needs: which device the tensors live on, seeds so a run can be
repeated, and a feel for how fast this machine multiplies matrices (the one operation a GPT
spends almost all its time on).

Run the check:  uv run python -m tiny_llm.device
"""

import argparse
import ctypes
import os
import platform
import random
import time
from contextlib import contextmanager, nullcontext

import numpy as np
import torch

DEVICES = ("cuda", "mps", "cpu")


def pick_device(name=None):
    """Return the device to use: `name` if given, else $TINY_LLM_DEVICE, else cuda, mps, cpu.

    >>> pick_device("cpu")
    device(type='cpu')
    """
    name = name or os.environ.get("TINY_LLM_DEVICE") or None
    if name is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    kind = name.split(":")[0]
    if kind not in DEVICES:
        raise ValueError(f"unknown device {name!r}: use one of {', '.join(DEVICES)}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but this PyTorch sees no CUDA GPU: use 'cpu'")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} asked for, but MPS is not available here: use 'cpu'")
    return torch.device(name)


def seed_everything(seed):
    """Seed Python's, NumPy's and PyTorch's generators (CPU and every GPU) with one number."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA and MPS device


def synchronize(device):
    """Wait for queued GPU work to finish, so a timer measures the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@contextmanager
def kept_memory(enabled=True):
    """Within the block, glibc's malloc keeps freed memory for reuse; yields whether it could.

    PyTorch's CPU tensors come from malloc, and malloc hands any block over 32 MB (the logits:
    B·T·vocab_size floats, 64 MiB for 16 x 256 x 4096) straight back to the operating system
    when it is freed. The next step's logits then arrive as fresh pages that the kernel
    zeroes one 4 KiB page fault at a time. mallopt turns that off: no mmap, no trimming.
    Linux with glibc only; elsewhere, and for GPUs (which cache their own memory), a no-op.
    """
    try:
        libc = ctypes.CDLL("libc.so.6") if enabled else None
    except OSError:
        libc = None
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameter numbers, from <malloc.h>
    if libc is None or not libc.mallopt(M_MMAP_MAX, 0):
        yield False
        return
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)  # keep up to 1 GiB of free memory
    try:
        yield True
    finally:  # glibc's defaults again, and give back what was kept
        libc.mallopt(M_MMAP_MAX, 65536)
        libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024)
        libc.malloc_trim(0)


def autocast(device, dtype):
    """A context that runs matmuls in bfloat16 (weights stay float32), or does nothing.

    dtype "float32" or "bfloat16"; "auto" picks bfloat16 on CUDA GPUs that have it. Steps 10 and
    13 use it; on CPUs without AMX bfloat16 is slower than float32 (step 13 measures it).
    """
    if dtype == "auto":  # bfloat16 pays off on GPUs built for it; on a CPU measure first
        dtype = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else ""
    if dtype != "bfloat16":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def matmul_gflops(device, n=512, dtype=torch.float32, repeats=10):
    """Time an (n, n) @ (n, n) matmul and return GFLOP/s: 2·n³ floating point operations each."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    for _ in range(2):  # warm up: the first calls pay for allocation and kernel selection
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    seconds = (time.perf_counter() - start) / repeats
    return 2 * n**3 / seconds / 1e9


def main():
    parser = argparse.ArgumentParser(description="Step 01: versions, device, a timed matmul.")
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args()

    device = pick_device(args.device)
    seed_everything(args.seed)
    print(f"{'python':<16} {platform.python_version()}")
    print(f"{'torch':<16} {torch.__version__}")
    print(f"{'numpy':<16} {np.__version__}")
    print(f"{'device':<16} {device}")
    print(f"{'threads':<16} {torch.get_num_threads()}")
    print(f"{'seeded randn':<16} {'  '.join(f'{v:.4f}' for v in torch.randn(3).tolist())}")
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        print(f"{'matmul ' + name:<16} {matmul_gflops(device, dtype=dtype):.1f} GFLOP/s")


if __name__ == "__main__":
    main()
