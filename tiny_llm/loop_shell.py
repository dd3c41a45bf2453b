"""Shared helper: what every training loop of the course runs inside, step 10's and step 18's.

A loop's own work is its update. Around it, the same guards for every loop, so that no loop has
to earn them again:

- stop signals: Ctrl-C, SIGTERM or SIGHUP finish the update under way; the loop saves and says
  the command that continues the run (checkpoint.stop_on_ctrl_c);
- the busy watch: a machine busier than the run's first updates promised makes the run drop
  threads, and say so (device.BusyWatch);
- the time budget, priced after every update from the measured pace (budget.Budget), and the
  plan it made against the updates made, for the run's summary;
- a loss that is not a finite number is refused before the update, and weights that are not
  finite are never saved over a good checkpoint;
- the flag pairs that cannot end a run (no budget and no step limit).

The run-folder lock (processes.hold_run_folder) is taken before the shell, around the run's
set-up, and --resume's fixed settings are checked by flags.check_resume_settings.
"""

import math
import sys
from contextlib import contextmanager

import torch
from tqdm import tqdm

from tiny_llm.budget import Budget
from tiny_llm.checkpoint import stop_on_ctrl_c
from tiny_llm.device import BusyWatch


def check_run_length(max_steps, time_budget):
    """Refuse a run that nothing would end: no step limit and no time budget."""
    if max_steps == 0 and not time_budget > 0:
        raise ValueError("give the run a length: --max-steps N, or --time-budget like 10m "
                         f"(got --max-steps {max_steps} and --time-budget {time_budget:g})")


def refuse_non_finite(loss, step, fix, where=""):
    """Raise before the update when the loss is inf or nan: an update would make every weight
    nan, and the last checkpoint saved still holds the weights from before. `fix`: what to try;
    `where`: the settings the update ran with."""
    if not math.isfinite(loss):
        raise FloatingPointError(
            f"the training loss became {loss} at step {step + 1}{where}: the run diverged. {fix}; "
            "the last checkpoint saved, if any, still holds the weights from before")


class LoopShell:
    """The guards around one run's updates (see the module's docstring). Use:

        shell = LoopShell(cfg, records, step, threads, on_cpu)
        with shell.running() as stop:
            while step < shell.end(cfg):
                ... one update, its record appended ...
                cfg = shell.after_update(cfg, step, records)
                if time to save or stop.is_set():
                    shell.check_weights(model, step); save
                if stop.is_set():
                    break

    `rank` and `agree` are step 16's: rank 0 alone speaks; `agree` averages a number over the
    processes of one run, so every rank takes the same plan and the same decision."""

    def __init__(self, cfg, records, step, threads, on_cpu, rank=0, agree=float):
        self.budget = Budget(cfg, records, step, agree=agree)
        self.watch = BusyWatch(threads, on_cpu)
        self.rank, self.agree, self.started = rank, agree, step
        self.first_plan, self.stop = None, None

    @contextmanager
    def running(self):
        """The loop's block: a stop signal sets the yielded Event (stop.reason names it)."""
        with stop_on_ctrl_c() as stop:
            self.stop = stop
            yield stop

    def end(self, cfg):
        """The step count the run ends at, as planned now."""
        return self.budget.end(cfg)

    def after_update(self, cfg, step, records):
        """After update `step` (records: the log, to it): the busy watch, then the budget's
        price; returns cfg, with the plan as max_steps."""
        if warning := self.watch.step():  # a busy machine: fewer threads, or a warning
            records[-1]["busy"] = warning  # in the log; the budget's pace starts again
            if self.rank == 0:
                tqdm.write(warning, file=sys.stderr)
        cfg = self.budget.price(cfg, step, records)  # the plan, as max_steps (budget.py)
        plan = self.budget.plan
        if self.first_plan is None and plan is not None and plan != self.budget.cap:
            self.first_plan = plan  # the budget's, not --max-steps
        return cfg

    def check_weights(self, model, step):
        """Before a save: refuse weights that are not finite, so the good checkpoint stays."""
        bad = any(not torch.isfinite(getattr(p, "_local_tensor", p)).all()
                  for p in model.parameters())
        if self.agree(float(bad)) > 0:  # every rank decides alike (step 16)
            raise FloatingPointError(
                f"the weights are no longer finite numbers after step {step}: the run diverged "
                "and was not saved. Try a lower --lr; the last checkpoint saved, if any, still "
                "holds the weights from before")

    def summary(self, step):
        """The updates made against the budget's first plan: '53 made in this run, against a
        first plan of 411 (the machine was busy)'; '' when --max-steps alone set the length."""
        if self.first_plan is None:
            return ""
        busy = " (the machine was busy: see the busy line)" if self.watch.since or \
            self.watch.slow_said else ""
        return (f"{step - self.started:,} made in this run, against a first plan of "
                f"{self.first_plan - self.started:,}{busy}")
