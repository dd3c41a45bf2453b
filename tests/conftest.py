"""Shared test settings and fixtures.

The suite runs in two worker processes (pytest-xdist, `-n 2` in pyproject.toml), each with one
PyTorch thread: the models here are tiny, so two single-threaded workers use a 2-core machine
better than one two-threaded one, and they stay fast when something else loads the machine
(busy-waiting OpenMP threads slow down badly when cores are shared). Commands the tests run
inherit OMP_NUM_THREADS=1.
"""

import atexit
import gc
import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Tests compare digits that a CPU printed, so what they run picks the CPU on any machine (step
# 01's pick_device reads this; commands get it too, with the GPU hidden: tests/chapters.py).
# The GPU paths are tested where a GPU is found, by naming the device (tests/test_gpu.py).
os.environ["TINY_LLM_DEVICE"] = "cpu"

import pytest  # noqa: E402
import torch  # noqa: E402
from chapters import WarmPython  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# What every worker holds from here to its end (torch, and torch._dynamo, which the first
# optimizer loads) goes to the collector's permanent generation: the collections that Python
# runs as tests allocate, and the one pytest runs at the end of every session a test starts in
# this process (tests/test_mistakes.py), then walk only the tests' own objects.
import torch._dynamo  # noqa: E402, F401

gc.freeze()
atexit.register(gc.unfreeze)  # the interpreter's own end frees it all, as it would have


@pytest.fixture(scope="session")
def sample_data_dir(tmp_path_factory):
    """A data folder prepared from the sample corpus, exactly as a learner's offline run makes it.

    It is also exported as TINY_LLM_DATA_DIR so that commands run by the tests read it.
    """
    from tiny_llm.data import prepare_data

    if os.environ.get("TINY_LLM_TEST_DATA_DIR"):  # prepared by the suite that started this one
        data_dir = Path(os.environ["TINY_LLM_TEST_DATA_DIR"])
        os.environ["TINY_LLM_DATA_DIR"] = str(data_dir)
        return data_dir
    data_dir = tmp_path_factory.mktemp("data")
    prepare_data("sample", data_dir=data_dir, progress=False)
    os.environ["TINY_LLM_DATA_DIR"] = str(data_dir)
    return data_dir


@pytest.fixture(scope="session")
def warm_python():
    """One interpreter per test worker with torch imported, forked into each command that the
    tests run as a learner would (see tests/chapters.py); None when TINY_LLM_CHAPTERS_COLD=1
    asks for a brand-new interpreter each time."""
    if os.environ.get("TINY_LLM_CHAPTERS_COLD") == "1":
        yield None
        return
    server = WarmPython({**os.environ, "PYTHONHASHSEED": "0"})
    yield server
    server.close()


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Order the tests for two workers: the long ones first, so that neither worker is left
    with a long test at the end while the other idles; and keep the tests that share a
    module-scoped fixture (a training run, a trained tokenizer) on one worker
    (`--dist loadgroup`), so that the fixture is computed once, not once per worker."""
    for item in items:
        shared = [name for name, defs in item._fixtureinfo.name2fixturedefs.items()
                  if defs[-1].scope == "module"]
        if shared:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=lambda item: -expected_seconds(item))


# (node id prefix, CPU seconds): the tests that take several seconds, roughly measured with
# `pytest -n 0 --durations=40`; a module whose tests share a fixture counts as one piece of work.
# The first prefix that matches wins; a console block's id carries its line in the chapter,
# so a chapter's own entry follows its blocks' as the fallback when lines move.
CONSOLE = "tests/test_chapters.py::test_console_block_matches_a_real_run["
EXPECTED_SECONDS = [
    # steps 04-10 typed along, a case a step: a skeleton's tests, the step's tests, its checks
    ("tests/test_learner_path.py::test_a_learner_writes_the_step[10]", 25),  # 3 training runs
    ("tests/test_learner_path.py::test_a_learner_writes_the_step", 12),
    ("tests/test_learner_path.py::test_the_learners_own_code_trains", 10),  # 200 steps
    (CONSOLE + "13-speed.md", 25),  # every setting of the small preset, one step each
    ("tests/test_buildup.py::test_each_steps_tests_pass_on_the_state_at_that_step[1", 7),
    ("tests/test_buildup.py::test_each_steps_tests_pass_on_the_state_at_that_step", 3),
    ("tests/test_buildup.py::test_every_state_imports", 6),
    ("tests/test_workalong.py::test_every_skeleton", 3),
    ("tests/test_workalong.py::test_a_finished_step", 6),
    ("tests/test_reliability.py", 8),
    ("tests/test_vs_nanogpt.py", 4),
    ("tests/test_scale.py::test_fsdp2", 17),  # two torchrun jobs of 2 ranks
    (CONSOLE + "16-scale-out.md:399", 25),  # a torchrun job and a one-process run, twice
    (CONSOLE + "16-scale-out.md:358", 20),  # the check: 2 spawned ranks, twice (state, head)
    (CONSOLE + "20-export.md", 12),
    (CONSOLE + "19-web.md", 22),  # a tiny training run and an export to ONNX, twice
    ("tests/test_web.py", 25),  # an export to ONNX, node
    ("tests/test_web_browser.py", 25),  # an export, headless Chromium
    (CONSOLE + "17-requests.md:484", 20),  # a tiny base, a fine-tuning and a story, twice
    (CONSOLE + "18-reward.md:298", 24),  # a base, a fine-tuning, 6 updates, twice
    (CONSOLE + "18-reward.md:275", 7),  # the check's two toy runs of 60 updates, twice
    (CONSOLE + "17-requests.md", 10),  # (a block whose line moved, until its id is updated)
    (CONSOLE + "18-reward.md", 10),
    ("tests/test_reward.py", 6),  # two toy runs, a resumed reward run
    ("tests/test_instruct.py", 8),
    ("tests/test_notebook.py", 10),  # a Jupyter kernel: torch, 12 tiny steps, a story, a score
    (CONSOLE + "11-evaluate.md:274", 43),  # the ladder: five rungs trained, twice (state, head)
    (CONSOLE + "11-evaluate.md", 15),  # 60 steps trained and scored, twice
    ("tests/test_ladder.py", 6),  # five rungs of 40 steps
    (CONSOLE + "16-scale-out.md", 15),
    ("tests/test_scale.py::test_two_ranks", 15),
    ("tests/test_scale.py::test_a_rank_that_fails", 15),
    (CONSOLE + "10-train.md", 15),
    ("tests/test_bench.py", 15),
    (CONSOLE + "14-", 12),
    (CONSOLE + "12-kvcache.md:355", 12),  # 200 tokens two ways, twice
    (CONSOLE + "13-", 10),
    ("tests/test_train.py", 10),
    ("tests/test_posenc_lab.py", 10),
    ("tests/test_export.py", 10),
    ("tests/test_tokenize.py", 8),
    (CONSOLE, 5),
    ("tests/test_smoke.py", 5),
    ("tests/test_studio_browser.py", 5),  # a headless Chromium and a server
    ("tests/test_reliability_runs.py::test_resume_refuses_to_change_step_17s", 6),  # 2 fine-tunes
]


def expected_seconds(item):
    """A rough CPU cost to order by (measured once; a wrong guess only costs balance)."""
    for prefix, seconds in EXPECTED_SECONDS:
        if item.nodeid.startswith(prefix):
            return seconds
    return 0
