"""Shared helper: a training run's command line, apart from the loop it starts.

Every field of step 10's TrainConfig is a flag (--max-steps for max_steps); a preset may bring
its own recipe (the gpu preset's batch and learning rate), and flags given still win. --resume
reads the saved run's settings, refuses a change to what its weights fix, and a run that stops
early says the command that continues it.
"""

import argparse
import importlib.util
import shlex
from dataclasses import fields, replace
from pathlib import Path

from tiny_llm.budget import parse_duration
from tiny_llm.checkpoint import resumed_config
from tiny_llm.paths import RUNS_DIR

# A preset's own training recipe, where the defaults (chosen on the 2-core CPU) do not suit it;
# flags given still win. `gpu`: 4x the CPU's tokens per step, a lower peak for a model 20x the
# size, compiled where Triton is. Not yet run on a GPU (docs/troubleshooting.md).
RECIPES = {"gpu": dict(batch_size=64, lr=3e-3,
                       compile=importlib.util.find_spec("triton") is not None)}

# What a checkpoint fixes (its weights and optimizer state fit only these): --resume refuses others.
FIXED_ON_RESUME = ("model", "preset", "dropout", "optimizer")


def check_resume_settings(cfg, saved, path):
    """Raise if cfg changes a setting FIXED_ON_RESUME from what the run saved in `path` holds."""
    changed = [f"--{name} {getattr(cfg, name)} (the run has {saved[name]})"
               for name in FIXED_ON_RESUME if name in saved and getattr(cfg, name) != saved[name]]
    if changed:
        accepted = [f"--{f.name.replace('_', '-')}" for f in fields(cfg)
                    if f.name not in (*FIXED_ON_RESUME, "resume")]
        raise ValueError(
            f"--resume cannot change what the run in {path} fixed: {', '.join(changed)}. "
            f"With --resume, leave out {', '.join('--' + n for n in FIXED_ON_RESUME)}; it "
            f"accepts {', '.join(accepted)} and --sample-tokens. To train another model, start "
            "a new run with another --out")


def resume_command(cfg):
    """The command that continues this run: the checkpoint holds every setting but the folder."""
    out = cfg.out or str(RUNS_DIR / cfg.preset)
    return f"uv run python -m tiny_llm.train --resume --out {shlex.quote(out)}"


def parse_train_args(config_class):
    """(config, story length) from the command line: each field of `config_class` is a flag
    (--max-steps). With --resume the saved run's settings replace the defaults; flags given
    override them."""
    parser = argparse.ArgumentParser(description="Step 10: train a GPT (flags: TrainConfig).")
    for f in fields(config_class):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            parser.add_argument(flag, action="store_true", default=None)
        else:  # the default's type; out and device default to None and take a text
            kind = str if f.default is None else type(f.default)
            kind = parse_duration if f.name == "time_budget" else kind
            parser.add_argument(flag, type=kind, help=f"default: {f.default}")
    parser.add_argument("--sample-tokens", type=int, default=200, help="story length (0: none)")
    args = parser.parse_args()
    given = {f.name: getattr(args, f.name) for f in fields(config_class)
             if getattr(args, f.name) is not None}
    cfg = replace(config_class(), **{**RECIPES.get(given.get("preset"), {}), **given})
    if cfg.resume:
        cfg = resumed_config(Path(cfg.out or RUNS_DIR / cfg.preset) / "ckpt.pt", config_class,
                             given)
    return cfg, args.sample_tokens
