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
