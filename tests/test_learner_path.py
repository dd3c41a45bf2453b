"""The learner's path, played: steps 04 to 10 with the type-along, then their own code run.

From a folder of its own (the default relative `mine/`, beside `tiny_llm/` and `scripts/` as in
a clone), for each step in order: `workalong NN` writes the skeleton, which fails its tests;
each asked-for body is written exactly as the chapter shows it (and chapter 07's diff applied to
the learner's multihead.py, as the chapter asks); then `workalong NN` runs again, every test
passes and every chapter check prints what the chapter shows, and no change is left to apply
(step 04 runs its tests a third time, on the kept build). Every file in `mine/` stays
byte for byte as the learner left it through every run. Last, the smoke test and a 30-step
training run go through `workalong --run` on those files, and print what they should.

The commands workalong starts run in forks of the warm interpreter (tests/chapters.py): the
same argv, folder and environment, without paying for torch's import each time.
"""

import ast
import re
import shlex
import sys
from pathlib import Path

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


def test_a_learner_writes_steps_04_to_10_and_runs_their_own_code(tmp_path, monkeypatch, capsys,
                                                                 warm_python, sample_data_dir):
    def forked(argv, cwd, env, timeout, capture=True):
        proc = run_python(argv, cwd, env, timeout, warm_python)
        if not capture:  # --run: what the command prints goes to the learner's terminal
            sys.stdout.write(proc.stdout + proc.stderr)
        return proc

    monkeypatch.setattr(workalong, "run_python", forked)
    for name in ("tiny_llm", "scripts"):  # a clone's folders: the repository's tiny_llm/ is
        (tmp_path / name).symlink_to(ROOT / name)  # right here, and must not be the one run
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine"

    def play(*args):
        before = snapshot(mine) if mine.exists() else {}
        code = workalong.main(list(args))
        out = capsys.readouterr().out
        after = snapshot(mine)
        assert {p: after[p] for p in before} == before, f"workalong {args} changed {mine}"
        return code, out, set(after) - set(before)

    for step in PLAYED:
        module, number = STEPS[step - 1], f"{step:02d}"
        code, out, new = play(number, "--tests", "--", "-x")  # the skeleton, and a failure
        assert code == 1 and new == {Path(f"{module}.py")}, out
        assert "NotImplementedError" in out and "write it from steps/" in out, out
        asked = write_bodies(mine / f"{module}.py", step)
        assert f"to write     {', '.join(asked)}\n" in out, out
        apply_diffs(mine, step)
        for name, path in workalong.yours(step, mine).items():  # the chapters' code is the
            assert path.read_text().endswith(buildup.state(step)[f"{name}.py"]), path  # state's
        # One run proves the step: its tests (this is their only run at the step's state, see
        # tests/chapters.py PLAYED) and its chapter's checks. A second, of the tests alone on the
        # kept build, only for the first step: the build is reused and the result the same.
        for args in ((number,), (number, "--tests"))[: 2 if step == PLAYED[0] else 1]:
            code, out, new = play(*args)
            assert code == 0 and not new, out
            assert "FAIL" not in out and "apply it to your file" not in out, out
            exercises = r"; exercises: (\d+) of \2 pass" if workalong.exercise_tests(module) else ""
            assert re.search(rf"summary +step's tests: (\d+) of \1 pass{exercises} in mine;", out)
            assert f"(your {', '.join(f'{m}.py' for m in STEPS[3:step])})" in out, out
            if "--tests" not in args:
                assert "the checks: as the chapter shows" in out, out
                checks = sum(len(pairs) for pairs in workalong.check_blocks(step))
                assert out.count("check        as the chapter shows") == checks, out

    # The learner's own code, run from where they are, with the commands chapters 05 and 10
    # show: a line at the top of their gpt.py shows that their file is the one imported, though
    # the repository's tiny_llm/ is right here.
    with open(mine / "gpt.py", "a") as file:
        file.write('\nprint("my own gpt.py")\n')
    files = snapshot(mine)
    out, expected = run_the_chapters_run_command(5, capsys)
    assert buildup.output_matches(out, expected), "\n".join(out)
    assert out[0] == "yours        mine/embed.py, mine/attention.py; the course's for the rest " \
                     "of step 05"
    smoke = [pairs for _, info, body in buildup.fenced_blocks(workalong.chapter_of(
        "attention").read_text()) if info == "console"
        for pairs in [buildup.console_commands(body)] if "smoke_test" in pairs[0][0]]
    assert buildup.output_matches(out[1:], smoke[0][0][1]), out  # what the course's code prints

    out, expected = run_the_chapters_run_command(10, capsys)
    assert buildup.output_matches(out, expected), "\n".join(out)
    assert out[0].startswith(f"yours        {', '.join(f'mine/{m}.py' for m in STEPS[3:10])};")
    assert out.count("my own gpt.py") == 1, out
    losses = [float(v) for line in out for v in re.findall(r"^step +\d+ +train ([\d.]+)", line)]
    assert len(losses) == 2 and losses[1] < losses[0] - 1, out  # step 0 and step 30: it learns
    assert (tmp_path / "runs" / "mine" / "ckpt.pt").is_file()  # runs/ is where they are
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
