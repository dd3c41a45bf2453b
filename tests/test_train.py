import argparse
import json
import math
import re
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import tiny_llm.budget as budget_module
import tiny_llm.train as train_module
from solutions import ex10_train
from tiny_llm.budget import budget_steps, pace_steps, parse_duration
from tiny_llm.checkpoint import load_checkpoint, save_checkpoint
from tiny_llm.data import get_batch, load_token_array
from tiny_llm.gpt import GPT, PRESETS
from tiny_llm.muon import muon_momentum
from tiny_llm.train import TrainConfig, accumulate_gradients, lr_at, param_groups, train

STEPS = 6


def config(data_dir, out, **changes):
    """A run of the tiny preset small enough for a test: a few steps of 4 windows of 64 tokens."""
    cfg = TrainConfig(preset="tiny", max_steps=STEPS, batch_size=4, warmup_steps=2,
                      eval_interval=3, eval_iters=2, data_dir=str(data_dir), out=str(out),
                      device="cpu")
    return replace(cfg, **changes)


def losses(out):
    return [json.loads(line)["train_loss"] for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(sample_data_dir, tmp_path_factory):
    """One uninterrupted run of STEPS steps: the losses every resumed run must reproduce."""
    out = tmp_path_factory.mktemp("reference")
    result = train(config(sample_data_dir, out))
    return out, result


def warmup_seen(lr):
    """What lr_at's first steps say about its warmup (max_lr 1e-3, warmup 100)."""
    if lr[0] == 0:
        return ("lr_at(0) is 0, so the first update learns nothing: warm up as "
                "max_lr · (step + 1) / warmup_steps, reaching max_lr at step warmup_steps - 1")
    return f"the warmup gives {lr[0]:.3g} at step 0 and {lr[99]:.3g} at step 99, " \
           "not 1e-5 and 1e-3: max_lr · (step + 1) / warmup_steps"


def test_lr_warms_up_linearly_then_decays_on_a_cosine_to_the_floor():
    lr = [lr_at(s, 1e-3, 1e-4, 100, 1000) for s in range(1200)]
    assert lr[0] == pytest.approx(1e-5) and lr[49] == pytest.approx(5e-4), warmup_seen(lr)
    assert lr[99] == pytest.approx(1e-3) == max(lr), warmup_seen(lr)
    assert lr[550] == pytest.approx(5.5e-4), (  # halfway down the cosine: halfway between
        f"lr_at(550) is {lr[550]:.3g}, not 5.5e-4, halfway between max_lr and min_lr"
        + (": the cosine runs down to 0; it goes from max_lr to min_lr, min_lr + 0.5 · (1 + "
           "cos(pi · progress)) · (max_lr - min_lr)" if lr[550] == pytest.approx(5e-4) else ""))
    assert lr[1000] == lr[1199] == pytest.approx(1e-4), (
        f"after decay_steps the lr is {lr[1000]:.3g}, {lr[1199]:.3g}, not min_lr = 1e-4")
    rises = [s for s in range(99, 1199) if lr[s + 1] > lr[s]]
    assert not rises, f"after warmup the lr rises at step(s) {rises[:5]}: it only comes down"


def test_lr_holds_the_peak_then_falls_in_a_line_to_the_floor():
    """Warmup-stable-decay, the default (cooldown 0.4): the peak until the last 40%, then a line
    reaching min_lr at the last step; and Muon's momentum rises from 0.85 to 0.95."""
    lr = [lr_at(s, 1e-3, 1e-4, 100, 1000, cooldown=0.4) for s in range(1000)]
    assert lr[0] == pytest.approx(1e-5) and lr[99] == lr[599] == pytest.approx(1e-3), (
        warmup_seen(lr))
    assert lr[799] == pytest.approx(5.5e-4) and lr[999] == pytest.approx(1e-4), (
        f"the cooldown gives {lr[799]:.3g} at step 799 and {lr[999]:.3g} at 999, not 5.5e-4 and "
        "1e-4: a line from max_lr at step 599 to min_lr at decay_steps - 1"
        + (": it runs down to 0, not to min_lr" if lr[999] == pytest.approx(0, abs=1e-9) else ""))
    momenta = [muon_momentum(s, 200) for s in (0, 100, 200, 900)]
    assert momenta == pytest.approx([0.85, 0.90, 0.95, 0.95]), (
        f"Muon's momentum at steps 0, 100, 200, 900 is {momenta}, not 0.85, 0.90, 0.95, 0.95")
    with pytest.raises(ValueError, match="cooldown is the fraction of the run spent decaying"):
        TrainConfig(cooldown=1.5)


def test_weight_decay_goes_to_matrices_only_and_the_tied_matrix_once():
    model = GPT(PRESETS["tiny"])
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0, (
        f"the groups' weight_decay are {decay['weight_decay']} and {no_decay['weight_decay']}, "
        "not 0.1 (the matrices) and 0.0 (the rest), in that order")
    ranks = [sorted({p.dim() for p in group["params"]}) for group in (decay, no_decay)]
    assert ranks[0] == [2], (
        f"the decayed group holds tensors of {ranks[0]} dimensions: biases or LayerNorm gains "
        "(1-D) are in the decayed group: decay only the matrices, p.dim() >= 2")
    assert ranks[1] == [1], f"the group without decay holds tensors of {ranks[1]} dimensions: " \
                            "a matrix is left out of weight decay"
    tied = sum(p is model.embed.tok_emb.weight for p in decay["params"])
    assert tied == 1, f"the tied tok_emb/lm_head matrix is in the decayed group {tied} times: " \
                      "take model.parameters(), which gives a shared tensor once"
    grouped = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert grouped == model.num_params(), (
        f"the groups hold {grouped:,} parameters, the model {model.num_params():,}: every "
        "trainable parameter goes in exactly one group")


def last_micro_batch_gradient(data, batch_size=2, grad_accum=2):
    """tok_emb's gradient of the last micro-batch's loss / grad_accum alone: what is left when
    the gradients are zeroed inside the loop."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(grad_accum):
        x, y = get_batch(data, batch_size, PRESETS["tiny"].max_seq_len, "cpu", generator)
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    (model(x, y)[1] / grad_accum).backward()
    return model.embed.tok_emb.weight.grad


def test_gradient_accumulation_matches_one_big_batch(sample_data_dir):
    data = load_token_array(sample_data_dir / "train.bin")
    grads = []
    for batch_size, grad_accum in ((4, 1), (2, 2)):  # the same 4 windows, in one go or two
        torch.manual_seed(0)
        model = GPT(PRESETS["tiny"])
        cfg = TrainConfig(batch_size=batch_size, grad_accum=grad_accum, dtype="float32")
        loss = accumulate_gradients(model, data, cfg, torch.device("cpu"),
                                    torch.Generator().manual_seed(1))
        grads.append((loss, model.embed.tok_emb.weight.grad.clone()))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-5), (
        f"the mean loss of 2 micro-batches is {grads[1][0]:.4f}, of one batch {grads[0][0]:.4f}: "
        "return the mean of the micro-batches' losses")
    ratio = (grads[1][1].norm() / grads[0][1].norm()).item()
    zeroed = torch.allclose(grads[1][1], last_micro_batch_gradient(data), atol=1e-7)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-7), (
        f"with grad_accum=2 the gradients are {ratio:.2f} times one big batch's"
        + (": divide each micro-batch's loss by grad_accum before backward(), so the gradients "
           "add up to the mean" if abs(ratio - 2) < 0.01 else "")
        + (": only the last micro-batch's gradient is left, so the gradients were zeroed inside "
           "the loop; backward() adds into .grad, and the update zeroes them after its step"
           if zeroed else ""))


def test_run_writes_log_and_a_complete_checkpoint(reference):
    out, result = reference
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS + 1))
    assert [r["step"] for r in records if "val_loss" in r] == [0, 3, 6]
    assert {"train_loss", "lr", "tokens", "tokens_per_s", "time_s"} <= set(records[-1])
    assert records[-1]["tokens"] == STEPS * 4 * 64 and result["step"] == STEPS
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert {"model", "optimizer", "step", "config", "rng", "data_position", "train_config",
            "tokenizer_sha256"} <= set(ckpt)
    assert {"python", "numpy", "torch", "data"} <= set(ckpt["rng"])
    assert ckpt["step"] == STEPS and ckpt["train_config"]["preset"] == "tiny"


def test_resume_continues_exactly(reference, sample_data_dir, tmp_path):
    out = tmp_path / "split"
    train(config(sample_data_dir, out, max_steps=2, lr_decay_steps=STEPS))
    assert load_checkpoint(out / "ckpt.pt")["step"] == 2
    train(config(sample_data_dir, out, resume=True, lr_decay_steps=STEPS))
    assert losses(out) == losses(reference[0])  # identical, not merely close


def test_ctrl_c_saves_and_resume_gives_the_same_losses(reference, sample_data_dir, tmp_path,
                                                        monkeypatch):
    real_update = train_module.update_weights

    def update_then_ctrl_c(*args, **kwargs):  # kwargs: step 16's `parallel`
        loss = real_update(*args, **kwargs)
        if args[-1] == 3:  # during update number 4, as if the learner pressed Ctrl-C
            signal.raise_signal(signal.SIGINT)
        return loss

    monkeypatch.setattr(train_module, "update_weights", update_then_ctrl_c)
    out = tmp_path / "interrupted"
    result = train(config(sample_data_dir, out))
    assert result["interrupted"] and result["step"] == 4
    assert load_checkpoint(out / "ckpt.pt")["step"] == 4
    monkeypatch.undo()
    train(config(sample_data_dir, out, resume=True))
    assert losses(out) == losses(reference[0])


def test_a_non_finite_loss_stops_with_a_useful_message(sample_data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(train_module, "accumulate_gradients", lambda *args: math.nan)
    with pytest.raises(FloatingPointError, match=r"became nan at step 1 .*lower --lr.*float32"):
        train(config(sample_data_dir, tmp_path / "nan"))
    assert not (tmp_path / "nan" / "ckpt.pt").exists()


def test_resuming_with_another_tokenizer_is_refused(reference, sample_data_dir, tmp_path):
    ckpt = load_checkpoint(reference[0] / "ckpt.pt")
    save_checkpoint(tmp_path / "ckpt.pt", {**ckpt, "tokenizer_sha256": "0" * 64})
    with pytest.raises(ValueError, match="different tokenizer"):
        train(config(sample_data_dir, tmp_path, resume=True, max_steps=STEPS + 1))


def test_an_existing_run_is_not_overwritten(reference, sample_data_dir):
    with pytest.raises(FileExistsError, match="already holds a run: continue it with --resume"):
        train(config(sample_data_dir, reference[0]))


@pytest.mark.parametrize("change, match", [
    ({"preset": "huge"}, "unknown preset 'huge'"), ({"batch_size": 0}, "batch_size must be"),
    ({"lr": 5.0}, "need 0 < lr < 1"), ({"dtype": "fp8"}, "dtype must be auto, float32"),
])
def test_bad_settings_are_refused(change, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        train(replace(TrainConfig(out=str(tmp_path)), **change))


def test_a_tiny_model_learns_the_sample_corpus(sample_data_dir, tmp_path):
    # Measured: 7.17 at step 0, about 4.3 after 60 steps. A model that ignored the context could
    # get no lower than the unigram entropy, 5.23 nats on this corpus.
    result = train(config(sample_data_dir, tmp_path, max_steps=60, batch_size=8, lr=3e-3,
                          min_lr=3e-4, warmup_steps=10, eval_interval=60, eval_iters=4))
    assert result["val_loss"] < 4.7


def test_command_line_resume_reuses_the_saved_settings(sample_data_dir, tmp_path, monkeypatch,
                                                       capsys):
    out = tmp_path / "cli"
    flags = ["--out", str(out), "--data-dir", str(sample_data_dir), "--device", "cpu"]
    monkeypatch.setattr(sys, "argv", ["train", "--preset", "tiny", "--max-steps", "2",
                                      "--batch-size", "2", "--eval-iters", "1",
                                      "--sample-tokens", "5", *flags])
    train_module.main()
    assert "story        Once upon a time" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["train", "--max-steps", "3", "--resume",
                                      "--sample-tokens", "0", *flags])
    train_module.main()
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["step"] == 3
    assert ckpt["train_config"]["preset"] == "tiny" and ckpt["train_config"]["batch_size"] == 2


def test_solutions(tmp_path):
    ex10_train.plot_lr_schedule(tmp_path / "lr.png", TrainConfig(max_steps=50, warmup_steps=5))
    assert (tmp_path / "lr.png").read_bytes()[:4] == b"\x89PNG"
    assert ex10_train.exercise_1_lr_by_hand() == pytest.approx((1e-5, 1e-3, 5.5e-4, 1e-4))
    assert ex10_train.exercise_2_effective_batch() == (64, 16_384)
    first_step = ex10_train.exercise_3_first_adam_step()
    assert first_step == pytest.approx(2e-3, rel=0.01)
    assert ex10_train.exercise_4_accumulation_is_a_mean() < 1e-6


def test_the_schedule_picture_draws_the_steps_the_default_budget_fixes(tmp_path):
    cfg, lrs = TrainConfig(), ex10_train.plot_lr_schedule(tmp_path / "lr.png")
    assert len(lrs) == ex10_train.default_run_steps() == 2_222  # 540 s at the recorded pace
    assert max(lrs) == lrs[cfg.warmup_steps - 1] == cfg.lr  # the peak, at the end of warmup
    assert lrs[-1] == pytest.approx(cfg.min_lr, abs=1e-8)  # and down to the floor at the end
    # the same arithmetic under the record's own 600-s budget gives about its 2,468 steps
    assert abs(ex10_train.default_run_steps(TrainConfig(time_budget=600)) - 2_468) <= 5
    chapter_copy = Path(__file__).resolve().parent.parent / "steps" / "images" / "10-lr.png"
    assert (tmp_path / "lr.png").read_bytes() == chapter_copy.read_bytes(), (
        "steps/images/10-lr.png is not today's schedule: uv run python -m solutions.ex10_train "
        "--plot steps/images/10-lr.png")
    with pytest.raises(ValueError, match="max_steps"):
        ex10_train.plot_lr_schedule(tmp_path / "empty.png", TrainConfig())  # the old empty plot


class FakeClock:
    """time.perf_counter for train.py that moves `tick` seconds per reading (three per step,
    10 ms by default): a budgeted run then plans the same step count on any machine, however
    busy."""

    def __init__(self, tick=0.01):
        self.now, self.tick = 0.0, tick

    def perf_counter(self):
        self.now += self.tick
        return self.now


def budgeted(data_dir, out, **changes):
    return config(data_dir, out, **{"max_steps": 0, "time_budget": 1.0, "warmup_steps": 5,
                                    "eval_interval": 50, **changes})


def test_durations_read_as_seconds():
    assert [parse_duration(t) for t in ("600", "90s", "10m", "1.5h")] == [600, 90, 600, 5400]
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration: 'ten'; write 600"):
        parse_duration("ten")


def test_the_budget_buys_the_steps_that_fit_with_their_evaluations():
    cfg = TrainConfig(time_budget=600, eval_interval=200)
    assert budget_steps(cfg, 20, seconds=10, step_seconds=0.2, eval_seconds=2) == 2820
    assert budget_steps(cfg, 20, 10, 0.2, 2, cap=500) == 500  # never past a --max-steps
    assert budget_steps(cfg, 20, seconds=700, step_seconds=0.2, eval_seconds=2) == 20


def test_a_budgeted_run_fixes_its_step_count_and_ends_its_schedule(sample_data_dir, tmp_path,
                                                                   monkeypatch, capsys):
    monkeypatch.setattr(train_module, "time", FakeClock())
    cfg = budgeted(sample_data_dir, tmp_path)
    result = train(cfg)
    saved = load_checkpoint(tmp_path / "ckpt.pt")["train_config"]
    assert saved["max_steps"] == result["step"] > pace_steps(cfg)  # fixed, and written down
    assert "budget       1 s: 30 ms per step" in capsys.readouterr().out
    last_lr = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[-1])["lr"]
    assert last_lr < cfg.min_lr + 0.01 * (cfg.lr - cfg.min_lr)  # the cosine has come down


def test_a_budgeted_run_resumes_exactly(sample_data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(train_module, "time", FakeClock())
    real_update = train_module.update_weights

    def update_then_ctrl_c(*args, **kwargs):  # kwargs: step 16's `parallel`
        loss = real_update(*args, **kwargs)
        if args[-1] == 29:  # after the pace is measured, as if the learner pressed Ctrl-C
            signal.raise_signal(signal.SIGINT)
        return loss

    monkeypatch.setattr(train_module, "update_weights", update_then_ctrl_c)
    interrupted = train(budgeted(sample_data_dir, tmp_path / "a"))
    assert interrupted["interrupted"] and interrupted["step"] == 30
    monkeypatch.setattr(train_module, "update_weights", real_update)
    resumed = train(budgeted(sample_data_dir, tmp_path / "a", resume=True))
    steps = load_checkpoint(tmp_path / "a" / "ckpt.pt")["train_config"]["max_steps"]
    plain = train(config(sample_data_dir, tmp_path / "b", max_steps=steps, time_budget=0,
                         warmup_steps=5, eval_interval=50))  # no budget, the same step count
    assert resumed["step"] == plain["step"] == steps
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_a_resumed_budget_is_priced_on_its_own_steps(sample_data_dir, tmp_path, monkeypatch,
                                                     capsys):
    """Issue 34's two commands, on a clock at 2.2 s a step (the busy machine where they ran):
    the resumed run priced the first run's 44 s as one step and stopped at step 23 of 30."""
    monkeypatch.setattr(train_module, "time", FakeClock(tick=0.73))
    flags = ["--data-dir", str(sample_data_dir), "--device", "cpu", "--out", str(tmp_path)]
    for command in (["--preset", "tiny", "--max-steps", "20", "--lr-decay-steps", "30",
                     "--warmup-steps", "5", "--eval-interval", "10", "--sample-tokens", "0",
                     "--eval-iters", "2"],  # (a faster evaluation: the same training losses)
                    ["--max-steps", "30", "--resume", "--sample-tokens", "0",
                     "--time-budget", "150"]):
        monkeypatch.setattr(sys, "argv", ["train", *command, *flags])
        train_module.main()
    assert "saved        " + str(tmp_path / "ckpt.pt") + " (step 30)" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "ckpt.pt")["step"] == 30
    assert losses(tmp_path)[-1] == pytest.approx(4.125, abs=0.01)  # chapter 10's split run


class LoadedClock(FakeClock):
    """A FakeClock whose readings slow to `slower` times the pace after `after` readings, as
    when other work starts beside a run: the re-priced plan must still end on time."""

    def __init__(self, after, slower):
        super().__init__()
        self.readings, self.after, self.slower = 0, after, slower

    def perf_counter(self):
        self.readings += 1
        self.now += 0.01 * (self.slower if self.readings > self.after else 1)
        return self.now


def test_a_budget_re_prices_when_the_machine_slows_and_ends_on_time(sample_data_dir, tmp_path,
                                                                    monkeypatch, capsys):
    """The pace triples a third of the way in: the plan shrinks, the run ends within 3% of its
    budget, the log and the console say how the plan changed, and a run without a progress bar
    prints progress lines to standard error (no real time is measured: the clock is fake)."""
    monkeypatch.setattr(train_module, "time", LoadedClock(after=90, slower=3))
    monkeypatch.setattr(train_module, "PROGRESS_EVERY_S", 0.5)
    monkeypatch.setattr(budget_module, "REPRICE_EVERY", 2)  # a short run: price it often
    monkeypatch.setattr(budget_module, "PACE_WINDOW", 6)
    monkeypatch.setattr(budget_module, "SAY_EVERY_S", 0.5)  # a plan line at most every 0.5 s
    cfg = budgeted(sample_data_dir, tmp_path, time_budget=2.0)
    result = train(cfg)
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    plans = [r["plan"] for r in records if "plan" in r]
    assert len(plans) >= 2 and plans[-1] < plans[0] * 0.9  # priced again, and shorter
    assert plans[-1] == result["step"] == load_checkpoint(tmp_path / "ckpt.pt")[
        "train_config"]["max_steps"]
    assert cfg.time_budget * 0.9 <= result["time_s"] <= cfg.time_budget * 1.03
    out, err = capsys.readouterr()
    said = [int(n.replace(",", "")) for n in re.findall(r"so ([\d,]+) steps", out)]
    assert f"so {said[1]:,} steps, was {said[0]:,}" in out  # the last plan line's plan
    assert said[0] == plans[0] and said[1] in plans and len(said) < len(plans)  # only 5% moves
    assert "progress     step 17 of 65  loss" in err  # 0.5 s of the fake clock: 17 steps
    assert records[-1]["lr"] < cfg.min_lr + 0.2 * (cfg.lr - cfg.min_lr)  # decayed all the same


def test_a_budget_too_short_for_its_warmup_shrinks_the_warmup(sample_data_dir, tmp_path,
                                                               monkeypatch, capsys):
    monkeypatch.setattr(train_module, "time", FakeClock())
    cfg = budgeted(sample_data_dir, tmp_path, warmup_steps=100)  # 1 s: about 33 steps of 30 ms
    result = train(cfg)
    saved = load_checkpoint(tmp_path / "ckpt.pt")["train_config"]
    assert saved["warmup_steps"] == 10 < result["step"] <= 36
    assert ("1 s is too short for the 100-step warmup: the warmup shrinks to 10 steps of the"
            in capsys.readouterr().out)
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert max(lrs) == pytest.approx(cfg.lr) and lrs[-1] < 0.1 * cfg.lr  # up, and down again
