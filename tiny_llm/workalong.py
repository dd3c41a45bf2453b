"""Shared helper: write each step yourself, with the finished course as the answer key.

    uv run python -m tiny_llm.workalong 05 --plan   # what you would write, and where it is shown
    uv run python -m tiny_llm.workalong 05          # make mine/attention.py, test it, check it

The second makes `mine/attention.py`, a copy of step 05's module in which every function and
method that the step's chapter shows has its body replaced by a `NotImplementedError` saying
what to write and which section shows it. Everything else (imports, constants, classes,
signatures, docstrings, the helpers the chapter does not show, code that runs while the module
loads, the `__main__` check) is kept. `--all` leaves you every body but `main`. Your file is
never overwritten: run the command again to test it, `--fresh` to start over (the old file is
kept as a `.bak`).

Each run tests your file with the step's own tests, `tests/test_attention.py`, then runs the
chapter's check (its first console block) on it. How: an import hook makes
`import tiny_llm.attention` load `mine/attention.py`, and only that module, in this process and
(through $TINY_LLM_WORKALONG, which tiny_llm/__init__.py reads) in the processes it starts.
Earlier steps stay the answer key, so your step 08 builds on the course's attention, not yours;
later modules that a step's tests use import your file, as they would the finished one.
"""

import argparse
import ast
import contextlib
import importlib.abc
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["device", "tokenize", "data", "embed", "attention", "multihead", "block", "gpt",
         "generate", "train", "evaluate", "kvcache", "speed", "posenc_lab", "modern", "scale",
         "export"]  # step 01 is device, step 17 export: the course table in README.md
HOOK = "TINY_LLM_WORKALONG"  # the learner's file; tiny_llm/__init__.py installs the hook
SOURCE_HEADER = re.compile(r"^```[^\n]*\n#\s*tiny_llm/(\w+)\.py[ \t]*\n(.*?)^```", re.S | re.M)
CONSOLE = re.compile(r"^```console[ \t]*\n(.*?)^```", re.S | re.M)


def step_module(step):
    """'05', '5' or 'attention' -> 'attention'."""
    if step in STEPS:
        return step
    if step.isdigit() and 1 <= int(step) <= len(STEPS):
        return STEPS[int(step) - 1]
    raise SystemExit(f"no step {step!r}: give a number 01-{len(STEPS)} "
                     f"or a module name ({', '.join(STEPS)})")


def chapter_of(module):
    """'attention' -> Path('steps/05-attention.md') (absolute)."""
    return next((ROOT / "steps").glob(f"{STEPS.index(module) + 1:02d}-*.md"))


def bodies(tree):
    """Yield (qualified name, def node) for top-level functions and methods of top-level classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{sub.name}", sub


def shown_in_chapter(module, source):
    """{qualified name: where} for each function or method whose code the step's chapter shows.

    A chapter's source block names its file (`# tiny_llm/attention.py`); we find each of its
    pieces in the file, whitespace aside, the way tests/chapters.py checks them. (Code of this
    module that a later chapter shows, such as device.kept_memory in 13, stays written.)
    """
    words, lines = [], []
    for number, line in enumerate(source.splitlines(), 1):
        words += line.split()
        lines += [number] * len(line.split())
    code, defs, shown = " ".join(words), list(bodies(ast.parse(source))), {}
    for chapter in [chapter_of(module)]:
        text = chapter.read_text()
        for match in SOURCE_HEADER.finditer(text):
            if match.group(1) != module:
                continue
            headings = re.findall(r"^## (.+)$", text[: match.start()], re.M)
            where = f"steps/{chapter.name}" + (f", section '{headings[-1]}'" if headings else "")
            for piece in re.split(r"^\s*#\s*\.\.\.\s*$", match.group(2), flags=re.M):
                piece = " ".join(piece.split())
                at = code.find(piece) if piece else -1
                if at < 0:
                    continue
                first = lines[code.count(" ", 0, at)]
                last = lines[code.count(" ", 0, at) + piece.count(" ")]
                for name, node in defs:
                    if node.lineno <= last and node.end_lineno >= first:
                        shown.setdefault(name, where)
    return shown


def called_at_import(tree):
    """Names the module calls while it loads (`PRESETS = {"tiny": GPTConfig(...)}` calls GPTConfig).

    Their bodies stay written: a skeleton that cannot even be imported would test nothing.
    """
    called = set()

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts = node.decorator_list + node.args.defaults + node.args.kw_defaults
            for part in filter(None, parts):
                visit(part)
            return  # the body runs only when called
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            called.update({name, f"{name}.__init__", f"{name}.__post_init__"})
        for child in ast.iter_child_nodes(node):
            visit(child)

    for node in tree.body:
        visit(node)
    return called


def skeleton(module, everything=False):
    """Return (text of the learner's file, {body to write: where the chapter shows it})."""
    source = (ROOT / "tiny_llm" / f"{module}.py").read_text()
    lines = source.splitlines()
    where = shown_in_chapter(module, source)
    chapter = f"steps/{chapter_of(module).name}"
    todo, tree = [], ast.parse(source)
    for name, node in bodies(tree):
        if not (name in where or (everything and name != "main")) or name in called_at_import(tree):
            continue
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        if not body or body[0].lineno == node.lineno:
            continue  # nothing to write, or a one-line def
        todo.append((name, node, body[0].lineno))
    for name, node, start in reversed(todo):  # from the bottom, so line numbers stay right
        while lines[start - 2].strip().startswith("#") or not lines[start - 2].strip():
            start -= 1  # the comments above the first statement go too: they explain it
        pad = " " * (node.col_offset + 4)
        said = f"{name}: type it in from {where.get(name, chapter)}"
        lines[start - 1 : node.end_lineno] = [f"{pad}raise NotImplementedError(", f"{pad}    "
                                              f"{said!r}", f"{pad})"]
    number = STEPS.index(module) + 1
    header = [f"# Your tiny_llm/{module}.py, step {number:02d}: replace each NotImplementedError.",
              f"# Test it: uv run python -m tiny_llm.workalong {number:02d}   "
              f"(the answer: tiny_llm/{module}.py)"]
    return "\n".join(header + lines) + "\n", {name: where.get(name, chapter) for name, _, _ in todo}


def learner_file(module, folder, fresh=False, everything=False):
    """Return the learner's file for a step, writing a skeleton only where there is none yet.

    Existing work is never overwritten: with `fresh` it is renamed to `<module>.py.<n>.bak`.
    """
    path = Path(folder) / f"{module}.py"
    if path.exists() and not fresh:
        print(f"yours        {path} (kept; --fresh starts over)")
        return path
    if path.exists():
        backups = (path.with_suffix(f".py.{n}.bak") for n in range(1, 10_000))
        backup = next(p for p in backups if not p.exists())
        path.rename(backup)
        print(f"kept         your old file as {backup}")
    text, todo = skeleton(module, everything=everything)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote        {path}: {len(todo)} bodies for you to write")
    print(f"to write     {', '.join(todo)}")
    return path


class LearnerFinder(importlib.abc.MetaPathFinder):
    """An import hook: `tiny_llm.<module>` loads the learner's file; other names are untouched."""

    def __init__(self, path):
        self.path, self.name = Path(path).resolve(), f"tiny_llm.{Path(path).stem}"

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path)

    @classmethod
    def install(cls, path):
        finder = cls(path)
        sys.meta_path.insert(0, finder)
        return finder


@contextlib.contextmanager
def learner_module(path):
    """Inside the block, `import tiny_llm.<module>` gives the learner's file; after it, as before.

    The course's modules, tests and solutions are imported afresh inside (so they bind to the
    learner's file), and the modules of before are put back afterwards.
    """
    before, environ = dict(sys.modules), os.environ.get(HOOK)
    forget_course_modules()
    finder = LearnerFinder.install(path)
    os.environ[HOOK] = str(finder.path)  # for the processes the tests start: tiny_llm/__init__.py
    try:
        yield finder.name
    finally:
        sys.meta_path.remove(finder)
        forget_course_modules()  # libraries imported meanwhile stay: torch loads once a process
        sys.modules.update(before)
        if environ is None:
            os.environ.pop(HOOK, None)
        else:
            os.environ[HOOK] = environ


def forget_course_modules():
    """Drop the course's own modules (tiny_llm.*, tests, solutions) from sys.modules."""
    ours = tuple(str(ROOT / folder) + os.sep for folder in ("tiny_llm", "tests", "solutions"))
    for name, mod in list(sys.modules.items()):
        file = getattr(mod, "__file__", None) or ""
        if name not in ("tiny_llm", __name__) and (file.startswith(ours)
                                                   or name.startswith("tiny_llm.")):
            del sys.modules[name]


class Outcomes:
    """A pytest plugin that keeps each test's outcome and prints them as a list at the end.

    Given `first`, names of functions the learner writes, it runs the tests that call one of
    them first (where the first failure is likely) and the rest after, in their order.
    """

    def __init__(self, first=()):
        self.results = {}  # test name -> (passed, first line of the failure)
        self.first = {part for name in first for part in name.split(".")}

    def pytest_collection_modifyitems(self, items):
        def calls_a_stub(item):
            code = getattr(getattr(item, "function", None), "__code__", None)
            return bool(code and self.first & set(code.co_names))

        items.sort(key=lambda item: not calls_a_stub(item))

    def pytest_runtest_logreport(self, report):
        name = report.nodeid.split("::", 1)[-1]
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash else str(report.longrepr)
            self.results[name] = (False, message.strip().splitlines()[0] if message else "")
        elif report.when == "call" and name not in self.results:
            self.results[name] = (True, "")

    def pytest_terminal_summary(self, terminalreporter):
        said = set()  # each failure message once: they are often all the same first stub
        for name, (passed, message) in self.results.items():
            terminalreporter.write_line(f"  {'pass' if passed else 'FAIL'}  {name}")
            if message and message not in said:
                terminalreporter.write_line(f"          {message[:200]}")
                said.add(message)


def run_tests(path, first_failure=(), extra=()):
    """Run the step's tests in this process against the learner's file: (exit code, Outcomes).

    `first_failure`: names of the functions to write; stop at the first failure, trying the
    tests that call them first (a quick "does anything fail?").
    """
    import pytest

    module = Path(path).stem
    args = [str(ROOT / "tests" / f"test_{module}.py"), f"--rootdir={ROOT}",
            "-c", str(ROOT / "pyproject.toml"), "-n", "0", "-q", "-rN", "--tb=no",
            "-p", "no:cacheprovider", *(["-x"] if first_failure else []), *extra]
    outcomes = Outcomes(first=first_failure)
    with learner_module(path):
        code = pytest.main(args, plugins=[outcomes])
    return int(code), outcomes


def check_commands(module):
    """The commands of the chapter's first console block that runs `-m tiny_llm.<module>`."""
    text = chapter_of(module).read_text()
    for block in CONSOLE.findall(text):
        commands = [line[2:] for line in block.splitlines() if line.startswith("$ ")]
        if any(f"-m tiny_llm.{module}" in c for c in commands):
            return commands
    return []


def run_check(path, module, work):
    """Run the chapter's check in the folder `work` with the learner's file: its exit code."""
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, HOOK: str(Path(path).resolve())}
    for command in check_commands(module):
        print(f"$ {command}", flush=True)
        argv = shlex.split(command)[3:]  # after `uv run python`
        proc = subprocess.run([sys.executable, *argv], cwd=work, env=env, check=False)
        if proc.returncode:
            return proc.returncode
    return 0


def print_plan(module, folder, everything=False):
    """Say what the learner writes for a step, where each piece is explained, and what runs."""
    number = STEPS.index(module) + 1
    print(f"step {number:02d}      tiny_llm/{module}.py is the answer; yours is "
          f"{Path(folder) / f'{module}.py'}")
    for name, where in skeleton(module, everything=everything)[1].items():
        print(f"write        {name:<30} {where}")
    print(f"tests        tests/test_{module}.py")
    for command in check_commands(module):
        print(f"check        {command}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        description="Write a step yourself: make your file, test it, run the chapter's check.",
        epilog="Arguments after `--` go to pytest, e.g. -- -k causal --tb=short")
    parser.add_argument("step", help="step number or module name: 05 or attention")
    parser.add_argument("--dir", type=Path, default=Path("mine"), help="your files (default mine/)")
    parser.add_argument("--fresh", action="store_true", help="start over (keeps the old as .bak)")
    parser.add_argument("--all", action="store_true", help="write every body but main, not just "
                        "what the chapter shows")
    parser.add_argument("--no-check", action="store_true", help="run the tests only")
    parser.add_argument("--plan", action="store_true", help="only say what you would write")
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    module = step_module(args.step)
    if args.plan:
        return print_plan(module, args.dir, everything=args.all)
    path = learner_file(module, args.dir, fresh=args.fresh, everything=args.all)
    print(f"tests        tests/test_{module}.py against {path}", flush=True)
    code, outcomes = run_tests(path, extra=extra)
    passed = sum(ok for ok, _ in outcomes.results.values())
    check = "not run" if args.no_check else None
    if check is None:
        print(f"check        the chapter's check, run in {args.dir / 'check'}", flush=True)
        status = run_check(path, module, args.dir / "check")
        check = "runs" if status == 0 else f"fails (exit {status})"
    print(f"summary      {passed} of {len(outcomes.results)} tests pass; the check {check}")
    return 0 if code == 0 and check in ("runs", "not run") else 1


if __name__ == "__main__":
    sys.exit(main())
