"""Shared helper: a training run's command line, apart from the loop it starts.

Every field of step 10's TrainConfig is a flag (--max-steps for max_steps), checked once when
the config is made; a preset may bring its own recipe (the gpu preset's batch and learning
rate), and flags given still win. --resume
reads the saved run's settings, refuses a change to what its weights fix, and a run that stops
early says the command that continues it.
"""

import argparse
import importlib.util
import shlex
from dataclasses import fields, replace
from pathlib import Path

from tiny_llm.budget import parse_duration
from tiny_llm.checkpoint import model_class, resumed_config
from tiny_llm.loop_shell import check_run_length
from tiny_llm.paths import RUNS_DIR
from tiny_llm.tuning import check_tuning

# A preset's own training recipe, where the defaults (chosen on the 2-core CPU) do not suit it;
# flags given still win. `gpu`: 4x the CPU's tokens per step, a lower peak for a model 20x the
# size, compiled where Triton is. Not yet run on a GPU (docs/troubleshooting.md).
RECIPES = {"gpu": dict(batch_size=64, lr=3e-3,
                       compile=importlib.util.find_spec("triton") is not None),
           # step 15: one model's own recipe for a preset (ModernGPT's screened peak)
           ("modern", "cpu"): dict(lr=3e-3)}

def check_config(cfg):
    """Raise a clear error for a TrainConfig setting that cannot work; called once, when the
    config is made."""
    presets = model_class(cfg.model).presets  # a clear error for an unknown --model
    if cfg.preset not in presets:
        raise ValueError(f"unknown preset {cfg.preset!r} for --model {cfg.model}: choose "
                         f"one of {', '.join(presets)}")
    if cfg.optimizer not in ("adamw", "muon"):
        raise ValueError(f"optimizer must be adamw or muon, got {cfg.optimizer!r}")
    if cfg.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got "
                         f"{cfg.dtype!r}")
    check_run_length(cfg.max_steps, cfg.time_budget)  # something must end the run
    lowest = {"max_steps": 0, "batch_size": 1, "grad_accum": 1, "warmup_steps": 0, "seed": 0,
              "eval_interval": 1, "eval_iters": 1, "lr_decay_steps": 0}
    for name, low in lowest.items():
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < low:
            raise ValueError(f"{name} must be an int >= {low}, got {getattr(cfg, name)!r}")
    if not 0 <= cfg.cooldown <= 1:
        raise ValueError(f"cooldown is the fraction of the run spent decaying, from 0 "
                         f"(cosine) to 1; got {cfg.cooldown}")
    if not (0 < cfg.lr < 1 and 0 <= cfg.min_lr <= cfg.lr and cfg.weight_decay >= 0
            and cfg.grad_clip >= 0):
        raise ValueError(f"need 0 < lr < 1, 0 <= min_lr <= lr, weight_decay, grad_clip >= 0; "
                         f"got {cfg.lr}, {cfg.min_lr}, {cfg.weight_decay}, {cfg.grad_clip}")
    check_tuning(cfg)  # step 15's settings (tiny_llm/tuning.py)


# What a checkpoint fixes (its weights and optimizer state fit only these): --resume refuses others.
FIXED_ON_RESUME = ("model", "preset", "dropout", "optimizer", "muon_scale", "qk_norm", "untied",
                   "mlp", "value_embeds", "x0_mix", "logit_softcap")


def check_resume_settings(cfg, saved, path):
    """Raise if cfg changes a setting FIXED_ON_RESUME from what the run saved in `path` holds
    (a setting the config has no field for is the caller's to refuse: resumed_config does)."""
    fixed_names = tuple(name for name in FIXED_ON_RESUME + getattr(type(cfg), "fixed_on_resume",
                                                                    ()) if hasattr(cfg, name))
    shown = lambda value: "none" if value is None else value  # noqa: E731
    changed = [f"--{name.replace('_', '-')} {shown(getattr(cfg, name))} (the run has "
               f"{shown(saved[name])})" for name in fixed_names
               if name in saved and hasattr(cfg, name) and getattr(cfg, name) != saved[name]]
    if changed:
        accepted = [f"--{f.name.replace('_', '-')}" for f in own_fields_first(cfg)
                    if f.name not in (*fixed_names, "resume")]
        fixed = ", ".join("--" + n.replace("_", "-") for n in fixed_names)
        raise ValueError(
            f"--resume cannot change what the run in {path} fixed: {', '.join(changed)}. "
            f"With --resume, leave out {fixed}; it "
            f"accepts {', '.join(accepted)}. To train another model, start a new run with "
            "another --out")


def own_fields_first(config):
    """The fields of a config (class or instance), its own before those it inherits (step 15's
    Tuning): the order of --help and of the flags a message lists."""
    own = vars(config if isinstance(config, type) else type(config)).get("__annotations__", {})
    return sorted(fields(config), key=lambda f: f.name not in own)


def resume_command(cfg):
    """The command that continues this run: the checkpoint holds every setting but the folder."""
    out = cfg.out or str(RUNS_DIR / cfg.preset)
    return f"uv run python -m {cfg.command} --resume --out {shlex.quote(out)}"


def parse_train_args(config_class):
    """(config, story length) from the command line: each field of `config_class` is a flag
    (--max-steps). With --resume the saved run's settings replace the defaults; flags given
    override them."""
    parser = argparse.ArgumentParser(description="Step 10: train a GPT (flags: TrainConfig).")
    for f in own_fields_first(config_class):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):  # --qk-norm, and --no-qk-norm against a recipe's
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:  # the default's type; out and device default to None and take a text
            kind = str if f.default is None else type(f.default)
            kind = parse_duration if f.name == "time_budget" else kind
            parser.add_argument(flag, type=kind, help=f"default: {f.default}")
    parser.add_argument("--sample-tokens", type=int, default=200, help="story length (0: none)")
    args = parser.parse_args()
    given = {f.name: getattr(args, f.name) for f in fields(config_class)
             if getattr(args, f.name) is not None}
    if hasattr(config_class, "given_flags"):  # a later step's say (step 17: --init-from's model)
        given = config_class.given_flags(given)
    defaults = config_class()  # a preset's recipe, then one model's own for it (step 15)
    key = (given.get("model", defaults.model), given.get("preset", defaults.preset))
    cfg = replace(defaults, **{**RECIPES.get(key[1], {}), **RECIPES.get(key, {}), **given})
    if cfg.resume:
        cfg = resumed_config(Path(cfg.out or RUNS_DIR / cfg.preset) / "ckpt.pt", config_class,
                             given)
    return cfg, args.sample_tokens
