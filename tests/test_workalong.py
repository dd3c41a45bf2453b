"""The type-along path: every step's skeleton can be made, imports, and fails its step's tests;
a finished step passes its tests and its chapter's checks through the same path.

The learner's files are linked into a build of the package at the step (mine/.build/); the
tests run there in forks of the warm interpreter (tests/chapters.py), as `workalong` runs them.
"""

import ast
import re

import pytest
from chapters import run_python

from tiny_llm import buildup, workalong
from tiny_llm.workalong import ROOT, STEPS, learner_file, skeleton, step_module

# Step 16's stubs run only inside the ranks it starts (torchrun, mp.spawn): its skeleton fails
# only in tests that start processes, too slow for this suite, so here it is made and imported.
ONLY_IMPORTED = {"scale"}


def test_the_steps_are_the_course_table_of_the_readme():
    rows = re.findall(r"^\| (\d\d) \| \[\w[\w ]*\]\(steps/(\d\d-[\w-]+)\.md\).*?"
                      r"`uv run python -m tiny_llm\.(\w+)", (ROOT / "README.md").read_text(), re.M)
    assert [module for _, _, module in rows] == STEPS
    for number, chapter, module in rows:
        assert step_module(number) == module
        assert workalong.chapter_of(module).stem == chapter


def test_step_names_and_numbers_resolve_and_a_wrong_one_says_what_to_give():
    assert step_module("05") == step_module("5") == step_module("attention") == "attention"
    with pytest.raises(SystemExit, match="give a number 01-18"):
        step_module("19")


@pytest.mark.parametrize("module", STEPS)
def test_skeleton_keeps_the_module_and_stubs_what_the_chapter_shows(module):
    text, todo = skeleton(module)
    answer = ast.parse(buildup.state(STEPS.index(module) + 1)[f"{module}.py"])
    mine = ast.parse(text)
    assert todo, f"step {module}: the chapter shows no function to write"
    # The same names at the top level (imports, constants, classes, functions, the check).
    def names(tree):
        return [ast.dump(n) if isinstance(n, ast.If) else getattr(n, "name", ast.dump(n)[:80])
                for n in tree.body]
    assert names(mine) == names(answer)
    stubs = [ast.unparse(n) for n in ast.walk(mine) if isinstance(n, ast.Raise)]
    stubs = [s for s in stubs if "NotImplementedError" in s and "write it from steps/" in s]
    assert len(stubs) == len(todo)
    chapter = workalong.chapter_of(module).name
    assert any(chapter in s for s in stubs), "no stub points at the step's chapter"


def test_everything_mode_leaves_only_main():
    _, shown = skeleton("block")
    _, everything = skeleton("block", everything=True)
    assert set(shown) < set(everything) and "main" not in everything
    assert {"MLP.forward", "residual_stds", "plot_stds"} <= set(everything) - set(shown)


def test_the_learners_file_is_never_overwritten_without_fresh(tmp_path, capsys):
    path = learner_file("device", tmp_path)
    assert "NotImplementedError" in path.read_text()
    path.write_text("# my work\n")
    assert learner_file("device", tmp_path).read_text() == "# my work\n"
    assert "kept; --fresh starts over" in capsys.readouterr().out
    learner_file("device", tmp_path, fresh=True)
    assert (tmp_path / "device.py.1.bak").read_text() == "# my work\n"
    assert "NotImplementedError" in path.read_text()


def test_the_plan_names_the_diffs_to_apply_to_your_earlier_files(tmp_path, capsys):
    (tmp_path / "embed.py").write_text("# my step 04\n")
    assert workalong.main(["12", "--plan", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "write        KVCache.append" in out
    assert re.search(r"change +tiny_llm/embed.py +the diffs in steps/12-kvcache.md, to your", out)
    assert re.search(r"change +tiny_llm/gpt.py .*you have no .*gpt.py: the course's is used", out)
    assert "check        uv run python -m tiny_llm.kvcache" in out


def test_the_build_links_your_files_into_the_package_at_the_step(tmp_path):
    (tmp_path / "embed.py").write_text("# my step 04\n")
    (tmp_path / "kvcache.py").write_text("# a later step: not part of step 05\n")
    where = workalong.build(5, tmp_path)
    package = where / "tiny_llm"
    assert (package / "embed.py").resolve() == (tmp_path / "embed.py").resolve()
    assert not (package / "kvcache.py").exists() and not (package / "multihead.py").exists()
    assert (package / "attention.py").read_text() == buildup.state(5)["attention.py"]


@pytest.mark.parametrize("module", [m for m in STEPS if m not in ONLY_IMPORTED])
def test_every_skeleton_fails_its_steps_tests_with_the_chapters_words(module, tmp_path,
                                                                      warm_python):
    learner_file(module, tmp_path)
    where = workalong.build(STEPS.index(module) + 1, tmp_path)
    argv = ["-m", "pytest", f"tests/test_{module}.py", "-n", "0", "-q", "-x", "--tb=line",
            "-p", "no:cacheprovider"]
    proc = run_python(argv, where, workalong.environment(), 300, warm_python)
    assert proc.returncode == 1, f"step {module}: no test fails on the skeleton"
    assert "NotImplementedError" in proc.stdout and "write it from steps/" in proc.stdout


def test_skeletons_of_steps_that_start_processes_import(tmp_path, warm_python):
    for module in ONLY_IMPORTED:
        learner_file(module, tmp_path)
        where = workalong.build(STEPS.index(module) + 1, tmp_path)
        proc = run_python(["-c", f"import tiny_llm.{module} as m; print(m.__file__)"], where,
                          workalong.environment(), 120, warm_python)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip().endswith(f".build/tiny_llm/{module}.py")


def test_a_finished_step_passes_its_tests_and_prints_its_chapters_check(tmp_path, capsys,
                                                                       monkeypatch):
    (tmp_path / "device.py").write_text(buildup.state(1)["device.py"])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert workalong.main(["01", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "check        as the chapter shows" in out
    assert re.search(r"summary +(\d+) of \1 tests pass .*the checks: as the chapter shows", out)


def test_a_failing_raises_test_shows_the_message_it_expected(tmp_path, capsys):
    mine = buildup.state(4)["embed.py"].replace(
        'raise ValueError(f"{name} must be a positive int, got {value!r}")', "pass")
    (tmp_path / "embed.py").write_text(mine)
    assert workalong.main(["04", "--dir", str(tmp_path), "--no-check", "--", "-k",
                           "bad_sizes"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  test_bad_sizes_are_refused" in out
    assert "the test expects an error matching \"max_seq_len must be a positive int" in out
