"""Shared helper: where the course keeps its files.

`DATA_DIR` is `data/` at the repository root unless the environment variable TINY_LLM_DATA_DIR
moves it (the tests use that to work on a scratch copy). Steps before step 03 need it too (the
tokenizer is saved there), which is why it lives here and `tiny_llm.data` re-exports it.
"""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("TINY_LLM_DATA_DIR") or REPO_ROOT / "data")
RUNS_DIR = Path("runs")  # training output, relative to where the command runs


def check_data_dir(data_dir):
    """Raise ValueError if `data_dir` exists as something other than a folder, naming where the
    path came from (TINY_LLM_DATA_DIR or --data-dir) and what to do."""
    data_dir = Path(data_dir)
    if not data_dir.exists() or data_dir.is_dir():
        return data_dir
    from_env = os.environ.get("TINY_LLM_DATA_DIR")
    if from_env and Path(from_env) == data_dir:
        fix = ("TINY_LLM_DATA_DIR names it: point the variable at a folder (it is made if "
               f"missing), or unset it to use {REPO_ROOT / 'data'}")
    else:
        fix = "pass a folder as --data-dir (it is made if missing)"
    raise ValueError(f"the data folder {data_dir} is a file, not a folder. {fix}")
