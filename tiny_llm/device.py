"""Step 01: the machine we train on.

Three things every later step needs: which device the tensors live on, seeds so a run can be
repeated, and a feel for how fast this machine multiplies matrices (the one operation a GPT
spends almost all its time on).

Run the check:  uv run python -m tiny_llm.device
"""

import argparse
import ctypes
import inspect
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
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
    problem = cuda_problem()  # an NVIDIA GPU that this PyTorch cannot use, in words; else None
    if name is None:
        if problem:
            print(f"note: {problem}", file=sys.stderr)
        elif torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    kind = name.split(":")[0]
    if kind not in DEVICES:
        raise ValueError(f"unknown device {name!r}: use one of {', '.join(DEVICES)}")
    if kind == "cuda" and problem:
        raise ValueError(f"device {name!r} asked for, but {problem}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but this PyTorch sees no CUDA GPU: use 'cpu'")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} asked for, but MPS is not available here: use 'cpu'")
    return torch.device(name)


GPU_HELP = "docs/troubleshooting.md, 'An NVIDIA GPU, and training runs on the CPU'"


def nvidia_driver_present():
    """Whether an NVIDIA driver is installed, whatever PyTorch makes of it: Linux lists it in
    /proc/driver/nvidia, and nvidia-smi comes with it everywhere."""
    return os.path.isdir("/proc/driver/nvidia") or shutil.which("nvidia-smi") is not None


def driver_cuda_version():
    """The newest CUDA the NVIDIA driver runs, from nvidia-smi's header ("CUDA Version: 12.4"):
    "12.4", or None where nvidia-smi is missing or says nothing of it."""
    try:
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", header)
    return f"{found[1]}.{found[2]}" if found else None


def oldest_kernels():
    """The lowest compute capability this PyTorch has GPU kernels for, or None if unknown:
    (7, 5) for a build of sm_75 ... sm_120 (CUDA 13 builds: T4 and RTX 20xx onwards)."""
    archs = [re.sub(r"\D", "", a) for a in torch.cuda.get_arch_list() if a.startswith("sm_")]
    return min(divmod(int(a), 10) for a in archs) if archs else None


def cuda_problem():
    """Why this PyTorch cannot train on the NVIDIA GPU here, with the fix, as one message; None
    where there is no NVIDIA GPU, or where PyTorch can use it.

    Two cases. The driver is older than the CUDA the build was made for (uv.lock's PyTorch is
    built for CUDA 13): then torch.cuda.is_available() is False, and without this message the
    run would train on the CPU in silence. Or the GPU is older than every kernel in the build
    (CUDA 13 builds have none for a V100 or a GTX 10xx): PyTorch sees it, and fails at the
    first operation with "no kernel image is available".
    """
    build = f"PyTorch {torch.__version__}"
    if torch.cuda.is_available():
        oldest, found = oldest_kernels(), torch.cuda.get_device_capability()
        if oldest is None or found >= oldest:
            return None
        return (f"{torch.cuda.get_device_name()} has compute capability {found[0]}.{found[1]}, "
                f"and {build} has GPU kernels only from {oldest[0]}.{oldest[1]} on. Install a "
                f"PyTorch build for an older CUDA that still has them, or use --device cpu "
                f"({GPU_HELP})")
    if not nvidia_driver_present():
        return None
    if torch.version.cuda is None:
        return (f"an NVIDIA GPU is here, but {build} is built without CUDA: install a CUDA build "
                f"of PyTorch ({GPU_HELP})")
    driver = driver_cuda_version()
    runs = (f"its driver runs CUDA up to {driver}" if driver else "its driver is probably "
            "older than that (nvidia-smi's first lines say which CUDA it runs)")
    index = f"cu{driver.replace('.', '')}" if driver else "cuXYZ"
    return (f"an NVIDIA GPU is here, but {build} is built for CUDA {torch.version.cuda} and cannot "
            f"use it: {runs}. Update the driver, or install a PyTorch built for your CUDA from "
            f"https://download.pytorch.org/whl/{index} or the nearest older one PyTorch offers "
            f"({GPU_HELP})")


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


def has_bf16_hardware(device):
    """Whether `device` multiplies bfloat16 matrices in hardware. On CUDA that means compute
    capability 8.0 or later (A100, H100, RTX 30xx and newer); torch.cuda.is_bf16_supported()
    also says yes to older GPUs (a T4, an RTX 20xx) that only emulate it, unless asked not to."""
    if device.type != "cuda":
        return False  # CPUs differ chip by chip (step 13 measures); MPS: see resolve_dtype
    if "including_emulation" in inspect.signature(torch.cuda.is_bf16_supported).parameters:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.cuda.get_device_capability(device) >= (8, 0)  # a PyTorch without the flag


def resolve_dtype(device, dtype):
    """The dtype matmuls run in: "float32", "bfloat16" or "float16"; "auto" picks by device:

    CUDA with bfloat16 hardware -> bfloat16; CUDA without (T4, RTX 20xx) -> float16, which needs a
    gradient scaler (grad_scaler); MPS and CPU -> float32. On MPS float32 works on every Mac and
    PyTorch version, and half-precision autocast there has not run in this course; on a CPU
    bfloat16 is faster only on some chips (step 13 measures it).
    """
    if dtype != "auto":
        return dtype
    if device.type == "cuda":
        return "bfloat16" if has_bf16_hardware(device) else "float16"
    return "float32"


def autocast(device, dtype):
    """A context that runs matmuls in bfloat16 or float16 (weights stay float32), or does nothing.

    dtype "float32", "bfloat16", "float16" or "auto" (resolve_dtype). Steps 10 and 13 use it; on
    CPUs without AMX bfloat16 is slower than float32 (step 13 measures it).
    """
    dtype = resolve_dtype(device, dtype)
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype))


def grad_scaler(device, dtype):
    """A gradient scaler for float16 autocast; for any other dtype a disabled one (a no-op).

    float16 has 5 exponent bits: gradients below about 6e-8 round to zero. The scaler multiplies
    the loss by a large factor before backward, divides the gradients by it before the step,
    skips a step whose gradients overflowed, and adapts the factor. bfloat16 has float32's
    range and needs none of it.
    """
    enabled = resolve_dtype(device, dtype) == "float16"
    return torch.amp.GradScaler(device.type, enabled=enabled)


def fast_float32_matmuls(device):
    """On CUDA, let float32 matmuls use TF32 tensor cores (inputs rounded to 10 mantissa bits,
    sums in float32), several times faster on A100 and later; CPUs are left as they are."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")


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


def usable_cores():
    """The CPU cores this process may run on: its affinity mask where the system has one
    (Linux; a container or `taskset` can narrow it), else every core of the machine."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def pick_threads():
    """Give PyTorch one thread per usable core, unless OMP_NUM_THREADS already chose a number.
    Returns (threads, why) for the run to print. A value that is not a whole number >= 1
    (0, -1, abc) is ignored, and `why` says so: libgomp only complains, in its own words."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return torch.get_num_threads(), "OMP_NUM_THREADS"
    cores = usable_cores()
    torch.set_num_threads(cores)
    if value:
        return cores, (f"{cores} usable cores; OMP_NUM_THREADS={value!r} was ignored: it must be "
                       "a whole number >= 1")
    return cores, f"{cores} usable cores"


def activation_bytes(config, batch_size):
    """About the memory one micro-batch's forward and backward keep, in bytes (float32): per
    token, some 20 numbers of width d_model per layer, and 3 of width vocab_size for the logits.
    A rough guide (within 2x), meant to catch a batch that cannot fit at all."""
    per_token = 20 * config.d_model * config.n_layers + 3 * config.vocab_size
    return 4 * per_token * batch_size * config.max_seq_len


def memory_bytes(device):
    """The device's memory in bytes: a GPU's own, else the machine's RAM; None if unknown."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        return None


def check_batch_fits(config, batch_size, grad_accum, device):
    """Raise before a run's first step if one micro-batch of a model of `config` needs more
    memory than the device has, naming the two flags that trade memory for steps."""
    need, have = activation_bytes(config, batch_size), memory_bytes(device)
    if have is not None and need > have:
        fits = max(1, batch_size * have // (2 * need))
        raise ValueError(
            f"--batch-size {batch_size} needs about {need / 1e9:,.0f} GB for one micro-batch "
            f"of {batch_size} x {config.max_seq_len} tokens, and the {device.type} has "
            f"{have / 1e9:,.0f} GB: lower --batch-size (about {fits} fits) and raise --grad-accum "
            f"(now {grad_accum}) to keep the tokens per step")


def busy_advice(threads):
    """What to do about a busy machine, leaving out what the run already does: one thread is
    the first advice only while the run has more."""
    more = ("Try OMP_NUM_THREADS=1 (or the number of cores that are really free), or train "
            "when the machine is quieter") if threads > 1 else "Train when the machine is quieter"
    return f"{more}; docs/troubleshooting.md, 'A busy machine'"


class BusyWatch:
    """Notices a machine much slower than the run's own steps promised, and adapts to it.

    Call step() after every training step; it returns a message when something changed, else
    None. Two signs, both read from this run's clocks. On a CPU, the process got under half the
    CPU time its threads ask for over its latest `first` steps (or over its first seconds, when
    the first steps are slow: step 0's evaluation is in the first): other programs hold the
    cores, and PyTorch's threads wait for each other at every operation (two threads on a
    shared pair of cores can be ten times slower than one), so the run drops to the threads it
    really gets (torch.set_num_threads) and says so. And, anywhere, recent steps take `slower`
    times the median of the first ones: said once. The budget (budget.py) prices its plan from
    the pace the run then has.
    """

    SEEN_S = 5.0  # wall seconds of steps enough to judge the threads, however few the steps

    def __init__(self, threads, on_cpu, first=5, slower=3.0,
                 wall=time.perf_counter, cpu=time.process_time, set_threads=None):
        self.threads, self.on_cpu, self.first, self.slower = threads, on_cpu, first, slower
        self.wall, self.cpu = wall, cpu
        self.set_threads = set_threads or torch.set_num_threads
        self.last = (wall(), cpu())
        self.steps = []  # (wall seconds, CPU seconds) of each step
        self.since = 0  # the steps of the threads now (after a change: from the second on)
        self.slow_said = False

    def step(self):
        now = (self.wall(), self.cpu())
        self.steps.append((now[0] - self.last[0], now[1] - self.last[1]))
        self.last = now
        return self._fewer_threads() or self._slower()

    def _fewer_threads(self):
        """On a CPU, the threads the latest steps really got, when under half of those asked."""
        seen = self.steps[self.since :]
        if len(seen) > self.first:
            seen = seen[-self.first :]  # the first step, with its allocations, is left out
        elif sum(w for w, _ in seen) < self.SEEN_S:
            return None
        share = sum(c for _, c in seen) / max(sum(w for w, _ in seen), 1e-9)
        if not (self.on_cpu and self.threads > 1 and share < self.threads / 2):
            return None  # CPU seconds per second of wall time: the cores it really got
        asked, self.threads = self.threads, max(1, int(share))  # a core it shares: left out
        self.set_threads(self.threads)
        self.since = len(self.steps) + 1  # judge the new threads on their own steps
        return (f"busy: this run got {share:.1f} of the {asked} cores its threads ask for; other "
                f"programs hold the rest, and threads that wait for each other slow every step. "
                f"It goes on with {self.threads} thread{'s' * (self.threads > 1)}, as "
                f"OMP_NUM_THREADS={self.threads} would from the start; docs/troubleshooting.md, "
                "'A busy machine'")

    def _slower(self):
        """Recent steps `slower` times the first ones' median (the very first left out): said
        once."""
        start = max(1, self.since)
        if self.slow_said or len(self.steps) - start < self.first:
            return None
        baseline = statistics.median(w for w, _ in self.steps[start : start + self.first])
        recent = statistics.median(w for w, _ in self.steps[-3:])
        if recent <= self.slower * baseline:
            return None
        self.slow_said = True
        return (f"slow: steps now take {recent / baseline:.1f} times as long as the first "
                f"ones ({1000 * recent:.0f} ms against {1000 * baseline:.0f} ms); something "
                f"else is using this machine. {busy_advice(self.threads)}")


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
        try:
            rate = f"{matmul_gflops(device, dtype=dtype):.1f} GFLOP/s"
        except (RuntimeError, TypeError) as err:  # bfloat16 on MPS before macOS 14
            rate = f"skipped: this device cannot multiply {name} ({str(err).splitlines()[0]})"
        print(f"{'matmul ' + name:<16} {rate}")


if __name__ == "__main__":
    main()
