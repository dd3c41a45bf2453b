"""Shared helper: save a model (and a training run) to one file, and load it back safely.

A checkpoint is a plain dict written with `torch.save`:

    {"model": state_dict, "config": {GPTConfig fields}, "step": 1200, "tokenizer_sha256": "9f2c...",
     "model_class": "tiny_llm.gpt.GPT",                           # which class to rebuild
     "data_source": "sample",                                     # which data it was trained on
     "optimizer": ..., "rng": ..., "data_position": ..., "train_config": ...}   # training only

Only plain types and tensors go in, so it loads with `weights_only=True`: loading a checkpoint
never runs code from the file. Nor does it import a module the file names: "model_class" is
looked up in the course's own table of models, and a name outside it is refused. Steps 09
(generate) and 10 (train) and everything after use it.
Training also needs the state of every random generator, and a way to stop on Ctrl-C between
two steps, where the state is consistent and worth saving: both are here too.
"""

import importlib
import json
import pickle
import random
import re
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from tiny_llm.files import atomic_path
from tiny_llm.paths import DATA_DIR
from tiny_llm.processes import ONE_PROCESS
from tiny_llm.tokenize import load_tokenizer, tokenizer_sha256

REQUIRED_KEYS = ("model", "config", "step", "tokenizer_sha256")
# Every model class the course builds: the name a checkpoint records -> (module, class), in
# course order. A module is imported only when its class is needed (a helper of step 10 must not
# import step 15), and only a module of this table: never one whose name comes from a file.
MODEL_CLASSES = {
    "tiny_llm.gpt.GPT": ("tiny_llm.gpt", "GPT"),  # step 08
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


def build_model(class_name, config):
    """A fresh model of class `class_name` (a MODELS key or dotted path) from a config dict."""
    cls = model_class(class_name)
    return cls(cls.config_class(**config))


def save_checkpoint(path, state):
    """Write `state` to `path` atomically: a crash leaves the old file, never half of a new one."""
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise ValueError(f"a checkpoint needs the keys {REQUIRED_KEYS}; missing {missing}")
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path, device="cpu", data_dir=None):
    """Read a checkpoint dict, with tensors placed on `device`; clear errors for bad files.

    With `data_dir`, also check that its prepared tokenizer is the one the model learned.
    """
    path = Path(path)
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
        found = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(
            f"{path} is not a tiny-llm checkpoint: expected the keys {REQUIRED_KEYS}, found {found}"
        )
    if data_dir is not None:
        check_tokenizer(state, data_dir, path)
    return state


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
    return model_from_state(ckpt).to(device).eval(), ckpt


def model_from_state(ckpt):
    """The model a loaded checkpoint dict holds: its recorded class, config and weights."""
    model = build_model(ckpt.get("model_class", DEFAULT_MODEL_CLASS), ckpt["config"])
    model.load_state_dict(ckpt["model"])
    return model


def save_run(ckpt_path, model, optimizer, data_gen, step, cfg, meta, records,
             parallel=ONE_PROCESS, scaler=None):
    """Write log.jsonl, then ckpt.pt, each atomically. A run killed between the two leaves a
    log ahead of the weights, which resume_run trims; the other order would lose records."""
    model_state, optimizer_state = parallel.state_dicts(model, optimizer)  # every rank takes part
    adapters = {}
    if getattr(cfg, "lora_rank", 0):  # step 17: plain merged weights, and the adapters
        from tiny_llm.instruct import merged
        model_state, adapters = merged(model_state), {"adapters": model_state}
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
        **adapters,  # step 17: what a LoRA run resumes from
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
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextmanager
def stop_on_ctrl_c():
    """Yield an Event that Ctrl-C sets instead of raising KeyboardInterrupt, so the loop can
    finish its step and save a consistent state. A second Ctrl-C interrupts at once."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # only the main thread receives signals: Ctrl-C acts as usual there
        return

    def handler(signum, frame):
        stop.set()
        signal.signal(signal.SIGINT, previous)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
