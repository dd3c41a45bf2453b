"""Step 11's pictures of a trained model: the train/validation gap, every head's attention on a
sentence, and the learned position table. Each is a PNG, the same bytes every run."""

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from tiny_llm import evaluate
from tiny_llm.checkpoint import save_checkpoint
from tiny_llm.evaluate import attention_maps, loss_gap
from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.plots import (
    plot_attention_maps,
    plot_loss_gap,
    plot_positions,
    read_gap_csv,
    write_gap_csv,
)
from tiny_llm.tokenize import tokenizer_sha256

IMAGES = Path(__file__).resolve().parent.parent / "steps" / "images"
PNG = b"\x89PNG\r\n\x1a\n"


def tiny_model(vocab_size=50, max_seq_len=8):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=vocab_size, max_seq_len=max_seq_len, d_model=16, n_layers=1,
                       n_heads=2)
    return GPT(config).eval()


def test_loss_gap_averages_the_train_loss_between_evaluations():
    records = [{"step": 0, "train_loss": 8.0, "val_loss": 8.1},
               {"step": 1, "train_loss": 6.0}, {"step": 2, "train_loss": 5.0, "val_loss": 5.9},
               {"step": 3, "train_loss": 4.0}]  # no evaluation after step 3: no row
    assert loss_gap(records) == [(0, 8.0, 8.1), (2, 5.5, 5.9)]


def test_gap_csv_round_trips_and_draws_chapter_10s_picture(tmp_path):
    rows = read_gap_csv(IMAGES / "10-loss-gap.csv")  # the main job's record, 14 evaluations
    write_gap_csv(rows, tmp_path / "gap.csv")
    assert read_gap_csv(tmp_path / "gap.csv") == rows
    first = plot_loss_gap(rows, tmp_path / "a.png", "final: train vs validation loss").read_bytes()
    second = plot_loss_gap(rows, tmp_path / "b.png", "final: train vs validation loss").read_bytes()
    assert first[:8] == PNG and first == second
    assert first == (IMAGES / "10-loss-gap.png").read_bytes(), (
        "steps/images/10-loss-gap.png is not what the code draws from its .csv now")


def test_attention_maps_are_causal_rows_that_sum_to_one():
    model = tiny_model()
    idx = torch.randint(0, 50, (1, 7))
    maps = attention_maps(model, idx)
    assert maps.shape == (1, 2, 7, 7)  # (n_layers, n_heads, T, T)
    assert torch.allclose(maps.sum(-1), torch.ones(1, 2, 7))
    assert maps.triu(diagonal=1).abs().max() == 0  # nothing from the future
    assert all(not block.attn._forward_hooks for block in model.blocks)  # hooks removed


def test_attention_and_position_plots_are_the_same_bytes_every_run(tmp_path):
    maps = attention_maps(tiny_model(), torch.arange(5).unsqueeze(0))
    tokens = ["Lily", " had", " a", " red", " ball"]
    a = plot_attention_maps(maps, tokens, tmp_path / "a.png").read_bytes()
    b = plot_attention_maps(maps, tokens, tmp_path / "b.png").read_bytes()
    assert a[:8] == PNG and a == b
    table = tiny_model().embed.pos_emb.weight.detach()
    c = plot_positions(table, tmp_path / "c.png").read_bytes()
    d = plot_positions(table, tmp_path / "d.png").read_bytes()
    assert c[:8] == PNG and c == d


def test_command_draws_the_three_pictures(tmp_path, sample_data_dir, monkeypatch, capsys):
    vocab = json.loads((sample_data_dir / "meta.json").read_text())["vocab_size"]
    model = tiny_model(vocab, max_seq_len=32)  # untrained: the pictures need no training
    save_checkpoint(tmp_path / "ckpt.pt", {
        "model": model.state_dict(), "config": asdict(model.config), "step": 3,
        "tokenizer_sha256": tokenizer_sha256(sample_data_dir / "tokenizer.json")})
    lines = [{"step": s, "train_loss": 7.0 - s / 10} for s in range(4)]
    lines[-1]["val_loss"] = 6.8
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    argv = ["--checkpoint", tmp_path / "ckpt.pt", "--data-dir", sample_data_dir, "--max-batches",
            1, "--samples", 0, "--gap-plot", tmp_path / "gap.png", "--attention-plot",
            tmp_path / "attn.png", "--positions-plot", tmp_path / "pos.png"]
    monkeypatch.setattr(sys, "argv", ["evaluate", *map(str, argv)])
    evaluate.main()
    out = capsys.readouterr().out
    assert "(1 evaluations, last gap" in out and "positions plot" in out
    assert read_gap_csv(tmp_path / "gap.csv") == [(3, pytest.approx(6.85), 6.8)]
    for name in ("gap.png", "attn.png", "pos.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG
