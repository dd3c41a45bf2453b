import json
import os

import pytest
from chapters import run_python

from tiny_llm.paths import REPO_ROOT

KEYS = ("data_prep_ratio", "train_speedup", "train_tokens_per_s", "mfu", "kv_cache_speedup")


def test_quick_bench_writes_every_figure(sample_data_dir, tmp_path, warm_python):
    out = tmp_path / "bench.json"
    env = {**os.environ, "TINY_LLM_DATA_DIR": str(sample_data_dir)}
    proc = run_python([str(REPO_ROOT / "scripts" / "bench.py"), "--quick", "--json", str(out),
                       "--device", "cpu"], tmp_path, env, 300, warm_python)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for key in KEYS:
        assert result[key] > 0, key
        assert f"\n{key} " in "\n" + proc.stdout
    # MFU divides the training's speed by a matmul peak timed at another moment: on a busy
    # machine it can pass 100%, which the report prints as "n/a". A record, so only its
    # arithmetic is asserted here, and that the line says which it is.
    assert result["mfu"] == pytest.approx(result["train_tokens_per_s"] * result["flops_per_token"]
                                          / (result["peak_gflops"] * 1e9))
    mfu_line = proc.stdout.split("\nmfu ", 1)[1].splitlines()[0]
    assert ("n/a (over 100%" in mfu_line) == (result["mfu"] > 1)
    assert result["kv_outputs_equal"] is True
    assert result["val_loss_baseline"] > 0 and isinstance(result["val_loss_within_2pct"], bool)
    assert {"cpu", "cores", "torch", "device"} <= set(result["machine"])
    assert set(result["targets"]) == {"data_prep_ratio", "train_speedup", "kv_cache_speedup"}
    assert result["settings"]["float32 (baseline)"]["tokens_per_s"] > 0


def test_bench_refuses_missing_data(tmp_path, warm_python):
    env = {**os.environ, "TINY_LLM_DATA_DIR": str(tmp_path / "nothing")}
    proc = run_python([str(REPO_ROOT / "scripts" / "bench.py"), "--quick", "--json",
                       str(tmp_path / "b.json")], tmp_path, env, 300, warm_python)
    assert proc.returncode != 0
    assert "error:" in proc.stderr and "tiny_llm.data" in proc.stderr
    assert not (tmp_path / "b.json").exists()
