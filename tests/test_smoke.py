import os

from chapters import ROOT, run_python


def test_smoke_test_prints_the_chain_of_shapes(sample_data_dir, tmp_path, warm_python):
    env = {**os.environ, "TINY_LLM_DATA_DIR": str(sample_data_dir)}
    proc = run_python([str(ROOT / "scripts" / "smoke_test.py")], tmp_path, env, 120, warm_python)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("valid.bin") and lines[0].endswith("tokens (sample)")
    assert lines[1:] == [
        "get_batch  x (2, 12) int64",
        "Embed      (2, 12, 64) float32",
        "attention  (2, 12, 64) float32",
        "smoke test OK",
    ]
