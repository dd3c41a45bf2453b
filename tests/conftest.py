"""Shared test settings and fixtures.

The suite runs in two worker processes (pytest-xdist, `-n 2` in pyproject.toml), each with one
PyTorch thread: the models here are tiny, so two single-threaded workers use a 2-core machine
better than one two-threaded one, and they stay fast when something else loads the machine
(busy-waiting OpenMP threads slow down badly when cores are shared). Commands the tests run
inherit OMP_NUM_THREADS=1.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def sample_data_dir(tmp_path_factory):
    """A data folder prepared from the sample corpus, exactly as a learner's offline run makes it.

    It is also exported as TINY_LLM_DATA_DIR so that commands run by the tests read it.
    """
    from tiny_llm.data import prepare_data

    data_dir = tmp_path_factory.mktemp("data")
    prepare_data("sample", data_dir=data_dir, progress=False)
    os.environ["TINY_LLM_DATA_DIR"] = str(data_dir)
    return data_dir
