"""The GPU, Mac and busy-machine paths, tested on a CPU with the device facts stubbed.

No GPU or Mac runs these tests: each test replaces what PyTorch would report there
(is_bf16_supported, get_device_capability, get_device_name, mps.is_available) and checks the
decision the course makes from it. What the hardware itself would do has not run here.
"""

import json
from dataclasses import replace

import pytest
import torch

from tiny_llm import device as device_module
from tiny_llm import speed
from tiny_llm import train as train_module
from tiny_llm.checkpoint import load_checkpoint
from tiny_llm.data import get_batch, load_token_array
from tiny_llm.device import (
    BusyWatch,
    autocast,
    fast_float32_matmuls,
    grad_scaler,
    pick_device,
    pick_threads,
    resolve_dtype,
    usable_cores,
)
from tiny_llm.gpt import GPT, PRESETS
from tiny_llm.modern import RotaryEmbedding
from tiny_llm.multihead import attend
from tiny_llm.muon import newton_schulz_dtype, orthogonalize
from tiny_llm.train import TrainConfig, accumulate_gradients, train

CUDA, MPS, CPU = torch.device("cuda"), torch.device("mps"), torch.device("cpu")


def gpu(monkeypatch, name, capability):
    """Pretend a CUDA GPU of this compute capability is present (bfloat16 from 8.0 on)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)

    def is_bf16_supported(including_emulation=True):  # PyTorch's answer: emulation counts
        return capability >= (8, 0) or including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)


# An NVIDIA GPU that this PyTorch cannot use


def nvidia_driver(monkeypatch, build_cuda="13.2", driver_cuda="12.4"):
    """Pretend an NVIDIA driver is installed that runs CUDA up to driver_cuda (None: nvidia-smi
    says nothing), under a PyTorch built for build_cuda (None: a build without CUDA)."""
    monkeypatch.setattr(device_module, "nvidia_driver_present", lambda: True)
    monkeypatch.setattr(device_module, "driver_cuda_version", lambda: driver_cuda)
    monkeypatch.setattr(torch.version, "cuda", build_cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.delenv("TINY_LLM_DEVICE", raising=False)


def test_a_driver_older_than_the_build_is_named_not_trained_past_in_silence(monkeypatch, capsys):
    nvidia_driver(monkeypatch)
    assert pick_device() == CPU  # the run goes on, on the CPU, and says why
    note = capsys.readouterr().err
    assert note.startswith("note: an NVIDIA GPU is here, but PyTorch")
    assert "built for CUDA 13.2 and cannot use it: its driver runs CUDA up to 12.4" in note
    assert "https://download.pytorch.org/whl/cu124" in note and "troubleshooting" in note
    with pytest.raises(ValueError, match=r"device 'cuda' asked for, but an NVIDIA GPU is here.*"
                                         r"Update the driver"):
        pick_device("cuda")


def test_an_unknown_driver_version_and_a_cpu_only_build_are_named_too(monkeypatch):
    nvidia_driver(monkeypatch, driver_cuda=None)
    assert "probably older than that (nvidia-smi" in device_module.cuda_problem()
    nvidia_driver(monkeypatch, build_cuda=None)  # Windows' PyPI build, or a +cpu one
    assert "is built without CUDA: install a CUDA build" in device_module.cuda_problem()


def test_no_nvidia_driver_no_note(monkeypatch, capsys):
    nvidia_driver(monkeypatch)
    monkeypatch.setattr(device_module, "nvidia_driver_present", lambda: False)
    assert device_module.cuda_problem() is None
    assert pick_device() == CPU and capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="this PyTorch sees no CUDA GPU: use 'cpu'"):
        pick_device("cuda")


def test_a_gpu_older_than_every_kernel_in_the_build_is_not_picked(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_75", "sm_80", "sm_90a",
                                                              "sm_100", "sm_120"])
    monkeypatch.delenv("TINY_LLM_DEVICE", raising=False)
    gpu(monkeypatch, "Tesla V100", (7, 0))
    assert pick_device() == CPU
    assert "Tesla V100 has compute capability 7.0, and PyTorch" in capsys.readouterr().err
    with pytest.raises(ValueError, match="GPU kernels only from 7.5 on"):
        pick_device("cuda:0")
    gpu(monkeypatch, "Tesla T4", (7, 5))
    assert pick_device() == CUDA and capsys.readouterr().err == ""


def test_the_driver_cuda_version_is_read_from_nvidia_smi(monkeypatch):
    header = "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |"
    monkeypatch.setattr(device_module.subprocess, "run",
                        lambda *a, **k: device_module.subprocess.CompletedProcess(a, 0, header))
    assert device_module.driver_cuda_version() == "12.2"

    def missing(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(device_module.subprocess, "run", missing)
    assert device_module.driver_cuda_version() is None


def test_the_check_skips_a_bfloat16_matmul_the_device_cannot_do(monkeypatch, capsys):
    def mps_before_macos_14(device, dtype=torch.float32, **kwargs):
        if dtype == torch.bfloat16:
            raise TypeError("MPS BFloat16 is only supported on MacOS 14 or newer")
        return 1234.5

    monkeypatch.setattr(device_module, "matmul_gflops", mps_before_macos_14)
    monkeypatch.setattr("sys.argv", ["device", "--device", "cpu"])
    device_module.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2] == "matmul float32   1234.5 GFLOP/s"
    assert lines[-1] == ("matmul bfloat16  skipped: this device cannot multiply bfloat16 "
                         "(MPS BFloat16 is only supported on MacOS 14 or newer)")


# Bug 2: --dtype auto


def test_auto_is_bfloat16_on_a_gpu_built_for_it(monkeypatch):
    gpu(monkeypatch, "NVIDIA H100", (9, 0))
    assert resolve_dtype(CUDA, "auto") == "bfloat16"


def test_auto_is_float16_on_a_t4_whose_bfloat16_is_only_emulated(monkeypatch):
    gpu(monkeypatch, "Tesla T4", (7, 5))
    assert torch.cuda.is_bf16_supported()  # the default answer that fooled the old code
    assert resolve_dtype(CUDA, "auto") == "float16"
    assert autocast(CUDA, "auto").fast_dtype == torch.float16


def test_auto_asks_the_capability_where_pytorch_has_no_emulation_flag(monkeypatch):
    gpu(monkeypatch, "Tesla V100", (7, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)  # an older PyTorch
    assert resolve_dtype(CUDA, "auto") == "float16"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    assert resolve_dtype(CUDA, "auto") == "bfloat16"


def test_a_mac_gets_mps_and_float32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.delenv("TINY_LLM_DEVICE", raising=False)
    device = pick_device()
    assert device == MPS
    assert resolve_dtype(device, "auto") == "float32"
    assert isinstance(autocast(device, "auto"), type(autocast(CPU, "float32")))  # nullcontext


def test_an_explicit_dtype_is_kept_and_cpu_auto_is_float32():
    assert resolve_dtype(CPU, "auto") == "float32"
    assert resolve_dtype(CUDA, "bfloat16") == "bfloat16"
    assert resolve_dtype(MPS, "float16") == "float16"


def test_only_float16_gets_a_working_gradient_scaler():
    assert grad_scaler(CPU, "float16").is_enabled()
    assert not grad_scaler(CPU, "bfloat16").is_enabled()
    assert not grad_scaler(CPU, "auto").is_enabled()


def test_a_scaled_run_saves_its_loss_scale_and_resumes_exactly(sample_data_dir, tmp_path,
                                                                monkeypatch):
    # float16's scaler, on a scale that doubles after every good step, so that a resume that
    # lost it would show; bfloat16 autocast, because float16 matmuls on a CPU are very slow
    monkeypatch.setattr(train_module, "grad_scaler",
                        lambda device, dtype: torch.amp.GradScaler("cpu", growth_interval=1))

    def run(out, **changes):
        cfg = TrainConfig(preset="tiny", dtype="bfloat16", batch_size=2, max_steps=3,
                          time_budget=0, warmup_steps=1, eval_interval=3, eval_iters=1,
                          data_dir=str(sample_data_dir), out=str(out))
        train(replace(cfg, **changes))
        log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        return [r["train_loss"] for r in log[1:]], load_checkpoint(out / "ckpt.pt")["scaler"]

    whole, scaler = run(tmp_path / "whole")
    assert scaler["scale"] > 65536  # it grew: the state is worth saving
    run(tmp_path / "split", max_steps=1, lr_decay_steps=3)
    assert run(tmp_path / "split", resume=True) == (whole, scaler)


# GPU hygiene


def test_tf32_is_switched_on_for_cuda_only():
    before = torch.get_float32_matmul_precision()
    try:
        fast_float32_matmuls(CPU)
        assert torch.get_float32_matmul_precision() == before == "highest"
        fast_float32_matmuls(CUDA)
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_batches_for_cuda_are_pinned_and_copied_without_waiting(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: calls.append("pin") or t)
    monkeypatch.setattr(torch.Tensor, "to",
                        lambda t, device, non_blocking=False: calls.append(non_blocking) or t)
    data = torch.arange(100, dtype=torch.int64).numpy().astype("uint16")
    get_batch(data, 2, 8, "cuda", torch.Generator().manual_seed(0))
    assert calls == ["pin", "pin", True, True]
    calls.clear()
    get_batch(data, 2, 8, "cpu", torch.Generator().manual_seed(0))
    assert calls == [False, False]


def test_the_loss_is_read_from_the_device_once_per_update(sample_data_dir, monkeypatch):
    reads = []
    real_item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda t: reads.append(1) or real_item(t))
    data = load_token_array(sample_data_dir / "train.bin")
    cfg = TrainConfig(preset="tiny", batch_size=2, grad_accum=4, dtype="float32")
    loss = accumulate_gradients(GPT(PRESETS["tiny"]), data, cfg, CPU,
                                torch.Generator().manual_seed(0))
    assert isinstance(loss, float) and len(reads) == 1  # not one per micro-batch


def test_rope_turns_bfloat16_queries_in_bfloat16():
    rope = RotaryEmbedding(16, 32)
    x = torch.randn(2, 4, 32, 16)
    turned = rope(x.bfloat16())
    assert turned.dtype == torch.bfloat16
    torch.testing.assert_close(turned.float(), rope(x), atol=0.05, rtol=0.02)
    assert rope(x).dtype == torch.float32  # float32 in: the same numbers as before


def test_grouped_query_attention_equals_repeated_heads():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 8, 16, generator=g)
    k, v = torch.randn(2, 2, 8, 16, generator=g), torch.randn(2, 2, 8, 16, generator=g)
    repeated = attend(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1))
    torch.testing.assert_close(attend(q, k, v), repeated)
    one = attend(q[:, :, -1:], k, v)  # one new query after the cache (step 12)
    torch.testing.assert_close(one, repeated[:, :, -1:])


def test_muon_iterates_in_bfloat16_where_the_gpu_has_it_else_float32(monkeypatch):
    gpu(monkeypatch, "Tesla T4", (7, 5))  # bfloat16 only emulated: as slow as on a CPU
    assert newton_schulz_dtype(CUDA) == torch.float32
    gpu(monkeypatch, "NVIDIA H100", (9, 0))
    assert newton_schulz_dtype(CUDA) == torch.bfloat16
    assert newton_schulz_dtype(CPU) == newton_schulz_dtype(MPS) == torch.float32
    g = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    exact = orthogonalize(g)
    assert exact.dtype == torch.float32
    monkeypatch.setattr("tiny_llm.muon.newton_schulz_dtype", lambda device: torch.bfloat16)
    fast = orthogonalize(g)  # what a GPU computes
    assert fast.dtype == torch.bfloat16
    assert (fast.float() - exact).abs().max() < 0.05  # bfloat16 keeps 3 significant digits


# Bug 1 and bug 3: tiny_llm.speed off the CPU, and on a CPU without bfloat16


def test_speed_names_each_kind_of_device(monkeypatch):
    def no_cuda(device=None):
        raise AssertionError("asked CUDA about a device that is not CUDA")

    monkeypatch.setattr(torch.cuda, "get_device_name", no_cuda)
    monkeypatch.setattr(speed, "cpu_name", lambda: "Apple M2")
    assert speed.device_name(MPS) == "Apple GPU of Apple M2"
    assert speed.device_name(CPU) == "Apple M2"
    gpu(monkeypatch, "Tesla T4", (7, 5))
    assert speed.device_name(CUDA) == "Tesla T4"


def test_speed_never_prints_an_mfu_over_100_percent(capsys):
    emulated = {"float32": 80.0, "bfloat16": 0.4}  # a CPU without bfloat16 hardware
    assert speed.peak_text(emulated, "bfloat16") == "bfloat16 0.4 GFLOP/s (emulated)"
    assert speed.peak_text({"float32": 128.0, "bfloat16": None}, "bfloat16") == \
        "bfloat16 not supported"
    result = {"tokens_per_s": 2000.0, "forward_ms": 1.0, "backward_ms": 2.0,
              "optimizer_ms": 0.1, "loss": 8.3}
    rows = [("float32", speed.Setting(), result),
            ("bfloat16 autocast", speed.Setting(dtype="bfloat16"), result),
            ("explicit attention", speed.Setting(sdpa=False), None)]
    flops = 9_437_184  # 2,000 tokens/s: 18.9 GFLOP/s, 47 times the emulated "peak"
    speed.print_table(rows, flops, emulated)
    assert speed.mfu_text(2000.0, flops, {"float32": 10.0}, "float32") == "n/a"
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[-2:] == ["23.6%", "8.3000"]
    assert lines[2].split()[-2:] == ["emulated", "8.3000"]
    assert lines[3].endswith("not supported on this device")


def test_speed_skips_a_dtype_the_device_cannot_multiply(monkeypatch):
    def refuse(device, n, dtype, repeats):
        raise TypeError("MPS BFloat16 is only supported on MacOS 14 or newer")

    monkeypatch.setattr(speed, "matmul_gflops", refuse)
    assert speed.peak_gflops(CPU, "bfloat16") is None


# A busy laptop


def test_threads_follow_the_usable_cores_unless_omp_num_threads_says(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)
    monkeypatch.setattr(device_module.os, "sched_getaffinity", lambda pid: {0, 2, 3},
                        raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert pick_threads() == (3, "3 usable cores") and chosen == [3]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert pick_threads()[1] == "OMP_NUM_THREADS" and chosen == [3]
    monkeypatch.delattr(device_module.os, "sched_getaffinity")  # macOS and Windows have none
    monkeypatch.setattr(device_module.os, "cpu_count", lambda: 8)
    assert usable_cores() == 8


class FakeClocks:
    """Wall and CPU clocks that advance by the seconds each step is given."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def advance(self, wall, cpu):
        self.wall += wall
        self.cpu += cpu


def watch_steps(threads, on_cpu, steps):
    """Feed BusyWatch steps of (wall, cpu) seconds; return the warnings it gave."""
    clocks = FakeClocks()
    watch = BusyWatch(threads, on_cpu, wall=lambda: clocks.wall, cpu=lambda: clocks.cpu)
    found = []
    for wall, cpu in steps:
        clocks.advance(wall, cpu)
        found.append(watch.step())
    return [w for w in found if w]


def test_a_quiet_machine_gets_no_warning():
    assert watch_steps(2, True, [(1.0, 2.0)] + [(0.1, 0.19)] * 30) == []


def test_two_threads_on_shared_cores_get_the_one_thread_advice():
    warnings = watch_steps(2, True, [(1.0, 1.0)] + [(0.5, 0.4)] * 30)  # 0.8 of 2 cores
    assert len(warnings) == 1
    assert warnings[0].startswith("busy: this run got 0.8 of the 2 cores")
    assert "OMP_NUM_THREADS=1" in warnings[0]


def test_steps_that_slow_down_mid_run_are_noticed_once():
    steps = [(1.0, 1.0)] + [(0.1, 0.1)] * 10 + [(0.5, 0.5)] * 10
    warnings = watch_steps(1, True, steps)
    assert len(warnings) == 1 and warnings[0].startswith("slow: steps now take 5.0 times")
    assert watch_steps(1, False, [(1.0, 0.0)] + [(0.1, 0.0)] * 10 + [(0.2, 0.0)] * 10) == []


def test_speed_reports_a_setting_a_gpu_cannot_run_instead_of_crashing(monkeypatch):
    def no_kernel(*args, **kwargs):
        raise RuntimeError("fused AdamW is not supported on this device")

    monkeypatch.setattr(speed, "measure", no_kernel)
    assert speed.measure_if_supported(PRESETS["tiny"], speed.Setting(), 2, 1, 1, MPS) is None
    with pytest.raises(RuntimeError, match="fused AdamW"):  # on a CPU it is a bug: raised
        speed.measure_if_supported(PRESETS["tiny"], speed.Setting(), 2, 1, 1, CPU)


# The gpu preset's recipe


def test_the_gpu_preset_trains_with_a_gpu_recipe_and_flags_still_win(monkeypatch):
    monkeypatch.setattr("sys.argv", ["train", "--preset", "gpu"])
    cfg, _ = train_module.parse_args()
    assert (cfg.batch_size, cfg.lr, cfg.dtype) == (64, 3e-3, "auto")  # 32,768 tokens a step
    assert cfg.batch_size * PRESETS["gpu"].max_seq_len == 4 * 16 * 512
    monkeypatch.setattr("sys.argv", ["train", "--preset", "gpu", "--lr", "1e-3", "--batch-size",
                                     "8"])
    assert train_module.parse_args()[0].lr == 1e-3 and train_module.parse_args()[0].batch_size == 8
    monkeypatch.setattr("sys.argv", ["train", "--preset", "cpu"])
    assert train_module.parse_args()[0] == TrainConfig(preset="cpu")  # the CPU's: unchanged


# More torchrun ranks than GPUs (chapter 16's two-rank command on a one-GPU machine)


def one_gpu_under_torchrun(monkeypatch, local_rank):
    """Pretend one H100 and a rank of a 2-rank torchrun job; touching the GPU or the process
    group fails the test (the refusal must come before any work)."""
    gpu(monkeypatch, "NVIDIA H100", (9, 0))
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_80", "sm_90"])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("TINY_LLM_DEVICE", raising=False)
    for name, value in (("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2"), ("RANK", str(local_rank)),
                        ("LOCAL_RANK", str(local_rank))):
        monkeypatch.setenv(name, value)

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the refusal")

    from tiny_llm import scale
    monkeypatch.setattr(torch.cuda, "set_device", no_work)
    monkeypatch.setattr(scale.dist, "init_process_group", no_work)
    monkeypatch.setattr("sys.argv", ["scale", "--preset", "tiny", "--max-steps", "20"])
    return scale


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # @record, under capsys
def test_more_ranks_than_gpus_stop_with_one_line_naming_the_way_out(monkeypatch, capsys):
    scale = one_gpu_under_torchrun(monkeypatch, local_rank=0)
    with pytest.raises(SystemExit) as stop:
        scale.main()
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err == ("rank 0: error: 2 ranks on this machine but 1 GPU: one rank per GPU. Start 1 "
                   "with --nproc-per-node 1, or run the ranks on the CPU with gloo: --device cpu\n")


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # @record, under capsys
def test_the_other_ranks_wait_to_be_stopped_quietly(monkeypatch, capsys):
    scale = one_gpu_under_torchrun(monkeypatch, local_rank=1)
    waited = []
    monkeypatch.setattr(scale.time, "sleep", waited.append)
    with pytest.raises(SystemExit) as stop:
        scale.main()
    assert stop.value.code == 1 and waited and capsys.readouterr().err == ""


def test_as_many_ranks_as_gpus_go_ahead(monkeypatch):
    scale = one_gpu_under_torchrun(monkeypatch, local_rank=0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    joined = []
    monkeypatch.setattr(torch.cuda, "set_device", joined.append)
    monkeypatch.setattr(scale.dist, "init_process_group",
                        lambda backend, **kwargs: joined.append(backend))
    assert scale.start() == torch.device("cuda", 0)
    assert joined == [torch.device("cuda", 0), "nccl"]
