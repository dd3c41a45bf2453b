"""The type-along path: every step's skeleton can be made, imports, and fails its step's tests;
a finished step passes its tests and its chapter's checks through the same path.

The learner's files are linked into a build of the package at the step (mine/.build/); the
tests run there in forks of the warm interpreter (tests/chapters.py), as `workalong` runs them.
"""

import ast
import os
import re
import subprocess

import pytest
from chapters import PLAYED, run_python

from tiny_llm.course import buildup, workalong
from tiny_llm.course.workalong import ROOT, STEPS, learner_file, skeleton, step_module

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
    with pytest.raises(SystemExit, match="give a number 01-19"):
        step_module("20")


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
                                                                       monkeypatch):
    (tmp_path / "device.py").write_text(buildup.state(1)["device.py"])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert workalong.main(["01", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "check        as the chapter shows" in out
    assert re.search(r"summary +(\d+) of \1 tests pass .*the checks: as the chapter shows", out)


def test_a_failing_raises_test_shows_the_message_it_expected(tmp_path, capsys):
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


def test_a_failing_assertion_shows_its_line_its_values_and_the_tests_message(tmp_path, capsys):
    """It showed `assert False` and nothing else."""
    mine = buildup.state(4)["embed.py"].replace("std=0.02)", "std=0.2)")
    (tmp_path / "embed.py").write_text(mine)
    assert workalong.main(["04", "--dir", str(tmp_path), "--tests", "--", "-k",
                           "small_normals"]) == 1
    out = capsys.readouterr().out
    assert f"at {tmp_path / 'embed.py'}" not in out  # the failing line is the test's
    assert "at tests/test_embed.py:" in out and "> assert" in out
    assert "tok_emb.weight starts with std 0.200" in out  # the test's message, with the value


def test_pytests_traceback_flags_are_passed_through(tmp_path, capsys):
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
