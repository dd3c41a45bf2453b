"""Solutions to the exercises of step 13 (steps/13-speed.md).

Run them:  uv run python -m solutions.ex13_speed
"""

import resource
from dataclasses import replace

import torch

from tiny_llm.gpt import GPT, PRESETS
from tiny_llm.speed import flops_per_token, kept_memory, matmul_params, mfu
from tiny_llm.train import TrainConfig

RECORD_FLOAT32 = 5989  # tokens/s of the small preset, float32, one thread: the chapter's record


def exercise_1_flops(preset="small", max_seq_len=None):
    """(N in matmuls, training FLOPs per token, the attention term's share of them).

    A longer context leaves N as it is (positions are a lookup) and grows the attention term:
    small at max_seq_len 1,024 spends 44% of its FLOPs in attention, against 17% at 256.
    """
    config = PRESETS[preset]
    if max_seq_len is not None:
        config = replace(config, max_seq_len=max_seq_len)
    n = matmul_params(GPT(config))
    flops = flops_per_token(config, n)
    return n, flops, (flops - 6 * n) / flops


def exercise_2_mfu(tokens_per_s=5000, preset="small", peak_gflops=150):
    """5,000 tokens/s of the small preset on a 150 GFLOP/s CPU core pair: about a third."""
    return mfu(tokens_per_s, exercise_1_flops(preset)[1], peak_gflops)


def exercise_3_gpu_seconds(mfu_=0.4, peak_tflops=989, cpu_tokens_per_s=RECORD_FLOAT32,
                           budget_s=None):
    """Seconds a GPU doing peak_tflops at `mfu_` needs for the tokens the CPU trains the small
    preset on in step 10's default time budget (TrainConfig().time_budget, read, not repeated).

    An H100's dense bf16 peak is about 989 TFLOP/s. (A model this small never gets near 40% on
    such a GPU: its matmuls are too small to keep the GPU busy, and launching kernels dominates.)
    """
    budget_s = TrainConfig().time_budget if budget_s is None else budget_s
    flops = exercise_1_flops()[1] * budget_s * cpu_tokens_per_s
    return flops / (mfu_ * peak_tflops * 1e12)


def exercise_4_page_faults(mib=64):
    """Minor page faults of creating (and freeing) a `mib` MiB tensor three times, after a few
    untimed rounds, as in a training loop's steady state: with glibc's defaults and inside
    kept_memory(). Returns (default, kept)."""

    def faults():
        for _ in range(8):  # warm up: let malloc settle (it grows its heap on the first rounds)
            torch.ones(mib * 2**20 // 4)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(3):
            torch.ones(mib * 2**20 // 4)  # float32: 4 bytes each; freed at once
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    default = faults()
    with kept_memory():
        kept = faults()
    return default, kept


if __name__ == "__main__":
    n, flops, share = exercise_1_flops()
    print("exercise 1:", f"N = {n:,}, {flops:,} FLOPs per token, attention {100 * share:.1f}%; "
          f"at max_seq_len 1,024: {100 * exercise_1_flops(max_seq_len=1024)[2]:.1f}%")
    print("exercise 2:", f"MFU {100 * exercise_2_mfu():.1f}%")
    print("exercise 3:", f"{exercise_3_gpu_seconds():.3f} s on an H100 at 40% MFU for the tokens "
          f"of a {TrainConfig().time_budget:.0f} s CPU run")
    default, kept = exercise_4_page_faults()
    print("exercise 4:", f"page faults for 3 x 64 MiB: {default:,} default, {kept:,} kept")
