"""Shared helper: train for a wall-clock budget, with a learning-rate schedule that still ends.

A cosine schedule needs to know its last step, and a budget gives seconds, not steps. So a
budgeted run measures its own pace over the first updates (all inside the warmup, whose learning
rates do not depend on the last step), then fixes the step count that fits the rest of the
budget, evaluations included, and writes it into the run's settings. From then on the run is an
ordinary run of that many steps: a resumed one continues to the same count, exactly.
Step 10's training loop uses it; `--time-budget 10m` on its command line.
"""

import argparse
import itertools
import math
import statistics
import sys
from dataclasses import replace

from tqdm import tqdm


def parse_duration(text):
    """A wall-clock duration in seconds: '600' -> 600.0, '90s' -> 90.0, '10m' -> 600.0."""
    units = {"s": 1, "m": 60, "h": 3600}
    text = str(text).strip().lower()
    number, unit = (text[:-1], units[text[-1]]) if text[-1:] in units else (text, 1)
    try:
        seconds = float(number) * unit
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r}; write 600, 600s or 10m")
    return seconds


def pace_steps(cfg):
    """How many updates measure the pace of a budgeted run: the warmup's, up to 100. Warmup
    learning rates do not depend on the step count, so fixing the count after them changes
    nothing already done."""
    return max(1, min(100, cfg.warmup_steps))


def budget_steps(cfg, step, seconds, step_seconds, eval_seconds):
    """The step count at which the time budget runs out: the `step` updates done in `seconds`,
    plus as many more as fit at the measured pace, evaluations included (at most max_steps).

    600 s budget, 20 steps done in 10 s, 0.2 s a step, 2 s an evaluation every 200 steps:
    20 + (600 - 10 - 2) / (0.2 + 2 / 200) = 20 + 2,800 = 2,820 steps.
    """
    left = cfg.time_budget - seconds - eval_seconds  # the last evaluation is always made
    more = max(0, int(left / (step_seconds + eval_seconds / cfg.eval_interval) + 1e-9))
    return min(cfg.max_steps or math.inf, step + more)


def fit_budget(cfg, step, records):
    """cfg with max_steps fixed so that the run ends when cfg.time_budget does; saved with the
    run, so --resume continues to the same count. The pace is the median wall time from one
    step's record to the next, so everything the loop does per step counts; the first two are
    left out: they include one-off costs (allocation, torch.compile)."""
    times = [r["time_s"] for r in records if r["step"] > 0]
    pace = statistics.median([b - a for a, b in itertools.pairwise(times)][2:] or [times[-1]])
    eval_s = next((r["eval_s"] for r in records if "eval_s" in r), 0.0)  # old logs lack it
    steps = budget_steps(cfg, step, records[-1]["time_s"], pace, eval_s)
    if steps == cfg.max_steps:
        return cfg  # the budget is not what ends this run: nothing to say
    tqdm.write(f"{'budget':<12} {cfg.time_budget:.0f} s: {pace * 1000:.0f} ms per step and "
               f"{eval_s:.1f} s per evaluation after {records[-1]['time_s']:.1f} s, "
               f"so {steps:,} steps", file=sys.stdout)
    if steps <= cfg.warmup_steps:  # the learning rate never comes down
        tqdm.write(f"{'budget':<12} {cfg.time_budget:g} s ends the run inside its "
                   f"{cfg.warmup_steps}-step warmup: it stops at step {steps:,}, at "
                   f"{steps / cfg.warmup_steps:.0%} of the peak learning rate, with no decay. "
                   "Give a longer --time-budget or fewer --warmup-steps", file=sys.stdout)
    return replace(cfg, max_steps=steps)
