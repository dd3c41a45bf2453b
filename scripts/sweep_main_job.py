"""The main job's recipe sweep: every row trained for the same wall-clock budget on the same text,
then scored on the whole of valid.bin in bits per byte (chapter 10 holds the table).

Each row is a model shape and a few training settings. A row runs in its own process, so one
row's memory or compiled kernels never help or hurt the next:

  uv run python scripts/sweep_main_job.py --data-dir DIR --budget 600 --rows t64 t64-lr3e-3
  uv run python scripts/sweep_main_job.py --list

DIR holds data prepared with `uv run python -m tiny_llm.data --source TRAIN.txt --valid VALID.txt
--data-dir DIR` (add --vocab-size for the rows whose name says so: they read DIR-vocabNNNN).
One JSON line per row is appended to --out; the last line printed is that row's result.

`--clock cpu` screens rows on a machine that other jobs share: each row runs on one thread and
its budget counts the CPU seconds its own process used (time.process_time) instead of wall
seconds, so a busy neighbour slows a row down without taking steps from it. The rows of a
screening can then run two at a time, one per core (`--parallel 2`).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMALL = {"max_seq_len": 256, "d_model": 128, "n_layers": 4, "n_heads": 4}  # the old default
NANO = {"max_seq_len": 64, "d_model": 128, "n_layers": 4, "n_heads": 4}  # nanoGPT's CPU shape
# every row starts from the settings the first screening ran with, whatever TrainConfig's defaults
# are now, so that a row of chapter 10's tables means the same run today
BASE = {"optimizer": "adamw", "lr": 2e-3, "min_lr": 2e-4, "cooldown": 0.0, "momentum_warmup": 0}
ROWS = {  # name: (model shape, TrainConfig changes to BASE)
    "small-t256": (SMALL, {}),
    "t64": (NANO, {}),
    "t128": ({**NANO, "max_seq_len": 128}, {}),
    "t64-b32": (NANO, {"batch_size": 32}),
    "t64-lr3e-3": (NANO, {"lr": 3e-3, "min_lr": 3e-4}),
    "t64-lr1e-3": (NANO, {"lr": 1e-3, "min_lr": 1e-4}),
    "t64-d192": ({**NANO, "d_model": 192, "n_heads": 6}, {}),
    "t64-l6": ({**NANO, "n_layers": 6}, {}),
    "t64-drop0.1": (NANO, {"dropout": 0.1}),
    "t64-wd0.3": (NANO, {"weight_decay": 0.3}),
    "t64-vocab2048": (NANO, {}),
    "t64-compile": (NANO, {"compile": True}),
    # step 15's ModernGPT at the same size (RoPE, RMSNorm, SwiGLU at equal weights, no biases)
    "modern-t64": ({**NANO, "n_kv_heads": 4, "d_ff": 344}, {"model": "modern", "lr": 3e-3,
                                                            "min_lr": 3e-4}),
    "modern-t64-gqa": ({**NANO, "n_kv_heads": 2, "d_ff": 344}, {"model": "modern", "lr": 3e-3,
                                                                "min_lr": 3e-4}),
    "modern-t64-min0": ({**NANO, "n_kv_heads": 4, "d_ff": 344}, {"model": "modern", "lr": 3e-3,
                                                                 "min_lr": 0.0}),
    "modern-t64-wd0.3": ({**NANO, "n_kv_heads": 4, "d_ff": 344},
                         {"model": "modern", "lr": 3e-3, "min_lr": 3e-4, "weight_decay": 0.3}),
    "modern-t128-min0": ({**NANO, "max_seq_len": 128, "n_kv_heads": 4, "d_ff": 344},
                         {"model": "modern", "lr": 3e-3, "min_lr": 0.0}),
    "modern-t128-min0-lr2e-3": ({**NANO, "max_seq_len": 128, "n_kv_heads": 4, "d_ff": 344},
                                {"model": "modern", "lr": 2e-3, "min_lr": 0.0}),
    "modern-t256-min0": ({**NANO, "max_seq_len": 256, "n_kv_heads": 4, "d_ff": 344},
                         {"model": "modern", "lr": 3e-3, "min_lr": 0.0}),
    # step 10's MuonAdamW (--optimizer muon) on the modern model, lr 3e-3 for both kinds of group
    "modern-t64-muon": ({**NANO, "n_kv_heads": 4, "d_ff": 344},
                        {"model": "modern", "optimizer": "muon", "lr": 3e-3, "min_lr": 0.0}),
    "modern-t128-muon": ({**NANO, "max_seq_len": 128, "n_kv_heads": 4, "d_ff": 344},
                         {"model": "modern", "optimizer": "muon", "lr": 3e-3, "min_lr": 0.0}),
    "modern-t256-muon": ({**NANO, "max_seq_len": 256, "n_kv_heads": 4, "d_ff": 344},
                         {"model": "modern", "optimizer": "muon", "lr": 3e-3, "min_lr": 0.0}),
    # step 08's GPT with step 15's MuonAdamW: the main job's model with the better optimizer
    "t64-muon": (NANO, {"optimizer": "muon", "lr": 3e-3, "min_lr": 0.0}),
    "t128-muon": ({**NANO, "max_seq_len": 128}, {"optimizer": "muon", "lr": 3e-3, "min_lr": 0.0}),
    "t128-muon-b8": ({**NANO, "max_seq_len": 128}, {"optimizer": "muon", "lr": 3e-3, "min_lr": 0.0,
                                                    "batch_size": 8}),
    "t128-muon-lr5e-3": ({**NANO, "max_seq_len": 128}, {"optimizer": "muon", "lr": 5e-3,
                                                        "min_lr": 0.0}),
    "t128-muon-lr7e-3": ({**NANO, "max_seq_len": 128}, {"optimizer": "muon", "lr": 7e-3,
                                                        "min_lr": 0.0}),
    "t128-muon-lr1e-2": ({**NANO, "max_seq_len": 128}, {"optimizer": "muon", "lr": 1e-2,
                                                        "min_lr": 0.0}),
    "t64-lr3e-3-drop0.1": (NANO, {"lr": 3e-3, "min_lr": 3e-4, "dropout": 0.1}),
    "t64-lr3e-3-min0": (NANO, {"lr": 3e-3, "min_lr": 0.0}),
}


def run_row(name, data_dir, budget, out_dir):
    """Train row `name` for `budget` seconds, score it; return its result dict."""
    from tiny_llm.checkpoint import model_class
    from tiny_llm.data import load_meta, load_token_array
    from tiny_llm.evaluate import bits_per_byte, evaluate_loss
    from tiny_llm.train import TrainConfig, train

    shape, changes = ROWS[name]
    cls = model_class(changes.get("model", "gpt"))
    cls.presets[f"sweep-{name}"] = cls.config_class(**shape)  # this process only: the row's shape
    cfg = replace(TrainConfig(preset=f"sweep-{name}", time_budget=budget, data_dir=str(data_dir),
                              out=str(out_dir / name), device="cpu"), **BASE | changes)
    start = time.perf_counter()
    result = train(cfg)
    wall = time.perf_counter() - start
    from tiny_llm.checkpoint import model_from_checkpoint

    model, _ = model_from_checkpoint(result["checkpoint"], "cpu", data_dir=data_dir)
    scored = evaluate_loss(model, load_token_array(data_dir / "valid.bin"))
    valid = load_meta(data_dir)["valid"]
    return {"row": name, "budget_s": budget, "clock": "cpu" if time.perf_counter is
            time.process_time else "wall", "steps": result["step"], "train_s": round(wall, 1),
            "tokens": result["tokens"], "tokens_per_s": round(result["tokens"] / result["time_s"]),
            "val_loss": round(scored["loss"], 4),
            "val_bpb": round(bits_per_byte(scored["loss"], valid["tokens"], valid["bytes"]), 4),
            "params": model.num_params(), "load_avg": [round(x, 2) for x in os.getloadavg()],
            "shape": shape, "changes": changes}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="+", choices=sorted(ROWS), help="rows to run, in order")
    parser.add_argument("--list", action="store_true", help="print the rows and stop")
    parser.add_argument("--data-dir", type=Path, help="prepared data (see the docstring)")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds of training per row")
    parser.add_argument("--out", type=Path, default=Path("runs/sweep/results.jsonl"))
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--parallel", type=int, default=1, help="rows at a time (--clock cpu)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process runs one row
    args = parser.parse_args()
    if args.list:
        for name, (shape, changes) in ROWS.items():
            print(f"{name:<16} {shape} {changes}")
        return
    if args.one:
        if args.clock == "cpu":  # this child process only: one thread, its own CPU seconds
            import torch

            torch.set_num_threads(1)
            time.perf_counter = time.process_time
        data_dir = args.data_dir
        if "vocab" in args.one:
            data_dir = Path(f"{data_dir}-vocab{args.one.split('vocab')[1]}")
        print(json.dumps(run_row(args.one, data_dir, args.budget, args.out.parent)))
        return
    if not args.rows or args.data_dir is None:
        parser.error("give --data-dir and --rows (or --list)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pending, running = list(args.rows), []
    while pending or running:
        while pending and len(running) < args.parallel:
            name = pending.pop(0)
            child = [sys.executable, __file__, "--one", name, "--data-dir", str(args.data_dir),
                     "--budget", str(args.budget), "--out", str(args.out), "--clock", args.clock]
            env = {**os.environ, "OMP_NUM_THREADS": "1"} if args.clock == "cpu" else None
            running.append((name, subprocess.Popen(child, stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE, text=True, env=env)))
        name, proc = running.pop(0)
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"row {name} failed:\n{err[-2000:]}")
        line = out.strip().splitlines()[-1]
        with args.out.open("a") as f:
            f.write(line + "\n")
        row = json.loads(line)
        print(f"{name:<16} {row['steps']:>6,} steps {row['tokens_per_s']:>7,} tok/s  "
              f"val loss {row['val_loss']:.4f}  bpb {row['val_bpb']:.4f}  "
              f"load {row['load_avg'][0]}", flush=True)

if __name__ == "__main__":
    main()
