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
# glibc's malloc hands PyTorch's larger tensors fresh pages from the kernel (mmap) and gives them
# back at once: every training step then page-faults its activations in again, a tenth of the
# suite's CPU time spent in the kernel. Kept in the heap instead, in every process the suite
# starts (xdist's workers and everything they run inherit this; the numbers are the same).
for _name, _value in (("MALLOC_MMAP_THRESHOLD_", "4294967296"),
                      ("MALLOC_TRIM_THRESHOLD_", "4294967296"), ("MALLOC_TOP_PAD_", "268435456")):
    os.environ.setdefault(_name, _value)
# Tests compare digits that a CPU printed, so what they run picks the CPU on any machine (step
# 01's pick_device reads this; commands get it too, with the GPU hidden: tests/chapters.py).
# The GPU paths are tested where a GPU is found, by naming the device (tests/test_gpu.py).
os.environ["TINY_LLM_DEVICE"] = "cpu"

import pytest  # noqa: E402
from chapters import WarmPython, WarmServer, replay_groups  # noqa: E402

WARM = "TINY_LLM_WARM_PYTHON"  # the folder of the suite's warm interpreter (tests/chapters.py)
COLD = os.environ.get("TINY_LLM_CHAPTERS_COLD") == "1"  # a new interpreter for every command


def pytest_configure(config):
    """Where tests run: one PyTorch thread, and torch frozen (below). pytest-xdist's controller
    runs no test, so it spends nothing on torch. For the whole suite (README's command, no
    paths given) it starts the warm interpreter that the workers' commands fork from, which
    loads its libraries while the workers collect; a run of chosen tests, which may need none,
    leaves it to each worker's first command (warm_python)."""
    if getattr(config, "workerinput", None) is None and (config.getoption("numprocesses", None)
                                                         or 0):
        whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS
        if whole and not COLD and not os.environ.get(WARM):
            config._warm_server = WarmServer({**os.environ, "PYTHONHASHSEED": "0"})
            os.environ[WARM] = config._warm_server.folder  # the workers inherit it
        return
    import torch
    import torch._dynamo  # noqa: F401 (loaded by the first optimizer: here, before the freeze)

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    # What every worker holds from here to its end goes to the collector's permanent
    # generation: the collections that Python runs as tests allocate, and the one pytest runs at
    # the end of every session a test starts in this process (tests/test_mistakes.py), then
    # walk only the tests' own objects.
    gc.freeze()
    atexit.register(gc.unfreeze)  # the interpreter's own end frees it all, as it would have


def pytest_unconfigure(config):
    server = getattr(config, "_warm_server", None)
    if server is not None:  # the controller's, once its workers are done
        os.environ.pop(WARM, None)
        server.close()


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
    """The suite's interpreter with torch imported, forked into each command that the tests run
    as a learner would (see tests/chapters.py): the one the xdist controller started for the
    whole suite, or else one started here. None when TINY_LLM_CHAPTERS_COLD=1 asks for a
    brand-new interpreter each time."""
    if COLD:
        yield None
        return
    server = None if os.environ.get(WARM) else WarmServer({**os.environ, "PYTHONHASHSEED": "0"})
    warm = WarmPython(os.environ.get(WARM) or server.folder)
    yield warm
    warm.close()
    if server is not None:
        server.close()


@pytest.fixture(scope="session")
def web_export(tmp_path_factory, sample_data_dir):
    """Step 19's export of a tiny request-tuned checkpoint (context 24: 200 tokens slide the
    window): (checkpoint, the folder written, web.build's report). Its tests and the page's
    browser test share it (SHARED below keeps them on one worker): an export is seconds."""
    from test_studio import tiny_checkpoint
    from test_web import require_web_runtime

    from tiny_llm import web

    require_web_runtime()
    folder = tmp_path_factory.mktemp("web")
    ckpt = tiny_checkpoint(folder / "gpt" / "ckpt.pt", sample_data_dir, requests="derived")
    report = web.build(ckpt, folder / "site", sample_data_dir, say=lambda *a, **k: None)
    return ckpt, folder / "site", report


# Session fixtures that tests of several modules share: their tests go to one worker together.
SHARED = ("web_export",)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Order the tests for two workers: the long ones first, so that neither worker is left
    with a long test at the end while the other idles; and keep the tests that share a
    module-scoped fixture (a training run, a trained tokenizer) on one worker
    (`--dist loadgroup`), so that the fixture is computed once, not once per worker. A group
    goes to its worker whole, so it is placed by the seconds of all its tests together, and
    its tests stay side by side."""
    groups = {}
    # console blocks that replay each other's runs (tests/chapters.py, Replays)
    replays = replay_groups() if any(i.nodeid.startswith(CONSOLE) for i in items) else {}
    for item in items:
        shared = [name for name, defs in item._fixtureinfo.name2fixturedefs.items()
                  if defs[-1].scope == "module"]
        across = [name for name in SHARED if name in item.fixturenames]
        if item.nodeid.startswith(CONSOLE) and item.callspec.id in replays:
            across = [replays[item.callspec.id]]
        group = across[0] if across else item.nodeid.split("::")[0] if shared else item.nodeid
        if shared or across:
            item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, []).append(item)
    seconds = {group: sum(map(expected_seconds, members)) for group, members in groups.items()}
    order = sorted(groups, key=lambda group: -seconds[group])  # stable: ties keep their order
    items[:] = [item for group in order for item in groups[group]]


# (node id prefix, CPU seconds): the tests that take a second or more, measured with
# `pytest --durations=60` on 2 idle cores (2026-11-28); the first prefix that matches wins. A
# console block's id carries its line in the chapter, so a chapter's own entry follows its
# blocks' as the fallback when lines move.
CONSOLE = "tests/test_chapters.py::test_console_block_matches_a_real_run["
STATE = "tests/test_buildup.py::test_each_steps_tests_pass_on_the_state_at_that_step["
LEARNER = "tests/test_learner_path.py::test_a_learner_writes_the_step["
EXPECTED_SECONDS = [
    (CONSOLE + "11-evaluate.md:274", 36),  # the ladder: five rungs trained, twice (state, head)
    (CONSOLE + "11-evaluate.md", 8),  # 60 steps trained and scored, twice
    (CONSOLE + "13-speed.md", 12),  # every setting of the small preset, one step each, twice
    (CONSOLE + "18-reward.md:291", 7),  # 6 updates, twice; the head's base and tuning replayed
    (CONSOLE + "18-reward.md", 4),
    (CONSOLE + "19-web.md", 10),  # a tiny training run and an export to ONNX, twice
    (CONSOLE + "17-requests.md:484", 10),  # a tiny base, a fine-tuning and a story, twice
    (CONSOLE + "17-requests.md", 1),
    (CONSOLE + "14-positional-encoding-lab.md:420", 9),  # every scheme trained, twice
    (CONSOLE + "16-scale-out.md:399", 9),  # a torchrun job and a one-process run, twice
    (CONSOLE + "16-scale-out.md", 3),
    (CONSOLE + "12-kvcache.md", 7),  # 200 tokens two ways, twice
    (CONSOLE + "20-export.md", 4),  # the training run: 19's at the head, replayed
    (CONSOLE + "07-block.md:268", 5),  # the why-runs of pre-norm and width: short trainings
    (CONSOLE + "03-data.md", 4),
    (CONSOLE + "10-train.md", 2),
    (CONSOLE, 1),
    # steps 04-10 typed along, a case a step: a skeleton's tests, the step's tests, its checks
    (LEARNER + "10]", 12),  # three training runs
    (LEARNER + "07]", 7),  # the block's why-runs
    (LEARNER, 2),
    ("tests/test_learner_path.py::test_the_learners_own_code_trains", 7),  # 200 steps
    ("tests/test_learner_path.py", 1),
    # each step's tests at its state (one group: the states are a module fixture)
    (STATE + "14]", 10), (STATE + "17]", 9), (STATE + "19]", 8), (STATE + "18]", 6),
    (STATE + "13]", 5), (STATE + "15]", 3), (STATE + "3]", 2.5), (STATE, 1.5),
    ("tests/test_buildup.py::test_every_state_imports", 2),
    ("tests/test_buildup.py", 1),
    ("tests/test_notebook.py::test_the_colab_notebook_runs", 2.5),  # a forked Jupyter kernel
    ("tests/test_web_browser.py", 4),  # headless Chromium
    ("tests/test_web.py", 1.5),  # with the browser's test, the group of step 19's export
    ("tests/test_posenc_lab.py", 0.6),  # the group: every scheme trained
    ("tests/test_studio_browser.py", 3),  # a headless Chromium and a server
    ("tests/test_scale.py::test_fsdp2", 3),  # two torchrun jobs of 2 ranks
    ("tests/test_scale.py::test_a_rank_that_fails", 3),
    ("tests/test_speed.py::test_check_prints", 3),
    ("tests/test_workalong.py::test_every_skeleton", 1.5),
    ("tests/test_bench.py::test_quick_bench", 2),
    ("tests/test_instruct.py", 0.5),
    ("tests/test_reward.py", 0.5),
    ("tests/test_train.py", 0.3),
    ("tests/test_mistakes.py", 0.2),
]


def expected_seconds(item):
    """A rough CPU cost to order by (measured once; a wrong guess only costs balance)."""
    for prefix, seconds in EXPECTED_SECONDS:
        if item.nodeid.startswith(prefix):
            return seconds
    return 0
