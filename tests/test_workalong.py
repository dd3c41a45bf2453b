"""The type-along path: every step's skeleton can be made, imports, and fails its step's tests.

The step's tests on the finished module are the rest of the suite; here they also pass when the
finished module is handed in as the learner's file (for two steps: that proves the import hook).
The heavy part runs in one child process, so the swapped modules never touch this one.
"""

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_llm import workalong
from tiny_llm.workalong import ROOT, STEPS, learner_file, skeleton, step_module

ANSWER_SAMPLE = ["device", "attention"]  # steps whose finished module is also run as "mine"
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
    with pytest.raises(SystemExit, match="give a number 01-17"):
        step_module("18")


@pytest.mark.parametrize("module", STEPS)
def test_skeleton_keeps_the_module_and_stubs_what_the_chapter_shows(module):
    text, todo = skeleton(module)
    answer = ast.parse((ROOT / "tiny_llm" / f"{module}.py").read_text())
    mine = ast.parse(text)
    assert todo, f"step {module}: the chapter shows no function to write"
    # The same names at the top level (imports, constants, classes, functions, the check).
    def names(tree):
        return [ast.dump(n) if isinstance(n, ast.If) else getattr(n, "name", ast.dump(n)[:80])
                for n in tree.body]
    assert names(mine) == names(answer)
    stubs = [ast.unparse(n) for n in ast.walk(mine) if isinstance(n, ast.Raise)]
    stubs = [s for s in stubs if "NotImplementedError" in s and "type it in from steps/" in s]
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


def run_every_step(folder):
    """In a child process: {step: [import ok, tests' exit code on the skeleton]} and the answers."""
    report = {}
    for module in STEPS:
        path = Path(folder) / "skeleton" / f"{module}.py"
        path.parent.mkdir(exist_ok=True)
        text, todo = skeleton(module)
        path.write_text(text)
        with workalong.learner_module(path) as name:
            imported = importlib.import_module(name).__file__ == str(path.resolve())
        report[module] = {"imports": imported}
        if module not in ONLY_IMPORTED:
            code, outcomes = workalong.run_tests(path, first_failure=todo)
            failed = [t for t, (ok, _) in outcomes.results.items() if not ok]
            report[module].update(code=code, failed=failed)
    for module in ANSWER_SAMPLE:
        path = Path(folder) / "answer" / f"{module}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text((ROOT / "tiny_llm" / f"{module}.py").read_text())
        code, outcomes = workalong.run_tests(path)
        report[f"answer:{module}"] = {"code": code, "n": len(outcomes.results)}
    return report


def test_every_skeleton_imports_and_fails_its_tests_and_the_answer_passes(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    script = ("import json, sys, test_workalong as t; "
              "print('REPORT', json.dumps(t.run_every_step(sys.argv[1])))")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.rsplit("REPORT ", 1)[1])
    for module in STEPS:
        got = report[module]
        assert got["imports"], f"step {module}: the skeleton did not import as tiny_llm.{module}"
        if module not in ONLY_IMPORTED:
            assert got["code"] == 1 and got["failed"], f"step {module}: no test fails on it"
    for module in ANSWER_SAMPLE:
        got = report[f"answer:{module}"]
        assert got["code"] == 0 and got["n"] > 3, f"step {module}: the answer as mine fails"
