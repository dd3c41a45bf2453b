"""Shared helper: save a model (and a training run) to one file, and load it back safely.

A checkpoint is a plain dict written with `torch.save`:

    {"format": 1, "model": state_dict, "config": {GPTConfig fields}, "step": 1200,
     "tokenizer_sha256": "9f2c...",
     "model_class": "tiny_llm.gpt.GPT",                           # which class to rebuild
     "data_source": "sample",                                     # which data it was trained on
     "optimizer": ..., "rng": ..., "data_position": ..., "train_config": ...}   # training only

Only plain types and tensors go in, so it loads with `weights_only=True`: loading a checkpoint
never runs code from the file. Nor does it import a module the file names: "model_class" is
looked up in the course's own table of models, and a name outside it is refused. Steps 09
(generate) and 10 (train) and everything after use it.
Every part is checked when the file is read: a config field missing or unknown is refused by
name, never filled with a default the weights did not learn with.
Training also needs the state of every random generator, and a way to stop on Ctrl-C (or
SIGTERM) between two steps, where the state is consistent and worth saving: both are here too.
"""

import importlib
import json
import os
import pickle
import random
import re
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import asdict, fields, replace
from pathlib import Path

import numpy as np
import torch

from tiny_llm.files import atomic_path, is_disk_full
from tiny_llm.paths import DATA_DIR
from tiny_llm.processes import ONE_PROCESS
from tiny_llm.tokenize import load_tokenizer, tokenizer_sha256

REQUIRED_KEYS = ("model", "config", "step", "tokenizer_sha256")
# The layout of the dict. One without "format" predates the number: read, with a note (its parts
# are checked all the same); a larger one comes from a newer tiny-llm and is refused.
FORMAT_VERSION = 1
TRAINING_KEYS = ("optimizer", "rng", "train_config")  # what --resume needs beyond the model
# Every model class the course builds: the name a checkpoint records -> (module, class), in
# course order. A module is imported only when its class is needed (a helper of step 10 must not
# import step 15), and only a module of this table: never one whose name comes from a file.
MODEL_CLASSES = {
    "tiny_llm.gpt.GPT": ("tiny_llm.gpt", "GPT"),  # step 08
    "tiny_llm.ladder.RungGPT": ("tiny_llm.ladder", "RungGPT"),  # step 11: the GPT's ancestors
    "tiny_llm.posenc_lab.LabGPT": ("tiny_llm.posenc_lab", "LabGPT"),  # step 14
    "tiny_llm.modern.ModernGPT": ("tiny_llm.modern", "ModernGPT"),  # step 15
}
MODELS = {"gpt": "tiny_llm.gpt.GPT", "modern": "tiny_llm.modern.ModernGPT"}  # --model's names
DEFAULT_MODEL_CLASS = MODELS["gpt"]  # checkpoints written before "model_class" existed


def model_class(name):
    """The class for a short name in MODELS ("gpt") or a name in MODEL_CLASSES
    ("tiny_llm.gpt.GPT"); anything else is refused without importing anything."""
    path = MODELS.get(name, name)
    if path not in MODEL_CLASSES:
        raise ValueError(f"unknown model class {name!r}: the course's models are "
                         f"{', '.join(MODELS)} (for --model) and {', '.join(MODEL_CLASSES)}; a "
                         "checkpoint naming another class is not loaded, so no code it names runs")
    module, attr = MODEL_CLASSES[path]
    return getattr(importlib.import_module(module), attr)


def class_path(model):
    """The dotted path a checkpoint records for `model`: GPT -> "tiny_llm.gpt.GPT". Classes that
    PyTorch makes are skipped: FSDP2 (step 16) turns a sharded GPT into a subclass, FSDPGPT."""
    cls = next(c for c in type(model).__mro__ if not c.__module__.startswith("torch."))
    return f"{cls.__module__}.{cls.__qualname__}"


def build_model(class_name, config, path="the checkpoint"):
    """A fresh model of class `class_name` (a MODELS key or dotted path) from a config dict,
    which must name every field of the class's config and no other (`path`: for messages)."""
    cls = model_class(class_name)
    return cls(checked_config(cls.config_class, config, path))


def checked_config(config_class, config, path="the checkpoint"):
    """config_class(**config), with every field required and no unknown one: a missing field
    must not be filled with today's default, which may differ from what the weights learned."""
    if not isinstance(config, dict):
        raise ValueError(f"{path}: its 'config' is a {type(config).__name__}, not a dict of "
                         f"{config_class.__name__} fields: the file is damaged or not tiny-llm's")
    names = [f.name for f in fields(config_class)]
    missing = [n for n in names if n not in config]
    unknown = [str(n) for n in config if n not in names]
    if missing or unknown:
        said = "; ".join(part for part in (
            missing and f"it lacks {', '.join(missing)}",
            unknown and f"it has {', '.join(unknown)}, which {config_class.__name__} does not know"
        ) if part)
        raise ValueError(f"{path} does not describe a {config_class.__name__}: {said}. It was "
                         "made by another version of tiny-llm, or edited by hand; use the "
                         "tiny-llm that wrote it, or train the model again")
    try:
        return config_class(**config)
    except (TypeError, ValueError) as err:  # a field of the wrong type or out of range
        raise ValueError(f"{path} holds a config this {config_class.__name__} refuses: {err}"
                         ) from None


def save_checkpoint(path, state):
    """Write `state` to `path` atomically: a crash leaves the old file, never half of a new one."""
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise ValueError(f"a checkpoint needs the keys {REQUIRED_KEYS}; missing {missing}")
    with atomic_path(path) as tmp:
        torch.save({"format": FORMAT_VERSION, **state}, tmp)


def load_checkpoint(path, device="cpu", data_dir=None, run=False):
    """Read a checkpoint dict, with tensors placed on `device`; clear errors for bad files.

    With `data_dir`, also check that its prepared tokenizer is the one the model learned;
    with run=True, that it holds a run's training state, for --resume.
    """
    path = Path(path)
    if path.is_dir() and (path / "ckpt.pt").is_file():  # a run folder, as --out names it
        path = path / "ckpt.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {path}: train one with `uv run python -m tiny_llm.train`"
            f" (it writes runs/<preset>/ckpt.pt) or pass the path of an existing one"
        )
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as err:  # objects that safe loading refuses to build
        raise ValueError(
            f"{path} could not be read as a checkpoint: it holds Python objects that safe "
            f"loading (weights_only=True) refuses, because building them could run code from the "
            f"file. It is not a tiny-llm checkpoint; load it unsafely only if you made it "
            f"yourself and trust it. PyTorch's whole reason:\n"
            + re.sub(r"\x1b\[[0-9;]*m", "", str(err))) from None  # without terminal colours
    except Exception as err:  # torch raises several kinds for truncated or foreign files
        raise ValueError(
            f"{path} could not be read as a checkpoint ({type(err).__name__}: {err}); "
            f"it is truncated or not a tiny-llm checkpoint: train again or pick another file"
        ) from None
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED_KEYS):
        found = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise ValueError(
            f"{path} is not a tiny-llm checkpoint: expected the keys {REQUIRED_KEYS}, found {found}"
        )
    check_parts(state, path)
    if run:
        check_training_state(state, path)
    if data_dir is not None:
        check_tokenizer(state, data_dir, path)
    return state


def check_parts(state, path):
    """Raise a ValueError naming the first part of a loaded checkpoint dict that is not what
    save_checkpoint writes: its format, the types of its parts, its model's config."""
    version = state.get("format")
    if version is None:
        print(f"note: {path} has no format version (it was written before tiny-llm numbered "
              "them): read, its parts checked one by one", file=sys.stderr)
    elif isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{path} has checkpoint format {version!r}, a {type(version).__name__}; "
                         "tiny-llm writes a whole number from 1 (this one writes "
                         f"{FORMAT_VERSION}): the file was edited by hand or damaged. If you "
                         f"edited it, set \"format\" back to {FORMAT_VERSION}; else train again")
    elif version > FORMAT_VERSION:
        raise ValueError(f"{path} has checkpoint format {version!r}; this tiny-llm reads format "
                         f"{FORMAT_VERSION} and older: it was made by another (newer) version of "
                         "tiny-llm, so update tiny-llm (git pull) or use the one that wrote it")
    kinds = {"model": dict, "config": dict, "step": int, "tokenizer_sha256": str,
             "model_class": str, "data_source": str, "optimizer": dict, "rng": dict,
             "train_config": dict}
    for key, kind in kinds.items():
        value = state.get(key, kind())
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{path}: its {key!r} is {type(value).__name__} {value!r:.40}, not a "
                             f"{kind.__name__}: the file was edited or damaged, or made by "
                             "another version of tiny-llm; train again or use another file")
    if state["step"] < 0:
        raise ValueError(f"{path}: its step is {state['step']}, below 0: the file was edited")
    if not all(isinstance(v, torch.Tensor) for v in state["model"].values()):
        raise ValueError(f"{path}: its 'model' holds something other than tensors: damaged")
    checked_config(model_class(state.get("model_class", DEFAULT_MODEL_CLASS)).config_class,
                   state["config"], path)


def check_training_state(ckpt, path):
    """Raise unless `ckpt` holds what --resume needs: the optimizer, the generators, the settings.
    A checkpoint that tiny_llm.export --import wrote holds weights only."""
    if missing := [key for key in TRAINING_KEYS if key not in ckpt]:
        source = ckpt.get("data_source", "")
        made = (f"it was {source} (tiny_llm.export --import), which writes weights only"
                if source.startswith("imported") else "it holds a model without a run")
        raise ValueError(f"{path} has no training state to resume ({', '.join(missing)} "
                         f"missing): {made}. --resume continues a run that tiny_llm.train saved; "
                         "pass the --out of such a run")
    if ckpt["train_config"].get("lora_rank") and not isinstance(ckpt.get("adapters"), dict):
        raise ValueError(f"{path} was a LoRA run (lora_rank {ckpt['train_config']['lora_rank']}) "
                         "but holds no 'adapters' to resume: the file was edited or damaged; "
                         "fine-tune again, or pass --init-from to start from its merged weights")


def check_tokenizer(ckpt, data_dir=DATA_DIR, path="the checkpoint"):
    """Raise if the checkpoint was trained with a different tokenizer from the one in `data_dir`.

    Token ids only mean something under the tokenizer that made them: id 812 may be " dog" in
    one vocabulary and " sky" in another, so a mismatch would give fluent-looking garbage.
    """
    tokenizer_file = Path(data_dir) / "tokenizer.json"
    prepared = tokenizer_sha256(tokenizer_file)
    if ckpt["tokenizer_sha256"] != prepared:
        beside = Path(path).parent / "tokenizer.json"  # where an import puts the model's own
        if beside.is_file() and tokenizer_sha256(beside) == ckpt["tokenizer_sha256"]:
            raise ValueError(f"{path} was made with the tokenizer beside it, not the one in "
                             f"{data_dir}: pass --data-dir {beside.parent}")
        source = ckpt.get("data_source", "unknown data")
        vocab = ckpt.get("config", {}).get("vocab_size")
        try:
            found = f"{load_tokenizer(tokenizer_file).get_vocab_size():,} tokens"
        except Exception:  # not a tokenizer the course can use: its hash is still shown
            found = "not a readable tokenizer"
        raise ValueError(
            f"{path} was trained with a different tokenizer (data source: {source}, tokenizer "
            f"sha256 {ckpt['tokenizer_sha256'][:12]}..., "
            + (f"{vocab:,} tokens" if vocab else "vocabulary unknown")
            + f") from the one prepared in {data_dir} (sha256 {prepared[:12]}..., {found}). "
            f"Re-prepare that data with `uv run python -m tiny_llm.data --source {source}`, or "
            f"pass --data-dir pointing at the folder the checkpoint was trained with."
        )


def model_from_checkpoint(path, device="cpu", data_dir=DATA_DIR):
    """Rebuild the model saved in `path`, whatever its class (in eval mode, on `device`);
    return (model, ckpt)."""
    ckpt = load_checkpoint(path, device=device, data_dir=data_dir)
    return model_from_state(ckpt, path).to(device).eval(), ckpt


def model_from_state(ckpt, path="the checkpoint"):
    """The model a loaded checkpoint dict holds: its recorded class, config and weights."""
    model = build_model(ckpt.get("model_class", DEFAULT_MODEL_CLASS), ckpt["config"], path)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as err:  # weights of other names or shapes than the config says
        raise ValueError(f"{path}: its weights do not fit its config "
                         f"({str(err).splitlines()[0]}): the file was edited or damaged") from None
    return model


@contextmanager
def explain_failed_save(ckpt_path, step, resume):
    """Turn a save that fails (a full disk, a folder gone) into one clear error, ending with the
    command that resumes the run (`resume`) if a checkpoint is there to resume. Every file is
    written to a temporary name and renamed when whole, so the last good save is still there."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        full = is_disk_full(err)  # torch.save says a short write in a RuntimeError
        if isinstance(err, RuntimeError) and not full:
            raise
        why = "the disk is full" if full else (getattr(err, "strerror", None) or str(err))
        fix = "Free some space" if full else "Fix that"
        then = (f"{ckpt_path} still holds the previous save, whole. {fix}, then continue with: "
                f"{resume}" if ckpt_path.exists() else "Nothing was saved before, "
                f"so there is nothing to resume: {fix}, then start the run again, as before")
        raise OSError(f"could not save step {step} in {ckpt_path.parent}: {why}. {then}") from None


def save_run(ckpt_path, model, optimizer, data_gen, step, cfg, meta, records,
             parallel=ONE_PROCESS, scaler=None, saved=None):
    """Write log.jsonl, then ckpt.pt, each atomically. A run killed between the two leaves a
    log ahead of the weights, which resume_run trims; the other order would lose records.
    `saved(model_state, cfg)` -> (weights to save, entries to add): a later step's say in what
    is saved (step 17: LoRA's merged weights, and its adapters to resume from)."""
    model_state, optimizer_state = parallel.state_dicts(model, optimizer)  # every rank takes part
    model_state, extra = saved(model_state, cfg) if saved else (model_state, {})
    if parallel.rank != 0:  # rank 0 alone writes
        return
    with atomic_path(ckpt_path.parent / "log.jsonl") as tmp:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    save_checkpoint(ckpt_path, {
        "model": model_state, "config": asdict(parallel.unwrap(model).config), "step": step,
        "model_class": class_path(parallel.unwrap(model)),
        "tokenizer_sha256": tokenizer_sha256(Path(cfg.data_dir) / "tokenizer.json"),
        "data_source": meta["source"], "optimizer": optimizer_state,
        "rng": rng_state(data_gen), "train_config": asdict(cfg),
        "scaler": scaler.state_dict() if scaler else {},  # float16's loss scale; {}: none
        # batches start at random offsets, so the data generator's state (in "rng") is the
        # position in the data; these counts say how much the run has read
        "data_position": {"batches": step * cfg.grad_accum, "tokens": records[-1]["tokens"]},
        "last_record": records[-1],  # this step's log record, should log.jsonl lose it
        "command": getattr(cfg, "command", "tiny_llm.train"),  # what --resume continues it with
        **extra,  # a later step's own entries (step 17: the adapters a LoRA run resumes from)
    })


def resume_run(ckpt, ckpt_path, model, optimizer, data_gen, parallel=ONE_PROCESS):
    """Put a resumed run's optimizer and generators back as `ckpt` saved them; return the
    log records up to its step (log.jsonl may run ahead of an interrupted save, or have lost
    its last line, which the checkpoint keeps)."""
    parallel.load_optimizer(model, optimizer, ckpt["optimizer"])
    set_rng_state(ckpt["rng"], data_gen)
    log = Path(ckpt_path).parent / "log.jsonl"
    records = [r for r in (read_log(log) if log.exists() else []) if r["step"] <= ckpt["step"]]
    if "last_record" in ckpt and (not records or records[-1]["step"] < ckpt["step"]):
        records.append(ckpt["last_record"])
    return records


def read_log(path):
    """The records of a run's log.jsonl, one dict per line. A last line cut short (by a copy or
    an editor that stopped midway: the course writes the file whole) is skipped with a notice;
    a bad line elsewhere is an error naming the file and the line."""
    lines = Path(path).read_text(errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number < len(lines):
                raise ValueError(
                    f"{path}, line {number}, is not a JSON record ({err.msg}); the checkpoint "
                    "beside it is not affected: delete that line, or the whole log to go on "
                    "without the history") from None
            last = records[-1]["step"] if records else "none"
            print(f"note: the last line of {path} is cut short ({err.msg}): skipped, so the "
                  f"log ends at step {last}", file=sys.stderr)
    return records


def resumed_config(path, config_class, given):
    """The settings (a config_class: step 10's TrainConfig) of the run saved in `path`, with the
    flags `given` over them. A setting the saved run lacks takes today's default (a field added
    since); one this tiny-llm does not know is refused. A data folder that is gone is named,
    never prepared again at its old place."""
    saved = load_checkpoint(path, run=True)
    names = {f.name for f in fields(config_class)}
    if unknown := sorted(str(n) for n in saved["train_config"] if n not in names):
        command = saved.get("command")
        if isinstance(command, str) and command != getattr(config_class, "command", command):
            raise ValueError(f"{path} is a run of `{command}` (its settings include "
                             f"{', '.join(unknown)}): continue it with the command that "
                             f"started it: uv run python -m {command} --resume --out "
                             f"{path.parent}")
        raise ValueError(f"{path} has the training settings {', '.join(unknown)}, which this "
                         "tiny-llm does not know: it was made by another version of tiny-llm")
    try:
        cfg = replace(config_class(**saved["train_config"]), **given)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path} holds training settings this tiny-llm refuses: {err}") from None
    if "data_dir" not in given and not (Path(cfg.data_dir) / "meta.json").is_file():
        moved = os.environ.get("TINY_LLM_DATA_DIR")
        if not moved or Path(moved) == Path(cfg.data_dir):
            raise FileNotFoundError(
                f"the run's data folder {cfg.data_dir} holds no prepared data any more (moved or "
                f"deleted?): point at where it is now with --data-dir NEW (or the environment "
                f"variable TINY_LLM_DATA_DIR=NEW); the checkpoint checks that its tokenizer is "
                "the one the run learned")
        print(f"note: the run's data folder {cfg.data_dir} is gone: using TINY_LLM_DATA_DIR, "
              f"{moved}", file=sys.stderr)
        cfg = replace(cfg, data_dir=moved)
    return cfg


def rng_state(data_gen):
    """Every random generator a run draws from (Python, NumPy, torch, CUDA, the batches')."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
             "data": data_gen.get_state()}  # NumPy's array travels as a tensor: weights_only
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state, data_gen):
    """Put every generator back where rng_state() found it."""
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    data_gen.set_state(state["data"])
    if "cuda" in state and torch.cuda.is_available():  # one generator per GPU
        saved, here = state["cuda"], torch.cuda.device_count()
        for index, gpu_state in enumerate(saved[:here]):
            torch.cuda.set_rng_state(gpu_state, index)
        if len(saved) != here:  # say, a run of 8 GPUs resumed on 1
            print(f"note: the checkpoint holds the random generators of {len(saved)} GPUs and "
                  f"this machine has {here}: restored {min(len(saved), here)}, so dropout on the "
                  "GPU draws other masks than the saved run would have", file=sys.stderr)


# The signals that ask a run to stop: Ctrl-C, a scheduler or `kill` (SIGTERM), a closed terminal
# (SIGHUP, which Windows does not have). Each finishes the step and saves; kill -9 cannot be caught.
STOP_SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM",
                **({signal.SIGHUP: "SIGHUP"} if hasattr(signal, "SIGHUP") else {})}


@contextmanager
def stop_on_ctrl_c():
    """Yield an Event that Ctrl-C (or SIGTERM, SIGHUP) sets instead of stopping the program, so
    the loop can finish its step and save a consistent state; stop.reason names the signal.
    A second one acts as it always does: it stops the program at once."""
    stop = threading.Event()
    stop.reason = None
    if threading.current_thread() is not threading.main_thread():
        yield stop  # only the main thread receives signals: Ctrl-C acts as usual there
        return

    def handler(signum, frame):
        stop.reason = STOP_SIGNALS[signum]
        stop.set()
        for sig, old in previous.items():
            signal.signal(sig, old)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
