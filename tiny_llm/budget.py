"""Shared helper: train for a wall-clock budget, with a learning-rate schedule that still ends.

A schedule that decays needs to know its last step, and a budget gives seconds, not steps. So
a budgeted run measures its own pace over its first updates (inside the warmup, whose learning
rates do not depend on the last step), plans the step count that fits the rest of the budget,
evaluations included, and prices it again every few steps from the latest pace: a machine that
gets busier (or quieter) moves the end, and the run still stops on time. With warmup-stable-decay
the learning rate is the peak until the decay starts, so a moved end changes no step already
taken. The plan is written into the run's settings (max_steps) at every save.
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
    """How many updates a budgeted run takes before its first plan: 10, or the whole warmup if
    it is shorter. Warmup learning rates do not depend on the step count, so planning after
    them changes nothing already done; 10 is few enough that a short budget can still shrink
    its warmup (see plan_budget)."""
    return max(1, min(10, cfg.warmup_steps))


def resumed_plan(cfg, records):
    """(budgeted, plan, cap) for a run whose log so far is `records` (empty for a new run).
    A resumed budget run goes on pricing the plan it saved as max_steps; a max_steps given again
    on the command line caps it instead. budgeted: the budget, not max_steps, may end the run."""
    plans = [r for r in records if "plan" in r]
    planned = plans and plans[-1]["plan"] == cfg.max_steps  # else --max-steps was given again
    cap = plans[-1]["plan_cap"] if planned else cfg.max_steps  # a budget never runs past it
    budgeted = cfg.time_budget > 0 and pace_steps(cfg) < (cap or math.inf)
    return budgeted, cfg.max_steps if planned else None, cap


REPRICE_EVERY = 10  # updates between two pricings of the plan (DDP ranks agree at each one)
PACE_WINDOW = 20  # the pace is the median of the latest step times: load shows in 10 steps
REPLAN_SLACK = 0.01  # a new plan replaces the old one when it moves the end by more than 1%


def budget_steps(cfg, step, seconds, step_seconds, eval_seconds, cap=0):
    """The step count at which the time budget runs out: the `step` updates done in `seconds`,
    plus as many more as fit at the measured pace, evaluations included (at most `cap`).

    600 s budget, 20 steps done in 10 s, 0.2 s a step, 2 s an evaluation every 200 steps:
    20 + (600 - 10 - 2) / (0.2 + 2 / 200) = 20 + 2,800 = 2,820 steps.
    """
    left = cfg.time_budget - seconds - eval_seconds  # the last evaluation is always made
    more = max(0, int(left / (step_seconds + eval_seconds / cfg.eval_interval) + 1e-9))
    return min(cap or math.inf, step + more)


def measured_pace(records, since=0):
    """(seconds per step, seconds per evaluation) from the log: the median wall time from one
    step's record to the next over the latest PACE_WINDOW steps after step `since` (where this
    process started), so everything the loop does per step counts and a change of load shows;
    the first two after `since` are left out (one-off costs: allocation, torch.compile). The
    evaluation's time is the latest one measured."""
    times = [r["time_s"] for r in records if r["step"] > since]
    gaps = [b - a for a, b in itertools.pairwise(times)][2:][-PACE_WINDOW:]
    pace = statistics.median(gaps) if gaps else times[-1] / max(1, len(times))
    eval_s = next((r["eval_s"] for r in reversed(records) if "eval_s" in r), 0.0)  # old logs
    return pace, eval_s


def plan_budget(cfg, step, records, plan=None, since=0, cap=0, agree=float):
    """Price the budget from the pace so far: (cfg, plan), where plan is the step count at which
    the budget runs out and cfg may have a shorter warmup. `plan` is the current plan (None
    before the first); a new one is taken only when it moves the end by more than 1%, or when
    the time is up, and the run prints what changed. With warmup-stable-decay the learning rate
    is the peak until the decay starts, so moving the end changes nothing already done.

    A budget too short for its warmup shrinks the warmup to a quarter of the plan (never below
    the steps already taken), so the run still reaches its peak and decays. `agree` averages a
    number over the processes of one run (step 16), so every rank takes the same plan."""
    pace, eval_s = measured_pace(records, since)
    seconds = records[-1]["time_s"]
    steps = round(agree(budget_steps(cfg, step, seconds, pace, eval_s, cap)))
    if steps == plan or plan is None and steps == cap:
        return cfg, steps  # nothing to say: the plan holds, or --max-steps ends the run first
    if plan is not None and abs(steps - plan) <= REPLAN_SLACK * plan and steps > step:
        return cfg, plan  # the pace has not moved enough to change the plan
    why = "" if plan is None else f", was {plan:,}"
    tqdm.write(f"{'budget':<12} {cfg.time_budget:.0f} s: {pace * 1000:.0f} ms per step and "
               f"{eval_s:.1f} s per evaluation after {seconds:.1f} s, so {steps:,} steps{why}",
               file=sys.stdout)
    warmup = max(min(step, cfg.warmup_steps), steps // 4)
    if plan is None and steps <= step < cfg.warmup_steps:
        tqdm.write(f"{'budget':<12} {cfg.time_budget:g} s is spent inside the "
                   f"{cfg.warmup_steps}-step warmup: the run ends at step {step:,}, with no "
                   "decay. Give a longer --time-budget or fewer --warmup-steps", file=sys.stdout)
    elif plan is None and warmup < cfg.warmup_steps:
        tqdm.write(f"{'budget':<12} {cfg.time_budget:g} s is too short for the "
                   f"{cfg.warmup_steps}-step warmup: the warmup shrinks to {warmup} steps of "
                   f"the {steps:,}, so the learning rate still comes down. Give a longer "
                   "--time-budget or fewer --warmup-steps", file=sys.stdout)
        cfg = replace(cfg, warmup_steps=warmup)
    return cfg, steps
