"""Shared helper: write each step yourself, on top of the steps you wrote before.

    uv run python -m tiny_llm.workalong 05 --plan    # what step 05 asks of you, and where
    uv run python -m tiny_llm.workalong 05           # make mine/attention.py, test it, check it
    uv run python -m tiny_llm.workalong --state 05 --out DIR   # the package after step 05

A step asks for two kinds of work. Its new module, `mine/attention.py`, starts as the module
as it stands at step 05 (tiny_llm/buildup.py) with every body the chapter shows replaced by a
`NotImplementedError` that carries the chapter's explanation, not its code. And where a later
chapter changes a module you wrote earlier (step 12 gives attention a cache), you apply the
chapter's diff to your own file.

Each run builds the package as it stands at the step in `mine/.build/`: the course's state at
that step, with every module you have written (`mine/<module>.py` of this step or an earlier
one) linked in its place. Then it runs the step's tests there, and the chapter's checks, and
compares what they print with the chapter. Your files are never overwritten (`--fresh` starts
the step's module over and keeps the old one as a `.bak`).
"""

import argparse
import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from tiny_llm import buildup
from tiny_llm.buildup import ROOT, STEPS, squash

LINKED = ("tests", "solutions", "scripts", "steps")  # what the tests read from the repository


def step_number(step):
    """'05', '5' or 'attention' -> 5."""
    if step in STEPS:
        return STEPS.index(step) + 1
    if step.isdigit() and 1 <= int(step) <= len(STEPS):
        return int(step)
    raise SystemExit(f"no step {step!r}: give a number 01-{len(STEPS)} "
                     f"or a module name ({', '.join(STEPS)})")


def step_module(step):
    """'05', '5' or 'attention' -> 'attention'."""
    return STEPS[step_number(step) - 1]


def chapter_of(module):
    """'attention' -> Path('steps/05-attention.md') (absolute)."""
    return buildup.chapter_path(STEPS.index(module) + 1)


def bodies(tree):
    """Yield (qualified name, def node) for top-level functions and methods of top-level classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{sub.name}", sub


def explanation(text, start, end):
    """The chapter's words about the code block text[start:end]: the last paragraph of prose
    before it in its section, else the first one after it; on one line."""
    def prose(part):
        part = re.sub(r"```.*?```", "\n\n", part, flags=re.S)
        return [squash(p) for p in re.split(r"\n\s*\n", part)
                if p.strip() and not p.lstrip().startswith(("#", "!", "|", "<!--"))]

    section = text[:start].rsplit("\n## ", 1)[-1].split("\n", 1)[-1]
    after = text[end:].split("\n## ", 1)[0]
    found = (prose(section)[-1:] or prose(after)[:1] or [""])[0]
    return found if len(found) <= 400 else found[:397].rsplit(" ", 1)[0] + " ..."


def shown_in_chapter(module, source):
    """{qualified name: (where, explanation)} for each function or method of `source` whose code
    the step's chapter shows: its section, and the prose that introduces the block."""
    words, lines = [], []
    for number, line in enumerate(source.splitlines(), 1):
        words += line.split()
        lines += [number] * len(line.split())
    code, defs, shown = " ".join(words), list(bodies(ast.parse(source))), {}
    chapter = chapter_of(module)
    text = chapter.read_text().split("\n## Exercises", 1)[0]  # what follows is reference
    for match in buildup.FENCE.finditer(text):
        first, _, body = match.group(3).partition("\n")
        header = buildup.FILE_HEADER.match(first)
        if match.group(2).strip() == "diff" or not header or header.group(1) != f"{module}.py":
            continue  # a diff is a change to apply to your file, not a body to write
        headings = re.findall(r"^## (.+)$", text[: match.start()], re.M)
        where = f"steps/{chapter.name}" + (f", section '{headings[-1]}'" if headings else "")
        for piece in re.split(r"^\s*#\s*\.\.\.\s*$", body, flags=re.M):
            piece = squash(piece)
            at = code.find(piece) if piece else -1
            if at < 0:
                continue
            first = lines[code.count(" ", 0, at)]
            last = lines[code.count(" ", 0, at) + piece.count(" ")]
            for name, node in defs:
                if node.lineno <= last and node.end_lineno >= first:
                    shown.setdefault(name, (where, explanation(text, match.start(), match.end())))
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
    """Return (text of the learner's file, {body to write: where the chapter shows it}).

    The text is the module as it stands at its own step, each body the chapter shows replaced by
    a NotImplementedError that says what the chapter says about it and where."""
    number = STEPS.index(module) + 1
    source = buildup.state(number)[f"{module}.py"]
    lines = source.splitlines()
    shown = shown_in_chapter(module, source)
    chapter = f"steps/{chapter_of(module).name}"
    todo, tree = [], ast.parse(source)
    text = squash(chapter_of(module).read_text().split("\n## Exercises", 1)[0])
    for name, node in bodies(tree):
        asked = name in shown and shown_whole(source, node, text)  # the chapter has every line
        if not (asked or (everything and name != "main")) or name in called_at_import(tree):
            continue
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        if not body or body[0].lineno == node.lineno:
            continue  # nothing to write, or a one-line def
        todo.append((name, node, body[0].lineno))
    for name, node, start in reversed(todo):  # from the bottom, so line numbers stay right
        while lines[start - 2].strip().startswith("#") or not lines[start - 2].strip():
            start -= 1  # the comments above the first statement go too: they explain it
        pad = " " * (node.col_offset + 4)
        where, said = shown.get(name, (chapter, ""))
        message = [f"{name}: write it from {where}."] + ([f"The chapter: {said}"] if said else [])
        lines[start - 1 : node.end_lineno] = (
            [f"{pad}raise NotImplementedError("]
            + [f"{pad}    {part!r}" for part in wrap(" ".join(message), 88 - len(pad))]
            + [f"{pad})"])
    header = [f"# Your tiny_llm/{module}.py, step {number:02d}: replace each NotImplementedError.",
              f"# Test it: uv run python -m tiny_llm.workalong {number:02d}   "
              f"(the answer: tiny_llm/{module}.py)"]
    return "\n".join(header + lines) + "\n", {n: shown.get(n, (chapter, ""))[0] for n, *_ in todo}


def shown_whole(source, node, chapter_text):
    """Whether every statement of the body of `node` (its docstring aside) is in the chapter's
    whitespace-normalised text: then a learner can write it from the chapter alone. A body the
    chapter shows only in part stays written in the skeleton."""
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    return all(squash(ast.get_source_segment(source, s)) in chapter_text for s in body)


def wrap(text, width):
    """Cut `text` into pieces of at most `width` characters at spaces (they join back exactly)."""
    pieces, line = [], ""
    for word in text.split(" "):
        if line and len(line) + len(word) + 1 > width:
            pieces.append(line + " ")
            line = word
        else:
            line = f"{line} {word}" if line else word
    return pieces + [line]


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


def yours(step, folder):
    """{module: path} of the learner's own files for the steps up to `step`."""
    paths = {m: Path(folder) / f"{m}.py" for m in STEPS[:step]}
    return {m: path for m, path in paths.items() if path.exists()}


def build(step, folder):
    """mine/.build/: the package at the end of `step`, the learner's modules linked in; a folder
    to run the step's tests and checks in (`python -m` and pytest find its tiny_llm/ first)."""
    where = Path(folder) / ".build"
    buildup.write_state(step, where)
    for module, path in yours(step, folder).items():
        target = where / "tiny_llm" / f"{module}.py"
        target.unlink()
        target.symlink_to(path.resolve())  # a traceback names the learner's own file
    for name in LINKED:
        link = where / name
        if not link.is_symlink():
            link.symlink_to(ROOT / name)
    shutil.copy(ROOT / "pyproject.toml", where / "pyproject.toml")
    return where


def environment():
    """The commands' environment: the learner's data folder, wherever the package is built."""
    from tiny_llm.paths import DATA_DIR

    return {**os.environ, "TINY_LLM_DATA_DIR": str(DATA_DIR.resolve())}


def run_tests(where, module, extra=()):
    """Run tests/test_<module>.py in the build folder: (exit code, [(test, passed, note)])."""
    report = where / "report.xml"
    argv = [sys.executable, "-m", "pytest", f"tests/test_{module}.py", "-n", "0", "-q",
            "--tb=short", "-p", "no:cacheprovider", f"--junitxml={report}", "-o",
            "junit_family=xunit1", *extra]
    proc = subprocess.run(argv, cwd=where, env=environment(), capture_output=True, text=True,
                          check=False)
    if not report.exists():
        return proc.returncode, [("collecting the tests", False, proc.stdout[-1500:].strip())]
    results = []
    for case in ET.parse(report).getroot().iter("testcase"):
        problem = case.find("failure")
        problem = case.find("error") if problem is None else problem
        results.append((case.get("name"), problem is None, note(problem)))
    return proc.returncode, results


def note(problem):
    """What a learner needs from a failure: its message, and the message a test expected."""
    if problem is None:
        return ""
    message = (problem.get("message") or "").strip().splitlines()
    text = problem.text or ""
    lines = message[:1]
    lines += [m.strip() for m in message[1:] if m.strip().startswith(("Regex", "Input",
                                                                       "Expected", "Actual"))]
    expected = re.findall(r"match=(r?['\"].*?['\"])\)?:?$", text, re.M)
    if "DID NOT RAISE" in " ".join(message) and expected:
        lines.append(f"the test expects an error matching {expected[-1]}")
    return "\n".join(line[:300] for line in lines)


def check_blocks(step):
    """[(commands and their expected lines)] of chapter `step`'s console blocks that run the
    course's own modules: the chapter's checks."""
    found = []
    text = buildup.chapter_path(step).read_text()
    for _, info, body in buildup.fenced_blocks(text):
        if info != "console":
            continue
        pairs = buildup.console_commands(body)
        ours = all(c.startswith("uv run python -m tiny_llm.") for c, _ in pairs)
        if ours and not any("tiny_llm.workalong" in c for c, _ in pairs):
            found.append(pairs)
    return found


def run_checks(where, step):
    """Run the chapter's checks in the build folder; print each output and whether it matches.
    Returns the number of commands that failed or printed something else."""
    wrong = 0
    for pairs in check_blocks(step):
        for command, expected in pairs:
            print(f"$ {command}", flush=True)
            argv = [sys.executable, *shlex.split(command)[3:]]  # after `uv run python`
            proc = subprocess.run(argv, cwd=where, env=environment(), capture_output=True,
                                  text=True, check=False)
            print(proc.stdout, end="")
            if proc.returncode:
                print(proc.stderr[-2000:], end="")
                print(f"check        exit {proc.returncode}")
                wrong += 1
            elif not buildup.output_matches(proc.stdout.splitlines(), expected):
                print("check        printed something other than the chapter shows")
                wrong += 1
            else:
                print("check        as the chapter shows")
    return wrong


def print_plan(step, folder, everything=False):
    """Say what the learner writes for a step, where each piece is explained, and what runs."""
    module = STEPS[step - 1]
    print(f"step {step:02d}      tiny_llm/{module}.py is the answer; yours is "
          f"{Path(folder) / f'{module}.py'}")
    for name, where in skeleton(module, everything=everything)[1].items():
        print(f"write        {name:<30} {where}")
    chapter = f"steps/{buildup.chapter_path(step).name}"
    for file in dict.fromkeys(h.file for h in buildup.hunks(step)):
        mine = Path(folder) / file
        whose = (f"to your {mine}" if mine.exists()
                 else f"(you have no {mine}: the course's is used)")
        print(f"change       tiny_llm/{file:<21} the diffs in {chapter}, {whose}")
    print(f"tests        tests/test_{module}.py")
    for pairs in check_blocks(step):
        for command, _ in pairs:
            print(f"check        {command}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        description="Write a step yourself: make your file, test it, run the chapter's checks.",
        epilog="Arguments after `--` go to pytest, e.g. -- -k causal --tb=long")
    parser.add_argument("step", nargs="?", help="step number or module name: 05 or attention")
    parser.add_argument("--dir", type=Path, default=Path("mine"), help="your files (default mine/)")
    parser.add_argument("--fresh", action="store_true", help="start over (keeps the old as .bak)")
    parser.add_argument("--all", action="store_true", help="write every body but main, not just "
                        "what the chapter shows")
    parser.add_argument("--no-check", action="store_true", help="run the tests only")
    parser.add_argument("--plan", action="store_true", help="only say what you would write")
    parser.add_argument("--state", metavar="NN", help="write the package as it stands at the end "
                        "of step NN to --out DIR (DIR/tiny_llm/...) and stop")
    parser.add_argument("--out", type=Path, help="where --state writes")
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    if args.state is not None:
        if args.out is None:
            parser.error("--state needs --out DIR")
        try:
            step = step_number(args.state)
        except SystemExit as err:
            parser.error(str(err))
        print(f"step {step:02d}      {buildup.write_state(step, args.out)}")
        return 0
    if args.step is None:
        parser.error("give a step (e.g. 05), or --state NN --out DIR")
    step = step_number(args.step)
    module = STEPS[step - 1]
    if args.plan:
        return print_plan(step, args.dir, everything=args.all)
    path = learner_file(module, args.dir, fresh=args.fresh, everything=args.all)
    where = build(step, args.dir)
    print(f"tests        tests/test_{module}.py on {where} (your "
          f"{', '.join(p.name for p in yours(step, args.dir).values())})", flush=True)
    code, results = run_tests(where, module, extra)
    said = set()
    for name, passed, why in results:
        print(f"  {'pass' if passed else 'FAIL'}  {name}")
        if why and why not in said:  # each failure message once: often all the same stub
            print("\n".join(f"          {line}" for line in why.splitlines()))
            said.add(why)
    wrong = 0 if args.no_check else run_checks(where, step)
    passed = sum(ok for _, ok, _ in results)
    check = ("not run" if args.no_check else "as the chapter shows" if not wrong
             else f"{wrong} command(s) differ")
    print(f"summary      {passed} of {len(results)} tests pass in {path.parent}; the checks: "
          f"{check}")
    return 0 if code == 0 and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
