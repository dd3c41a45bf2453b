"""Shared helper: write each step yourself, on top of the steps you wrote before.

    uv run workalong 05 --plan    # what step 05 asks of you, and where
    uv run workalong 05           # make mine/attention.py, test it, check it
    uv run workalong 05 --tests   # only the step's tests: the quick loop while you write
    uv run workalong 05 --run -- python scripts/smoke_test.py  # on your code
    uv run workalong --state 05 --out DIR   # the package after step 05

A step asks for two kinds of work. Its new module, `mine/attention.py`, starts as the module
as it stands at step 05 (tiny_llm/course/buildup.py) with every body the chapter shows replaced by a
`NotImplementedError` that quotes the chapter's contract for it (its `### Your turn` section,
else the paragraph that introduces its code), not its code. And where a later chapter changes a
module you wrote earlier (step 12 gives attention a cache), you apply the chapter's diff to your
own file.

Each run builds the package as it stands at the step in `mine/.build/`: the course's state at
that step with every module you have written (`mine/<module>.py` of this step or an earlier
one) linked in its place. The folder is deleted and written again when the step or the set of
your files changed (it holds a marker, MARKER, so nothing else is ever deleted), and kept
otherwise. A run holds `mine/.build.lock` meanwhile: a second run on the same folder stops and
says so instead of rebuilding under the first. Then it runs the step's tests there and shows
each failure's line (yours where the error passed through your file), values and message, the
exercises' tests apart from the step's own, and the chapter's checks, comparing what they print
with the chapter line by line; each command is stopped after `--timeout` seconds, and dies with
this run even when it is killed. A test run that ends without pytest's report is never a pass.
`--run -- python ...` runs any course command on that build, from where you are. Your files
are only ever read: the one file a run writes in `mine/` is a step's skeleton where you have
none yet; `--fresh` writes a new skeleton beside yours (`mine/attention.fresh.py`) and leaves
yours exactly as it is.
"""

import argparse
import ast
import difflib
import hashlib
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from pathlib import Path

from tiny_llm.course import buildup
from tiny_llm.course.buildup import ROOT, STEPS, squash
from tiny_llm.files import lock_holder, take_lock

LINKED = ("tests", "solutions", "scripts", "steps")  # what the tests read from the repository
MARKER = ".tiny-llm-workalong"  # in every folder workalong writes: only such a folder is rewritten
TIMEOUT = 300  # seconds for the step's tests, and for each check: time enough on a slow laptop


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
    """'attention' -> Path('steps/05-attention.md') (absolute); 'autograd' -> 01-setup.md."""
    return buildup.chapter_path(buildup.FIRST_STEP[f"{module}.py"])


def step_modules(step):
    """The modules a learner writes at `step`: its own, then any typed helper of the step
    (buildup.TYPED_HELPERS): 1 -> ['device', 'autograd']."""
    return [STEPS[step - 1], *(m for m, n in buildup.TYPED_HELPERS.items() if n == step)]


def bodies(tree):
    """Yield (qualified name, def node) for top-level functions and methods of top-level classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{sub.name}", sub


HEADING = re.compile(r"^#{2,3} .*$", re.M)
YOUR_TURN = re.compile(r"^### Your turn:(.*)$", re.M)


def prose(part):
    """The paragraphs of prose in a piece of chapter, each on one line: no code, headings,
    pictures, tables or HTML (`<details>`, `<summary>`)."""
    part = buildup.FENCE.sub("\n\n", part)
    return [squash(p) for p in re.split(r"\n\s*\n", part)
            if p.strip() and not p.lstrip().startswith(("#", "!", "|", "<"))]


def short(paragraph, limit=400):
    """`paragraph`, cut at a space to at most `limit` characters."""
    if len(paragraph) <= limit:
        return paragraph
    return paragraph[: limit - 3].rsplit(" ", 1)[0] + " ..."


def contract(text, name):
    """The contract a `### Your turn: `Name`` section gives for body `name` ('Embed.forward';
    a heading that names the class, `Embed`, covers its methods): the prose between the heading
    and the code, on one line; None where no such section names it."""
    for match in YOUR_TURN.finditer(text):
        named = {n.split("(")[0].strip() for n in re.findall(r"`([^`]+)`", match.group(1))}
        if name in named or name.rpartition(".")[0] in named:
            rest = text[match.end():]
            stop = re.search(r"^(<details|```|#{1,3} )", rest, re.M)
            return " ".join(prose(rest[: stop.start() if stop else len(rest)]))
    return None


def explanation(text, start, end, name, names):
    """The chapter's words for body `name`, whose code the block text[start:end] shows (with
    the bodies `names`, in order): its `### Your turn` contract; else, for a block of one body,
    the paragraph just before the block (or just after it, unless that one introduces the next
    block); for a block of several, the nearest paragraph of the section that names this body,
    else the paragraph before the block for the first body only. On one line; "" if none."""
    if (said := contract(text, name)) is not None:
        return short(said, 800)
    top = max([0, *(m.start() for m in HEADING.finditer(text, 0, start))])
    bottom = min([len(text), *(m.start() for m in HEADING.finditer(text, end))])
    fences = list(buildup.FENCE.finditer(text, top, bottom))
    since = max([top, *(m.end() for m in fences if m.end() <= start)])
    until = min([bottom, *(m.start() for m in fences if m.start() >= end)])
    before, after = prose(text[since:start]), prose(text[end:until])
    if until < bottom:
        after = after[:-1]  # the paragraph just before the next block introduces that block
    if len(names) == 1:
        return short((before[-1:] or after[:1] or [""])[0])
    last = name.rpartition(".")[2]
    keys = [f"`{name}`", f"`{last}`", f"{last}("] + ["constructor"] * (last == "__init__")
    nearest = prose(text[top:start])[::-1] + prose(text[end:bottom])
    named = [p for p in nearest if any(key in p for key in keys)]
    first = before[-1:] if name == names[0] else []
    return short((named[:1] or first or [""])[0])


def code_blocks(module):
    """[(match, where)] for each code block of the step's chapter that shows `module`'s code
    (first line `# tiny_llm/<module>.py`, not a diff), fenced alone or inside a `<details>`;
    `where` names the chapter and section. What follows `## Exercises` is left out."""
    chapter = chapter_of(module)
    text = chapter.read_text().split("\n## Exercises", 1)[0]  # what follows is reference
    found = []
    for match in buildup.FENCE.finditer(text):
        header = buildup.FILE_HEADER.match(match.group(3).partition("\n")[0])
        if match.group(2).strip() == "diff" or not header or header.group(1) != f"{module}.py":
            continue  # a diff is a change to apply to your file, not a body to write
        headings = re.findall(r"^## (.+)$", text[: match.start()], re.M)
        found.append((match, f"steps/{chapter.name}" + (f", section '{headings[-1]}'"
                                                       if headings else "")))
    return found


def shown_in_chapter(module, source):
    """{qualified name: (where, explanation)} for each function or method of `source` whose code
    the step's chapter shows: its section, and the chapter's words for it (explanation())."""
    words, lines = [], []
    for number, line in enumerate(source.splitlines(), 1):
        words += line.split()
        lines += [number] * len(line.split())
    code, defs, shown = " ".join(words), list(bodies(ast.parse(source))), {}
    text = chapter_of(module).read_text().split("\n## Exercises", 1)[0]
    for match, where in code_blocks(module):
        body = match.group(3).partition("\n")[2]
        names = []
        for piece in re.split(r"^\s*#\s*\.\.\.\s*$", body, flags=re.M):
            piece = squash(piece)
            at = code.find(piece) if piece else -1
            if at < 0:
                continue
            first = lines[code.count(" ", 0, at)]
            last = lines[code.count(" ", 0, at) + piece.count(" ")]
            names += [name for name, node in defs
                      if node.lineno <= last and node.end_lineno >= first and name not in names]
        for name in names:
            shown.setdefault(name, (where, explanation(text, match.start(), match.end(), name,
                                                       names)))
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
    number = buildup.FIRST_STEP[f"{module}.py"]
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
        if (start := body_start(lines, node)) is None:
            continue  # nothing to write, or a one-line def
        todo.append((name, node, start))
    for name, node, start in reversed(todo):  # from the bottom, so line numbers stay right
        pad = " " * (node.col_offset + 4)
        where, said = shown.get(name, (chapter, ""))
        message = [f"{name}: write it from {where}."] + ([f"The chapter: {said}"] if said else [])
        lines[start - 1 : node.end_lineno] = (
            [f"{pad}raise NotImplementedError("]
            + [f"{pad}    {part!r}" for part in wrap(" ".join(message), 88 - len(pad))]
            + [f"{pad})"])
    header = [f"# Your tiny_llm/{module}.py, step {number:02d}: replace each NotImplementedError.",
              f"# Test it: uv run workalong {number:02d}   "
              f"(the answer: tiny_llm/{module}.py)"]
    return "\n".join(header + lines) + "\n", {n: shown.get(n, (chapter, ""))[0] for n, *_ in todo}


def given_check(statement):
    """Whether `statement` calls a given input check, `check_...(...)` or `self._check_...(...)`
    (`T = check_batch(idx)` too): the armour, written in tiny_llm/checks.py, not by the learner.
    """
    call = getattr(statement, "value", None) if isinstance(statement, (ast.Expr, ast.Assign)) \
        else None
    name = ast.unparse(call.func).rpartition(".")[2] if isinstance(call, ast.Call) else ""
    return name.startswith(("check_", "_check_"))


def body_start(lines, node):
    """The first line (1-based) of what the learner writes for `node`: its first statement after
    the docstring and after the given checks it starts with (given_check: they stay in the
    skeleton, written), with the comments just above it (they explain it); None for a def with
    nothing to write or a one-line def. The body runs from there to node.end_lineno."""
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    if not body or body[0].lineno == node.lineno:
        return None
    body = list(itertools.dropwhile(given_check, body))
    if not body:
        return None
    start = body[0].lineno
    while lines[start - 2].strip().startswith("#") or not lines[start - 2].strip():
        start -= 1
    return start


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

    An existing file is never written: with `fresh` the new skeleton goes beside it, to
    `<module>.fresh.py` (then `.fresh-2.py`, ...), and that path is returned."""
    path = Path(folder) / f"{module}.py"
    if path.exists() and not fresh:
        print(f"yours        {path} (kept; --fresh writes a new skeleton beside it)")
        return path
    target = path
    if path.exists() or path.is_symlink():
        names = (path.with_name(f"{module}.fresh{'' if n == 1 else f'-{n}'}.py")
                 for n in itertools.count(1))
        target = next(p for p in names if not (p.exists() or p.is_symlink()))
    text, todo = skeleton(module, everything=everything)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "x") as file:  # "x": fails rather than replace anything already there
        file.write(text)
    print(f"wrote        {target}: {len(todo)} bodies for you to write")
    print(f"to write     {', '.join(todo)}")
    if target != path:
        print(f"yours        {path} is as it was; to start over with the new one: "
              f"mv {path} {path.with_suffix('.old.py')} && mv {target} {path}")
    return target


def yours(step, folder):
    """{module: path} of the learner's own files for the steps up to `step`."""
    paths = {m: Path(folder) / f"{m}.py" for n in range(1, step + 1) for m in step_modules(n)}
    return {m: path for m, path in paths.items() if path.is_file()}


def check_ours(folder, fix):
    """Raise SystemExit unless `folder` is absent, empty, or was written by workalong (it holds
    MARKER, which lists what it wrote there, `*` for all): nothing else is ever deleted."""
    folder = Path(folder)
    name = folder if folder.name else folder.absolute()  # "." says too little
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise SystemExit(f"{name} is a {'link' if folder.is_symlink() else 'file'}, not a "
                         f"folder workalong wrote: nothing was written. {fix}")
    if not folder.exists() or not any(folder.iterdir()):
        return
    if not (folder / MARKER).is_file():
        raise SystemExit(f"{name} is not empty and workalong did not write it (it holds no "
                         f"{MARKER}): nothing in it was touched. {fix}")
    ours = (folder / MARKER).read_text().partition("\n")[0].split()
    other = sorted(p.name for p in folder.iterdir() if p.name not in {*ours, MARKER})
    if other and "*" not in ours:
        raise SystemExit(f"{name} holds what workalong did not write ({', '.join(other)}): "
                         f"nothing in it was touched. {fix}")


def fresh_folder(folder, fix, names="*"):
    """Make `folder` empty but for MARKER (listing `names`), deleting it first only if
    check_ours allows. A link inside is removed as a link: its target stays as it is."""
    folder = Path(folder)
    check_ours(folder, fix)
    if folder.exists() and any(folder.iterdir()):
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(f"{names}\n")
    return folder


def manifest(folder):
    """{path relative to `folder`: sha256} of every file under folder/tiny_llm/."""
    package = Path(folder) / "tiny_llm"
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(package.rglob("*")) if (p.is_file() or p.is_symlink())
            and "__pycache__" not in p.parts}  # Python's own caches are not anyone's edits


def changed_since_written(folder):
    """The files under folder/tiny_llm/ that --state did not write there, or that were changed
    since (MARKER lists each file it wrote with its sha256): a learner's edits and notes."""
    lines = (Path(folder) / MARKER).read_text().splitlines()[1:]
    written = {path: digest for digest, path in (line.split("  ", 1) for line in lines
                                                 if "  " in line)}
    if not written:  # a marker from before the list: nothing can be told apart, so all count
        raise SystemExit(f"{folder} was written by an older workalong, which kept no list of "
                         "what it wrote, so your edits there cannot be told apart: nothing in it "
                         "was touched. Pick a new or empty folder for --out, or move this one "
                         "away.")
    return [path for path, digest in manifest(folder).items() if written.get(path) != digest]


def write_state(step, out):
    """--state NN --out DIR: the package at the end of `step` in DIR/tiny_llm/, in a folder that
    is new, empty, or written here before, with none of its files changed or added since."""
    fix = "Pick a new or empty folder for --out."
    if (Path(out) / MARKER).is_file() and (Path(out) / "tiny_llm").is_dir():
        check_ours(out, fix)
        if changed := changed_since_written(out):
            shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if changed[8:]
                                              else "")
            raise SystemExit(f"{out} holds files --state did not write, or that changed since "
                             f"({shown}): nothing in it was touched. {fix}")
    fresh_folder(out, fix, names="tiny_llm")
    folder = buildup.write_state(step, out)
    listed = "".join(f"{digest}  {path}\n" for path, digest in manifest(out).items())
    (Path(out) / MARKER).write_text(f"tiny_llm\n{listed}")
    return folder


@contextmanager
def holding(folder):
    """Hold `folder`/.build.lock while a run builds and uses `folder`/.build: a second run on
    the same folder would delete the build under the first one and give both false results."""
    lock = Path(folder) / ".build.lock"
    Path(folder).mkdir(parents=True, exist_ok=True)  # the build goes there anyway
    def in_use(who):
        return SystemExit(f"another workalong run ({who}) is using {Path(folder) / '.build'}: "
                          "wait until it ends, or give this one its own folder with --dir")

    take_lock(lock, in_use)
    try:
        yield
    finally:
        if lock_holder(lock) == os.getpid():
            lock.unlink(missing_ok=True)


def fingerprint(step, folder):
    """What a build at `step` is made of: the course's files at the step and which of the
    learner's files are linked in (their content is read through the links at each run)."""
    parts = sorted(buildup.state(step).items()) + [(m, str(p.resolve()))
                                                   for m, p in yours(step, folder).items()]
    return hashlib.sha256(repr([step, str(ROOT), parts]).encode()).hexdigest()


def build(step, folder):
    """mine/.build/: the package at the end of `step`, the learner's modules linked in; a folder
    to run the step's tests and checks in (`python -m` and pytest find its tiny_llm/ first).
    Written afresh unless the last build was of the same step with the same files linked
    (its MARKER records that): then it is used again. Returns its absolute path."""
    where = Path(folder).absolute() / ".build"
    made_of = fingerprint(step, folder)
    if (where / MARKER).is_file() and not (where / MARKER).is_symlink():
        if (where / MARKER).read_text().split()[1:2] == [made_of] and all(
                (where / name).is_symlink() for name in LINKED):
            return where
    fresh_folder(where, f"Move it away, or delete it (rm -r {Path(folder) / '.build'}) if it is "
                        "a build an older workalong made.")
    buildup.write_state(step, where)
    for module, path in yours(step, folder).items():
        target = where / "tiny_llm" / f"{module}.py"
        target.unlink()
        target.symlink_to(path.resolve())  # read-only for us: the folder is rebuilt every run
    for name in LINKED:
        (where / name).symlink_to(ROOT / name)
    shutil.copy(ROOT / "pyproject.toml", where / "pyproject.toml")
    (where / MARKER).write_text(f"*\n{made_of}\n")  # written last: a build cut short is redone
    return where


def syntax_errors(files):
    """['mine/x.py:12:5: invalid syntax' and the line] for each file Python cannot read."""
    found = []
    for path in files.values():
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except SyntaxError as err:
            found.append(f"{path}:{err.lineno}:{err.offset}: {err.msg}")
            if err.text:
                found.append(f"    {err.text.rstrip()}")
                found.append(f"    {' ' * max((err.offset or 1) - 1, 0)}^")
        except ValueError as err:  # a null byte
            found.append(f"{path}: {err}")
    return found


def environment(build_folder=None):
    """The commands' environment: the learner's data folder (as seen from where they are),
    wherever the package is built; with `build_folder`, Python finds its tiny_llm/ first."""
    from tiny_llm.paths import DATA_DIR

    data = Path(os.environ.get("TINY_LLM_DATA_DIR") or DATA_DIR).resolve()
    env = {**os.environ, "TINY_LLM_DATA_DIR": str(data)}
    if build_folder is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(build_folder),
                                                          env.get("PYTHONPATH")]))
    return env


PR_SET_PDEATHSIG = 1  # Linux's prctl option: a signal the child gets when its parent dies


def die_with(parent):
    """A preexec_fn that makes the child killed when workalong (`parent`) dies, even by kill -9,
    where the platform can (Linux's parent-death signal); elsewhere (macOS) None: nothing."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def in_the_child():
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # workalong died before the line above: go with it
            os._exit(1)

    return in_the_child


def run_python(argv, cwd, env, timeout, capture=True):
    """`python *argv` in `cwd`: a CompletedProcess (text stdout and stderr when `capture`, else
    they go to this terminal). After `timeout` seconds (None: no limit) the command and what it
    started are stopped and subprocess.TimeoutExpired is raised."""
    out = subprocess.PIPE if capture else None
    proc = subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=out, stderr=out,
                            text=True, start_new_session=True,  # its own group, to stop it all
                            preexec_fn=die_with(os.getpid()))
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:  # the time limit, or Ctrl-C: stop the command and its children too
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended in the meantime
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def print_changes(step, folder):
    """Say, for each change chapter `step` makes to a module of an earlier step, whether the
    learner's file has it yet, and show the lines to change where it does not: a test of this
    step may need it."""
    chapter = buildup.chapter_path(step).name
    for hunk in buildup.hunks(step):
        mine = Path(folder) / hunk.file
        what = f"{hunk.label} (steps/{chapter}:{hunk.line})" if hunk.label else \
            f"steps/{chapter}:{hunk.line}"
        if not mine.is_file():
            print(f"change       tiny_llm/{hunk.file}: {what}; you have no {mine}: the "
                  "course's, changed, is used")
        elif applied(hunk, mine.read_text()):
            print(f"change       {mine}: {what}: applied")
        else:
            print(f"change       {mine}: {what}: apply it to your file, as the chapter shows:")
            for line in diff_lines(hunk):
                print(f"             {line}")


def code_only(text):
    """`text` as code alone, on one line: comments, blank lines and runs of spaces dropped
    ('x = 1  # one\n\ny = 2' -> 'x = 1 y = 2'). A `#` inside a string is kept."""
    kept = []
    for line in text.splitlines():
        quote, skip = None, False
        for at, char in enumerate(line):
            if skip:
                skip = False
            elif quote:
                skip, quote = char == "\\", None if char == quote else quote
            elif char in "'\"":
                quote = char
            elif char == "#":
                line = line[:at]
                break
        kept.append(line)
    return squash("\n".join(kept))


def applied(hunk, text):
    """Whether the learner's file `text` has chapter change `hunk`, comments and white space
    aside: its new lines are there, and its old ones gone unless the new ones hold them."""
    new, old, mine = (code_only("\n".join(hunk.new)), code_only("\n".join(hunk.old)),
                      code_only(text))
    return new in mine and (old in new or old not in mine)


def diff_lines(hunk):
    """The hunk as its chapter shows it: ' ' context, '-' lines to remove, '+' lines to add."""
    shown = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, hunk.old, hunk.new,
                                                       autojunk=False).get_opcodes():
        if tag == "equal":
            shown += [f"  {line}" for line in hunk.old[i1:i2]]
        else:
            shown += [f"- {line}" for line in hunk.old[i1:i2]]
            shown += [f"+ {line}" for line in hunk.new[j1:j2]]
    return shown


def run_tests(where, module, extra=(), timeout=TIMEOUT, mine=None):
    """Run tests/test_<module>.py in the build folder: (exit code, [(test, passed, note)]).
    `mine`: the learner's files as the build's paths ('tiny_llm/embed.py'), for note(). An
    exercise's failure points into their file only while the step's own tests fail too."""
    report = Path(where).absolute() / "report.xml"  # pytest runs in `where`: a path from here
    report.unlink(missing_ok=True)  # a kept build holds the last run's: never read it as this one's
    argv = ["-m", "pytest", f"tests/test_{module}.py", "-n", "0", "-q", "--tb=short", "-p",
            "no:cacheprovider", f"--junitxml={report}", "-o", "junit_family=xunit1", *extra]
    try:
        proc = run_python(argv, where, environment(), timeout)
    except subprocess.TimeoutExpired:
        return 1, [(f"tests/test_{module}.py", False,
                    f"stopped after {timeout} s: a loop that never ends? (--timeout SECONDS "
                    "allows more)")]
    if not report.exists():  # pytest writes it as it ends: without it, nothing is known to pass
        return proc.returncode or 1, [(DID_NOT_FINISH, False, unfinished(proc))]
    cases, exercises = [], exercise_tests(module)
    for case in ET.parse(report).getroot().iter("testcase"):
        problem = case.find("failure")
        cases.append((case.get("name"), case.find("error") if problem is None else problem))
    own_pass = all(problem is None for name, problem in cases if not is_exercise(name, exercises))
    results = [(name, problem is None,
                note(problem, show_full(extra),
                     set() if own_pass and is_exercise(name, exercises) else mine))
               for name, problem in cases]
    if not results and proc.returncode:  # no test ran: pytest's own words say why
        output = (proc.stdout + proc.stderr)[-1500:].strip()
        return proc.returncode, [("collecting the tests", False, output)]
    return proc.returncode, results


def is_exercise(test, exercises):
    """Whether pytest's test name 'test_solutions[1]' is one of `exercises` (exercise_tests)."""
    return test.partition("[")[0] in exercises


DID_NOT_FINISH = "the tests did not finish"


def unfinished(proc):
    """Why a pytest run that wrote no report ended, for the learner: its exit code (or the
    signal that killed it) and its last words."""
    code = proc.returncode
    how = (f"was killed by signal {-code} ({signal.Signals(-code).name})" if code < 0
           else f"exited with code {code}")
    said = ((proc.stdout or "") + (proc.stderr or ""))[-1500:].strip()
    return (f"pytest {how} and wrote no report, so no test is known to pass: something ended "
            "the process early (os._exit or sys.exit in your code, a crash, a kill)"
            + (f". Its last output:\n{said}" if said else ""))


def exercise_tests(module):
    """The names of the tests in tests/test_<module>.py that use the chapter's exercises'
    answers (a name imported from solutions/): reported apart from the step's own tests."""
    tree = ast.parse((ROOT / "tests" / f"test_{module}.py").read_text())
    answers = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "solutions":
            answers |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            answers |= {(a.asname or a.name).split(".")[0] for a in node.names
                        if a.name.split(".")[0] == "solutions"}
    uses = {name.rpartition(".")[2]: {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            for name, node in bodies(tree)}
    found, grown = set(), True
    while grown:  # a test that calls a helper of the file which uses the answers counts too
        more = {name for name, names in uses.items() if names & (answers | found)}
        grown, found = bool(more - found), found | more
    return {name for name in found if name.startswith("test")}


FRAME = re.compile(r"^(\S.*?):(\d+): in (\S+)$")  # pytest's short traceback: file:line: in name
CARETS = re.compile(r"^\s*[~^]+\s*$")  # Python's marks under the failing part of a line


def frames(traceback):
    """[(file, line, function, the code line)] of pytest's short traceback, outermost first:
    each frame's own code line, never the `^^^^` line Python writes under it."""
    found = []
    for number, line in enumerate(traceback):
        if match := FRAME.match(line):
            code = [text.strip() for text in traceback[number + 1 : number + 3]
                    if text.startswith(" ") and not CARETS.match(text)]
            found.append((*match.groups(), code[0] if code else ""))
    return found


def learners(path, mine):
    """Whether traceback path `path` is one of the learner's files: one of `mine` (paths as
    pytest writes them in the build, 'tiny_llm/embed.py'); None: any course module."""
    if mine is None:
        return path.startswith("tiny_llm/") and not path.startswith("tiny_llm/course/")
    return path in mine


def note(problem, full=False, mine=None):
    """What a learner needs from a failure: where it failed, the assertion with its values and
    the test's own message, and the message a test expected. The failing line is the learner's
    own (the deepest frame in one of `mine`, as learners() reads it) where the traceback passes
    through their file, after the test's line that called it; else the test's (or an exercise's
    answer's, solutions/). `full`: pytest's whole report of the failure, in the traceback style the
    learner asked for (-- --tb=long)."""
    if problem is None:
        return ""
    text = (problem.text or "").strip()
    if full:
        return text
    traceback = text.splitlines()
    ends = [n for n, line in enumerate(traceback) if line.startswith("E ") or line == "E"]
    if not ends:
        return (problem.get("message") or "").strip().splitlines()[0][:300]
    first = ends[-1]
    while first - 1 in ends:  # the last block of `E` lines: the error the test ended with
        first -= 1
    stack = frames(traceback[:first])
    ours = [f for f in stack if f[0].startswith(("tests/", "solutions/"))]
    chosen = ([f for f in stack if learners(f[0], mine)] or ours or stack or [None])[-1]
    lines = []
    if ours and chosen and ours[-1] != chosen:  # the learner's line: first, the test's call
        lines.append(f"at {ours[-1][0]}:{ours[-1][1]}: in {ours[-1][2]}")
    if chosen:
        lines += [f"at {chosen[0]}:{chosen[1]}: in {chosen[2]}", f"> {chosen[3]}"]
    lines += [line[2:].strip() for line in traceback[first : ends[-1] + 1]][:16]  # the error
    expected = re.findall(r"match=(r?['\"].*?['\"])\)?:?$", text, re.M)
    if "DID NOT RAISE" in text and expected:
        lines.append(f"the test expects an error matching {expected[-1]}")
    return "\n".join(line[:300] for line in lines if line.strip("> "))


def show_full(extra):
    """Whether the pytest flags after `--` ask for pytest's own report of each failure: a
    traceback style (--tb=long), locals (-l) or more verbose assertions (-vv)."""
    return any(a.startswith(("--tb", "-l", "--showlocals", "-vv", "--verbose")) or a == "-v"
               for a in extra)


def differences(actual, expected):
    """The lines where what ran differs from what the chapter shows, as '- chapter' and
    '+ yours' lines (numbers within the chapter's tolerance count as equal)."""
    actual = [line for line in actual if line.strip()]
    expected = [line for line in expected if line.strip()]
    key = [buildup.NUMBER.sub("#", squash(line)) for line in actual]
    want = [buildup.NUMBER.sub("#", squash(line)) for line in expected]
    shown = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, want, key,
                                                       autojunk=False).get_opcodes():
        if tag == "equal":
            pairs = [(e, a) for e, a in zip(expected[i1:i2], actual[j1:j2], strict=True)
                     if not buildup.line_matches(a, e)]
            shown += [line for e, a in pairs for line in (f"- {e}", f"+ {a}")]
        else:
            shown += [f"- {e}" for e in expected[i1:i2] if e.strip() != "..."]
            shown += [f"+ {a}" for a in actual[j1:j2]] if want[i1:i2] != ["..."] else []
    return shown


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
        if ours:  # `uv run workalong ...` blocks show the type-along itself, not a check
            found.append(pairs)
    return found


def run_checks(where, step, timeout=TIMEOUT):
    """Run the chapter's checks in the build folder; print each output and whether it matches.
    Returns the number of commands that failed or printed something else."""
    wrong = 0
    for pairs in check_blocks(step):
        for command, expected in pairs:
            print(f"$ {command}", flush=True)
            argv = shlex.split(command)[3:]  # after `uv run python`
            try:
                proc = run_python(argv, where, environment(), timeout)
            except subprocess.TimeoutExpired:
                print(f"check        stopped after {timeout} s: a loop that never ends? "
                      "(--timeout SECONDS allows more)")
                wrong += 1
                continue
            print(proc.stdout, end="")
            if proc.returncode:
                print(proc.stderr[-2000:], end="")
                print(f"check        exit {proc.returncode}")
                wrong += 1
            elif not buildup.output_matches(proc.stdout.splitlines(), expected):
                print("check        printed something other than the chapter shows "
                      "(- the chapter, + yours):")
                for line in differences(proc.stdout.splitlines(), expected)[:40]:
                    print(f"             {line}")
                wrong += 1
            else:
                print("check        as the chapter shows")
    return wrong


def print_plan(step, folder, everything=False):
    """Say what the learner writes for a step, where each piece is explained, and what runs."""
    for n, module in enumerate(step_modules(step)):
        print(f"{f'step {step:02d}' if n == 0 else 'and':<12} tiny_llm/{module}.py is the "
              f"answer; yours is {Path(folder) / f'{module}.py'}")
        for name, where in skeleton(module, everything=everything)[1].items():
            print(f"write        {name:<30} {where}")
    chapter = f"steps/{buildup.chapter_path(step).name}"
    for file in dict.fromkeys(h.file for h in buildup.hunks(step)):
        mine = Path(folder) / file
        whose = (f"to your {mine}" if mine.exists()
                 else f"(you have no {mine}: the course's is used)")
        print(f"change       tiny_llm/{file:<21} the diffs in {chapter}, {whose}")
    print(f"tests        tests/test_{STEPS[step - 1]}.py")
    for pairs in check_blocks(step):
        for command, _ in pairs:
            print(f"check        {command}")
    return 0


# `python -c LAUNCH BUILD -m module args...` (or `-c code`, or `script.py`): the command as
# `python -m module` runs it, but with the build folder first on sys.path, ahead of the folder it
# runs from (where `python -m` would find the repository's own tiny_llm/).
LAUNCH = """
import os, runpy, sys
build, target, args = sys.argv[1], sys.argv[2:4], sys.argv[4:]
if target[0] == "-m":
    sys.argv, sys.path[0:1] = [target[1], *args], [build, os.getcwd()]
    runpy._run_module_as_main(target[1])
elif target[0] == "-c":
    sys.argv, sys.path[0:1] = ["-c", *args], [build, ""]
    exec(compile(target[1], "<string>", "exec"), {"__name__": "__main__"})
else:
    sys.argv = [target[0], *sys.argv[3:]]
    sys.path[0:1] = [build, os.path.dirname(os.path.abspath(target[0]))]
    runpy.run_path(target[0], run_name="__main__")
"""


def launch_argv(command, where):
    """['python', '-m', 'tiny_llm.train', ...] (a leading `uv run` allowed; `-c code` and
    `script.py` too) -> the argv after `python` that runs it on the build `where`; SystemExit
    for anything else."""
    words = list(command)
    if words[:2] == ["uv", "run"]:
        words = words[2:]
    python = bool(words) and Path(words[0]).name.startswith("python")
    if not python or len(words) < 2 or (words[1] in ("-m", "-c") and len(words) < 3) or (
            words[1].startswith("-") and words[1] not in ("-m", "-c")):
        shown = " ".join(command) or "nothing"
        raise SystemExit(f"--run runs a Python command, got {shown!r}: give it after --, e.g. "
                         "--run -- python -m tiny_llm.train --preset tiny, or "
                         "--run -- python scripts/smoke_test.py")
    return ["-c", LAUNCH, str(where), *words[1:]]


def run_mine(step, folder, command, timeout):
    """--run: the course command `command` on the package at `step` with the learner's files,
    from the learner's folder (relative paths such as runs/ and data/ are theirs)."""
    files = yours(step, folder)
    if problems := syntax_errors(files):
        print("syntax error " + "\n".join(problems))
        print("stopped      Python cannot read your file: fix the line above first")
        return 1
    launch_argv(command, "")  # a command it cannot run is refused before anything is built
    where = build(step, folder)
    argv = launch_argv(command, where)
    mine = ", ".join(str(p) for p in files.values()) or "none of yours"
    print(f"yours        {mine}; the course's for the rest of step {step:02d}", flush=True)
    try:
        return run_python(argv, Path.cwd(), environment(where), timeout, capture=False).returncode
    except subprocess.TimeoutExpired:
        print(f"stopped      {' '.join(command)} after {timeout} s (--timeout)")
        return 1


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        description="Write a step yourself: make your file, test it, run the chapter's checks.",
        epilog="Arguments after `--` go to pytest, e.g. -- -k causal --tb=long; with --run, "
               "they are the command: --run -- python scripts/smoke_test.py")
    parser.add_argument("step", nargs="?", help="step number or module name: 05 or attention")
    parser.add_argument("--dir", type=Path, default=Path("mine"), help="your files (default mine/)")
    parser.add_argument("--fresh", action="store_true", help="write a new skeleton beside yours "
                        "(mine/<module>.fresh.py); yours stays as it is")
    parser.add_argument("--all", action="store_true", help="write every body but main, not just "
                        "what the chapter shows")
    parser.add_argument("--tests", "--no-check", action="store_true", dest="no_check",
                        help="run the step's tests only, not the chapter's checks: the quick "
                        "loop while you write (the build is kept between runs)")
    parser.add_argument("--plan", action="store_true", help="only say what you would write")
    parser.add_argument("--run", action="store_true", help="run the command after -- on the "
                        "package at the step with your files, from here")
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="stop the tests, or a "
                        f"check, after this long (default {TIMEOUT}; --run: no limit)")
    parser.add_argument("--state", metavar="NN", help="write the package as it stands at the end "
                        "of step NN to --out DIR (DIR/tiny_llm/...) and stop")
    parser.add_argument("--out", type=Path, help="where --state writes: a new or empty folder, "
                        "or one --state wrote before")
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    if args.timeout is not None and not args.timeout > 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.state is not None:
        if args.out is None:
            parser.error("--state needs --out DIR")
        try:
            step = step_number(args.state)
        except SystemExit as err:
            parser.error(str(err))
        print(f"step {step:02d}      {write_state(step, args.out)}")
        return 0
    if args.step is None:
        parser.error("give a step (e.g. 05), or --state NN --out DIR")
    step = step_number(args.step)
    if args.dir.exists() and not args.dir.is_dir():
        parser.error(f"--dir {args.dir} is a file: give the folder that holds (or will hold) "
                     "your files, e.g. --dir mine")
    if args.plan:
        return print_plan(step, args.dir, everything=args.all)
    if args.run:
        with holding(args.dir):
            return run_mine(step, args.dir, extra, args.timeout)
    timeout = args.timeout or TIMEOUT
    paths = [learner_file(m, args.dir, fresh=args.fresh, everything=args.all)
             for m in step_modules(step)]
    path = paths[0]
    if any(p.name != f"{m}.py" for p, m in zip(paths, step_modules(step), strict=True)):
        return 0  # --fresh beside the learner's file: nothing new to test yet
    files = yours(step, args.dir)
    if problems := syntax_errors(files):
        print("syntax error " + "\n".join(problems))
        print("summary      Python cannot read your file: fix the line above, then run the "
              "same command again")
        return 1
    print_changes(step, args.dir)
    with holding(args.dir):
        return test_and_check(step, args, extra, files, path, timeout)


def test_and_check(step, args, extra, files, path, timeout):
    """Build, run the step's tests and (unless --tests) the chapter's checks; print a summary."""
    module = STEPS[step - 1]
    where = build(step, args.dir)
    print(f"tests        tests/test_{module}.py on {Path(args.dir) / '.build'} (your "
          f"{', '.join(p.name for p in files.values())})", flush=True)
    mine = {f"tiny_llm/{m}.py" for m in files}
    code, results = run_tests(where, module, extra, timeout, mine)
    for module_name, yours_ in files.items():  # the build's link is the learner's own file
        results = [(n, ok, why.replace(f"at tiny_llm/{module_name}.py:", f"at {yours_}:"))
                   for n, ok, why in results]
    exercises = exercise_tests(module)
    own = [r for r in results if not is_exercise(r[0], exercises)]
    theirs = [r for r in results if is_exercise(r[0], exercises)]
    said = set()
    for name, passed, why in own:
        print(f"  {'pass' if passed else 'FAIL'}  {name}")
        if why and why not in said:  # each failure message once: often all the same stub
            print("\n".join(f"          {line}" for line in why.splitlines()))
            said.add(why)
    own_pass = all(ok for _, ok, _ in own)
    if theirs:
        print(f"exercises    the answers in solutions/ex{step:02d}_*.py, run on your files "
              "(the chapter's Exercises)")
    for name, passed, why in theirs:
        print(f"  {'pass' if passed else 'FAIL'}  {name}")
        if not passed:
            print("          " + ("the step's own tests pass: this is an exercise's answer "
                                  "failing, not a body the step asks of you" if own_pass else
                                  "the step's own tests fail above: this may follow from them; "
                                  "fix those first"))
        if why and why not in said:
            print("\n".join(f"          {line}" for line in why.splitlines()))
            said.add(why)
    wrong = 0 if args.no_check else run_checks(where, step, timeout)
    check = ("not run" if args.no_check else "as the chapter shows" if not wrong
             else f"{wrong} command(s) differ")
    if [name for name, *_ in results] == [DID_NOT_FINISH]:
        tests = DID_NOT_FINISH + " (above)"
    else:
        tests = f"step's tests: {sum(ok for _, ok, _ in own)} of {len(own)} pass"
        if theirs:
            tests += f"; exercises: {sum(ok for _, ok, _ in theirs)} of {len(theirs)} pass"
    print(f"summary      {tests} in {path.parent}; the checks: {check}")
    return 0 if code == 0 and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
