"""Step 15's measurement: from step 08's GPT to the modern model, one change at a time.

Every row keeps the changes above it and adds one:

    gpt            step 08's GPT at the main job's width and depth ("cpu"), context 64 (--context)
    +rmsnorm       RMSNorm instead of LayerNorm (learned positions, GELU MLP, biases: as before)
    +rope          RoPE in every attention instead of the learned position table
    +swiglu        SwiGLU (d_ff = 344) instead of the 4·d GELU MLP: the same number of weights
    +no-bias       no bias in any linear layer
    +muon          step 15's MuonAdamW instead of AdamW: Muon for the matrices inside the blocks
    +gqa           2 key/value heads for the 4 query heads
    +untied        an output head of its own instead of reusing tok_emb (this is ModernGPT
                   with tie_embeddings=False; the row above is ModernGPT's preset)

A second table (`--rows modern modern+qk-norm ...`) starts from the 10-minute CPU recipe and
tries the speedrunners' changes (step 15's last section), each on its own or several joined by
"+": a row is a base, `modern` (ModernGPT's cpu preset) or `main` (step 08's GPT as the main
job trains it), then the changes named in CHANGES.

Each row trains for the same budget of CPU seconds (one thread, so a busy machine slows the
wall clock but not the budget), its learning-rate schedule sized to end when the budget does,
then scores the whole valid.bin with tiny_llm.evaluate: bits per byte.

    uv run python scripts/ablate_modern.py --data-dir DATA --seconds 120 --seeds 1 2 --out a.jsonl
    uv run python scripts/ablate_modern.py --report a.jsonl b.jsonl --plot table.png
"""

import argparse
import json
import statistics
import time
from dataclasses import fields, replace
from pathlib import Path

import torch
import torch.nn as nn

from tiny_llm.block import MLP, init_weights
from tiny_llm.data import load_meta, load_token_array
from tiny_llm.device import seed_everything
from tiny_llm.evaluate import bits_per_byte, evaluate_loss
from tiny_llm.files import save_figure
from tiny_llm.gpt import GPT
from tiny_llm.gpt import PRESETS as GPT_PRESETS
from tiny_llm.modern import PRESETS, ModernGPT, RMSNorm
from tiny_llm.muon import muon_adamw
from tiny_llm.train import TrainConfig, lr_at, param_groups, update_weights
from tiny_llm.tuning import story_rows

ROWS = ("gpt", "+rmsnorm", "+rope", "+swiglu", "+no-bias", "+muon", "+gqa", "+untied")

# The speedrunners' changes: (ModernConfig fields, TrainConfig fields). The first five change
# the model and need ModernGPT; the last three change the recipe and apply to either base.
CHANGES = {
    "qk-norm": ({"qk_norm": True}, {}),
    "relu2": ({"mlp": "relu2", "d_ff": "4d"}, {}),  # "4d": four times the preset's width
    "value-embeds": ({"value_embeds": True}, {}),
    "x0-mix": ({"x0_mix": True}, {}),
    "softcap": ({"logit_softcap": 15.0}, {}),
    "untied": ({"tie_embeddings": False}, {}),  # an output head of its own (for lr_head=...)
    "zero-init": ({}, {"zero_init": True}),  # not a TrainConfig field: this script does it
    "momentum-warmup": ({}, {"momentum_warmup": 200}),
    "wsd": ({}, {"cooldown": 0.4}),
    "story-starts": ({}, {"story_starts": True}),  # every row starts at a story's first token
}
# A change may also set one TrainConfig field, as FIELD=VALUE: modern+wsd+lr_embed=10 gives the
# embedding ten times the peak, modern+lr=6e-3 another peak, modern+muon_scale=shape ...
# Each base's peak learning rate, with step 10's cosine and Muon's momentum fixed at 0.95 (the
# recipe before step 15 made warmup-stable-decay and the momentum warmup every run's default).
BASES = {"modern": {"lr": 3e-3, "cooldown": 0.0, "momentum_warmup": 0},
         "main": {"lr": 5e-3, "cooldown": 0.0, "momentum_warmup": 0}}


def parse_row(row):
    """'modern+relu2+wsd' -> ('modern', model fields, recipe fields); a clear error otherwise."""
    base, *names = row.split("+")
    settings = dict(n.split("=", 1) for n in names if "=" in n)
    names = [n for n in names if "=" not in n]
    known = {f.name: type(f.default) for f in fields(TrainConfig)}
    unknown = [n for n in names if n not in CHANGES] + [n for n in settings if n not in known]
    if base not in BASES or unknown or base == "main" and any(CHANGES[n][0] for n in names):
        raise SystemExit(f"error: row {row!r}: a row is modern or main, then +changes from "
                         f"{', '.join(CHANGES)} (main takes only the recipe's: zero-init, "
                         "momentum-warmup, wsd)")
    model, recipe = {}, dict(BASES[base])
    for name in names:
        model.update(CHANGES[name][0])
        recipe.update(CHANGES[name][1])
    recipe.update({k: known[k](v) for k, v in settings.items()})
    return base, model, recipe


def add_biases(model):
    """Give every linear layer but the output head a bias (zeros): the modern model, biased."""
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and m.bias is None and name != "lm_head":
            m.bias = nn.Parameter(torch.zeros(m.out_features))
    return model


def zero_residual_outputs(model):
    """The zero-init row: every weight marked residual_output (attention's wo, the MLP's w2)
    starts at 0, so each block starts as the identity. It did not earn a place in step 10's
    loop (the record), so it lives here."""
    for m in model.modules():
        if getattr(m, "residual_output", False):
            nn.init.zeros_(m.weight)
    return model


def build_speedrun(row, vocab_size, preset="cpu", context=128):
    """The model of a speedrun row, freshly initialised (seed it first), and its recipe."""
    base, changes, recipe = parse_row(row)
    if base == "main":
        return GPT(replace(GPT_PRESETS[preset], vocab_size=vocab_size, max_seq_len=context)), recipe
    config = replace(PRESETS[preset], vocab_size=vocab_size, max_seq_len=context)
    changes = {k: 4 * config.d_model if v == "4d" else v for k, v in changes.items()}
    return ModernGPT(replace(config, **changes)), recipe


def build(row, vocab_size, preset="cpu", context=64):
    """The model of one row at a preset's size and a context length, freshly initialised (seed
    it first). 64 is the context of the recorded table: the main job's before step 10's second
    screening moved it to 128."""
    gpt_config = replace(GPT_PRESETS[preset], vocab_size=vocab_size, max_seq_len=context)
    modern = replace(PRESETS[preset], vocab_size=vocab_size,  # step 08's context in every row
                     max_seq_len=gpt_config.max_seq_len, n_kv_heads=gpt_config.n_heads // 2)
    if row in ("gpt", "+rmsnorm"):
        model = GPT(gpt_config)
        if row == "+rmsnorm":  # RMSNorm's gain starts at 1, as LayerNorm's does: no re-init
            for block in model.blocks:
                block.ln_1, block.ln_2 = RMSNorm(modern.d_model), RMSNorm(modern.d_model)
            model.ln_f = RMSNorm(modern.d_model)
        return model
    if row in ("+rope", "+swiglu", "+no-bias", "+muon"):
        modern = replace(modern, n_kv_heads=modern.n_heads)  # plain multi-head attention
    if row == "+untied":
        modern = replace(modern, tie_embeddings=False)
    model = ModernGPT(modern)
    if row == "+rope":  # step 07's GELU MLP, initialised as step 07 does
        for layer in model.blocks:
            layer.feed_forward = init_weights(MLP(modern.d_model), modern.n_layers)
    return add_biases(model) if row in ("+rope", "+swiglu") else model


def train_for(model, data, seconds, cfg, muon=False, steps=0):
    """Train for `seconds` of this process's CPU time, or for `steps` updates if given; return
    (steps, cpu s, wall s, loss)."""
    if muon:
        optimizer = muon_adamw(model, cfg)
    else:
        optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr,
                                      betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(cfg.seed)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    warmup = min(100, max(1, steps // 15)) if steps else 100  # time: re-sized at step 10
    step, total, losses = 0, steps or 10**9, []
    while step < total:
        used = time.process_time() - cpu0
        if not steps and (step in (10, 50) or step % 100 == 0 and step > 0):  # fit the budget
            total = max(step + 1, int(step * seconds / used))
            warmup = min(warmup, max(1, total // 15)) if step == 10 else warmup
        if used >= seconds and not steps:
            break
        lr = lr_at(step, cfg.lr, cfg.min_lr, warmup, total, cfg.cooldown)
        losses.append(update_weights(model, optimizer, data, cfg, torch.device("cpu"), generator,
                                     lr, step))
        step += 1
    train_loss = sum(losses[-20:]) / len(losses[-20:])
    return step, time.process_time() - cpu0, time.perf_counter() - wall0, train_loss


def run_row(row, seed, args, meta, train_data, valid_data):
    """Train and score one row with one seed; returns the record of the table."""
    seed_everything(seed)
    if row in ROWS:  # the LLaMA table: AdamW above +muon, a floor of a tenth of the peak
        model = build(row, meta["vocab_size"], args.preset, args.context or 64)
        cfg = replace(TrainConfig(), seed=seed, dtype="float32", lr=args.lr, min_lr=args.lr / 10,
                      cooldown=0.0, momentum_warmup=0)  # the recorded table's cosine
        muon = ROWS.index(row) >= ROWS.index("+muon")  # every row from +muon on trains with Muon
    else:  # a speedrun row: Muon, decay to 0, as the 10-minute runs train
        model, recipe = build_speedrun(row, meta["vocab_size"], args.preset, args.context or 128)
        if recipe.pop("zero_init", False):
            zero_residual_outputs(model)
        cfg = replace(TrainConfig(), seed=seed, dtype="float32", min_lr=0.0, **recipe)
        muon = True
        train_data = story_rows(cfg, train_data, meta["eot_id"], model.config.max_seq_len)
    steps, cpu_s, wall_s, train_loss = train_for(model, train_data, args.seconds, cfg, muon,
                                                 args.steps)
    tokens = steps * cfg.batch_size * model.config.max_seq_len
    scored = evaluate_loss(model, valid_data)
    bpb = bits_per_byte(scored["loss"], meta["valid"]["tokens"], meta["valid"]["bytes"])
    return {"row": row, "seed": seed, "params": model.num_params(), "steps": steps,
            "tokens": tokens, "cpu_s": round(cpu_s, 1), "wall_s": round(wall_s, 1),
            "tokens_per_cpu_s": round(tokens / cpu_s), "train_loss": round(train_loss, 4),
            "val_loss": round(scored["loss"], 4), "val_bpb": round(bpb, 4), "lr": cfg.lr}


def read(paths):
    """Every run recorded in the JSONL files."""
    return [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line]


def rows_in(records):
    """The rows the records hold: the LLaMA table's in its order, then the others as first run."""
    present = list(dict.fromkeys(r["row"] for r in records))
    return [row for row in ROWS if row in present] + [row for row in present if row not in ROWS]


def report(paths):
    """Print one line per row: params, steps, tokens/s, val bits per byte per seed and mean."""
    records = read(paths)
    rows = rows_in(records)
    width = max(10, *(len(r) for r in rows))
    print(f"{'row':<{width}} {'params':>10} {'steps':>11} {'tok/cpu-s':>10} "
          f"{'val bpb, each seed':>20} {'mean':>7}")
    for row in rows:
        runs = sorted((r for r in records if r["row"] == row), key=lambda r: r["seed"])
        bpb = [r["val_bpb"] for r in runs]
        steps = "/".join(str(r["steps"]) for r in runs)
        speed = statistics.mean(r["tokens_per_cpu_s"] for r in runs)
        print(f"{row:<{width}} {runs[0]['params']:>10,} {steps:>11} {speed:>10,.0f} "
              f"{' '.join(f'{b:.4f}' for b in bpb):>20} {statistics.mean(bpb):>7.4f}")


def plot(paths, out):
    """Val bits per byte per row: one dot per seed, a bar at their mean; saved as a PNG."""
    from matplotlib.figure import Figure

    records = read(paths)
    rows = rows_in(records)
    fig = Figure(figsize=(8, 3.6), layout="constrained")
    ax = fig.subplots()
    for i, row in enumerate(rows):
        bpb = [r["val_bpb"] for r in records if r["row"] == row]
        ax.bar(i, statistics.mean(bpb), color="C0", alpha=0.35)
        ax.plot([i] * len(bpb), bpb, "o", color="C0")
    low = min(r["val_bpb"] for r in records)
    high = max(r["val_bpb"] for r in records)
    ax.set(xticks=range(len(rows)), xticklabels=rows, ylim=(low - 0.02, high + 0.02),
           ylabel="val bits per byte (lower is better)",
           title="From step 08's GPT to ModernGPT, one change per row (dots: seeds)")
    save_figure(fig, out, dpi=80)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="data", help="prepared data (tiny_llm.data)")
    parser.add_argument("--seconds", type=float, default=120.0, help="CPU seconds per run")
    parser.add_argument("--steps", type=int, default=0,
                        help="train every row for this many updates instead (0: --seconds)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rows", nargs="+", default=list(ROWS),
                        help=f"{' '.join(ROWS)}, or speedrun rows like modern+relu2 (CHANGES)")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak (the recorded table's)")
    parser.add_argument("--preset", default=TrainConfig.preset, choices=sorted(PRESETS),
                        help="the size of every row (both models have it)")
    parser.add_argument("--context", type=int, default=0,
                        help="every row's context length (default: 64 for the LLaMA table, "
                             "128 for speedrun rows)")
    parser.add_argument("--out", default="ablation.jsonl", help="one JSON line per run, appended")
    parser.add_argument("--report", nargs="+", metavar="JSONL", help="print the table and stop")
    parser.add_argument("--plot", metavar="PNG", help="with --report: also draw the table")
    args = parser.parse_args()
    if args.report:
        report(args.report)
        if args.plot:
            print(f"picture {plot(args.report, args.plot)}")
        return
    for row in args.rows:
        if row not in ROWS:
            parse_row(row)  # a misspelt row stops here, not after an hour of the others
    torch.set_num_threads(1)  # the budget is CPU time: one thread makes it a fair clock
    data_dir = Path(args.data_dir)
    meta = load_meta(data_dir)
    train_data, valid_data = (load_token_array(data_dir / f"{s}.bin") for s in ("train", "valid"))
    for seed in args.seeds:
        for row in args.rows:
            record = run_row(row, seed, args, meta, train_data, valid_data)
            print(json.dumps(record), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(record) + "\n")
    report([args.out])


if __name__ == "__main__":
    main()
