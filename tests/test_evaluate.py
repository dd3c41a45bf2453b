import json
import math
import socket
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from solutions import ex11_evaluate
from tiny_llm import evaluate
from tiny_llm.checkpoint import save_checkpoint
from tiny_llm.evaluate import bits_per_byte, evaluate_loss, plot_loss_curve, read_log
from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.loss import window_spans
from tiny_llm.tokenize import tokenizer_sha256

SMALL = GPTConfig(vocab_size=50, max_seq_len=8, d_model=16, n_layers=1, n_heads=2)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return GPT(SMALL).eval()


def test_windows_cover_every_target_exactly_once():
    assert window_spans(10, 4) == [(0, 4), (4, 4), (8, 1)]
    assert window_spans(9, 4) == [(0, 4), (4, 4)]
    for n in (2, 7, 33, 100):
        spans = window_spans(n, 8)
        targets = [t for start, length in spans for t in range(start + 1, start + length + 1)]
        assert targets == list(range(1, n))


def test_windows_reject_a_file_with_nothing_to_predict():
    with pytest.raises(ValueError, match="at least 2 tokens.*got 1"):
        window_spans(1, 8)


def test_evaluate_loss_is_the_mean_over_every_target():
    model = tiny_model()
    data = np.random.default_rng(0).integers(0, 50, 29).astype(np.uint16)
    result = evaluate_loss(model, data, batch_size=2)
    nats = []  # the same windows one at a time, cross-entropy written out
    with torch.no_grad():
        for start, length in window_spans(len(data), 8):
            x = torch.tensor(data[start : start + length].astype(np.int64))[None]
            y = torch.tensor(data[start + 1 : start + length + 1].astype(np.int64))
            nats += F.cross_entropy(model(x)[0][0], y, reduction="none").tolist()
    assert result["targets"] == len(data) - 1 == len(nats)
    assert result["windows"] == 4
    assert result["loss"] == pytest.approx(sum(nats) / len(nats), rel=1e-6)


def test_evaluate_loss_does_not_depend_on_the_batch_size_and_can_stop_early():
    model = tiny_model(1)
    data = np.random.default_rng(1).integers(0, 50, 100).astype(np.uint16)
    one, five = evaluate_loss(model, data, batch_size=1), evaluate_loss(model, data, batch_size=5)
    assert one["loss"] == pytest.approx(five["loss"], rel=1e-6)
    capped = evaluate_loss(model, data, batch_size=5, max_batches=2)
    assert capped["targets"] == 2 * 5 * 8 and capped["windows"] == 10


def test_bits_per_byte_of_the_docstring_and_of_a_uniform_guess():
    assert bits_per_byte(2.0, tokens=100, n_bytes=400) == pytest.approx(0.7213, abs=1e-4)
    # guessing uniformly over 4096 tokens costs log2(4096) = 12 bits per token
    assert bits_per_byte(math.log(4096), 1000, 4000) == pytest.approx(12 / 4)


def test_loss_curve_png_is_written_and_identical_on_a_second_run(tmp_path):
    records = [{"step": s, "train_loss": 8 - s / 10} for s in range(0, 31)]
    for r in records[::10]:
        r["val_loss"] = r["train_loss"] + 0.1
    first = plot_loss_curve(records, tmp_path / "a.png").read_bytes()
    second = plot_loss_curve(records, tmp_path / "b.png").read_bytes()
    assert first[:8] == b"\x89PNG\r\n\x1a\n" and first == second
    assert not list(tmp_path.glob(".*tmp*"))  # written through atomic_path


def make_checkpoint(folder, data_dir, sha=None, log=True):
    """A checkpoint of an untrained tiny model, as tiny_llm.train would save it."""
    vocab = json.loads((data_dir / "meta.json").read_text())["vocab_size"]
    config = GPTConfig(vocab_size=vocab, max_seq_len=32, d_model=16, n_layers=1, n_heads=2)
    torch.manual_seed(0)
    save_checkpoint(folder / "ckpt.pt", {
        "model": GPT(config).state_dict(), "config": asdict(config), "step": 3,
        "tokenizer_sha256": sha or tokenizer_sha256(data_dir / "tokenizer.json")})
    if log:
        lines = [{"step": s, "train_loss": 7.0 - s / 10, "lr": 1e-3} for s in range(4)]
        lines[-1]["val_loss"] = 6.8
        (folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder / "ckpt.pt"


def run_cli(monkeypatch, capsys, *argv):
    monkeypatch.setattr(sys, "argv", ["evaluate", *map(str, argv)])
    evaluate.main()
    return capsys.readouterr().out


def test_command_prints_metrics_plots_and_samples(tmp_path, sample_data_dir, monkeypatch, capsys):
    ckpt = make_checkpoint(tmp_path, sample_data_dir)
    out = run_cli(monkeypatch, capsys, "--checkpoint", ckpt, "--data-dir", sample_data_dir,
                  "--max-batches", 3, "--samples", 1)
    assert "scored           1,536 targets in 48 windows" in out  # 3 batches x 16 x 32
    loss = float(out.split("val loss")[1].split()[0])
    perplexity = float(out.split("perplexity")[1].split()[0].replace(",", ""))
    assert perplexity == pytest.approx(math.exp(loss), rel=1e-3)
    assert (tmp_path / "loss.png").is_file() and "(4 log records)" in out
    assert "sample 1         'Once upon a time" in out
    assert len(read_log(tmp_path / "log.jsonl")) == 4


def test_command_without_a_log_still_scores(tmp_path, sample_data_dir, monkeypatch, capsys):
    ckpt = make_checkpoint(tmp_path, sample_data_dir, log=False)
    out = run_cli(monkeypatch, capsys, "--checkpoint", ckpt, "--data-dir", sample_data_dir,
                  "--max-batches", 1, "--samples", 0)
    assert "nothing to plot" in out and "bits per byte" in out


def test_command_refuses_a_checkpoint_of_another_tokenizer(tmp_path, sample_data_dir,
                                                          monkeypatch, capsys):
    ckpt = make_checkpoint(tmp_path, sample_data_dir, sha="0" * 64)
    with pytest.raises(SystemExit, match="different tokenizer"):
        run_cli(monkeypatch, capsys, "--checkpoint", ckpt, "--data-dir", sample_data_dir)


def test_command_rejects_a_missing_checkpoint_and_bad_flags(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit, match="no checkpoint at"):
        run_cli(monkeypatch, capsys, "--checkpoint", tmp_path / "none.pt")
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, capsys, "--checkpoint", "x.pt", "--max-batches", 0)
    assert "--max-batches must be at least 1, got 0" in capsys.readouterr().err


def test_solutions():
    assert ex11_evaluate.exercise_1_perplexity(math.log(10)) == pytest.approx(10)
    assert ex11_evaluate.exercise_1_loss_for_perplexity(10) == pytest.approx(2.302585)
    assert ex11_evaluate.exercise_2_uniform_bits_per_byte(4096, 1000, 4000) == pytest.approx(3.0)
    a, b = ex11_evaluate.exercise_3_compare_tokenizers()
    assert a == pytest.approx(0.7213, abs=1e-4) and b == pytest.approx(0.7694, abs=1e-4)
    assert a < b  # the model with the higher loss per token is the better compressor


def test_unigram_solution_beats_uniform_but_not_by_everything(sample_data_dir):
    loss, bpb = ex11_evaluate.exercise_4_unigram_baseline(sample_data_dir)
    meta = json.loads((sample_data_dir / "meta.json").read_text())
    assert 2.0 < loss < math.log(meta["vocab_size"])
    valid = meta["valid"]
    assert bpb == pytest.approx(bits_per_byte(loss, valid["tokens"], valid["bytes"]))


def test_nearest_neighbours_solution_finds_a_row_placed_near_another(sample_data_dir):
    """Exercise 5: cosine neighbours of a word's row in the (tied) token table, itself left out."""
    from tiny_llm.tokenize import load_tokenizer

    tokenizer = load_tokenizer(sample_data_dir / "tokenizer.json")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), max_seq_len=8, d_model=16,
                          n_layers=1, n_heads=2)).eval()
    dog, cat = (tokenizer.encode(w).ids[0] for w in (" dog", " Max"))
    with torch.no_grad():  # put " Max" almost on " dog", three times as long: cosine ignores length
        model.embed.tok_emb.weight[cat] = 3 * model.embed.tok_emb.weight[dog] + 1e-4
    found = ex11_evaluate.exercise_5_nearest_neighbours(model, tokenizer, [" dog", " Max"], k=3)
    assert found[" dog"][0][0] == " Max" and found[" Max"][0][0] == " dog"
    assert found[" dog"][0][1] == pytest.approx(1.0, abs=1e-3)
    for near in found.values():
        assert len(near) == 3 and [c for _, c in near] == sorted((c for _, c in near), reverse=True)
    assert " dog" not in [t for t, _ in found[" dog"]]
    with pytest.raises(ValueError, match="not one"):
        ex11_evaluate.exercise_5_nearest_neighbours(model, tokenizer, [" dragonfly"])


def test_nearest_neighbours_of_a_trained_checkpoint_and_an_untrained_twin(tmp_path,
                                                                            sample_data_dir):
    ckpt = make_checkpoint(tmp_path, sample_data_dir)
    trained, untrained = ex11_evaluate.exercise_5_trained_and_untrained(ckpt, sample_data_dir, k=2)
    assert list(trained) == list(untrained) == list(ex11_evaluate.WORDS)
    assert all(len(near) == 2 for near in trained.values())
    assert trained == untrained  # this "trained" model is the untrained twin: seed 0, no steps


def test_story_grades_see_a_loop():
    loop = evaluate.story_grades("The cat sat. The cat sat. The cat sat.")
    assert loop["repeated sentences"] == pytest.approx(2 / 3)
    assert loop["distinct-1"] == pytest.approx(1 / 3) and loop["repeated 4-grams"] == 0.5
    fresh = evaluate.story_grades("A fox ran home. It slept by the warm fire all night.")
    assert fresh["repeated 4-grams"] == fresh["repeated sentences"] == 0.0
    assert fresh["distinct-1"] == 1.0


def test_the_judges_answer_is_read_only_when_it_holds_four_grades():
    from tiny_llm.judge import read_grades

    good = {"grammar": 7, "creativity": 5, "consistency": 6, "plot": 4}
    assert read_grades('Sure! {"grammar": 7, "creativity": 5, "consistency": 6, "plot": 4}') == good
    for answer in ("Once upon a time", '{"grammar": 7}', '{"grammar": 11, "creativity": 5, '
                   '"consistency": 6, "plot": 4}', '{"grammar": "7"', "[1, 2]"):
        assert read_grades(answer) is None, answer


def test_the_command_prints_grades_and_says_when_no_judge_listens(tmp_path, sample_data_dir,
                                                                   monkeypatch, capsys):
    ckpt = make_checkpoint(tmp_path, sample_data_dir, log=False)
    (tmp_path / "twin").mkdir()
    twin = tmp_path / "twin" / "ckpt.pt"
    twin.write_bytes(ckpt.read_bytes())
    out = run_cli(monkeypatch, capsys, "--checkpoint", ckpt, "--checkpoint", twin, "--data-dir",
                  sample_data_dir, "--max-batches", 1, "--samples", 0, "--stories", 2,
                  "--story-tokens", 8)
    assert "stories          2 for each checkpoint, up to 8 tokens, seed 1337" in out
    header, first, second = out.splitlines()[-3:]
    assert header.split()[:2] == ["grades", "repeated"]
    assert first.split()[1:] == second.split()[1:]  # the same model, prompts and seed
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens on it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SystemExit, match="cannot reach a judge at .* start one: `ollama serve`"):
        run_cli(monkeypatch, capsys, "--checkpoint", ckpt, "--data-dir", sample_data_dir,
                "--max-batches", 1, "--samples", 0, "--stories", 1, "--story-tokens", 4,
                "--judge", f"http://127.0.0.1:{port}", "--judge-model", "qwen2.5:1.5b")
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, capsys, "--checkpoint", ckpt, "--judge", "http://127.0.0.1:1")
    assert "--judge needs --judge-model" in capsys.readouterr().err
