"""scripts/vs_nanogpt.py, offline: a tiny stand-in for nanoGPT's model.py, written here, takes
the place of the learner's clone (same constructor, forward and configure_optimizers contract)."""

import importlib.util
import math

import pytest

from tiny_llm.paths import REPO_ROOT
from tiny_llm.train import TrainConfig, train

spec = importlib.util.spec_from_file_location("vs_nanogpt", REPO_ROOT / "scripts" / "vs_nanogpt.py")
vs_nanogpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vs_nanogpt)

STAND_IN = '''
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class GPT(nn.Module):
    """A bigram model with nanoGPT's interface: enough to train and score in a second."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, 16)
        self.lm_head = nn.Linear(16, config.vocab_size, bias=config.bias)

    def forward(self, idx, targets=None):
        logits = self.lm_head(self.wte(idx))
        if targets is None:
            return logits[:, [-1], :], None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas,
                                 weight_decay=weight_decay)
'''


@pytest.fixture
def clone(tmp_path):
    folder = tmp_path / "nanoGPT"
    folder.mkdir()
    (folder / "model.py").write_text(STAND_IN)
    return folder


class SteadyClock:
    """time for scripts/vs_nanogpt.py whose perf_counter moves `tick` seconds per reading."""

    def __init__(self, tick):
        self.now, self.tick = 0.0, tick

    def perf_counter(self):
        self.now += self.tick
        return self.now


def test_a_path_without_model_py_says_to_clone_nanogpt(tmp_path, capsys):
    with pytest.raises(SystemExit):
        vs_nanogpt.main(["--nanogpt", str(tmp_path / "nowhere"), "quality"])
    err = capsys.readouterr().err
    assert "no model.py in" in err and "git clone https://github.com/karpathy/nanoGPT" in err


def test_a_model_py_that_is_not_nanogpt_is_refused(tmp_path):
    (tmp_path / "model.py").write_text("x = 1\n")
    with pytest.raises(ImportError, match="no GPT or GPTConfig"):
        vs_nanogpt.load_nanogpt(tmp_path)


def test_missing_data_is_an_error_that_says_how_to_prepare_it(clone, tmp_path):
    with pytest.raises(SystemExit, match="tiny_llm.data"):
        vs_nanogpt.main(["--nanogpt", str(clone), "--data-dir", str(tmp_path / "no-data"),
                         "quality", "--seconds", "1"])


def test_nanogpt_schedule_warms_up_then_ends_at_its_floor():
    lr = [vs_nanogpt.nanogpt_lr(step, 1000) for step in range(1200)]
    assert lr[0] == pytest.approx(1e-3 / 101) and lr[100] == pytest.approx(1e-3) == max(lr)
    assert lr[550] == pytest.approx(5.5e-4) and lr[1000] == lr[1199] == pytest.approx(1e-4)


def test_steps_that_fit_scale_the_pace_to_the_budget():
    assert vs_nanogpt.steps_that_fit(50, 5.0, 600) == 6000
    assert vs_nanogpt.steps_that_fit(50, 700.0, 600) == 51  # overran: stop at the next step


def test_quality_trains_for_the_time_and_scores_both_models_on_valid(
        clone, sample_data_dir, tmp_path, capsys, monkeypatch):
    # a short warmup to a high rate, so that the stand-in learns within the test's second
    monkeypatch.setitem(vs_nanogpt.RECIPE, "warmup", 5)
    # a clock that moves 40 ms per reading: the "second" holds the same 24 steps on any
    # machine, however busy, so what is asserted below cannot depend on the machine's speed
    monkeypatch.setattr(vs_nanogpt, "time", SteadyClock(0.04))
    monkeypatch.setitem(vs_nanogpt.RECIPE, "lr", 0.1)
    out = tmp_path / "ours"
    train(TrainConfig(preset="tiny", max_steps=2, batch_size=2, warmup_steps=1, eval_iters=1,
                      data_dir=str(sample_data_dir), out=str(out), device="cpu"))
    capsys.readouterr()
    result = vs_nanogpt.main(["--nanogpt", str(clone), "--data-dir", str(sample_data_dir),
                              "quality", "--seconds", "1", "--checkpoint", str(out / "ckpt.pt")])
    printed = capsys.readouterr().out
    assert "nanoGPT      step " in printed  # the progress line
    # the budget is spent in steps paced by the first ones (steps_that_fit, above)
    assert result["steps"] == 24 and result["seconds"] == pytest.approx(1.0, abs=0.05)
    uniform = math.log(1300) * 75_702 / 296_742 / math.log(2)  # the sample's valid.bin
    assert 0 < result["nanogpt_bpb"] < uniform  # a second of training learns something
    assert result["ours_bpb"] > result["nanogpt_bpb"]  # two steps of ours: near uniform
    assert result["ratio"] == pytest.approx(result["ours_bpb"] / result["nanogpt_bpb"])
    assert f"{result['ratio']:.3f} (ours / nanoGPT's bits per byte" in printed


def test_speed_times_both_models_in_turns(clone, capsys):
    result = vs_nanogpt.main(["--nanogpt", str(clone), "speed", "--batch-size", "2",
                              "--seq-len", "8", "--d-model", "16", "--n-layers", "1",
                              "--n-heads", "2", "--vocab-size", "64", "--rounds", "2",
                              "--seconds", "0.05"])
    printed = capsys.readouterr().out
    assert printed.count("round ") == 2
    assert result["nanoGPT"] > 0 and result["tiny_llm"] > 0
    assert result["ratio"] == pytest.approx(result["tiny_llm"] / result["nanoGPT"])
