"""Step 13: where does a training step's time go, and what makes it faster?

A step is a forward pass, a backward pass (about twice the forward's work) and an optimizer
update. We time each part, run the same step under a few settings, the levers PyTorch offers
(fused attention, bfloat16 autocast, a fused optimizer, reusing freed memory, torch.compile,
the batch shape), and compare every setting with what the hardware could do: MFU, model FLOPs
utilisation, is the arithmetic the model needs per second divided by the matmul speed
measured on this device.

Run the check:  uv run python -m tiny_llm.speed        (measures this machine: numbers vary)
Add --profile for PyTorch's table of the operators a step spends its time in, or --decode to
compare step 12's cached decoding with a static cache and a CUDA graph (the GPU's lever).
"""

import argparse
import os
import platform
import subprocess
import time
from dataclasses import dataclass

import torch
import torch.nn as nn

from tiny_llm.device import (  # noqa: F401 (kept_memory: step 10 uses it, step 13 explains it)
    autocast,
    fast_float32_matmuls,
    kept_memory,
    matmul_gflops,
    pick_device,
    seed_everything,
    synchronize,
)
from tiny_llm.gpt import DEFAULT_PRESET, GPT, PRESETS
from tiny_llm.muon import MuonAdamW, muon_groups
from tiny_llm.static_decode import compare_decoding


@dataclass(frozen=True)
class Setting:
    """One way to run the same training step; the default is what step 10 does on a CPU."""

    name: str = "float32"
    dtype: str = "float32"  # or "bfloat16", "float16": matmuls under autocast, weights float32
    sdpa: bool = True  # False: step 06's explicit attention (scores, mask, softmax)
    adamw: str = "for-loop"  # "foreach" or "fused": the same update in fewer, bigger kernels;
    # "muon": step 10's MuonAdamW, the main job's optimizer (Muon for the matrices in the blocks)
    keep_memory: bool = False  # CPU: malloc keeps freed memory for the next step (glibc only)
    compile: bool = False  # torch.compile the model: fused kernels, but minutes to compile


SETTINGS = (
    Setting(),
    Setting("explicit attention", sdpa=False),
    Setting("foreach AdamW", adamw="foreach"),
    Setting("fused AdamW", adamw="fused"),
    Setting("keep freed memory", keep_memory=True),
    Setting("bfloat16 autocast", dtype="bfloat16"),
    Setting("fused AdamW, kept memory", adamw="fused", keep_memory=True),
)
COMPILED = Setting("compiled, fused, kept", adamw="fused", keep_memory=True, compile=True)
HALF = Setting("float16 autocast", dtype="float16")  # timed on CUDA only: a T4 has no bf16


def matmul_params(model):
    """Parameters that take part in a matmul: every nn.Linear weight, the output head included.

    The head shares its matrix with tok_emb, but the lookup costs no arithmetic and the head's
    (B·T, d_model) @ (d_model, vocab_size) matmul does; pos_emb, biases and norms are ignored.
    """
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def flops_per_token(config, n_matmul):
    """Training FLOPs per token: 6·N + 12·n_layers·T·d_model.

    Forward: 2 FLOPs (a multiply and an add) per matmul weight, plus attention's two matmuls
    q·kᵀ and weights·v at 2·T·d_model each per layer. Backward costs twice the forward (the
    gradients for the inputs and for the weights), so 3·(2·N + 4·L·T·d) in all.
    """
    return 6 * n_matmul + 12 * config.n_layers * config.max_seq_len * config.d_model


def build(config, setting, device, seed=1337):
    """A fresh model and its optimizer for `setting`; returns (model, forward_fn, optimizer)."""
    seed_everything(seed)
    model = GPT(config).to(device).train()
    for block in model.blocks:
        block.attn.use_sdpa = setting.sdpa
    kind = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
    if setting.adamw == "muon":
        optimizer = MuonAdamW(muon_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.95))
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95),
                                      **kind[setting.adamw])
    forward = torch.compile(model) if setting.compile else model
    return model, forward, optimizer


def train_step(forward, optimizer, setting, x, y, device, clock=None):
    """One update; with a `clock` dict, add the seconds of forward, backward and optimizer."""
    marks = [time.perf_counter()]

    def mark():
        if clock is not None:  # waiting for the GPU costs a little, so only when timing parts
            synchronize(device)
            marks.append(time.perf_counter())

    with autocast(device, setting.dtype):
        _, loss = forward(x, y)
    mark()
    loss.backward()
    mark()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    mark()
    if clock is not None:
        parts = ("forward", "backward", "optimizer")
        for part, start, end in zip(parts, marks[:-1], marks[1:], strict=True):
            clock[part] = clock.get(part, 0.0) + end - start
    return loss


def measure(config, setting, batch_size, steps=3, warmup=2, device="cpu"):
    """Time `steps` updates on random ids after `warmup` untimed ones; keep the fastest.

    Other programs can only make a step slower, never faster, so the fastest step is the
    best estimate of what the machine does. Returns {"tokens_per_s", "ms_per_step",
    "forward_ms", "backward_ms", "optimizer_ms"} of that step, and the last step's "loss": the
    same seed and batch for every setting, so settings that do the same math show the same loss.
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, config.vocab_size, (2, batch_size, config.max_seq_len), generator=gen)
    x, y = x.to(device), y.to(device)
    clocks = [{} for _ in range(steps)]
    with kept_memory(setting.keep_memory):
        _, forward, optimizer = build(config, setting, device)
        for _ in range(warmup):  # the first steps allocate memory (and compile, if asked)
            train_step(forward, optimizer, setting, x, y, device)
        for clock in clocks:
            loss = train_step(forward, optimizer, setting, x, y, device, clock)
    best = min(clocks, key=lambda clock: sum(clock.values()))
    seconds = sum(best.values())
    result = {"tokens_per_s": batch_size * config.max_seq_len / seconds,
              "ms_per_step": 1000 * seconds, "loss": loss.item()}
    return result | {f"{part}_ms": 1000 * s for part, s in best.items()}


def measure_if_supported(config, setting, batch_size, steps, warmup, device):
    """measure(), or None where a GPU has no kernel for the setting (fused AdamW on an older
    MPS, say). On a CPU every setting runs, so an error there is a bug and is raised."""
    try:
        return measure(config, setting, batch_size, steps, warmup, device=device)
    except (RuntimeError, NotImplementedError):
        if device.type == "cpu":
            raise
        return None


def peak_gflops(device, dtype="float32"):
    """The device's matmul speed in `dtype`, GFLOP/s: the best of three timings of a 1024 matmul,
    or the first alone where one matmul takes over 0.1 s (bfloat16 emulated on a CPU: 3 s).
    None where the device cannot multiply in `dtype` (bfloat16 on MPS before macOS 14)."""
    kind = getattr(torch, dtype)
    try:
        first = matmul_gflops(device, n=1024, dtype=kind, repeats=1)
    except (RuntimeError, TypeError):  # PyTorch says "not supported" with these
        return None
    if 2 * 1024**3 / (first * 1e9) > 0.1:  # slow enough that one timing is precise
        return first
    return max(matmul_gflops(device, n=1024, dtype=kind, repeats=5) for _ in range(3))


def mfu(tokens_per_s, flops, peak):
    """Model FLOPs utilisation: tokens/s · FLOPs per token ÷ peak FLOP/s (peak in GFLOP/s)."""
    return tokens_per_s * flops / (peak * 1e9)


def is_emulated(peaks, dtype):
    """A 16-bit dtype whose matmul peak is under a quarter of float32's has no hardware here:
    the 1024 matmul takes a slow generic path, while a training step's smaller matmuls may
    convert to float32 and run faster than that peak. Its MFU would mean nothing."""
    return dtype != "float32" and peaks[dtype] is not None and peaks[dtype] < peaks["float32"] / 4


def mfu_text(tokens_per_s, flops, peaks, dtype):
    """MFU as the table prints it: a percentage, "emulated", or "n/a" over 100%, which only a
    wrong peak gives (timed while the machine was busy): a step cannot beat its best matmul."""
    if is_emulated(peaks, dtype):
        return "emulated"
    value = mfu(tokens_per_s, flops, peaks[dtype])
    return f"{100 * value:.1f}%" if value <= 1 else "n/a"


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "scaled_dot_product", "gemm", "flash")


def profile_step(config, setting, batch_size, device, rows=12):
    """Profile two training steps. Returns PyTorch's table of operators (most time first) and
    the share of that time spent in matmuls and attention kernels: the work that FLOPs count."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    x = torch.randint(0, config.vocab_size, (batch_size, config.max_seq_len), device=device)
    gpu = device.type == "cuda"
    with kept_memory(setting.keep_memory):
        _, forward, optimizer = build(config, setting, device)
        for _ in range(2):  # warm up outside the profile
            train_step(forward, optimizer, setting, x, x, device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
        with profile(activities=activities) as prof:
            for _ in range(2):
                train_step(forward, optimizer, setting, x, x, device)
            synchronize(device)
    events = prof.key_averages()
    own = (lambda e: e.self_device_time_total) if gpu else (lambda e: e.self_cpu_time_total)
    heavy = sum(own(e) for e in events if any(op in e.key for op in MATMUL_OPS))
    key = "self_cuda_time_total" if gpu else "self_cpu_time_total"
    return events.table(sort_by=key, row_limit=rows), heavy / max(sum(own(e) for e in events), 1)


def graph_breaks(config, batch_size=16):
    """torch._dynamo.explain over the training forward (train mode, with targets): the graphs
    torch.compile would cut it into, and why. One graph and no break: nothing runs in Python."""
    seed_everything(1337)
    model = GPT(config).train()
    x, y = torch.randint(0, config.vocab_size, (2, batch_size, config.max_seq_len))
    return torch._dynamo.explain(model)(x, y)


def cpu_name():
    """The CPU's model name, from /proc/cpuinfo (Linux) or sysctl (macOS: "Apple M2")."""
    if platform.system() == "Darwin":
        found = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                               text=True, check=False)
        return found.stdout.strip() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = (line.split(":", 1)[1] for line in f if line.startswith("model name"))
            return next(names).strip()
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def device_name(device):
    """What the device is: the GPU's name on CUDA, the chip's on a Mac (MPS) or a CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"Apple GPU of {cpu_name()}"
    return cpu_name()


def peak_text(peaks, dtype):
    """One dtype's peak as the check prints it: "float32 128 GFLOP/s", "bfloat16 0.4 GFLOP/s
    (emulated)", or "bfloat16 not supported" (peaks[dtype] None)."""
    peak = peaks[dtype]
    if peak is None:
        return f"{dtype} not supported"
    text = f"{dtype} {peak:,.0f} GFLOP/s" if peak >= 10 else f"{dtype} {peak:.1f} GFLOP/s"
    return text + (" (emulated)" if is_emulated(peaks, dtype) else "")


def print_table(rows, flops, peaks):
    """rows: [(label, setting, result)]; one aligned line each with tokens/s, parts, MFU and the
    loss of the setting's last step (result None: the device could not run the setting)."""
    print(f"{'setting':<24} {'tokens/s':>9} {'forward':>8} {'backward':>9} {'optimizer':>10} "
          f"{'MFU':>8} {'loss':>7}")
    for label, setting, r in rows:
        if r is None:
            print(f"{label:<24} not supported on this device")
            continue
        print(f"{label:<24} {r['tokens_per_s']:>9,.0f} {r['forward_ms']:>6.0f}ms "
              f"{r['backward_ms']:>7.0f}ms {r['optimizer_ms']:>8.1f}ms "
              f"{mfu_text(r['tokens_per_s'], flops, peaks, setting.dtype):>8} {r['loss']:>7.4f}")


def print_decoding(preset, device):
    """The --decode check: an untrained GPT of `preset` writes max_seq_len - 1 tokens greedily
    both ways (speed does not depend on the weights)."""
    seed_everything(1337)
    model = GPT(PRESETS[preset]).to(device).eval()
    n = model.config.max_seq_len - 1  # within the window: every step a one-token step
    (cached, static), same = compare_decoding(model, n)
    graph = "one CUDA graph a token" if device.type == "cuda" else "no graph: CUDA only"
    print(f"{'decode':<16} untrained {preset} GPT on {device.type}, {n} greedy tokens after one")
    print(f"{'cached':<16} {cached[1]:,.0f} tokens/s (step 12)")
    print(f"{'static':<16} {static[1]:,.0f} tokens/s ({graph})")
    print(f"{'same tokens':<16} {same}")


def main():
    parser = argparse.ArgumentParser(description="Step 13: time training steps.")
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS))
    parser.add_argument("--batch-size", type=int, default=16, help="windows per step, as step 10")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per setting")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile (slow)")
    parser.add_argument("--profile", action="store_true", help="print the profiler's table")
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    parser.add_argument("--graph-breaks", action="store_true",
                        help="only count the graph breaks torch.compile meets in the forward")
    parser.add_argument("--decode", action="store_true", help="only compare step 12's cached "
                        "decoding with the static cache and a CUDA graph")
    args = parser.parse_args()
    if min(args.batch_size, args.steps, args.warmup) < 1:
        parser.error(f"--batch-size, --steps and --warmup must be >= 1, got {args.batch_size}, "
                     f"{args.steps}, {args.warmup}")
    try:
        device = pick_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    config = PRESETS[args.preset]
    if args.graph_breaks:
        found = graph_breaks(config, args.batch_size)
        print(f"{'forward':<16} {args.preset} GPT in training mode, batch {args.batch_size}")
        print(f"{'graphs':<16} {found.graph_count}")
        print(f"{'graph breaks':<16} {found.graph_break_count}")
        print(f"{'operators':<16} {found.op_count}")
        for reason in found.break_reasons:
            print(f"{'break':<16} {reason.reason}")
        return
    if args.decode:
        print_decoding(args.preset, device)
        return
    fast_float32_matmuls(device)  # CUDA: float32 matmuls on TF32 tensor cores, as step 10 does
    n_matmul = matmul_params(GPT(config))
    flops = flops_per_token(config, n_matmul)
    dtypes = ("float32", "bfloat16") + (("float16",) if device.type == "cuda" else ())
    peaks = {dtype: peak_gflops(device, dtype) for dtype in dtypes}
    c, B = config, args.batch_size
    threads = torch.get_num_threads()
    print(f"{'device':<16} {device.type}: {device_name(device)}, {threads} "
          f"thread{'s' if threads > 1 else ''} ({os.cpu_count()} cores), torch {torch.__version__}")
    print(f"{'model':<16} {args.preset}: {n_matmul:,} parameters in matmuls (N)")
    print(f"{'batch':<16} {B} x {c.max_seq_len} = {B * c.max_seq_len:,} tokens per step")
    print(f"{'FLOPs/token':<16} 6·N + 12·L·T·d = {6 * n_matmul:,} + "
          f"{12 * c.n_layers * c.max_seq_len * c.d_model:,} = {flops:,}")
    print(f"{'matmul peak':<16} {', '.join(peak_text(peaks, dtype) for dtype in peaks)}")
    print()
    settings = SETTINGS + ((HALF,) if "float16" in peaks else ())
    settings += (COMPILED,) if args.compile else ()
    rows = []
    for s in settings:
        if peaks[s.dtype] is None:  # this device cannot multiply in that dtype
            rows.append((s.name, s, None))
            continue
        one = is_emulated(peaks, s.dtype)  # no hardware: a step takes seconds, so one of each
        steps, warmup = (1, 1) if one else (args.steps, args.warmup)
        rows.append((s.name, s, measure_if_supported(c, s, B, steps, warmup, device)))
    for batch in (1, 4):  # the batch shape: smaller matmuls, the same work per token
        rows.append((f"float32, batch {batch}", Setting(),
                     measure(c, Setting(), batch, args.steps, args.warmup, device=device)))
    print_table(rows, flops, peaks)
    if args.profile:
        table, share = profile_step(c, Setting(), B, device)
        print(f"\n{table}\nmatmuls and attention: {100 * share:.0f}% of the profiled time")


if __name__ == "__main__":
    main()
