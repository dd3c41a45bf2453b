"""The course's tool: the package as it stands at the end of every step, from the chapters' changes.

    uv run workalong --state 04 --out DIR   # DIR/tiny_llm/ as at step 04

The finished `tiny_llm/` is the one source. A chapter shows its step's code minimal, and a later
chapter that extends an earlier module shows the change as a diff block:

    ```diff
    # tiny_llm/embed.py
    @@ Embed.forward: where the cache's positions start @@
    -    def forward(self, idx):
    +    def forward(self, idx, start=0):
             T = idx.shape[1]
    ```

Lines starting with a space are context, `-` lines are what the step removes, `+` what it adds
(an empty line is an empty context line). A hunk's old lines must occur exactly once in the file
before the step, and its new lines exactly once after it. A file appears at the step that first
needs it (`FIRST_STEP`). Going back from the last step, each chapter's diffs are undone and its new
files removed: that gives the state at every step.
"""

import ast
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

# The repository: where steps/ really is. A state written by write_state (a test's scratch
# folder, workalong's mine/.build/) links steps/ there, so it still finds the finished package.
ROOT = (Path(__file__).resolve().parents[2] / "steps").resolve().parent
PACKAGE = ROOT / "tiny_llm"
STEPS = ["device", "tokenize", "data", "embed", "attention", "multihead", "block", "gpt",
         "generate", "train", "evaluate", "kvcache", "speed", "posenc_lab", "modern", "scale",
         "instruct", "reward", "web", "export"]  # step 01 is device, step 20 export (README.md)
# The shared helpers, each at the first step whose module imports it; the course's own tools
# (tiny_llm/course/) are in every state, so a state folder runs the type-along and draws its
# pictures. Every file of the package is named here (the studio's page too): a state is the
# whole package as it stands, not only its Python.
HELPERS = {"__init__": 1, "files": 1, "paths": 1, "course/__init__": 1, "course/buildup": 1,
           "course/workalong": 1, "course/diagrams": 2, "bpe": 2, "sample_stories": 2,
           "prepared": 3, "checks": 4, "loss": 10, "budget": 10, "checkpoint": 9,
           "processes": 10, "loop_shell": 10, "muon": 10, "flags": 10, "plots": 11, "ladder": 11,
           "judge": 11,
           "static_decode": 13, "posenc": 14, "tuning": 15, "request_data": 17, "studio": 17}
OTHER_FILES = {"studio.html": 17, **{f"web_page/{name}": 19 for name in (
    "index.html", "page.js", "tokenizer.js", "sampler.js")}}  # step 19's page
# A helper the learner writes as well, in the type-along of its step (its chapter shows its code
# and its step's tests check it): step 01's autograd, the PyTorch the model needs.
TYPED_HELPERS = {"autograd": 1}
FIRST_STEP = {**{f"{name}.py": step for name, step in {**HELPERS, **TYPED_HELPERS}.items()},
              **OTHER_FILES,
              **{f"{name}.py": number for number, name in enumerate(STEPS, 1)}}

FENCE = re.compile(r"^(`{3,})([^\n`]*)\n(.*?)^\1[ \t]*$", re.S | re.M)
FILE_HEADER = re.compile(r"^#\s*tiny_llm/([\w/.-]+\.py)\s*$")
NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")


class ChangeError(ValueError):
    """A chapter's diff that does not fit the code it changes."""


@dataclass
class Hunk:
    """One change to one file: `old` lines become `new` lines (context in both)."""

    chapter: str
    line: int  # where the hunk starts in the chapter, for messages
    file: str  # relative to tiny_llm/, e.g. "embed.py"
    label: str
    old: list
    new: list

    @property
    def where(self):
        return f"{self.chapter}:{self.line}"


def chapter_path(step):
    """3 -> Path('steps/03-data.md') (absolute)."""
    found = sorted((ROOT / "steps").glob(f"{step:02d}-*.md"))
    if not found:
        raise FileNotFoundError(f"no chapter steps/{step:02d}-*.md")
    return found[0]


def fenced_blocks(text):
    """[(line number, info string, body)] for every fenced block of a Markdown text."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(2).strip(), m.group(3))
            for m in FENCE.finditer(text)]


def hunks(step):
    """Every hunk of the diff blocks in chapter `step`, in the order they appear."""
    chapter = chapter_path(step)
    found = []
    for line, info, body in fenced_blocks(chapter.read_text()):
        if info != "diff":
            continue
        lines = body.rstrip("\n").split("\n")
        header = FILE_HEADER.match(lines[0])
        if not header:
            raise ChangeError(f"{chapter.name}:{line}: a diff block starts with the file it "
                              f"changes, e.g. '# tiny_llm/embed.py'; got {lines[0]!r}")
        current = None
        for number, text in enumerate(lines[1:], line + 2):
            if text.startswith("@@"):
                current = Hunk(chapter.name, number, header.group(1), text.strip("@ "), [], [])
                found.append(current)
                continue
            if current is None:  # no @@ line: the block is one hunk
                current = Hunk(chapter.name, number, header.group(1), "", [], [])
                found.append(current)
            mark, code = (text[:1], text[1:]) if text else (" ", "")
            if mark not in " -+":
                raise ChangeError(f"{chapter.name}:{number}: a diff line starts with ' ', '-' "
                                  f"or '+', got {text!r}")
            if mark in " -":
                current.old.append(code)
            if mark in " +":
                current.new.append(code)
    return found


def _replace_once(text, before, after, hunk, direction):
    """Replace the one occurrence of the lines `before` in `text` by the lines `after`."""
    lines = text.split("\n")
    n = len(before)
    at = [i for i in range(len(lines) - n + 1) if lines[i : i + n] == before]
    if len(at) != 1:
        seen = "not found" if not at else f"found {len(at)} times"
        shown = "\n".join(before)
        raise ChangeError(f"{hunk.where}: the hunk '{hunk.label}' does not {direction} "
                          f"tiny_llm/{hunk.file}: these lines are {seen}:\n{shown}")
    return "\n".join(lines[: at[0]] + after + lines[at[0] + n :])


def apply(files, step, reverse=False):
    """Chapter `step`'s hunks applied to `files` ({name: text}) in place: forward takes the state
    before the step to the state after it; reverse undoes them."""
    for hunk in (reversed(hunks(step)) if reverse else hunks(step)):
        if hunk.file not in files:
            raise ChangeError(f"{hunk.where}: tiny_llm/{hunk.file} does not exist at step "
                              f"{step - 1 if not reverse else step:02d}")
        before, after = (hunk.new, hunk.old) if reverse else (hunk.old, hunk.new)
        direction = "undo on" if reverse else "apply to"
        files[hunk.file] = _replace_once(files[hunk.file], before, after, hunk, direction)
    return files


def package_files(folder):
    """The package's own files below `folder` (a tiny_llm/), by name relative to it:
    'gpt.py', 'course/workalong.py', 'studio.html', 'web_page/page.js' (no caches, no editor
    droppings)."""
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*")
                  if path.is_file() and path.suffix in (".py", ".html", ".js")
                  and "__pycache__" not in path.parts and not path.name.startswith("."))


def finished():
    """{file name: text} of the finished package: every file of tiny_llm/, the subpackage and
    the studio's page included ('course/buildup.py', 'studio.html')."""
    return {name: (PACKAGE / name).read_text() for name in package_files(PACKAGE)}


def module_file(module):
    """'gpt' -> 'gpt.py'; 'course.diagrams' -> 'course/diagrams.py'."""
    return module.replace(".", "/") + ".py"


_STATES = {}


def state(step):
    """{file name: text}: the package as it stands at the end of `step` (1..20)."""
    if not 1 <= step <= len(STEPS):
        raise ValueError(f"no step {step}: the course has steps 01-{len(STEPS)}")
    if step not in _STATES:
        if step == len(STEPS):
            files = finished()
            unknown = sorted(set(files) - set(FIRST_STEP))
            if unknown:
                raise ChangeError(f"tiny_llm/{unknown[0]} has no step: add it to "
                                  "buildup.HELPERS with the first step that imports it")
        else:
            files = apply(dict(state(step + 1)), step + 1, reverse=True)
            files = {name: text for name, text in files.items() if FIRST_STEP[name] <= step}
        _STATES[step] = files
    return dict(_STATES[step])


def write_state(step, out):
    """Write the package at the end of `step` to out/tiny_llm/; return that folder.

    No write follows a link: each file is written beside its name and renamed onto it, which
    replaces a link there (a learner's file linked in by workalong) instead of writing through
    it. Stale modules of another step are removed (a link is removed, never its target)."""
    folder = Path(out) / "tiny_llm"
    if folder.is_symlink():
        raise FileExistsError(f"{folder} is a link: the package is written only into a folder "
                              "of its own; pick another --out")
    files = state(step)
    folder.mkdir(parents=True, exist_ok=True)
    for name in package_files(folder):
        if name not in files:
            (folder / name).unlink()
    for name, text in files.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, target)
    return folder


def imports(files, module):
    """The course modules that `module` imports, directly or through others, itself included
    (with any that `files` lacks, so that a caller can say what is missing). Names are dotted
    below tiny_llm: 'gpt', 'course.diagrams' (module_file gives the file)."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if module_file(name) not in files:
            continue  # a module missing at this step: the caller decides
        for kind, below, names in _course_imports(files[module_file(name)]):
            if kind == "from":
                subpackage = module_file(below) not in files and f"{below}/__init__.py" in files
                todo += [f"{below}.{alias}" for alias in names] if subpackage else [below]
            else:
                todo += names
    return seen


@functools.lru_cache(maxsize=1024)
def _course_imports(text):
    """The imports of tiny_llm modules in a module's source: ('from', 'gpt', ('GPT', ...)) for
    `from tiny_llm.gpt import GPT, ...`, ('names', None, ('gpt', ...)) for `import tiny_llm.gpt`
    and `from tiny_llm import gpt`."""
    found = []
    for node in _statements(ast.parse(text).body):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tiny_llm."):
            found.append(("from", node.module.split(".", 1)[1],
                          tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.ImportFrom) and node.module == "tiny_llm":
            found.append(("names", None, tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.Import):
            found.append(("names", None, tuple(a.name.split(".", 1)[1] for a in node.names
                                               if a.name.startswith("tiny_llm."))))
    return tuple(found)


def _statements(body):
    """Every statement in `body` and in the blocks nested in it (an import is a statement, so
    the expressions around need no visit: a tenth of ast.walk's nodes)."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, block, None)
            if isinstance(inner, list):  # a Lambda's or an IfExp's body is one expression
                yield from _statements(inner)


# What a command printed against what a chapter shows (tests/chapters.py has the rules): text
# exactly, runs of spaces as one; `...` any text; integers exactly; decimals within 1% or two
# units of the last printed digit, or a relative tolerance the chapter states.


def squash(text):
    return " ".join(text.split())


def console_commands(body, where="a console block"):
    """[(command, expected_lines)] from the body of a ```console block."""
    pairs = []
    for line in body.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            pairs.append((line[2:].strip(), []))
        elif pairs:
            pairs[-1][1].append(line)
        else:
            raise ValueError(f"{where}: a console block must start with a `$ ` command")
    return pairs


def _line_pattern(expected):
    """A regex for one expected line: numbers become groups, `...` becomes a wildcard."""
    parts = []
    for i, chunk in enumerate(squash(expected).split("...")):
        if i:
            parts.append(".*?")
        at = 0
        for m in NUMBER.finditer(chunk):
            parts.append(re.escape(chunk[at : m.start()]))
            parts.append(f"({NUMBER.pattern})")
            at = m.end()
        parts.append(re.escape(chunk[at:]))
    return re.compile("".join(parts))


def _close(actual, expected, rtol):
    a, e = float(actual.replace(",", "")), float(expected.replace(",", ""))
    if rtol is not None:
        return abs(a - e) <= rtol * abs(e) + 1e-12
    mantissa, _, exponent = expected.lower().partition("e")
    if "." not in mantissa and not exponent:
        return a == e  # counts, shapes, sizes: exact
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    last_digit = 10.0 ** (int(exponent or 0) - decimals)
    return abs(a - e) <= max(0.01 * abs(e), 2 * last_digit)


def line_matches(actual, expected, rtol=None):
    m = _line_pattern(expected).fullmatch(squash(actual))
    if not m:
        return False
    wanted = NUMBER.findall(squash(expected).replace("...", " "))
    got = list(m.groups())
    if len(got) != len(wanted):
        return False
    return all(_close(a, e, rtol) for a, e in zip(got, wanted, strict=True))


def output_matches(actual_lines, expected_lines, rtol=None):
    """Match output lines against expected lines, where a lone `...` line matches any lines."""
    actual = [line for line in actual_lines if line.strip()]
    expected = [line for line in expected_lines if line.strip()]

    def match(i, j):
        if j == len(expected):
            return i == len(actual)
        if expected[j].strip() == "...":
            return any(match(k, j + 1) for k in range(i, len(actual) + 1))
        here = i < len(actual) and line_matches(actual[i], expected[j], rtol)
        return here and match(i + 1, j + 1)

    return match(0, 0)
