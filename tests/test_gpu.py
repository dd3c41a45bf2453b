"""The GPU paths on a real GPU: training steps, float16 with its scaler, cached decoding, export
parity and one torchrun rank, each small enough to take seconds.

They run where PyTorch sees a CUDA GPU and are skipped with the reason elsewhere. Every other
test computes on the CPU whatever the machine has (tests/conftest.py), since the chapters'
digits come from one; these tests name the device. The last test, of scripts/gpu_check.sh
(the learner's one command for all of them), runs everywhere.
"""

import os
import re
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from tiny_llm.checkpoint import load_checkpoint
from tiny_llm.generate import generate
from tiny_llm.gpt import GPT, PRESETS
from tiny_llm.kvcache import generate_cached
from tiny_llm.paths import REPO_ROOT
from tiny_llm.train import TrainConfig, train

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="no CUDA GPU here: the GPU paths are tested where one is")
CUDA = torch.device("cuda")


def tiny_run(data_dir, out, **changes):
    """Four steps of the tiny preset on the GPU, as test_train.py runs them on the CPU."""
    cfg = TrainConfig(preset="tiny", max_steps=4, batch_size=4, warmup_steps=2, eval_interval=2,
                      eval_iters=1, data_dir=str(data_dir), out=str(out), device="cuda",
                      time_budget=0)
    return replace(cfg, **changes)


@needs_gpu
def test_a_few_training_steps_on_the_gpu(sample_data_dir, tmp_path):
    result = train(tiny_run(sample_data_dir, tmp_path))
    assert result["step"] == 4 and torch.isfinite(torch.tensor(result["train_loss"]))
    assert load_checkpoint(tmp_path / "ckpt.pt")["step"] == 4


@needs_gpu
def test_float16_trains_with_its_gradient_scaler(sample_data_dir, tmp_path):
    result = train(tiny_run(sample_data_dir, tmp_path, dtype="float16"))
    assert torch.isfinite(torch.tensor(result["train_loss"]))
    scaler = load_checkpoint(tmp_path / "ckpt.pt")["scaler"]
    assert scaler and scaler["scale"] > 1  # the loss was scaled up, and the scale was saved


@pytest.fixture
def full_float32():
    """float32 matmuls in full float32: a training run on CUDA turns on TF32 for the whole
    process (step 13), whose 10-bit inputs would make near-equal logits differ."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)


@needs_gpu
def test_cached_and_uncached_decoding_write_the_same_tokens_on_the_gpu(full_float32):
    torch.manual_seed(0)
    model = GPT(replace(PRESETS["tiny"], vocab_size=512)).to(CUDA).eval()
    prompt = torch.tensor([[1, 2, 3]], device=CUDA)
    greedy = {"temperature": 0, "eot_id": None}
    plain = generate(model, prompt, 90, **greedy)  # past max_seq_len 64: the window slides
    cached = generate_cached(model, prompt, 90, **greedy)
    assert torch.equal(plain, cached)


@needs_gpu
def test_the_graphed_static_decode_step_writes_the_plain_tokens(full_float32):
    from tiny_llm.static_decode import GraphedDecoder, compare_decoding

    torch.manual_seed(0)
    model = GPT(replace(PRESETS["tiny"], vocab_size=512)).to(CUDA).eval()
    decoder = GraphedDecoder(model)
    prompt = torch.tensor([[1, 2, 3]], device=CUDA)
    greedy = {"temperature": 0, "eot_id": None}
    plain = generate(model, prompt, 90, **greedy)  # past the window too
    assert torch.equal(generate(decoder, prompt, 90, cache=decoder.cache, **greedy), plain)
    assert decoder.graph is not None  # the one-token steps were replays
    assert torch.equal(generate(decoder, prompt, 90, cache=decoder.cache, **greedy), plain)
    rates, same = compare_decoding(model, 63)
    assert same and all(rate > 0 for _, rate in rates)


@needs_gpu
def test_a_model_trained_on_the_gpu_exports_with_equal_logits(sample_data_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    from tiny_llm.export import LIMIT, export, max_logit_difference

    train(tiny_run(sample_data_dir, tmp_path / "run"))
    model, _ = export(tmp_path / "run" / "ckpt.pt", tmp_path / "hf", data_dir=sample_data_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert max_logit_difference(model, hf) <= LIMIT  # compared on the CPU, as export does


@needs_gpu
def test_torchrun_with_one_rank_trains_on_the_gpu_with_nccl(sample_data_dir, tmp_path):
    env = {**os.environ, "TINY_LLM_DEVICE": "cuda", "TINY_LLM_DATA_DIR": str(sample_data_dir)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
         "-m", "tiny_llm.scale", "--preset", "tiny", "--max-steps", "4", "--batch-size", "4",
         "--warmup-steps", "2", "--eval-iters", "1", "--sample-tokens", "0", "--time-budget",
         "0", "--out", str(tmp_path / "run")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"ranks\s+1 x cuda \(nccl\)", proc.stdout), proc.stdout
    assert (tmp_path / "run" / "ckpt.pt").is_file()


def test_the_gpu_check_script_parses_and_runs_every_gpu_path():
    script = REPO_ROOT / "scripts" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    plan = subprocess.run(["bash", str(script), "--dry-run"], capture_output=True, text=True,
                          check=True, cwd=REPO_ROOT).stdout
    rows = [line.split("  ")[0] for line in plan.splitlines()]
    for row in ("check device", "check kvcache", "main job", "gpu preset", "export parity",
                "decode: static+graph", "requests", "float16 + scaler", "torchrun, 1 rank",
                "torchrun, 2 ranks"):
        assert row in rows, plan
    assert "--preset gpu" in plan and "--dtype float16" in plan
    for module in set(re.findall(r"-m (tiny_llm\.\w+)", plan)):  # each names a real module
        assert (REPO_ROOT / (module.replace(".", "/") + ".py")).is_file(), module
