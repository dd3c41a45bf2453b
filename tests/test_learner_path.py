"""The learner's path, played: steps 04 to 10 with the type-along, then their own code run.

Each step is its own case, so that the two test workers share them out. A case starts from a
folder of its own (the default relative `mine/`, beside `tiny_llm/` and `scripts/` as in a clone)
holding the learner's files of the steps before it, typed from the chapters' code as the learner
types them (each skeleton, its asked-for bodies exactly as the chapter shows them, and each
chapter's diffs applied to the learner's earlier files, as chapter 07 asks of multihead.py): the
runs that proved those steps are the earlier cases', not replayed. Then, for its step:
`workalong NN` writes the skeleton, which fails its tests with the chapter's words; the bodies
are typed and the chapter's diffs applied; `workalong NN` runs again, every test passes, every
chapter check prints what the chapter shows, and no change is left to apply (step 04 runs its
tests a third time, on the kept build). Every file in `mine/` stays byte for byte as the learner
left it through every run. The last two cases type all seven steps and run the commands chapters
05 and 10 show with `workalong --run` on those files: the smoke test, and a training run that
learns.

The commands workalong starts run in forks of the warm interpreter (tests/chapters.py): the
same argv, folder and environment, without paying for torch's import each time.
"""

import ast
import re
import shlex
import sys
from pathlib import Path

import pytest
from chapters import PLAYED, run_python

from tiny_llm.course import buildup, workalong
from tiny_llm.course.buildup import ROOT, STEPS, squash


def chapter_lines(module, source, node):
    """The chapter's own lines for what the learner writes of `node` (from workalong.body_start
    to its end, in `source`, the module at its step): found, whitespace-normalised, in one of the
    chapter's code blocks for `module`, as workalong finds them."""
    lines = source.splitlines()
    wanted = squash("\n".join(lines[workalong.body_start(lines, node) - 1 : node.end_lineno]))
    for match, _ in workalong.code_blocks(module):
        block = match.group(3).split("\n")[1:]  # after the `# tiny_llm/x.py` line
        words = [(number, word) for number, line in enumerate(block) for word in line.split()]
        code = " ".join(word for _, word in words)
        at = code.find(wanted)
        while at > 0 and code[at - 1] != " ":  # a match inside a longer word is not it
            at = code.find(wanted, at + 1)
        if at >= 0:
            first = code.count(" ", 0, at)
            return block[words[first][0] : words[first + wanted.count(" ")][0] + 1]
    raise AssertionError(f"{module}: no block of its chapter shows {node.name}'s body whole")


def indented(lines, pad):
    """`lines` moved so that the first starts at column `pad`."""
    shift = pad - (len(lines[0]) - len(lines[0].lstrip()))
    if shift >= 0:
        return [" " * shift + line if line.strip() else "" for line in lines]
    assert all(not line.strip() or line[:-shift].isspace() for line in lines)
    return [line[-shift:] for line in lines]


def write_bodies(path, step):
    """Replace each stub in the learner's file by the chapter's code for that body."""
    module = STEPS[step - 1]
    source = buildup.state(step)[f"{module}.py"]
    answer = dict(workalong.bodies(ast.parse(source)))
    text = path.read_text()
    mine = text.split("\n")
    stubs = [(name, node, node.body[-1]) for name, node in workalong.bodies(ast.parse(text))
             if isinstance(node.body[-1], ast.Raise)
             and "write it from steps/" in ast.unparse(node.body[-1])]
    assert stubs, f"{path}: no stub to write"
    for name, node, stub in reversed(stubs):  # from the bottom: line numbers above stay right
        code = chapter_lines(module, source, answer[name])
        mine[stub.lineno - 1 : node.end_lineno] = indented(code, stub.col_offset)
    path.write_text("\n".join(mine))
    return [name for name, *_ in stubs]


def apply_diffs(folder, step):
    """Apply chapter `step`'s diffs to the learner's own earlier files, as the chapter asks."""
    theirs = {f"{m}.py": folder / f"{m}.py" for m in STEPS[: step - 1]}
    theirs = {name: path for name, path in theirs.items() if path.exists()}
    files = buildup.apply({**buildup.state(step - 1), **{n: p.read_text()
                                                         for n, p in theirs.items()}}, step)
    for name, path in theirs.items():
        if files[name] != path.read_text():
            path.write_text(files[name])


def snapshot(folder):
    """{path: bytes} of every file in the learner's folder but the build workalong rewrites."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".build" not in p.relative_to(folder).parts}


def type_steps(folder, steps):
    """The learner's files for `steps`, typed from the chapters without a run: each step's
    skeleton as workalong writes it, its bodies as the chapter shows them, the chapter's diffs
    applied to the earlier files."""
    for step in steps:
        module = STEPS[step - 1]
        path = folder / f"{module}.py"
        folder.mkdir(exist_ok=True)
        path.write_text(workalong.skeleton(module)[0])
        write_bodies(path, step)
        apply_diffs(folder, step)


@pytest.fixture
def clone(tmp_path, monkeypatch, warm_python, sample_data_dir):
    """A learner's clone, where they type along: {tmp_path}/mine/ (not made yet), the
    repository's tiny_llm/ and scripts/ beside it, and workalong's commands run from there in
    forks of the warm interpreter."""
    def forked(argv, cwd, env, timeout, capture=True):
        proc = run_python(argv, cwd, env, timeout, warm_python)
        if not capture:  # --run: what the command prints goes to the learner's terminal
            sys.stdout.write(proc.stdout + proc.stderr)
        return proc

    monkeypatch.setattr(workalong, "run_python", forked)
    # The step's tests that read a data folder (step 10's) use the one this suite prepared, as
    # tests/test_buildup.py's runs of them do, instead of preparing the sample again.
    monkeypatch.setenv("TINY_LLM_TEST_DATA_DIR", str(sample_data_dir))
    for name in ("tiny_llm", "scripts"):  # a clone's folders: the repository's tiny_llm/ is
        (tmp_path / name).symlink_to(ROOT / name)  # right here, and must not be the one run
    monkeypatch.chdir(tmp_path)
    return tmp_path / "mine"


def play(mine, capsys, *args):
    """`workalong *args`, as the learner types it: (exit code, what it printed, the files it
    added to `mine`); asserts it changed none of the learner's files."""
    before = snapshot(mine) if mine.exists() else {}
    code = workalong.main(list(args))
    out = capsys.readouterr().out
    after = snapshot(mine)
    assert {p: after[p] for p in before} == before, f"workalong {args} changed {mine}"
    return code, out, set(after) - set(before)


@pytest.mark.parametrize("step", PLAYED, ids=[f"{s:02d}" for s in PLAYED])
def test_a_learner_writes_the_step(step, clone, capsys):
    mine = clone
    type_steps(mine, range(PLAYED[0], step))
    module, number = STEPS[step - 1], f"{step:02d}"
    code, out, new = play(mine, capsys, number, "--tests", "--", "-x")  # the skeleton, a failure
    assert code == 1 and new == {Path(f"{module}.py")}, out
    assert "NotImplementedError" in out and "write it from steps/" in out, out
    changes = [h.file for h in buildup.hunks(step) if (mine / h.file).is_file()]
    assert out.count("apply it to your file") == len(changes), out  # none applied yet
    asked = write_bodies(mine / f"{module}.py", step)
    assert f"to write     {', '.join(asked)}\n" in out, out
    apply_diffs(mine, step)
    for name, path in workalong.yours(step, mine).items():  # the chapters' code is the state's
        assert path.read_text().endswith(buildup.state(step)[f"{name}.py"]), path
    assert set(workalong.yours(step, mine)) == set(STEPS[PLAYED[0] - 1 : step])
    # One run proves the step: its tests (this is their only run at the step's state, see
    # tests/chapters.py PLAYED) and its chapter's checks. A second, of the tests alone on the
    # kept build, only for the first step: the build is reused and the result the same.
    for args in ((number,), (number, "--tests"))[: 2 if step == PLAYED[0] else 1]:
        code, out, new = play(mine, capsys, *args)
        assert code == 0 and not new, out
        assert "FAIL" not in out and "apply it to your file" not in out, out
        exercises = r"; exercises: (\d+) of \2 pass" if workalong.exercise_tests(module) else ""
        assert re.search(rf"summary +step's tests: (\d+) of \1 pass{exercises} in mine;", out)
        assert f"(your {', '.join(f'{m}.py' for m in STEPS[3:step])})" in out, out
        if "--tests" not in args:
            assert "the checks: as the chapter shows" in out, out
            checks = sum(len(pairs) for pairs in workalong.check_blocks(step))
            assert out.count("check        as the chapter shows") == checks, out


@pytest.fixture
def typed(clone):
    """The learner's folder with steps 04 to 10 typed, and a line at the top of their gpt.py
    that shows when their file is the one imported (though the repository's tiny_llm/ is right
    here): (mine, its files as they are)."""
    type_steps(clone, PLAYED)
    with open(clone / "gpt.py", "a") as file:
        file.write('\nprint("my own gpt.py")\n')
    return clone, snapshot(clone)


def test_the_learners_own_code_runs_the_smoke_test(typed, capsys):
    """Chapter 05's command, on their embed.py and attention.py (their later files unused)."""
    mine, files = typed
    out, expected = run_the_chapters_run_command(5, capsys)
    assert buildup.output_matches(out, expected), "\n".join(out)
    assert out[0] == "yours        mine/embed.py, mine/attention.py; the course's for the rest " \
                     "of step 05"
    smoke = [pairs for _, info, body in buildup.fenced_blocks(workalong.chapter_of(
        "attention").read_text()) if info == "console"
        for pairs in [buildup.console_commands(body)] if "smoke_test" in pairs[0][0]]
    assert buildup.output_matches(out[1:], smoke[0][0][1]), out  # what the course's code prints
    assert snapshot(mine) == files


def test_the_learners_own_code_trains(typed, capsys):
    """Chapter 10's training run, on all seven of their files: it learns, and its checkpoint is
    written where they are, not in the build."""
    mine, files = typed
    out, expected = run_the_chapters_run_command(10, capsys)
    assert buildup.output_matches(out, expected), "\n".join(out)
    assert out[0].startswith(f"yours        {', '.join(f'mine/{m}.py' for m in STEPS[3:10])};")
    assert out.count("my own gpt.py") == 1, out
    losses = [float(v) for line in out for v in re.findall(r"^step +\d+ +train ([\d.]+)", line)]
    assert len(losses) == 2 and losses[1] < losses[0] - 1, out  # the first step and the last
    assert (mine.parent / "runs" / "mine" / "ckpt.pt").is_file()  # runs/ is where they are
    assert not (mine / ".build" / "runs").exists()
    assert snapshot(mine) == files


def run_the_chapters_run_command(step, capsys):
    """Run the `workalong NN --run -- ...` command chapter `step` shows, as the learner types it:
    (the lines it printed, the lines the chapter shows)."""
    text = buildup.chapter_path(step).read_text()
    start = f"$ uv run workalong {step:02d} --run -- "
    shown = [buildup.console_commands(body)[0] for _, _, body in buildup.fenced_blocks(text)
             if body.startswith(start)]
    assert len(shown) == 1, f"chapter {step:02d} shows no `workalong {step:02d} --run` command"
    command, expected = shown[0]
    assert workalong.main(shlex.split(command)[3:]) == 0  # after `uv run workalong`
    return capsys.readouterr().out.splitlines(), expected
