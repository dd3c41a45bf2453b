"""The type-along path: every step's skeleton can be made, imports, and fails its step's tests;
a finished step passes its tests and its chapter's checks through the same path.

The learner's files are linked into a build of the package at the step (mine/.build/); the
tests run there in forks of the warm interpreter (tests/chapters.py), as `workalong` runs them.
"""

import ast
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from chapters import PLAYED, run_python

from tiny_llm.course import buildup, workalong
from tiny_llm.course.workalong import ROOT, STEPS, learner_file, skeleton, step_module


@pytest.fixture
def warm(monkeypatch, warm_python):
    """workalong's commands run in forks of the warm interpreter, as tests/chapters.py does."""
    monkeypatch.setattr(workalong, "run_python", lambda argv, cwd, env, timeout, capture=True:
                        run_python(argv, cwd, env, timeout, warm_python))


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
    with pytest.raises(SystemExit, match=f"give a number 01-{len(STEPS)}"):
        step_module(str(len(STEPS) + 1))


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


def test_the_learners_file_is_never_written_not_even_with_fresh(tmp_path, capsys):
    path = learner_file("device", tmp_path)
    assert "NotImplementedError" in path.read_text()
    path.write_text("# my work\n")
    assert learner_file("device", tmp_path).read_text() == "# my work\n"
    assert "kept; --fresh writes a new skeleton beside it" in capsys.readouterr().out
    assert workalong.main(["01", "--fresh", "--dir", str(tmp_path)]) == 0
    assert workalong.main(["01", "--fresh", "--dir", str(tmp_path)]) == 0
    assert path.read_text() == "# my work\n"
    for fresh in ("device.fresh.py", "device.fresh-2.py"):
        assert "NotImplementedError" in (tmp_path / fresh).read_text()
    out = capsys.readouterr().out
    assert f"{path} is as it was; to start over with the new one: mv {path} " in out


def test_a_second_build_writes_nothing_through_the_links_to_your_files(tmp_path):
    """The first build links mine/attention.py into mine/.build; the second once wrote the
    answer key through that link into the learner's file."""
    mine = tmp_path / "attention.py"
    mine.write_text("# MY OWN WORK\n")
    for _ in range(3):
        where = workalong.build(5, tmp_path)
        assert mine.read_text() == "# MY OWN WORK\n"
        assert (where / "tiny_llm" / "attention.py").resolve() == mine.resolve()
        assert (where / workalong.MARKER).is_file()


def test_write_state_replaces_a_link_and_leaves_its_target_alone(tmp_path):
    target = tmp_path / "mine.py"
    target.write_text("# mine\n")
    (tmp_path / "out" / "tiny_llm").mkdir(parents=True)
    (tmp_path / "out" / "tiny_llm" / "embed.py").symlink_to(target)
    buildup.write_state(4, tmp_path / "out")
    assert target.read_text() == "# mine\n"
    assert (tmp_path / "out" / "tiny_llm" / "embed.py").read_text() == buildup.state(4)["embed.py"]


def test_a_build_folder_workalong_did_not_write_is_refused(tmp_path):
    (tmp_path / ".build").mkdir()
    (tmp_path / ".build" / "notes.txt").write_text("mine\n")
    with pytest.raises(SystemExit, match=r"\.build is not empty and workalong did not write it"):
        workalong.build(5, tmp_path)
    assert (tmp_path / ".build" / "notes.txt").read_text() == "mine\n"


def test_state_out_refuses_a_folder_it_did_not_write_and_rewrites_its_own(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(SystemExit, match=rf"{tmp_path} is not empty and workalong did not write "
                                         r"it .*Pick a new or empty folder for --out"):
        workalong.main(["--state", "05", "--out", str(tmp_path)])
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    out = tmp_path / "out"
    assert workalong.main(["--state", "06", "--out", str(out)]) == 0
    assert workalong.main(["--state", "05", "--out", str(out)]) == 0  # its own: rewritten
    assert not (out / "tiny_llm" / "multihead.py").exists()
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(SystemExit, match=r"holds what workalong did not write \(notes.txt\)"):
        workalong.main(["--state", "05", "--out", str(out)])
    assert (out / "notes.txt").read_text() == "mine\n"


def test_a_syntax_error_names_the_file_and_line_before_any_test_runs(tmp_path, capsys):
    (tmp_path / "embed.py").write_text("import torch\n\ndef oops(:\n    pass\n")
    assert workalong.main(["05", "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"syntax error {tmp_path / 'embed.py'}:3:" in out and "def oops(:" in out
    assert "tests/test_attention.py" not in out and not (tmp_path / ".build").exists()


def test_a_command_that_never_ends_is_stopped_and_said(tmp_path, capsys, monkeypatch):
    assert workalong.main(["01", "--dir", str(tmp_path), "--run", "--timeout", "0.5", "--",
                           "python", "-c", "while True: pass"]) == 1
    out = capsys.readouterr().out
    assert "stopped      python -c while True: pass after 0.5 s (--timeout)" in out

    def never_ends(argv, cwd, env, timeout, capture=True):
        raise subprocess.TimeoutExpired(argv, timeout)

    (tmp_path / "device.py").write_text(buildup.state(1)["device.py"])
    monkeypatch.setattr(workalong, "run_python", never_ends)
    assert workalong.main(["01", "--dir", str(tmp_path), "--timeout", "7"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  tests/test_device.py\n          stopped after 7.0 s: a loop that never" in out
    assert "check        stopped after 7.0 s" in out


def test_run_refuses_what_is_not_a_python_command_before_building(tmp_path):
    with pytest.raises(SystemExit, match="--run runs a Python command, got 'ls -l'"):
        workalong.main(["05", "--dir", str(tmp_path), "--run", "--", "ls", "-l"])
    assert not (tmp_path / ".build").exists()


def test_run_puts_the_build_first_and_stays_where_you_are(tmp_path, capfd, monkeypatch):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "device.py").write_text('print("my device.py")\n')
    (tmp_path / "tiny_llm").symlink_to(ROOT / "tiny_llm")  # the repository's, as in a clone
    monkeypatch.chdir(tmp_path)
    code = "import os, tiny_llm.device as d; print(d.__file__); print(os.getcwd())"
    assert workalong.main(["02", "--run", "--", "uv", "run", "python", "-c", code]) == 0
    out = capfd.readouterr().out.splitlines()
    assert out[0] == "yours        mine/device.py; the course's for the rest of step 02"
    assert out[1:] == ["my device.py", str(tmp_path / "mine" / ".build" / "tiny_llm" /
                                           "device.py"), str(tmp_path)]


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


# test_learner_path runs the skeletons of steps 04-10 (PLAYED) and asserts they fail the same way
@pytest.mark.parametrize("module", [m for n, m in enumerate(STEPS, 1)
                                    if m not in ONLY_IMPORTED and n not in PLAYED])
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
                                                                       monkeypatch, warm):
    (tmp_path / "device.py").write_text(buildup.state(1)["device.py"])
    (tmp_path / "autograd.py").write_text(buildup.state(1)["autograd.py"])  # step 01's second
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert workalong.main(["01", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "check        as the chapter shows" in out
    assert re.search(r"summary +step's tests: (\d+) of \1 pass; exercises: (\d+) of \2 pass in .*"
                     r"the checks: as the chapter shows", out), out


def test_a_failing_raises_test_shows_the_message_it_expected(tmp_path, capsys, warm):
    mine = buildup.state(4)["embed.py"].replace(  # the given check, deleted by the learner
        "check_sizes(vocab_size=vocab_size, d_model=d_model, max_seq_len=max_seq_len)", "pass")
    (tmp_path / "embed.py").write_text(mine)
    assert workalong.main(["04", "--dir", str(tmp_path), "--no-check", "--", "-k",
                           "bad_sizes"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  test_bad_sizes_are_refused" in out
    assert "the test expects an error matching \"max_seq_len must be a positive int" in out


CHAPTER = '''## The code

### Your turn: `Embed.forward`

`forward(idx)` takes a `(B, T)` tensor of ids and returns it. Checked by `test_forward`.

<details>
<summary>The code, once you have tried</summary>

```python
# tiny_llm/embed.py
    def forward(self, idx):
        return idx
```

</details>

## Two at once

The first helper says hello.

```python
# tiny_llm/embed.py
def one():
    return 1


def two():
    return 2
```

`two` gives two.
'''
SOURCE = '''class Embed:
    def forward(self, idx):
        return idx


def one():
    return 1


def two():
    return 2
'''


def test_code_in_details_is_found_and_each_body_quotes_its_own_words(tmp_path, monkeypatch):
    import chapters

    path = tmp_path / "04-embed.md"
    path.write_text(CHAPTER)
    found = chapters.blocks(path)  # the chapter checks read a fence inside <details> too
    assert [(b.info, b.body.split("\n")[1]) for b in found] == [
        ("python", "    def forward(self, idx):"), ("python", "def one():")]
    assert [info for _, info, _ in buildup.fenced_blocks(CHAPTER)] == ["python", "python"]
    monkeypatch.setattr(workalong, "chapter_of", lambda module: path)
    shown = workalong.shown_in_chapter("embed", SOURCE)
    assert shown == {
        "Embed.forward": ("steps/04-embed.md, section 'The code'", "`forward(idx)` takes a "
                          "`(B, T)` tensor of ids and returns it. Checked by `test_forward`."),
        "one": ("steps/04-embed.md, section 'Two at once'", "The first helper says hello."),
        "two": ("steps/04-embed.md, section 'Two at once'", "`two` gives two.")}
    node = dict(workalong.bodies(ast.parse(SOURCE)))["Embed.forward"]
    assert workalong.shown_whole(SOURCE, node, buildup.squash(CHAPTER))


def test_stubs_do_not_quote_another_bodys_paragraph():
    """Embed.__init__ quoted the forward's paragraph, check_length check_ids', and
    CausalSelfAttention.__init__ the forward's."""
    pairs = {"embed": [("Embed.__init__", "Embed.forward"), ("check_length", "check_ids")],
             "attention": [("CausalSelfAttention.__init__", "CausalSelfAttention.forward")]}
    checked = 0
    for module, names in pairs.items():
        shown = workalong.shown_in_chapter(module, buildup.state(STEPS.index(module) + 1)[
            f"{module}.py"])
        for mine, other in names:
            if mine in shown and other in shown:
                assert not shown[mine][1] or shown[mine][1] != shown[other][1], (mine, other)
                checked += 1
    assert checked


def test_a_failing_assertion_shows_its_line_its_values_and_the_tests_message(tmp_path, capsys,
                                                                             warm):
    """It showed `assert False` and nothing else."""
    mine = buildup.state(4)["embed.py"].replace("std=0.02)", "std=0.2)")
    (tmp_path / "embed.py").write_text(mine)
    assert workalong.main(["04", "--dir", str(tmp_path), "--tests", "--", "-k",
                           "small_normals"]) == 1
    out = capsys.readouterr().out
    assert f"at {tmp_path / 'embed.py'}" not in out  # the failing line is the test's
    assert "at tests/test_embed.py:" in out and "> assert" in out
    assert "tok_emb.weight starts with std 0.200" in out  # the test's message, with the value


def test_pytests_traceback_flags_are_passed_through(tmp_path, capsys, warm):
    mine = buildup.state(4)["embed.py"].replace("std=0.02)", "std=0.2)")
    (tmp_path / "embed.py").write_text(mine)
    assert workalong.main(["04", "--dir", str(tmp_path), "--tests", "--", "-k",
                           "small_normals", "--tb=long"]) == 1
    out = capsys.readouterr().out
    assert "def test_tables_start_as_small_normals" in out  # --tb=long shows the whole test


def test_a_differing_check_shows_the_lines_that_differ():
    expected = ["params           532,480", "input ids        (2, 8)", "...", "std 0.0283"]
    actual = ["params           532,480", "input ids        (2, 9)", "extra", "std 0.0283"]
    assert workalong.differences(actual, expected) == ["- input ids        (2, 8)",
                                                       "+ input ids        (2, 9)"]
    assert workalong.differences(["std 0.0284"], ["std 0.0283"]) == []  # within tolerance
    assert workalong.differences(["a 1", "c 3"], ["a 1", "b 2", "c 3"]) == ["- b 2"]


def test_workalong_prints_the_changes_to_earlier_files_it_asks_for(tmp_path, capsys):
    """Chapter 07's change to multihead.py was printed only by --plan."""
    (tmp_path / "multihead.py").write_text(buildup.state(6)["multihead.py"])
    workalong.print_changes(7, tmp_path)
    out = capsys.readouterr().out
    assert f"change       {tmp_path / 'multihead.py'}: MultiHeadAttention.__init__" in out
    assert "apply it to your file" in out
    assert "+         self.proj.residual_output = True" in out
    (tmp_path / "multihead.py").write_text(buildup.state(7)["multihead.py"])
    workalong.print_changes(7, tmp_path)
    assert capsys.readouterr().out.rstrip().endswith(": applied")
    # Issue 42: applied without the chapter's trailing comment, it still said "apply it".
    mine = buildup.state(7)["multihead.py"].replace(
        "residual_output = True  # added onto the residual stream: step 07's init_weights",
        "residual_output  =  True\n")
    assert "step 07's init_weights" not in mine
    (tmp_path / "multihead.py").write_text(mine)
    workalong.print_changes(7, tmp_path)
    assert capsys.readouterr().out.rstrip().endswith(": applied")
    assert workalong.code_only("x = '#1'  # one\n\n  y  = 2 # two") == "x = '#1' y = 2"


def test_a_second_run_on_the_same_folder_is_refused_while_the_first_holds_it(tmp_path, capsys):
    """Issue 36, BAD 4: a second run deleted mine/.build under the first one."""
    (tmp_path / "embed.py").write_text(buildup.state(4)["embed.py"])
    first = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / ".build.lock").write_text(f"{first.pid}\n")
        for args in (["--tests"], ["--run", "--", "python", "-c", "pass"]):
            with pytest.raises(SystemExit, match=rf"another workalong run \(process {first.pid}\)"
                                                 r" is using .*\.build: wait until it ends"):
                workalong.main(["05", "--dir", str(tmp_path), *args])
        assert not (tmp_path / ".build").exists()
    finally:
        first.kill()
        first.wait()
    where = workalong.build(5, tmp_path)  # its process gone, the lock is stale: taken over
    with workalong.holding(tmp_path):
        assert (tmp_path / ".build.lock").read_text().strip() == str(os.getpid())
    assert not (tmp_path / ".build.lock").exists() and where.is_dir()


def test_the_build_is_reused_while_the_same_files_are_linked(tmp_path):
    (tmp_path / "embed.py").write_text("# mine\n")
    where = workalong.build(5, tmp_path)
    (where / "notes.txt").write_text("kept\n")
    assert workalong.build(5, tmp_path) == where and (where / "notes.txt").exists()
    (tmp_path / "attention.py").write_text("# mine too\n")  # one more of yours: built again
    workalong.build(5, tmp_path)
    assert not (where / "notes.txt").exists()
    assert (where / "tiny_llm" / "attention.py").resolve() == (tmp_path / "attention.py").resolve()


def test_state_keeps_your_edits_and_your_files(tmp_path):
    """Issue 36, BAD 5: --state 06 over --state 05 deleted an edit and a file the learner added."""
    out = tmp_path / "st"
    assert workalong.main(["--state", "05", "--out", str(out)]) == 0
    (out / "tiny_llm" / "attention.py").write_text("# my edit\n")
    (out / "tiny_llm" / "mynotes.txt").write_text("notes\n")
    with pytest.raises(SystemExit, match=r"holds files --state did not write, or that changed "
                                         r"since \(tiny_llm/attention.py, tiny_llm/mynotes.txt\)"):
        workalong.main(["--state", "06", "--out", str(out)])
    assert (out / "tiny_llm" / "attention.py").read_text() == "# my edit\n"
    assert (out / "tiny_llm" / "mynotes.txt").read_text() == "notes\n"
    (out / "tiny_llm" / "mynotes.txt").unlink()
    (out / "tiny_llm" / "attention.py").write_text(buildup.state(5)["attention.py"])
    (out / "tiny_llm" / "__pycache__").mkdir()  # Python's cache is nobody's edit
    (out / "tiny_llm" / "__pycache__" / "x.pyc").write_bytes(b"")
    assert workalong.main(["--state", "06", "--out", str(out)]) == 0
    assert (out / "tiny_llm" / "multihead.py").is_file()


def test_a_dir_that_is_a_file_is_refused_in_a_sentence(tmp_path, capsys):
    """Issue 36: --dir pointing at a file gave a FileExistsError traceback."""
    (tmp_path / "notes").write_text("mine\n")
    with pytest.raises(SystemExit):
        workalong.main(["05", "--dir", str(tmp_path / "notes")])
    assert f"--dir {tmp_path / 'notes'} is a file: give the folder" in capsys.readouterr().err
    assert (tmp_path / "notes").read_text() == "mine\n"


def test_a_kept_builds_last_report_is_never_read_as_this_runs(tmp_path):
    (tmp_path / "embed.py").write_text(buildup.state(4)["embed.py"])
    where = workalong.build(4, tmp_path)
    (where / "report.xml").write_text('<testsuite><testcase name="old"/></testsuite>')
    (where / "tests").unlink()  # pytest finds no tests folder now: no report of its own
    (where / "tests").mkdir()
    code, results = workalong.run_tests(where, "embed")
    assert code != 0 and [name for name, *_ in results] == ["collecting the tests"]


def test_a_steps_second_module_gets_its_skeleton_its_plan_and_its_link(tmp_path, capsys):
    """Step 01 has two modules the learner writes: device and autograd (buildup.TYPED_HELPERS)."""
    assert workalong.step_modules(1) == ["device", "autograd"]
    assert workalong.chapter_of("autograd").name == "01-setup.md"
    text, todo = skeleton("autograd")
    assert "sgd_step" in todo and "check_logits" not in todo, f"autograd's bodies: {todo}"
    assert text.startswith("# Your tiny_llm/autograd.py, step 01"), text[:80]
    workalong.print_plan(1, tmp_path)
    plan = capsys.readouterr().out
    assert "and          tiny_llm/autograd.py is the answer" in plan, plan
    assert "tests        tests/test_device.py" in plan, plan
    (tmp_path / "autograd.py").write_text(buildup.state(1)["autograd.py"])
    assert workalong.yours(4, tmp_path) == {"autograd": tmp_path / "autograd.py"}
    where = workalong.build(4, tmp_path)  # a later step links the learner's autograd.py in too
    assert (where / "tiny_llm" / "autograd.py").resolve() == (tmp_path / "autograd.py").resolve()

def test_the_failing_line_is_the_learners_own_never_pythons_carets(tmp_path, capsys, warm):
    """Issue 42: the line shown was Python's `^^^^` line under the code."""
    mine = buildup.state(4)["embed.py"].replace("return x + self.pos_emb(pos)  #",
                                                "return x + self.pos_emb(pos)[T]  #")
    (tmp_path / "embed.py").write_text(mine)
    assert workalong.main(["04", "--dir", str(tmp_path), "--tests", "--", "-k",
                           "output_is_token_row"]) == 1
    out = capsys.readouterr().out
    line = next(n for n, text in enumerate(mine.splitlines(), 1) if "pos_emb(pos)[T]" in text)
    assert re.search(rf"at tests/test_embed.py:\d+: in \w+\n +at {tmp_path / 'embed.py'}:{line}: "
                     r"in forward\n +> return x \+ self.pos_emb\(pos\)\[T\]  #", out), out
    assert not re.search(r"^\s*>?\s*[\^~]+\s*$", out, re.M), out  # no caret line


def test_a_failing_assertion_in_the_test_shows_the_tests_line():
    problem = ET.fromstring(
        '<failure message="AssertionError">tests/test_embed.py:30: in test_x\n'
        '    assert out.shape == (2, 8, 16), "shape"\n           ^^^^^^^^^\n'
        'E   AssertionError: shape</failure>')
    assert workalong.note(problem, mine={"tiny_llm/embed.py"}).splitlines()[:2] == [
        "at tests/test_embed.py:30: in test_x", '> assert out.shape == (2, 8, 16), "shape"']


def report(cases):
    """A fake run_python that writes pytest's junit report of `cases` ({name: traceback or None}),
    as a run of the step's tests would."""
    def run(argv, cwd, env, timeout, capture=True):
        path = next(a for a in argv if a.startswith("--junitxml=")).partition("=")[2]
        suite = ET.Element("testsuite")
        for name, text in cases.items():
            case = ET.SubElement(suite, "testcase", name=name)
            if text:
                ET.SubElement(case, "failure", message="failed").text = text
        ET.ElementTree(suite).write(path)
        return subprocess.CompletedProcess(argv, 1 if any(cases.values()) else 0, "", "")
    return run


IN_YOUR_FILE = ("tests/test_embed.py:150: in test_solutions\n    same, cos = ex.cosines()\n"
                "solutions/ex04_embed.py:20: in cosines\n    out = emb(idx)\n"
                "tiny_llm/embed.py:49: in forward\n    x = self.tok_emb(idx)\n        ^^^^^\n"
                "E   IndexError: index out of range")


def test_the_exercises_are_reported_apart_from_the_steps_own_tests(tmp_path, capsys,
                                                                    monkeypatch):
    """Issue 42: test_solutions failed beside the step's tests and pointed into the learner's
    forward, though every test of the step passed."""
    assert workalong.exercise_tests("embed") == {"test_solutions"}
    (tmp_path / "embed.py").write_text(buildup.state(4)["embed.py"])
    monkeypatch.setattr(workalong, "run_python", report(
        {"test_parameter_count_is_two_tables": None, "test_bad_sizes_are_refused": None,
         "test_solutions": IN_YOUR_FILE}))
    assert workalong.main(["04", "--dir", str(tmp_path), "--tests"]) == 1
    out = capsys.readouterr().out
    assert "exercises    the answers in solutions/ex04_*.py" in out
    assert "the step's own tests pass: this is an exercise's answer failing" in out
    assert f"at {tmp_path / 'embed.py'}" not in out and "at solutions/ex04_embed.py:20" in out
    assert f"summary      step's tests: 2 of 2 pass; exercises: 0 of 1 pass in {tmp_path};" in out
    monkeypatch.setattr(workalong, "run_python", report(
        {"test_parameter_count_is_two_tables": IN_YOUR_FILE.replace("test_solutions", "test_p"),
         "test_bad_sizes_are_refused": None, "test_solutions": IN_YOUR_FILE}))
    assert workalong.main(["04", "--dir", str(tmp_path), "--tests"]) == 1
    out = capsys.readouterr().out
    assert "the step's own tests fail above: this may follow from them" in out
    assert f"at {tmp_path / 'embed.py'}:49: in forward" in out
    assert "step's tests: 1 of 2 pass; exercises: 0 of 1 pass" in out


@pytest.mark.parametrize(("ending", "said"), [
    ("os._exit(0)", "pytest exited with code 0 and wrote no report"),
    ("os.kill(os.getpid(), 9)", "pytest was killed by signal 9 (SIGKILL) and wrote no report")])
def test_tests_that_did_not_finish_are_never_a_pass(tmp_path, capsys, warm, ending, said):
    """Issue 45, BAD 3: a body that called os._exit(0) gave "0 of 1 tests pass" and exit 0."""
    (tmp_path / "embed.py").write_text(buildup.state(4)["embed.py"] + f"\nimport os\n{ending}\n")
    assert workalong.main(["04", "--dir", str(tmp_path), "--tests"]) == 1
    out = capsys.readouterr().out
    assert f"FAIL  the tests did not finish\n          {said}" in out, out
    assert "summary      the tests did not finish (above)" in out, out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal")
def test_a_run_killed_with_sigkill_leaves_no_test_run_behind(tmp_path):
    """Issue 45: after kill -9, the killed run's pytest kept burning a core in mine/.build."""
    (tmp_path / "embed.py").write_text(buildup.state(4)["embed.py"] +
                                       "\nimport time\ntime.sleep(120)\n")
    run = subprocess.Popen([sys.executable, "-m", "tiny_llm.course.workalong", "04", "--tests",
                            "--dir", str(tmp_path)], cwd=ROOT, stdout=subprocess.DEVNULL)
    children = Path(f"/proc/{run.pid}/task/{run.pid}/children")
    for _ in range(600):
        if run.poll() is None and (child := children.read_text().split()):
            break
        time.sleep(0.05)
    else:
        run.kill()
        pytest.fail("workalong started no test run in 30 s")
    run.kill()  # SIGKILL: no finally, no handler runs
    run.wait()
    stat = Path(f"/proc/{child[0]}/stat")
    for _ in range(100):
        if not stat.exists() or stat.read_text().rpartition(")")[2].split()[0] == "Z":
            break  # gone, or dead and waiting to be reaped: burning nothing
        time.sleep(0.05)
    else:
        os.kill(int(child[0]), 9)
        pytest.fail(f"the test run {child[0]} outlived the killed workalong by 5 s")
