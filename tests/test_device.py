import pytest
import torch

from solutions import ex01_device
from tiny_llm.device import matmul_gflops, pick_device, seed_everything


def test_pick_device_honours_a_name_and_the_environment(monkeypatch):
    assert pick_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("TINY_LLM_DEVICE", "cpu")
    assert pick_device() == torch.device("cpu")


def test_pick_device_rejects_unknown_and_unavailable_devices():
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        pick_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            pick_device("cuda")


def test_seed_everything_replays_the_same_numbers():
    seed_everything(3)
    a = torch.randn(4)
    seed_everything(3)
    assert torch.equal(a, torch.randn(4))


def test_seed_everything_rejects_a_bad_seed():
    with pytest.raises(ValueError, match="non-negative int, got -1"):
        seed_everything(-1)


def test_matmul_gflops_is_a_positive_finite_rate():
    # A loaded machine can be very slow, so only sanity bounds: no CPU does 10^7 GFLOP/s.
    rate = matmul_gflops(torch.device("cpu"), n=64, repeats=2)
    assert 0 < rate < 1e7


def test_solutions():
    assert ex01_device.exercise_1_matmul_flops(512) == 268_435_456
    assert ex01_device.exercise_2_same_seed_same_numbers() == (True, False)
    rates = ex01_device.exercise_3_gflops_by_size(sizes=(16, 256))
    assert set(rates) == {16, 256} and all(r > 0 for r in rates.values())
