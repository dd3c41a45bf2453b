"""Read the chapters in steps/ and compare what they show with what the code is and does.

The rules (the chapter author's side of them is in steps/README.md):

1. Source blocks. A fenced code block whose first line is a comment naming a repository file,
   such as `# tiny_llm/embed.py`, must appear in that file. Whitespace is normalised (runs of
   spaces and newlines count as one space), so indentation and blank lines may differ. A line
   `# ...` inside the block elides code: the pieces around it must appear in the file in order.

2. Output blocks. A fenced block with the info string `console` holds commands (lines starting
   with `$ `) each followed by the output it prints. The test runs every command and compares:
   - text exactly (runs of spaces count as one space);
   - `...` inside a line matches any text; a line that is only `...` matches any lines;
   - numbers within a tolerance: integers exactly, decimals within 1% or 2 units of the last
     printed digit, whichever is larger. `<!-- check: rtol=0.05 -->` on the line before the
     block changes the relative tolerance for every number in it (integers included).
   The commands of one block run in order in one scratch folder (`scripts/` and `steps/` linked
   in), with TINY_LLM_DATA_DIR pointing at data prepared from the sample corpus, so numbers that
   depend on the corpus are the sample's.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "steps"

FENCE = re.compile(r"^(`{3,})([^\n`]*)\n(.*?)^\1[ \t]*$", re.S | re.M)
SOURCE_HEADER = re.compile(r"^#\s*((?:tiny_llm|scripts|tests)/[\w/.-]+\.py)\s*$")
CHECK_OPTIONS = re.compile(r"<!--\s*check:(.*?)-->\s*$")
NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
ELISION = re.compile(r"^\s*#\s*\.\.\.\s*$")


@dataclass
class Block:
    chapter: Path
    line: int
    info: str
    body: str
    options: dict = field(default_factory=dict)

    @property
    def where(self):
        return f"{self.chapter.name}:{self.line}"


def chapters():
    return sorted(STEPS.glob("[0-9][0-9]-*.md"))


def blocks(chapter):
    """Every fenced block of a chapter, with the `<!-- check: ... -->` options just above it."""
    text = chapter.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        options = {}
        if opt := CHECK_OPTIONS.search(before):
            for pair in opt.group(1).split():
                key, _, value = pair.partition("=")
                options[key] = value
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(chapter, line, match.group(2).strip(), match.group(3), options))
    return found


def source_blocks():
    every = [b for c in chapters() for b in blocks(c)]
    return [b for b in every if SOURCE_HEADER.match(b.body.split("\n", 1)[0])]


def console_blocks():
    return [b for c in chapters() for b in blocks(c) if b.info == "console"]


def squash(text):
    return " ".join(text.split())


def source_pieces(block):
    """Split a source block into (file, [pieces]) where each piece is whitespace-normalised."""
    first, _, rest = block.body.partition("\n")
    path = SOURCE_HEADER.match(first).group(1)
    pieces, current = [], []
    for line in rest.split("\n"):
        if ELISION.match(line):
            pieces.append(current)
            current = []
        else:
            current.append(line)
    pieces.append(current)
    return path, [squash("\n".join(p)) for p in pieces if squash("\n".join(p))]


def missing_piece(block):
    """Return None when the block appears in its file, else a message saying what is missing."""
    path, pieces = source_pieces(block)
    target = ROOT / path
    if not target.exists():
        return f"{block.where} names {path}, which does not exist"
    code = squash(target.read_text())
    at = 0
    for piece in pieces:
        found = code.find(piece, at)
        if found < 0:
            return f"{block.where}: this part of the block is not in {path} (in order):\n{piece}"
        at = found + len(piece)
    return None


def commands(block):
    """[(command, expected_lines)] from a console block."""
    pairs = []
    for line in block.body.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            pairs.append((line[2:].strip(), []))
        elif pairs:
            pairs[-1][1].append(line)
        else:
            raise ValueError(f"{block.where}: a console block must start with a `$ ` command")
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
