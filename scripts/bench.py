"""Benchmark: where the course stands on this machine, in one table and one JSON file.

Three measurements, each against the plain way of doing the same work:
  data      our prepare pipeline (read, encode, write .bin) vs Tokenizer.encode_batch alone;
  training  the fastest setting of step 13 vs float32 eager (step 10's way on a CPU), on the
            default preset, with a short run of each to check that the loss is as good;
  kv cache  256 new tokens with step 12's cache vs step 09's generate, default preset.
It uses the TinyStories text in ../shared/data/tinystories/ when present (TINY_LLM_BENCH_TEXT
moves it), else the offline sample corpus; a GPU when there is one.

Run it:  uv run python scripts/bench.py [--json PATH] [--no-compile] [--quick]
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from tiny_llm.data import (
    encode_to_files,
    get_batch,
    load_meta,
    load_token_array,
    open_source,
    prepare_data,
)
from tiny_llm.device import fast_float32_matmuls, pick_device, seed_everything
from tiny_llm.evaluate import evaluate_loss
from tiny_llm.files import atomic_path
from tiny_llm.gpt import DEFAULT_PRESET, PRESETS
from tiny_llm.kvcache import compare
from tiny_llm.paths import DATA_DIR, REPO_ROOT
from tiny_llm.sample_stories import generate_stories
from tiny_llm.speed import (
    COMPILED,
    Setting,
    build,
    cpu_name,
    device_name,
    flops_per_token,
    kept_memory,
    matmul_params,
    measure,
    mfu,
    peak_gflops,
    profile_step,
    train_step,
)
from tiny_llm.tokenize import EOT, load_tokenizer
from tiny_llm.train import TrainConfig, lr_at

TEXT_DIR = Path(os.environ.get("TINY_LLM_BENCH_TEXT")
                or REPO_ROOT.parent / "shared" / "data" / "tinystories")
TARGETS = {"data_prep_ratio": 0.8, "train_speedup": 1.5, "kv_cache_speedup": 5.0}
MAIN_JOB = "main job: Muon, kept memory"  # what tiny_llm.train does by default on a CPU
CANDIDATES = (  # the float32 baseline first; compile is added unless --no-compile
    Setting("float32 (baseline)"),
    Setting(MAIN_JOB, adamw="muon", keep_memory=True),
    Setting("fused AdamW, kept memory", adamw="fused", keep_memory=True),  # --optimizer adamw
    Setting("bf16, fused, kept", dtype="bfloat16", adamw="fused", keep_memory=True),
)


def machine(device):
    return {"device": device.type, "device_name": device_name(device), "cpu": cpu_name(),
            "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__}


def write_sample_text(folder, n_train, n_valid):
    """The offline sample corpus as two .txt files (EOT lines between stories)."""
    paths = []
    for name, n, seed in (("train.txt", n_train, 0), ("valid.txt", n_valid, 1)):
        path = Path(folder) / name
        path.write_text("".join(f"{s}\n{EOT}\n" for s in generate_stories(n, seed)))
        paths.append(path)
    return paths


def bench_data(source, valid, tokenizer, folder, rounds=3):
    """Bytes/s of our encoding pass (read file, encode, write .bin) and of encode_batch alone,
    each the best of `rounds` (a busy machine only ever slows a round down)."""
    import datasets  # noqa: F401  (imported once here: its import time is not throughput)

    stories = [story for _, story in open_source(str(source), str(valid))()]
    n_bytes = sum(len(s.encode("utf-8")) for s in stories)
    paths = {split: Path(folder) / f"bench-{split}.bin" for split in ("train", "valid")}
    ours = raw = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        tokenizer.encode_batch(stories)
        raw = max(raw, n_bytes / (time.perf_counter() - start))
        start = time.perf_counter()
        counts = encode_to_files(tokenizer, open_source(str(source), str(valid))(), paths, False)
        seconds = time.perf_counter() - start
        ours = max(ours, sum(c["bytes"] for c in counts.values()) / seconds)
    return {"data_bytes": n_bytes, "prepare_bytes_per_s": ours, "encode_batch_bytes_per_s": raw,
            "data_prep_ratio": ours / raw}


def short_run(config, setting, data, steps, batch_size, device):
    """Train `steps` updates with `setting` (step 10's schedule, same seed and batches for every
    setting); return (model, tokens/s)."""
    cfg = TrainConfig()
    gen = torch.Generator().manual_seed(cfg.seed)
    with kept_memory(setting.keep_memory):
        model, forward, optimizer = build(config, setting, device, seed=cfg.seed)
        start = time.perf_counter()
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg.lr, cfg.min_lr, max(1, steps // 10), steps)
            x, y = get_batch(data, batch_size, config.max_seq_len, device, gen)
            train_step(forward, optimizer, setting, x, y, device)
        seconds = time.perf_counter() - start
    return model.eval(), steps * batch_size * config.max_seq_len / seconds


def bench_training(config, data_dir, device, args):
    """Time every candidate, then a short run of the baseline and of the fastest."""
    batch = TrainConfig().batch_size
    candidates = CANDIDATES + ((COMPILED,) if args.compile else ())
    timed = []
    for setting in candidates:
        start = time.perf_counter()
        result = measure(config, setting, batch, args.timed_steps, device=device)
        timed.append((setting, result | {"wall_s": time.perf_counter() - start}))
        print(f"  {setting.name:<28} {result['tokens_per_s']:>9,.0f} tokens/s", file=sys.stderr)
    base, best = timed[0], max(timed, key=lambda t: t[1]["tokens_per_s"])
    train, valid = (load_token_array(Path(data_dir) / f"{s}.bin") for s in ("train", "valid"))
    losses = {}
    for setting in dict.fromkeys([base[0], best[0]]):  # one run when the baseline is fastest
        model, _ = short_run(config, setting, train, args.run_steps, batch, device)
        losses[setting.name] = evaluate_loss(model, valid, max_batches=args.eval_batches,
                                             device=device)["loss"]
    flops = flops_per_token(config, matmul_params(build(config, base[0], "cpu")[0]))
    peak = peak_gflops(device, best[0].dtype)
    val_base, val_best = losses[base[0].name], losses[best[0].name]
    return {"train_tokens_per_s": best[1]["tokens_per_s"],
            "train_speedup": best[1]["tokens_per_s"] / base[1]["tokens_per_s"],
            "mfu": mfu(best[1]["tokens_per_s"], flops, peak),
            "fastest_setting": best[0].name, "baseline_tokens_per_s": base[1]["tokens_per_s"],
            "main_job_tokens_per_s": dict((s.name, r) for s, r in timed)[MAIN_JOB]["tokens_per_s"],
            "val_loss_baseline": val_base, "val_loss_fastest": val_best,
            "val_loss_within_2pct": abs(val_best - val_base) <= 0.02 * val_base,
            "run_steps": args.run_steps, "batch": [batch, config.max_seq_len],
            "flops_per_token": flops, "peak_gflops": peak, "peak_dtype": best[0].dtype,
            "settings": {s.name: r for s, r in timed}}, best[0]


def bench_kv(config, device, new_tokens):
    """Greedy generation of `new_tokens` after one EOT token, uncached and cached."""
    model = build(config, Setting(), device)[0].eval()
    idx = torch.zeros(1, 1, dtype=torch.long, device=device)  # a new story: just <|endoftext|>
    slow, fast, slow_s, fast_s = compare(model, idx, new_tokens, device, rounds=3)
    return {"kv_cache_speedup": slow_s / fast_s, "kv_new_tokens": new_tokens,
            "kv_uncached_tokens_per_s": new_tokens / slow_s,
            "kv_cached_tokens_per_s": new_tokens / fast_s,
            "kv_outputs_equal": torch.equal(slow, fast)}


def prepare(args, folder):
    """The text to measure on and a data folder to train from: (source, valid, data_dir, label)."""
    if args.quick:  # the data already prepared (the tests' sample), a few stories to encode
        source, valid = write_sample_text(folder, 150, 50)
        return source, valid, DATA_DIR, "sample (quick: 200 stories)"
    if (TEXT_DIR / "train-sample.txt").is_file() and (TEXT_DIR / "valid.txt").is_file():
        source, valid, label = TEXT_DIR / "train-sample.txt", TEXT_DIR / "valid.txt", "tinystories"
    else:
        source, valid = write_sample_text(folder, 5000, 500)
        label = "sample"
    start = time.perf_counter()
    prepare_data(str(source), str(valid), data_dir=Path(folder) / "data", progress=False)
    print(f"  prepared {label} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return source, valid, Path(folder) / "data", label


def run(args):
    device = pick_device(args.device)
    fast_float32_matmuls(device)  # CUDA: TF32 for float32 matmuls, as step 10 trains
    seed_everything(0)
    clock = time.perf_counter()
    result = {"machine": machine(device)}
    with tempfile.TemporaryDirectory() as folder:
        source, valid, data_dir, label = prepare(args, folder)
        tokenizer = load_tokenizer(Path(data_dir) / "tokenizer.json")
        result |= {"text": label} | bench_data(source, valid, tokenizer, folder)
        preset = "tiny" if args.quick else TrainConfig().preset  # the main job's model
        vocab_size = load_meta(data_dir)["vocab_size"]
        config = replace(PRESETS[preset], vocab_size=vocab_size)
        training, fastest = bench_training(config, data_dir, device, args)
        result |= {"preset": preset} | training
    kv_config = replace(PRESETS["tiny" if args.quick else DEFAULT_PRESET], vocab_size=vocab_size)
    result |= bench_kv(kv_config, device, 32 if args.quick else 256)  # a 256-token window
    result["targets"] = {k: {"target": t, "met": result[k] >= t} for k, t in TARGETS.items()}
    result["targets"]["train_speedup"]["met"] &= result["val_loss_within_2pct"]
    if not result["targets"]["train_speedup"]["met"] and not args.quick:
        table, share = profile_step(config, fastest, TrainConfig().batch_size, device)
        base = result["baseline_tokens_per_s"]
        result |= {"profile_of_fastest": table, "matmul_attention_share": share,
                   # if everything but matmuls and attention took no time at all:
                   "train_speedup_bound": result["train_tokens_per_s"] / share / base}
    result["bench_seconds"] = time.perf_counter() - clock
    return result


def print_table(r):
    m = r["machine"]
    met = {k: "met" if v["met"] else "NOT met" for k, v in r["targets"].items()}
    rows = [
        ("machine", f"{m['device_name']}, {m['threads']} threads, torch {m['torch']}"),
        ("text", f"{r['text']}, {r['data_bytes']:,} bytes"),
        ("data_prep_ratio", f"{r['data_prep_ratio']:.2f} (target >= 0.8, {met['data_prep_ratio']})"
         f": prepare {r['prepare_bytes_per_s'] / 1e6:.2f} MB/s, encode_batch "
         f"{r['encode_batch_bytes_per_s'] / 1e6:.2f} MB/s"),
        ("train_speedup", f"{r['train_speedup']:.2f}x (target >= 1.5, {met['train_speedup']}): "
         f"{r['fastest_setting']}"),
        ("train_tokens_per_s", f"{r['train_tokens_per_s']:,.0f} (float32 baseline "
         f"{r['baseline_tokens_per_s']:,.0f}), {r['preset']} preset, batch "
         f"{r['batch'][0]} x {r['batch'][1]}"),
        ("main job path", f"{r['main_job_tokens_per_s']:,.0f} tokens/s, "
         f"{r['main_job_tokens_per_s'] / r['baseline_tokens_per_s']:.2f}x float32 eager"),
        ("val loss", f"{r['val_loss_fastest']:.4f} fastest vs {r['val_loss_baseline']:.4f} float32 "
         f"after {r['run_steps']} steps (within 2%: {r['val_loss_within_2pct']})"),
        ("mfu", (f"{100 * r['mfu']:.1f}%" if r["mfu"] <= 1 else "n/a (over 100%: a wrong peak)")
         + f" of a {r['peak_dtype']} matmul's {r['peak_gflops']:,.0f} GFLOP/s"),
        ("kv_cache_speedup", f"{r['kv_cache_speedup']:.1f}x (target >= 5, "
         f"{met['kv_cache_speedup']}): {r['kv_new_tokens']} tokens, "
         f"{r['kv_uncached_tokens_per_s']:,.0f} -> {r['kv_cached_tokens_per_s']:,.0f} tokens/s, "
         f"outputs equal {r['kv_outputs_equal']}"),
        ("time", f"{r['bench_seconds']:.0f} s"),
    ]
    for label, text in rows:
        print(f"{label:<20} {text}")
    if "profile_of_fastest" in r:
        print(f"\nwhat limits train_speedup: matmuls and attention take "
              f"{100 * r['matmul_attention_share']:.0f}% of the fastest setting's step; if "
              f"nothing else took any time it would be {r['train_speedup_bound']:.2f}x")
        print(r["profile_of_fastest"])


def main():
    parser = argparse.ArgumentParser(description="Benchmark data prep, training and the KV cache.")
    parser.add_argument("--json", type=Path, default=Path("runs/bench.json"))
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="leave torch.compile out (it takes a minute or more to compile)")
    parser.add_argument("--quick", action="store_true",
                        help="seconds, for the tests: tiny preset, prepared data, a few steps")
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    args = parser.parse_args()
    args.timed_steps, args.run_steps, args.eval_batches = (2, 4, 2) if args.quick else (5, 60, 8)
    args.compile &= not args.quick
    try:
        result = run(args)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    print_table(result)
    with atomic_path(args.json) as tmp:
        tmp.write_text(json.dumps(result, indent=2, default=float) + "\n")
    print(f"{'json':<20} {args.json}")
    if not all(math.isfinite(result[k]) for k in TARGETS):
        raise SystemExit("error: a measurement is not a finite number")


if __name__ == "__main__":
    main()
