import sys
from dataclasses import replace

import pytest
import torch

from solutions import ex13_speed
from tiny_llm import speed, static_decode
from tiny_llm.generate import generate
from tiny_llm.gpt import GPT, PRESETS
from tiny_llm.kvcache import generate_cached
from tiny_llm.speed import (
    SETTINGS,
    Setting,
    build,
    flops_per_token,
    kept_memory,
    matmul_params,
    measure,
    mfu,
    profile_step,
    train_step,
)

TINY = PRESETS["tiny"]
CPU = torch.device("cpu")


def test_flops_per_token_of_the_small_preset():
    config = PRESETS["small"]
    n = matmul_params(GPT(config))
    assert n == 4 * 12 * 128**2 + 4096 * 128 == 1_310_720  # blocks' Linears + the head
    assert flops_per_token(config, n) == 6 * n + 12 * 4 * 256 * 128 == 9_437_184


def test_mfu_is_achieved_flops_over_peak():
    assert mfu(tokens_per_s=1000, flops=1e8, peak=200) == pytest.approx(0.5)


def first_losses(setting, steps=2):
    """The losses of the first `steps` updates of the tiny preset under `setting`."""
    _, forward, optimizer = build(TINY, setting, CPU)
    x, y = torch.randint(0, TINY.vocab_size, (2, 4, TINY.max_seq_len),
                         generator=torch.Generator().manual_seed(0))
    with kept_memory(setting.keep_memory):
        return [train_step(forward, optimizer, setting, x, y, CPU).item() for _ in range(steps)]


def test_every_setting_trains_the_same_model():
    reference = first_losses(Setting())
    for setting in SETTINGS[1:]:
        rtol = 2e-2 if setting.dtype == "bfloat16" else 1e-4  # bf16 keeps 8 bits of mantissa
        assert first_losses(setting) == pytest.approx(reference, rel=rtol), setting.name


def test_measure_times_each_part_of_a_step():
    result = measure(TINY, Setting(), batch_size=2, steps=1, device="cpu")
    parts = [result[f"{p}_ms"] for p in ("forward", "backward", "optimizer")]
    assert all(p > 0 for p in parts)
    assert result["ms_per_step"] == pytest.approx(sum(parts))
    assert result["tokens_per_s"] == pytest.approx(2 * 64 / (result["ms_per_step"] / 1000))


def test_kept_memory_says_whether_it_could_and_can_be_switched_off():
    with kept_memory(enabled=False) as kept:
        assert kept is False
    if sys.platform.startswith("linux"):
        with kept_memory() as kept:
            assert kept is True


@pytest.fixture
def glibc_defaults():
    """malloc as glibc starts it, for one test: the suite's processes keep freed memory already
    (MALLOC_* in tests/conftest.py). mallopt's numbers are <malloc.h>'s; the thresholds and the
    top pad are 128 KiB by default, and above 32 MiB glibc always maps a block on its own."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    trim, top_pad, mmap_threshold = -1, -2, -3
    for number in (trim, top_pad, mmap_threshold):
        assert libc.mallopt(number, 128 * 1024)
    yield
    libc.mallopt(trim, 2**31 - 1)  # the suite's: keep what is freed (conftest.py)
    libc.mallopt(top_pad, 256 * 2**20)
    libc.mallopt(mmap_threshold, 32 * 2**20)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_kept_memory_stops_the_page_faults_of_big_tensors(glibc_defaults):
    default, kept = ex13_speed.exercise_4_page_faults(mib=64)
    assert default > 3 * 16_000  # 64 MiB is 16,384 pages of 4 KiB, every round
    assert kept < default / 10


def test_profile_names_the_matmuls_and_their_share():
    table, share = profile_step(TINY, Setting(), batch_size=2, device="cpu", rows=30)
    assert "aten::mm" in table or "aten::addmm" in table
    assert 0 < share <= 1  # a ratio of timings: its size depends on the machine and its load


def test_check_prints_a_row_per_setting(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["speed", "--preset", "tiny", "--steps", "1", "--warmup", "1",
                                      "--batch-size", "2"])
    speed.main()
    out = capsys.readouterr().out
    for setting in SETTINGS:
        assert f"\n{setting.name} " in out
    assert "FLOPs/token      6·N + 12·L·T·d = 2,162,688 + 98,304 = 2,260,992" in out
    rows = out.split("\nsetting ")[1].splitlines()[1:]
    mfus = [row.split()[-2] for row in rows]  # a percentage, "emulated" or "n/a"
    assert all(m in ("emulated", "n/a") or 0 < float(m.rstrip("%")) <= 100 for m in mfus), mfus
    losses = {row.split()[-1] for row in rows[:4]}  # float32 settings: the same arithmetic
    assert len(losses) == 1, rows


def test_check_rejects_bad_flags(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["speed", "--steps", "0"])
    with pytest.raises(SystemExit):
        speed.main()
    assert "--batch-size, --steps and --warmup must be >= 1" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["speed", "--device", "tpu"])
    with pytest.raises(SystemExit):
        speed.main()
    assert "unknown device 'tpu'" in capsys.readouterr().err


def test_the_training_forward_compiles_to_one_graph_without_breaks():
    found = speed.graph_breaks(PRESETS["tiny"], batch_size=2)
    assert (found.graph_count, found.graph_break_count) == (1, 0), found.break_reasons


def test_solutions():
    n, flops, share = ex13_speed.exercise_1_flops()
    assert (n, flops) == (1_310_720, 9_437_184) and share == pytest.approx(1 / 6, abs=1e-3)
    n_long, _, share_long = ex13_speed.exercise_1_flops(max_seq_len=1024)
    assert n_long == n and share_long == pytest.approx(0.444, abs=1e-3)
    assert ex13_speed.exercise_2_mfu() == pytest.approx(0.3146, abs=1e-4)
    budget = ex13_speed.TrainConfig().time_budget  # step 10's default, whatever it becomes
    assert ex13_speed.exercise_3_gpu_seconds() == pytest.approx(
        budget * 5989 * 9_437_184 / (0.4 * 989e12), rel=1e-9)
    assert ex13_speed.exercise_3_gpu_seconds(budget_s=540) == pytest.approx(0.0771, abs=1e-4)


# Decoding with a static cache (the lever for a GPU): the same tokens as step 12, on the CPU


def tiny_gpt(seed=0, vocab_size=300):
    torch.manual_seed(seed)
    return GPT(replace(TINY, vocab_size=vocab_size)).eval()


def test_the_static_cache_writes_at_its_position_and_returns_every_slot():
    cache = static_decode.StaticCache(TINY)
    cache.position.fill_(3)
    k = torch.ones(1, TINY.n_heads, 2, TINY.d_model // TINY.n_heads)
    keys, _ = cache.append(0, k, k)
    assert keys.shape[2] == TINY.max_seq_len  # every slot, always the same shape
    assert keys[0, 0, :, 0].nonzero().flatten().tolist() == [3, 4]
    cache.length = 5
    cache.reset()
    assert (cache.length, cache.position.item()) == (0, 0)


def test_a_static_step_gives_the_models_logits_and_advances_on_the_device():
    model = tiny_gpt()
    cache = static_decode.StaticCache(model.config)
    prompt, _ = static_decode.static_forward(model, torch.tensor([[1, 2, 3]]), cache)
    logits, _ = static_decode.static_forward(model, torch.tensor([[5]]), cache)
    with torch.no_grad():
        expected, _ = model(torch.tensor([[1, 2, 3, 5]]))
    assert (prompt - expected[:, :3]).abs().max() < 1e-5  # the prompt: causal within the mask
    assert (logits[0, -1] - expected[0, -1]).abs().max() < 1e-5  # empty slots get no weight
    assert (cache.length, cache.position.item()) == (4, 4)


def test_decoding_through_the_static_cache_writes_step_12s_tokens():
    model = tiny_gpt()
    decoder = static_decode.GraphedDecoder(model)  # on the CPU: static_forward, without a graph
    prompt = torch.tensor([[1, 2, 3]])
    greedy = {"temperature": 0, "eot_id": None}
    plain = generate(model, prompt, 100, **greedy)  # past max_seq_len 64: the window slides
    assert torch.equal(generate(decoder, prompt, 100, cache=decoder.cache, **greedy), plain)
    assert torch.equal(generate_cached(model, prompt, 100, **greedy), plain)
    assert decoder.graph is None and not decoder.training


def test_the_decode_check_compares_both_ways(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["speed", "--decode", "--preset", "tiny", "--device", "cpu"])
    speed.main()
    out = capsys.readouterr().out
    assert "decode           untrained tiny GPT on cpu, 63 greedy tokens after one" in out
    assert "tokens/s (no graph: CUDA only)" in out
    assert out.rstrip().endswith("same tokens      True")


def test_the_static_decode_step_refuses_another_model_class():
    class Variant(GPT):  # as steps 14 and 15 make: parts static_forward does not know
        pass

    with pytest.raises(ValueError, match="written for step 08's GPT, not Variant"):
        static_decode.GraphedDecoder(Variant(TINY))
