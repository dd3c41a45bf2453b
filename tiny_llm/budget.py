"""Shared helper: train for a wall-clock budget, with a learning-rate schedule that still ends.

A schedule that decays needs to know its last step, and a budget gives seconds, not steps. So
a budgeted run measures its own pace over its first updates (inside the warmup, whose learning
rates do not depend on the last step), plans the step count that fits the rest of the budget,
evaluations included, and prices it again as it goes from the latest pace: a machine that gets
busier (or quieter) moves the end, and a budget is a deadline: when time runs out the decay
comes sooner, and when not one more update fits the run ends there. With warmup-stable-decay
the learning rate is the peak until the decay starts, so a moved end changes no step already
taken. The plan is written into the run's settings (max_steps) at every save. The console
hears of a new plan only when it moves by more than 5%, at most once every 30 s.
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
    its warmup (see fit_warmup)."""
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


REPRICE_EVERY = 10  # at most this many updates between two pricings (every one near the end)
PACE_WINDOW = 20  # the pace is the median of the latest step times: load shows in 10 steps,
RECENT = 3  # or of the latest 3 if slower: a machine that gets busier shows at once
REPLAN_SLACK = 0.01  # a new plan replaces the old one when it moves the end by more than 1%
SAY_SLACK = 0.05  # a `budget` line when the plan moved by more than 5% since the last one,
SAY_EVERY_S = 30  # at most one every 30 s: the progress bar (or line) shows the plan meanwhile
USEFUL_STEPS = 300  # fewer updates leave the main job's model far from sentences: val 6.1 at
# 22 steps, 3.74 at 332, on the busy laptop; the 10-minute record's 3.74 came at step 400


def budget_steps(cfg, step, seconds, step_seconds, eval_seconds, cap=0):
    """The step count at which the time budget runs out: the `step` updates done in `seconds`,
    plus as many more as fit at the measured pace, evaluations included (at most `cap`).

    600 s budget, 20 steps done in 10 s, 0.2 s a step, 2 s an evaluation every 200 steps:
    20 + (600 - 10 - 2) / (0.2 + 2 / 200) = 20 + 2,800 = 2,820 steps.
    """
    left = cfg.time_budget - seconds - eval_seconds  # the last evaluation is always made
    more = max(0, int(left / (step_seconds + eval_seconds / cfg.eval_interval) + 1e-9))
    return min(cap or math.inf, step + more)


def step_times(records, since=0):
    """Each latest update's seconds, from the log's clock: the gaps between the records of the
    steps from `since` on (where this process started: a resumed run's earlier time is spent,
    not a pace), from the latest `busy` record on (device.py changed the threads there) while
    that leaves two, and no further back than the pace needs. The first gap after a start is
    the first step, one-off costs and all.

    records at 0, 1.0, 1.2, 1.9 s, an evaluation of 0.5 s at step 2 -> [1.0, 0.2, 0.2]."""
    latest = itertools.islice(reversed(records), PACE_WINDOW + 5)  # not a long run's whole log
    mine = list(itertools.takewhile(lambda r: r["step"] >= since, latest))[::-1]
    changed = [i for i, r in enumerate(mine) if "busy" in r and len(mine) - i > 2]
    mine = mine[changed[-1] if changed else 0 :]
    return [b["time_s"] - a["time_s"] - a.get("eval_s", 0.0)  # an evaluation is priced apart
            for a, b in itertools.pairwise(mine)]


def measured_pace(records, since=0):
    """(seconds per step, seconds per evaluation, one-off seconds, the latest step's seconds)
    from the log. The pace is the median of the latest PACE_WINDOW step times, or of the latest
    RECENT if that is slower; the first three steps are left out (allocation, torch.compile)
    while later ones are there, and their time beyond the pace is the one-off cost. The
    evaluation's time is the latest one."""
    times = step_times(records, since)
    if not times:  # no update timed yet
        return None, 0.0, 0.0, None
    steady = times[3:] or times[1:] or times
    pace = max(statistics.median(steady[-PACE_WINDOW:]), statistics.median(steady[-RECENT:]))
    one_off = sum(t - pace for t in times[: len(times) - len(steady)])
    return pace, eval_time(records), one_off, times[-1]


def eval_time(records, bound=math.inf):
    """An evaluation's seconds: the median of the latest three, step 0's left out once a later
    one is timed (the first pays one-off costs, and on a busy machine it can take ten times as
    long): evaluations of 16.3 s (step 0), 1.4 s and 1.5 s -> 1.45 s. With step 0's alone, at
    most `bound` (an evaluation's forward passes cannot take longer than training steps do)."""
    latest = itertools.islice(((r["step"], r["eval_s"]) for r in reversed(records)
                               if "eval_s" in r), 4)
    timed = list(latest)
    later = [s for step, s in timed if step > 0]
    if later:
        return statistics.median(later[:3])
    return min(timed[0][1], bound) if timed else 0.0  # none in old logs


class Budget:
    """The plan of a budgeted run: the step count at which --time-budget runs out, priced after
    every update of this process from its own steps.

    A new plan is taken when it moves the end by more than 1% at a pricing (every REPRICE_EVERY
    updates, more often in the last 100, every update in the last 20), or at once when the rest
    would take more than twice its time; when not one more update fits, the run ends at this
    one: time is up. A `budget` line says the first plan, then a plan that moved by more than
    SAY_SLACK since the last line, SAY_EVERY_S after it at the soonest.
    `agree` averages a number over the processes of one run (step 16), so every rank takes the
    same plan at the same step. The plan is written into cfg (max_steps): the decay ends there.
    """

    def __init__(self, cfg, records, step, agree=float):
        self.on, self.plan, self.cap = resumed_plan(cfg, records)
        self.since, self.priced, self.agree = step, step, agree
        self.said, self.said_at = self.plan, -math.inf  # the plan of the last `budget` line
        self.few_said = False

    def end(self, cfg):
        """The step count the run ends at, as planned now."""
        return (self.plan or self.cap or math.inf) if self.on else cfg.max_steps

    def price(self, cfg, step, records):
        """Price the rest after update `step` (records: the log, to it); returns cfg, with a
        changed plan as max_steps (the log's record of the step says so too)."""
        if not self.on:
            return cfg
        pace, eval_s, one_off, last = measured_pace(records, self.since)
        if pace is None:
            return cfg
        # eval_iters forward passes take no longer than as many training micro-batches
        bound = getattr(cfg, "eval_iters", math.inf) * pace / getattr(cfg, "grad_accum", 1)
        eval_s = eval_time(records, bound)
        seconds = records[-1]["time_s"]
        fit = round(self.agree(self.steps_that_fit(cfg, step, seconds, pace, eval_s, last)))
        if self.takes(cfg, step, fit):
            was, self.plan, self.priced = self.plan, fit, step
            if fit != self.cap:  # the budget, not --max-steps, ends the run
                records[-1].update(plan=fit, plan_cap=self.cap)
            cfg = replace(cfg, max_steps=fit)
            if was is None and fit == self.cap:  # nothing to say: --max-steps ends the run
                self.said = fit
            elif was is None:
                once = one_off if one_off >= max(1.0, 10 * pace) else 0.0
                self.say_plan(cfg, seconds, pace, eval_s, once)
                cfg = fit_warmup(cfg, step, fit)
            elif fit <= step:
                say(f"time is up: {seconds:.1f} s of the {cfg.time_budget:g} s budget are spent "
                    f"and the latest step took {last:.1f} s; the run ends at step {step:,}, not "
                    f"{was:,}, with its last evaluation and a save")
            if fit < getattr(cfg, "useful_steps", USEFUL_STEPS) and fit != self.cap \
                    and not self.few_said:
                self.few_said = True
                self.too_few(cfg, step, seconds, pace, eval_s, fit)
        if self.said and step < self.plan and abs(self.plan - self.said) > SAY_SLACK * self.said \
                and seconds - self.said_at >= SAY_EVERY_S:  # quiet output: moves that count
            self.say_plan(cfg, seconds, pace, eval_s)
        return cfg

    def say_plan(self, cfg, seconds, pace, eval_s, once=0.0):
        """The `budget` line of the plan, with the one it replaces (and one-off seconds)."""
        spent = f" ({once:.1f} s of them once, in the first steps)" if once else ""
        was = "" if self.said is None else f", was {self.said:,}"
        say(f"{cfg.time_budget:g} s: {pace * 1000:,.0f} ms per step and {eval_s:.1f} s per "
            f"evaluation after {seconds:.1f} s{spent}, so {self.plan:,} steps{was}")
        self.said, self.said_at = self.plan, seconds

    def steps_that_fit(self, cfg, step, seconds, pace, eval_s, last):
        """budget_steps at the pace; or `step`, time is up, when the next update would end past
        the budget were it as slow as the latest. With one update timed (one-off costs and
        all), only a budget already spent ends the run."""
        if step - self.since < 2 and (self.plan is not None or pace_steps(cfg) > 1):
            pace = last = 1e-9
        if budget_steps(cfg, step, seconds, max(pace, last), eval_s, self.cap) <= step:
            return step
        return budget_steps(cfg, step, seconds, pace, eval_s, self.cap)

    def takes(self, cfg, step, fit):
        """Whether the plan `fit`, priced after update `step`, replaces the current one."""
        if fit == self.plan:
            return False
        if fit <= step:  # not one more update fits: time is up
            return True
        timed = step - self.since >= 2  # the first update paid one-off costs: a second is needed
        if self.plan is None:  # the first plan: after the pace steps, or earlier if they do
            first = self.since + pace_steps(cfg)  # not fit
            return step >= first or timed and fit < first
        if not timed:
            return False
        due = step - self.priced >= max(1, min(REPRICE_EVERY, (self.plan - step) // 10))
        late = fit - step < (self.plan - step) / 2  # the rest would take twice its time
        return late or due and abs(fit - self.plan) > REPLAN_SLACK * self.plan

    def too_few(self, cfg, step, seconds, pace, eval_s, fit):
        """Say, before the minutes are spent, that the plan is too short to be of use, with the
        budget that would do, priced from a measured pace: the first three updates pay one-off
        costs, so with fewer timed after them the line names no minutes."""
        few = f"only {fit:,} update{'s' * (fit != 1)} fit in {cfg.time_budget:g} s"
        if step - self.since <= 3:  # no steady update timed yet: a price would be the one-offs'
            say(f"{few}, before the run's pace could be measured (its first updates pay one-off "
                f"costs), and a model needs a few hundred to write sentences. Give it a few "
                "minutes, or pass --time-budget 0 --max-steps N for N updates however long they "
                "take")
            return
        need = seconds + (USEFUL_STEPS - step) * (pace + eval_s / cfg.eval_interval) + eval_s
        say(f"{few} at this pace, "
            f"and a model needs a few hundred to write sentences: {USEFUL_STEPS} take about "
            f"--time-budget {math.ceil(need / 60)}m here. Give it that, train when the machine "
            "is quieter, or pass --time-budget 0 --max-steps N for N updates however long they "
            "take")


def say(text):
    """A `budget` line on standard output, above the progress bar."""
    tqdm.write(f"{'budget':<12} {text}", file=sys.stdout)


def fit_warmup(cfg, step, steps):
    """The first plan, `steps` updates, told to a warmup it cannot hold: cfg, with a warmup of a
    quarter of the plan (never below the steps already taken), so the run still reaches its
    peak and decays; or, when the budget is spent inside the warmup, the same cfg."""
    warmup = max(min(step, cfg.warmup_steps), steps // 4)
    if steps <= step < cfg.warmup_steps:
        say(f"{cfg.time_budget:g} s is spent inside the {cfg.warmup_steps}-step warmup: the run "
            f"ends at step {step:,}, with no decay. Give a longer --time-budget or fewer "
            "--warmup-steps")
    elif warmup < cfg.warmup_steps:
        say(f"{cfg.time_budget:g} s is too short for the {cfg.warmup_steps}-step warmup: the "
            f"warmup shrinks to {warmup} steps of the {steps:,}, so the learning rate still "
            "comes down. Give a longer --time-budget or fewer --warmup-steps")
        cfg = replace(cfg, warmup_steps=warmup)
    return cfg
