"""Step 10: training the GPT, with checkpoints that resume exactly.

The loop: draw a batch from train.bin, predict every next token, measure the cross-entropy,
follow its gradient with Muon and AdamW, repeat. Around it: a learning-rate warmup, a stable
peak and a decay, gradient clipping and accumulation, evaluations, a log, progress, a time
budget, and a checkpoint that resumes exactly (every RNG).

Run the main job:  uv run python -m tiny_llm.train      (prepares data first if there is none)
A quick run:       uv run python -m tiny_llm.train --preset tiny --max-steps 30 --out runs/demo
"""

import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import torch
from tqdm import tqdm

from tiny_llm.budget import pace_steps
from tiny_llm.checkpoint import (
    explain_failed_save,
    load_checkpoint,
    model_class,
    model_from_state,
    resume_run,
    save_run,
)
from tiny_llm.data import ensure_data, get_batch, load_meta, load_token_array
from tiny_llm.device import (
    autocast,
    check_batch_fits,
    fast_float32_matmuls,
    grad_scaler,
    kept_memory,
    pick_device,
    pick_threads,
    resolve_dtype,
    seed_everything,
)
from tiny_llm.flags import (
    check_config,
    check_resume_settings,
    parse_train_args,
    resume_command,
)
from tiny_llm.generate import story_from_checkpoint
from tiny_llm.loop_shell import LoopShell, refuse_non_finite
from tiny_llm.loss import mean_loss
from tiny_llm.muon import muon_adamw, muon_momentum
from tiny_llm.paths import DATA_DIR, RUNS_DIR
from tiny_llm.processes import ONE_PROCESS, hold_run_folder
from tiny_llm.tuning import Tuning, model_parts, story_rows

NO_SCALING = grad_scaler(torch.device("cpu"), "float32")  # a disabled scaler: every call a no-op


@dataclass
class TrainConfig(Tuning):  # step 15's fields (lr_embed, qk_norm ...) come from tuning.py
    """Everything that defines a run. It is saved in the checkpoint, so --resume reuses it."""

    command: ClassVar[str] = "tiny_llm.train"  # the command that trains it (and resumes it)

    model: str = "gpt"  # which model: gpt (step 08) or modern (step 15)
    preset: str = "cpu"  # the model size, a name in that model's presets (step 08: tiny...gpu)
    dropout: float = 0.0  # the model's dropout; 0.1 helps a long run on a small corpus
    time_budget: float = 540.0  # seconds of training, evaluations included (0: no budget)
    max_steps: int = 0  # optimizer updates (0: as many as fit the time budget)
    out: str | None = None  # folder for ckpt.pt and log.jsonl (default runs/<preset>)
    resume: bool = False  # continue the run saved in out/ckpt.pt
    batch_size: int = 16  # windows of max_seq_len tokens per micro-batch
    grad_accum: int = 1  # micro-batches per update: the update sees batch_size·grad_accum windows
    lr: float = 5e-3  # peak learning rate, reached at the end of warmup
    min_lr: float = 0.0  # the floor the learning rate decays to
    warmup_steps: int = 100
    lr_decay_steps: int = 0  # where the decay reaches min_lr (0: at max_steps)
    cooldown: float = 0.4  # > 0: hold the peak, then straight down over this last fraction
    momentum_warmup: int = 200  # > 0: Muon's momentum rises from 0.85 to 0.95 over these steps
    weight_decay: float = 0.1
    optimizer: str = "muon"  # muon: Muon for the matrices in the blocks, AdamW for the rest; adamw
    grad_clip: float = 1.0  # largest gradient norm allowed (0: no clipping)
    eval_interval: int = 200  # evaluate on valid.bin and save a checkpoint every this many steps
    eval_iters: int = 20  # batches per evaluation
    device: str | None = None  # cuda, mps or cpu (default: the best available)
    dtype: str = "auto"  # float32, bfloat16 or float16 (autocast); auto: by device (step 13)
    compile: bool = False  # torch.compile the model: faster steps after a compile of a minute
    seed: int = 1337
    data_dir: str = str(DATA_DIR)

    def __post_init__(self):
        check_config(self)  # a clear error for a setting that cannot work (tiny_llm/flags.py)


class TrainHooks:
    """Where a later step changes a run without step 10 importing it (step 17 subclasses it).
    Each method is step 10's own behaviour."""

    def new_model(self, cfg, meta):  # a new run's model
        cls = model_class(cfg.model)
        return cls(replace(cls.presets[cfg.preset], vocab_size=meta["vocab_size"],
                           dropout=cfg.dropout, **model_parts(cfg)))

    def adapt(self, model, cfg, ckpt):  # the model before it is wrapped (ckpt: resumed, or None)
        return model

    def rows(self, cfg, train_data, valid_data, seq_len):  # what batches are drawn from
        return train_data, valid_data

    def saved(self, model_state, cfg):  # (the weights to save, entries to add)
        return model_state, {}


def lr_at(step, max_lr, min_lr, warmup_steps, decay_steps, cooldown=0.0):
    """Learning rate for update number `step` (0-based): linear warmup, then the decay.
    cooldown > 0, warmup-stable-decay: the peak, then a line reaching min_lr at the last step over
    that last fraction (max_lr=1e-3, min_lr=1e-4, warmup 100, decay 1000, cooldown 0.4:
    step 0 -> 1e-5, 1e-3 from step 99 to 599, 5.5e-4 at 799, 1e-4 at 999).
    cooldown 0: a cosine from the peak to min_lr (step 550, halfway down, -> 5.5e-4).
    """
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if cooldown > 0:
        left = (decay_steps - 1 - step) / (cooldown * decay_steps)  # 1 where the decay starts
        return min_lr + min(1.0, max(0.0, left)) * (max_lr - min_lr)
    progress = min(1.0, (step - warmup_steps) / max(1, decay_steps - warmup_steps))
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def param_groups(model, weight_decay):
    """AdamW groups: decay the matrices (2-D: Linear and Embedding weights) and nothing else.
    Biases and LayerNorm gains are 1-D: pulling them towards 0 would only fight the scale and
    offset they exist to set. The tied tok_emb/lm_head matrix is one tensor, decayed once."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def estimate_loss(model, data, cfg, device):
    """Mean loss over eval_iters batches drawn with a fixed seed: the same batches every time."""
    generator = torch.Generator().manual_seed(cfg.seed)
    batches = (get_batch(data, cfg.batch_size, model.config.max_seq_len, device, generator)
               for _ in range(cfg.eval_iters))
    return mean_loss(model, batches, device, cfg.dtype)[0]


def accumulate_gradients(model, data, cfg, device, generator, parallel=ONE_PROCESS,
                         scaler=NO_SCALING):
    """Forward and backward over grad_accum micro-batches; returns their mean loss."""
    total = 0.0
    seq_len = parallel.unwrap(model).config.max_seq_len
    rows = slice(parallel.rank * cfg.batch_size, (parallel.rank + 1) * cfg.batch_size)
    for i in range(cfg.grad_accum):  # every rank draws the same windows and reads its own rows
        x, y = get_batch(data, cfg.batch_size * parallel.world_size, seq_len, device, generator,
                         part=rows)
        with parallel.no_sync(model, sync=i == cfg.grad_accum - 1):
            with autocast(device, cfg.dtype):
                _, loss = model(x, y)
            scaler.scale(loss / cfg.grad_accum).backward()  # gradients add up to a mean
        total += loss.detach() / cfg.grad_accum  # stays on the device: no wait per micro-batch
    return parallel.mean(total.item())  # one wait for the device per update


def start_run(cfg, meta, device, ckpt_path, parallel=ONE_PROCESS, hooks=None):
    """The model, optimizer, gradient scaler, data generator, step, log records and cfg (with
    the step count a budget fixed): fresh, or from ckpt_path, read once."""
    hooks = hooks or TrainHooks()
    ckpt = load_checkpoint(ckpt_path, data_dir=cfg.data_dir, run=True) if cfg.resume else None
    if ckpt is None and ckpt_path.exists():
        raise FileExistsError(f"{ckpt_path} already holds a run: continue it with --resume, "
                              "or pass another --out (or delete the folder) to start afresh")
    if ckpt:
        check_resume_settings(cfg, ckpt["train_config"], ckpt_path)
    seed_everything(cfg.seed)
    # the whole model, before step 16 shards it; a later step may change it (step 17: LoRA)
    model = hooks.adapt(model_from_state(ckpt) if ckpt else hooks.new_model(cfg, meta), cfg, ckpt)
    model = parallel.wrap(model.to(device))  # then compile what DDP or FSDP2 made
    if cfg.compile:
        model.compile()  # in place: the state_dict keeps its names
    if cfg.optimizer == "muon":
        optimizer = muon_adamw(parallel.unwrap(model), cfg)
    else:  # fused: the whole update in one kernel per parameter group (CPU and CUDA), same math
        optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr,
                                      betas=(0.9, 0.95), fused=device.type in ("cpu", "cuda"))
    scaler = grad_scaler(device, cfg.dtype)  # float16 only; a no-op for other dtypes
    data_gen = torch.Generator().manual_seed(cfg.seed)
    if ckpt is None:
        return model, optimizer, scaler, data_gen, 0, [], cfg
    records = resume_run(ckpt, ckpt_path, model, optimizer, data_gen, parallel)
    if ckpt.get("scaler"):  # float16: the loss scale it had reached, for an exact resume
        scaler.load_state_dict(ckpt["scaler"])
    if cfg.max_steps == 0 and ckpt["step"] >= pace_steps(cfg):  # the budget fixed the count
        cfg = replace(cfg, max_steps=ckpt["train_config"]["max_steps"])
    return model, optimizer, scaler, data_gen, ckpt["step"], records, cfg


def update_weights(model, optimizer, data, cfg, device, generator, lr, step, parallel=ONE_PROCESS,
                   scaler=NO_SCALING):
    """One optimizer update at learning rate `lr`; returns the mean loss of its micro-batches."""
    for group in optimizer.param_groups:  # each group's scale of the schedule (step 15)
        group["lr"] = lr * (getattr(cfg, f"lr_{group['name']}") if "name" in group else 1.0)
        if group.get("muon") and cfg.momentum_warmup:  # a lighter momentum while Muon starts
            group["momentum"] = muon_momentum(step, cfg.momentum_warmup)
    loss = accumulate_gradients(model, data, cfg, device, generator, parallel, scaler)
    refuse_non_finite(loss, step, f"Try a lower --lr (now {cfg.lr}) or --dtype float32",
                      f" (lr {lr:.2e}, dtype {cfg.dtype})")  # before the step: weights stay finite
    scaler.unscale_(optimizer)  # float16: the true gradients, before clipping (else a no-op)
    if cfg.grad_clip > 0:  # one unlucky batch cannot throw the weights far
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    scaler.step(optimizer)  # optimizer.step(), skipped if float16 gradients overflowed
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss


def first_record(model, train_data, valid_data, cfg, device):
    """Step 0, printed as an evaluation: the untrained model's losses, and how long an evaluation
    takes (for the budget), timed on the second of the two: the first pays one-off costs."""
    record = {"step": 0, "train_loss": estimate_loss(model, train_data, cfg, device)}
    t0 = time.perf_counter()
    record = {**record, "val_loss": estimate_loss(model, valid_data, cfg, device),
              "eval_s": time.perf_counter() - t0, "lr": 0.0, "tokens": 0, "tokens_per_s": 0.0,
              "time_s": 0.0}
    tqdm.write(eval_line(record), file=sys.stdout)
    return record


PROGRESS_EVERY_S = 30  # without a progress bar, a line on standard error this often


def progress_line(r, total):
    """A progress line for a run without a bar: step 120 of 2,222  loss 4.123  lr 5.00e-03."""
    of = f" of {total:,}" if total else ""
    return (f"{'progress':<12} step {r['step']:,}{of}  loss {r['train_loss']:.3f}  "
            f"lr {r['lr']:.2e}  {r['tokens_per_s']:,.0f} tok/s  {r['time_s']:.0f} s")


def show_progress(bar, r, total, note_at, rank=0):
    """Move the bar on by the step of record `r` (of `total`, the plan); without a bar (output to
    a file), print a progress line once the run's clock passes `note_at`. Returns when the next
    line is due."""
    bar.total = total or None
    bar.update()
    bar.set_postfix_str(f"loss {r['train_loss']:.3f}, lr {r['lr']:.2e}, "
                        f"{r['tokens_per_s']:,.0f} tok/s")
    if not (bar.disable and rank == 0 and r["time_s"] >= note_at):
        return note_at
    print(progress_line(r, total), file=sys.stderr, flush=True)
    return r["time_s"] + PROGRESS_EVERY_S


def eval_line(r):
    """One line per evaluation: step 200     train 3.412  val 3.455  lr 1.85e-03."""
    return (f"{'step ' + str(r['step']):<12} train {r['train_loss']:.3f}  "
            f"val {r['val_loss']:.3f}  lr {r['lr']:.2e}")


def print_setup(cfg, meta, gpt, device, tokens_per_step, world_size):
    """The three lines a run starts with: its data, its model, its batch."""
    print(f"{'data':<12} {meta['source']}, {meta['train']['tokens']:,} train tokens")
    print(f"{'model':<12} {cfg.preset}, {gpt.num_params():,} parameters, on {device.type}")
    ranks = f" x {world_size} ranks" if world_size > 1 else ""
    print(f"{'batch':<12} {cfg.batch_size} x {gpt.config.max_seq_len} tokens x {cfg.grad_accum} "
          f"accumulated{ranks} = {tokens_per_step:,} tokens per step, dtype {cfg.dtype}")


def train(cfg, parallel=ONE_PROCESS, hooks=None):
    """Train (or, with cfg.resume, continue) a GPT; return the last log record plus a summary.
    Step 0's record holds the untrained losses; later ones the update's loss (val_loss at evals).
    The run holds a lock on its folder throughout: one run per folder, and a folder that cannot
    be written is found before any work (rank 0 alone writes, so it alone holds the lock)."""
    out = Path(cfg.out or RUNS_DIR / cfg.preset)
    with hold_run_folder(out) if parallel.rank == 0 else nullcontext():
        return train_in_folder(cfg, parallel, hooks or TrainHooks())


def train_in_folder(cfg, parallel, hooks):
    """train(), once the run folder is ours: set up, then update until the end or a Ctrl-C."""
    data_dir = Path(cfg.data_dir)
    meta = load_meta(data_dir) if cfg.resume else ensure_data(data_dir)  # resume: never prepare
    device = pick_device(cfg.device)
    threads, why = pick_threads()
    fast_float32_matmuls(device)  # CUDA: TF32 tensor cores for float32 matmuls
    ckpt_path = Path(cfg.out or RUNS_DIR / cfg.preset) / "ckpt.pt"
    model, optimizer, scaler, data_gen, step, records, cfg = start_run(
        cfg, meta, device, ckpt_path, parallel, hooks)
    gpt = parallel.unwrap(model)
    train_data, valid_data = (load_token_array(data_dir / f"{s}.bin") for s in ("train", "valid"))
    train_data, valid_data = hooks.rows(cfg, train_data, valid_data, gpt.config.max_seq_len)
    train_data = story_rows(cfg, train_data, meta["eot_id"], gpt.config.max_seq_len)  # step 15
    tokens_per_step = cfg.batch_size * cfg.grad_accum * gpt.config.max_seq_len * parallel.world_size
    print_setup(cfg, meta, gpt, device, tokens_per_step, parallel.world_size)
    if parallel.rank == 0:  # standard error: machine facts, like the progress bar
        print(f"{'threads':<12} {threads} ({why}), dtype {resolve_dtype(device, cfg.dtype)}",
              file=sys.stderr)
    check_batch_fits(gpt.config, cfg.batch_size, cfg.grad_accum, device)  # before any step
    clock = time.perf_counter() - (records[-1]["time_s"] if records else 0.0)  # on after resume
    note_at = PROGRESS_EVERY_S + (records[-1]["time_s"] if records else 0.0)
    shell = LoopShell(cfg, records, step, threads, device.type == "cpu",  # loop_shell.py
                      parallel.rank, parallel.mean)
    bar = tqdm(total=cfg.max_steps or None, initial=step,  # stderr, terminals only, rank 0
               disable=None if parallel.rank == 0 else True)
    with shell.running() as stop, kept_memory(device.type == "cpu"):  # step 13 explains it
        if step == 0:  # the untrained model's losses, printed as an evaluation
            records.append(first_record(gpt, train_data, valid_data, cfg, device))
        while step < shell.end(cfg):
            decay_steps = cfg.lr_decay_steps or cfg.max_steps
            lr = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, decay_steps, cfg.cooldown)
            t0 = time.perf_counter()
            loss = update_weights(model, optimizer, train_data, cfg, device, data_gen, lr, step,
                                  parallel=parallel, scaler=scaler)
            step += 1
            records.append({"step": step, "train_loss": loss, "lr": lr, "tokens": step *
                            tokens_per_step, "time_s": time.perf_counter() - clock,
                            "tokens_per_s": tokens_per_step / (time.perf_counter() - t0)})
            cfg = shell.after_update(cfg, step, records)  # the busy watch, the budget's plan
            note_at = show_progress(bar, records[-1], cfg.max_steps, note_at, parallel.rank)
            evaluate = step % cfg.eval_interval == 0 or step == shell.end(cfg)
            if evaluate:
                add_evaluation(records[-1], gpt, valid_data, cfg, device)
            if evaluate or stop.is_set():
                shell.check_weights(model, step)  # never a diverged model over a good save
                with explain_failed_save(ckpt_path, step, resume_command(cfg)):
                    save_run(ckpt_path, model, optimizer, data_gen, step, cfg, meta, records,
                             parallel, scaler, hooks.saved)
            if stop.is_set():  # Ctrl-C: the step is finished and saved, so stop here
                break
    bar.close()
    return {**records[-1], "checkpoint": str(ckpt_path), "interrupted": stop.reason,
            "plan": shell.summary(step)}


def add_evaluation(record, model, valid_data, cfg, device):
    """Add the validation loss to the step's record, with its time (the budget prices it), and
    print the evaluation's line."""
    t_eval = time.perf_counter()
    record["val_loss"] = estimate_loss(model, valid_data, cfg, device)
    record["eval_s"] = time.perf_counter() - t_eval
    tqdm.write(eval_line(record), file=sys.stdout)


def parse_args(config_class=TrainConfig):
    """(config, story length) from the command line (tiny_llm/flags.py)."""
    return parse_train_args(config_class)


def main(config_class=TrainConfig, hooks=None):
    """The train command; a later step's command passes its own config and hooks (step 17)."""
    try:
        cfg, sample_tokens = parse_args(config_class)
        result = train(cfg, hooks=hooks)
        if result["interrupted"]:
            raise SystemExit(f"stopped by {result['interrupted']} at step {result['step']}, saved "
                             f"{result['checkpoint']}; continue with:\n  {resume_command(cfg)}")
        print(f"{'saved':<12} {result['checkpoint']} (step {result['step']})")
        print(f"{'time':<12} {result['time_s']:.1f} s, "
              f"{result['tokens'] / max(result['time_s'], 1e-9):,.0f} tokens/s with evaluations")
        if result["plan"]:  # a budgeted run: the updates it made against its plan
            print(f"{'updates':<12} {result['plan']}")
        if sample_tokens > 0:  # what tiny_llm.generate --checkpoint ... --seed prints
            story = story_from_checkpoint(result["checkpoint"], sample_tokens, cfg.seed,
                                          pick_device(cfg.device), cfg.data_dir)
            print(f"{'story':<12} {story}")
    except (OSError, FloatingPointError, ValueError) as err:  # OSError: files, folders, disks
        raise SystemExit(f"error: {err}") from None
    except KeyboardInterrupt:
        raise SystemExit("interrupted at once: nothing new was saved (a checkpoint saved "
                         "before, if any, is whole)") from None


if __name__ == "__main__":
    main()
