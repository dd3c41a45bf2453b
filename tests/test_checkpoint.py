import random
import signal
from dataclasses import asdict

import numpy as np
import pytest
import torch

from tiny_llm.checkpoint import (
    load_checkpoint,
    model_from_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    stop_on_ctrl_c,
)
from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.tokenize import tokenizer_sha256

CONFIG = GPTConfig(vocab_size=64, max_seq_len=8, d_model=16, n_layers=1, n_heads=2)


def make_state(sha="0" * 64, step=3):
    torch.manual_seed(0)
    model = GPT(CONFIG)
    return model, {"model": model.state_dict(), "config": asdict(CONFIG), "step": step,
                   "tokenizer_sha256": sha, "data_source": "sample"}


def test_save_and_load_round_trip(tmp_path):
    model, state = make_state()
    save_checkpoint(tmp_path / "run" / "ckpt.pt", state)
    loaded = load_checkpoint(tmp_path / "run" / "ckpt.pt")
    assert loaded["step"] == 3 and loaded["config"] == asdict(CONFIG)
    assert all(torch.equal(loaded["model"][k], v) for k, v in model.state_dict().items())


def test_model_from_checkpoint_rebuilds_the_same_model(tmp_path, sample_data_dir):
    model, state = make_state(sha=tokenizer_sha256(sample_data_dir / "tokenizer.json"))
    save_checkpoint(tmp_path / "ckpt.pt", state)
    rebuilt, ckpt = model_from_checkpoint(tmp_path / "ckpt.pt", data_dir=sample_data_dir)
    idx = torch.tensor([[1, 2, 3]])
    assert not rebuilt.training and ckpt["step"] == 3
    assert torch.equal(rebuilt(idx)[0], model.eval()(idx)[0])
    assert rebuilt.lm_head.weight is rebuilt.embed.tok_emb.weight  # still tied after loading


def test_a_checkpoint_from_another_tokenizer_is_refused(tmp_path, sample_data_dir):
    save_checkpoint(tmp_path / "ckpt.pt", make_state(sha="f" * 64)[1])
    with pytest.raises(ValueError, match=r"different tokenizer \(data source: sample.*"
                                         r"tiny_llm.data --source sample.*--data-dir"):
        model_from_checkpoint(tmp_path / "ckpt.pt", data_dir=sample_data_dir)


def test_an_interrupted_save_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, make_state(step=1)[1])

    def torch_save_dies_halfway(obj, f):
        with open(f, "wb") as out:
            out.write(b"PK\x03\x04 half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", torch_save_dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, make_state(step=2)[1])
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left


def test_saving_without_the_required_keys_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"missing \['config', 'step'"):
        save_checkpoint(tmp_path / "ckpt.pt", {"model": {}})


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*tiny_llm.train"):
        load_checkpoint(tmp_path / "missing.pt")
    good = tmp_path / "good.pt"
    save_checkpoint(good, make_state()[1])
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated or not a tiny-llm checkpoint"):
        load_checkpoint(truncated)
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    with pytest.raises(ValueError, match="could not be read as a checkpoint"):
        load_checkpoint(text)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(ValueError, match=r"not a tiny-llm checkpoint: .*found \['weights'\]"):
        load_checkpoint(other)


def test_rng_state_restores_every_generator():
    data_gen = torch.Generator().manual_seed(5)
    state = rng_state(data_gen)

    def draws():
        return (random.random(), np.random.rand(), torch.rand(1).item(),
                torch.rand(1, generator=data_gen).item())

    first = draws()
    set_rng_state(state, data_gen)
    assert draws() == first


def test_rng_state_survives_a_weights_only_save(tmp_path):
    state = {**make_state()[1], "rng": rng_state(torch.Generator())}
    save_checkpoint(tmp_path / "ckpt.pt", state)
    loaded = load_checkpoint(tmp_path / "ckpt.pt")["rng"]
    assert torch.equal(loaded["torch"], state["rng"]["torch"])
    assert loaded["python"] == state["rng"]["python"]


def test_ctrl_c_sets_the_stop_flag_instead_of_raising():
    before = signal.getsignal(signal.SIGINT)
    with stop_on_ctrl_c() as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.is_set()
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("kind", ["gpt", "lab-rope"])
def test_a_lab_model_and_the_gpt_go_through_checkpoint_evaluate_and_the_cache(
        kind, tmp_path, sample_data_dir):
    from tiny_llm.checkpoint import class_path
    from tiny_llm.data import load_meta, load_token_array
    from tiny_llm.evaluate import evaluate_loss
    from tiny_llm.generate import generate
    from tiny_llm.kvcache import generate_cached
    from tiny_llm.posenc_lab import LabConfig, LabGPT

    vocab_size = load_meta(sample_data_dir)["vocab_size"]
    sizes = dict(vocab_size=vocab_size, max_seq_len=16, d_model=32, n_layers=2, n_heads=4)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**sizes)) if kind == "gpt" else LabGPT(LabConfig(**sizes, pos="rope"))
    save_checkpoint(tmp_path / "ckpt.pt", {
        "model": model.state_dict(), "config": asdict(model.config), "step": 0,
        "model_class": class_path(model),  # no flag needed to load it back
        "tokenizer_sha256": tokenizer_sha256(sample_data_dir / "tokenizer.json")})
    rebuilt, _ = model_from_checkpoint(tmp_path / "ckpt.pt", data_dir=sample_data_dir)
    assert type(rebuilt) is type(model) and rebuilt.config == model.config

    valid = load_token_array(sample_data_dir / "valid.bin")
    scored = evaluate_loss(rebuilt, valid, max_batches=2)
    assert scored["loss"] == pytest.approx(evaluate_loss(model, valid, max_batches=2)["loss"])
    assert scored["targets"] == 2 * 16 * 16

    prompt = torch.from_numpy(valid[:5].astype(np.int64))[None]  # (1, 5)
    greedy = {"temperature": 0, "eot_id": None}  # 40 tokens: past max_seq_len 16 too
    assert torch.equal(generate_cached(rebuilt, prompt, 40, **greedy),
                       generate(rebuilt, prompt, 40, **greedy))
