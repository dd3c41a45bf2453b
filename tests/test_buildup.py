"""The build-up: the package as it stands at every step, proven to apply, import and pass.

tiny_llm/course/buildup.py derives the state at each step from the finished package and
the chapters' diff blocks. Here: each chapter's diffs take the state before it to the state
after it; each state imports; the step's own tests pass on the state at that step (run on
the state only where it differs from the finished package: otherwise the rest of the suite
already ran them). Each chapter's console blocks run on its state in tests/test_chapters.py.
"""

import ast
import os
import shutil
import sys

import pytest
from chapters import PLAYED, run_python

from tiny_llm.course import buildup
from tiny_llm.course.buildup import ROOT, STEPS, ChangeError, apply, state

LAST = len(STEPS)


@pytest.mark.parametrize("step", range(2, LAST + 1))
def test_each_chapters_diffs_take_the_state_before_it_to_the_state_after_it(step):
    before, after = state(step - 1), state(step)
    forward = apply(dict(before), step)
    new_files = {name for name in after if buildup.FIRST_STEP[name] == step}
    assert {**forward, **{n: after[n] for n in new_files}} == after
    assert set(before) | new_files == set(after)


def test_the_state_at_the_last_step_is_the_finished_package(tmp_path):
    from tiny_llm.course import workalong

    assert workalong.main(["--state", str(LAST), "--out", str(tmp_path)]) == 0
    written, package = tmp_path / "tiny_llm", ROOT / "tiny_llm"
    names = buildup.package_files(written)
    assert "studio.html" in names and "course/workalong.py" in names  # every file, not only .py
    assert names == buildup.package_files(package)
    assert all((written / n).read_bytes() == (package / n).read_bytes() for n in names)


def signature(files, qualified):
    """Parameter names of 'Class.method' or 'function' in `files`, e.g. ['self', 'idx']."""
    owner, _, name = qualified.rpartition(".")
    for text in files.values():
        tree = ast.parse(text)
        scopes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner]
        for scope in scopes if owner else [tree]:
            for node in scope.body:
                if isinstance(node, ast.FunctionDef) and node.name == name:
                    return [a.arg for a in node.args.args + node.args.kwonlyargs]
    raise KeyError(f"no {qualified} in the package")


def test_each_step_shows_its_own_code_and_no_later_hook():
    assert signature(state(4), "Embed.forward") == ["self", "idx"]
    assert signature(state(4), "Embed.__init__") == ["self", "vocab_size", "d_model",
                                                     "max_seq_len"]
    assert signature(state(6), "MultiHeadAttention.forward") == ["self", "x"]
    assert signature(state(6), "attend") == ["q", "k", "v", "dropout_p"]
    assert signature(state(7), "Block.forward") == ["self", "x"]
    assert signature(state(8), "GPT.forward") == ["self", "idx", "targets"]
    assert "cache" not in signature(state(9), "generate")
    assert "cache" in signature(state(12), "generate")
    assert signature(state(12), "Embed.forward") == ["self", "idx", "start"]
    assert "learned_positions" in signature(state(14), "Embed.__init__")
    assert "kvcache.py" not in state(11) and "kvcache.py" in state(12)
    for name, text in state(10).items():  # step 16's process hooks are not there yet
        assert "parallel." not in text and "ONE_PROCESS" not in text, f"{name} at step 10"


def test_a_diff_that_does_not_fit_names_the_chapter_and_the_lines(tmp_path, monkeypatch):
    chapter = tmp_path / "steps" / "05-attention.md"
    chapter.parent.mkdir()
    chapter.write_text("```diff\n# tiny_llm/embed.py\n@@ a change @@\n-    no such line\n"
                       "+    a new line\n```\n")
    monkeypatch.setattr(buildup, "ROOT", tmp_path)
    with pytest.raises(ChangeError, match=r"05-attention.md:3: the hunk 'a change' does not "
                                          r"apply to tiny_llm/embed.py: these lines are not found"):
        apply({"embed.py": "x = 1\n"}, 5)


def test_workalong_state_refuses_a_step_that_does_not_exist(capsys, tmp_path):
    from tiny_llm.course import workalong

    last = len(buildup.STEPS)
    with pytest.raises(SystemExit):
        workalong.main(["--state", str(last + 1), "--out", str(tmp_path / "unused")])
    assert f"no step '{last + 1}'" in capsys.readouterr().err
    assert not (tmp_path / "unused").exists()


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    """Every state written once, each as a folder a learner could run and test in."""
    root = tmp_path_factory.mktemp("states")
    for step in range(1, LAST + 1):
        folder = root / f"{step:02d}"
        buildup.write_state(step, folder)
        for name in ("tests", "solutions", "scripts", "steps"):
            (folder / name).symlink_to(ROOT / name)
        shutil.copy(ROOT / "pyproject.toml", folder / "pyproject.toml")
    return root


def test_every_state_imports_every_module_it_has(states, warm_python):
    """One process imports every state in turn (libraries load once), each from its folder."""
    code = f"""
import importlib, pathlib, sys
for folder in sorted(pathlib.Path({str(states)!r}).iterdir()):
    for name in [n for n in sys.modules if n == "tiny_llm" or n.startswith("tiny_llm.")]:
        del sys.modules[name]
    sys.path[0] = str(folder)
    names = sorted(p.relative_to(folder / "tiny_llm").with_suffix("").as_posix().replace("/", ".")
                   for p in (folder / "tiny_llm").rglob("*.py") if p.stem != "__init__")
    for name in names:
        module = importlib.import_module("tiny_llm." + name)
        want = folder / "tiny_llm" / (name.replace(".", "/") + ".py")
        assert module.__file__ == str(want), module.__file__
    print(folder.name, len(names))
"""
    proc = run_python(["-c", code], states, dict(os.environ), 300, warm_python)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = dict(line.split() for line in proc.stdout.split("\n") if line)
    modules = {s: [n for n in state(s) if n.endswith(".py") and not n.endswith("__init__.py")]
               for s in range(1, LAST + 1)}
    assert counts == {f"{s:02d}": str(len(modules[s])) for s in range(1, LAST + 1)}


def step_test_modules(step):
    """The course modules that step `step`'s tests (and its solutions) use, directly or not."""
    used = set()
    module = STEPS[step - 1]
    for path in [ROOT / "tests" / f"test_{module}.py",
                 *sorted((ROOT / "solutions").glob(f"ex{step:02d}_*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tiny_llm"):
                names = [node.module.split(".")[1]] if "." in node.module else [
                    a.name for a in node.names]
                used |= set(names)
    files = state(step)
    return set().union(*(buildup.imports(files, name) for name in used
                         if buildup.module_file(name) in files))


@pytest.mark.parametrize("step", [s for s in range(1, LAST + 1) if s not in PLAYED])
def test_each_steps_tests_pass_on_the_state_at_that_step(step, states, warm_python,
                                                         sample_data_dir):
    files, final = state(step), state(LAST)
    file = buildup.module_file
    differ = sorted(m for m in step_test_modules(step) if files[file(m)] != final[file(m)])
    if not differ:  # the same code as the finished package, whose run is the rest of the suite
        assert all(files[file(m)] == final[file(m)] for m in step_test_modules(step))
        return
    folder = states / f"{step:02d}"
    env = {**os.environ, "TINY_LLM_TEST_DATA_DIR": str(sample_data_dir)}
    # Tests that start ranks of their own (marked `processes`) take half a minute: they run on
    # the finished package only, whose process hooks are step 16's own code at every state.
    argv = ["-m", "pytest", f"tests/test_{STEPS[step - 1]}.py", "-n", "0", "-q", "-x",
            "-p", "no:cacheprovider", "--no-header", "-m", "not processes"]
    proc = run_python(argv, folder, env, 300, warm_python)
    assert proc.returncode == 0, (f"step {step:02d} (its state differs from the finished "
                                  f"package in {differ}):\n{proc.stdout[-3000:]}")


def test_the_course_modules_import_only_earlier_steps():
    for step in range(1, LAST + 1):
        files = state(step)
        for name in [n for n in files if n.endswith(".py")]:
            module = name[:-3].replace("/", ".").removesuffix(".__init__")
            for used in buildup.imports(files, module):
                assert buildup.module_file(used) in files or f"{used}/__init__.py" in files, (
                    f"step {step:02d}: {name} imports {used}")
    assert sys.modules.get("tiny_llm.course.buildup") is buildup
