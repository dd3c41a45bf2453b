"""Solutions to the exercises of step 10 (steps/10-train.md).

Run them:  uv run python -m solutions.ex10_train
The picture of the schedule:  uv run python -m solutions.ex10_train --plot steps/images/10-lr.png
(add --steps N, the count your run's `budget` line printed, to draw your own run's schedule)
"""

import argparse
from dataclasses import replace

import torch

from tiny_llm.budget import budget_steps
from tiny_llm.files import save_figure
from tiny_llm.gpt import GPT, PRESETS
from tiny_llm.train import TrainConfig, lr_at, param_groups

# The pace of chapter 10's recorded main job on the course's 2-core CPU, from its budget line
# "235 ms per step and 1.3 s per evaluation after 26.1 s" (the 100 warmup updates).
RECORDED_STEP = 100  # where the record priced its budget: the pace held from there on
RECORDED_PACE = {"seconds": 26.1, "step_seconds": 0.235, "eval_seconds": 1.3}


def exercise_1_lr_by_hand():
    """max_lr 1e-3, min_lr 1e-4, warmup 100, decay over 1000 steps.

    step 0:    1e-3 · 1/100 = 1e-5 (the first update is already a small step, not zero)
    step 99:   1e-3 · 100/100 = 1e-3, the peak
    step 550:  halfway through the cosine (450 of 900 steps), cos(π/2) = 0:
               1e-4 + 0.5 · (1 + 0) · (1e-3 - 1e-4) = 5.5e-4
    step 1000: the end of the cosine, 1e-4, and it stays there.
    """
    return tuple(lr_at(step, 1e-3, 1e-4, 100, 1000) for step in (0, 99, 550, 1000))


def exercise_2_effective_batch(batch_size=16, grad_accum=4, seq_len=256):
    """Each update averages grad_accum micro-batches: 16 · 4 = 64 windows, 64 · 256 tokens."""
    windows = batch_size * grad_accum
    return windows, windows * seq_len


def exercise_3_first_adam_step(lr=2e-3):
    """Why warmup: Adam's first update moves almost every weight by about lr, whatever the size of
    its gradient (m̂ / √v̂ = g / |g| = ±1 on step one). With lr 2e-3 against weights of std 0.02,
    that is a 10% change of every weight at once, taken on the evidence of a single batch.
    Returns the median size of the change."""
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(param_groups(model, TrainConfig().weight_decay), lr=lr)
    idx = torch.randint(0, model.config.vocab_size, (4, 32))
    model(idx, idx)[1].backward()
    optimizer.step()
    steps = torch.cat([(p.detach() - b).abs().flatten() for p, b in zip(model.parameters(), before,
                                                                        strict=True)])
    return steps.median().item()


def exercise_4_accumulation_is_a_mean():
    """Two micro-batches of 4, each loss divided by 2, give the gradient of one batch of 8.
    Returns the largest difference between the two gradients (rounding only)."""
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    x = torch.randint(0, model.config.vocab_size, (8, 32))
    y = torch.roll(x, -1, dims=1)
    model(x, y)[1].backward()
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for part in (slice(0, 4), slice(4, 8)):
        (model(x[part], y[part])[1] / 2).backward()
    return max((p.grad - g).abs().max().item() for p, g in zip(model.parameters(), whole,
                                                               strict=True))


def default_run_steps(cfg=None):
    """The step count the default run's time budget fixes at the recorded pace, computed as
    tiny_llm.train computes it: budget_steps at the pace the record measured by step 100.
    Today's 540-s budget: 100 + (540 - 26.1 - 1.3) / (0.235 + 1.3 / 200) = 2,222 steps."""
    cfg = cfg or TrainConfig()
    return budget_steps(cfg, RECORDED_STEP, **RECORDED_PACE)


def lr_schedule(cfg):
    """The learning rate of each of cfg.max_steps updates, as the training loop sets it."""
    if cfg.max_steps < 1:
        raise ValueError(f"a schedule needs its step count, got max_steps={cfg.max_steps} (a "
                         "budgeted run fixes it as it goes): pass --steps N from its budget line")
    decay_steps = cfg.lr_decay_steps or cfg.max_steps
    return [lr_at(s, cfg.lr, cfg.min_lr, cfg.warmup_steps, decay_steps, cfg.cooldown)
            for s in range(cfg.max_steps)]


def plot_lr_schedule(path, cfg=None):
    """Draw the learning rate of a run step by step (default: the main job's, with
    TrainConfig's peak and floor over default_run_steps() updates)."""
    cfg = cfg or replace(TrainConfig(), max_steps=default_run_steps())
    lrs = lr_schedule(cfg)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot(range(len(lrs)), lrs)
    ax.axvline(cfg.warmup_steps, color="grey", linestyle=":", label="end of warmup")
    ax.axhline(cfg.min_lr, color="grey", linestyle="--", label=f"min_lr {cfg.min_lr:g}, the floor")
    ax.set(xlabel="step", ylabel="learning rate",
           title=f"linear warmup to {cfg.lr:g}, held, then down to {cfg.min_lr:g} over the last "
                 f"{cfg.cooldown:.0%} of {cfg.max_steps:,} steps" if cfg.cooldown else
                 f"linear warmup to {cfg.lr:g}, then cosine decay over {cfg.max_steps:,} steps")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    return lrs


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--plot", help="save the learning-rate schedule picture here")
    parser.add_argument("--steps", type=int, default=None, help="the run's step count (default: "
                        f"{default_run_steps():,}, what the default budget fixes at the pace "
                        "of chapter 10's record)")
    args = parser.parse_args()
    if args.plot:
        steps = default_run_steps() if args.steps is None else args.steps
        try:
            plot_lr_schedule(args.plot, replace(TrainConfig(), max_steps=steps))
        except ValueError as err:
            parser.error(str(err))
        print(f"saved {args.plot}: the default settings' schedule over {steps:,} steps")
    print("exercise 1:", ", ".join(f"{lr:.2e}" for lr in exercise_1_lr_by_hand()))
    windows, tokens = exercise_2_effective_batch()
    print("exercise 2:", f"{windows} windows, {tokens:,} tokens per update")
    change = exercise_3_first_adam_step()
    print("exercise 3:", f"median weight change after Adam's first step: {change:.2e}")
    print("exercise 4:", f"largest gradient difference: {exercise_4_accumulation_is_a_mean():.1e}")
