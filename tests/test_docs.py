"""The README and docs/ stay true: the glossary's steps and terms, the commands and flags the
pages show, and the files they link to. Each module's --help is read in this process (no new
Python and no second import of torch), so the whole file takes a few seconds."""

import contextlib
import functools
import io
import re
import runpy
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

ENTRY = re.compile(r"^### (.+)\n\*Step \[(\d\d)\]\(([^)\s]+)\)\.\*", re.M)
HEADING = re.compile(r"^(.+?)(?: \((.+)\))?$")  # "KV cache (key/value cache)": name, other name
# `python -m tiny_llm.X [command] ...` up to the end of a code span; `instruct train` and
# `instruct write` are step 17's commands, with flags of their own
COMMAND = re.compile(r"python -m tiny_llm\.(\w+(?: (?:train|write)\b)?)([^`\n]*)")
FLAG = re.compile(r"(?<!\S)(--[a-z][\w-]*)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def normalised(text):
    """Lower case, no backticks, hyphens as spaces, runs of white space as one space."""
    return " ".join(text.lower().replace("`", "").replace("-", " ").split())


def mentions(chapter_text, term):
    """Whether the chapter uses `term` as a word or phrase (`Top-k` matches "top-k", "Top k")."""
    return re.search(r"(?<!\w)" + re.escape(normalised(term)), chapter_text) is not None


def glossary_entries():
    text = (DOCS / "glossary.md").read_text()
    entries = ENTRY.findall(text)
    assert len(entries) == text.count("\n### "), "every `### term` needs a `*Step [NN](...).*` line"
    return entries


@pytest.mark.parametrize("heading, step, link", glossary_entries(), ids=lambda v: str(v))
def test_glossary_entry_names_a_step_whose_chapter_uses_the_term(heading, step, link):
    chapter = (DOCS / link).resolve()
    assert chapter.is_file(), f"{heading}: {link} is not a file"
    assert chapter.parent == ROOT / "steps" and chapter.name.startswith(f"{step}-"), (
        f"{heading}: the link {link} is not step {step}'s chapter")
    name, other = HEADING.match(heading).groups()
    names = [other] if other else []
    # "Query, key, value": each part must appear; "(B, T, C)" is one term
    parts = name.split(", ") if not name.startswith("(") else [name]
    text = normalised(chapter.read_text())
    assert all(mentions(text, part) for part in parts) or any(mentions(text, n) for n in names), (
        f"glossary entry {heading!r}: {chapter.name} does not mention it")


def test_glossary_is_in_alphabetical_order():
    keys = [re.sub(r"[^a-z0-9 ]", "", heading.lower()).strip() for heading, _, _ in
            glossary_entries()]
    assert keys == sorted(keys)


def shown_commands(page):
    """(module, flags) for every `python -m tiny_llm.X ...` the page shows, in prose or blocks."""
    text = page.read_text()
    spans = re.findall(r"`([^`]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
    lines = [line for block in re.findall(r"^```.*?^```", text, flags=re.S | re.M)
             for line in block.splitlines()]
    pieces = [" ".join(span.split()) for span in spans] + lines
    return sorted({(module, tuple(FLAG.findall(rest)))
                   for piece in pieces for module, rest in COMMAND.findall(piece)})


@functools.cache
def help_text(module):
    """What `python -m tiny_llm.<module> --help` prints, run in this process."""
    module, *command = module.split()
    source = (ROOT / "tiny_llm" / f"{module}.py").read_text()
    if "parse_args(" not in source:
        return ""  # a module without argparse takes no flags (and --help would run its check)
    out = io.StringIO()
    argv = sys.argv
    sys.argv = [f"tiny_llm/{module}.py", *command, "--help"]
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # runpy: the module may already be imported
            with pytest.raises(SystemExit):
                runpy.run_module(f"tiny_llm.{module}", run_name="__main__")
    finally:
        sys.argv = argv
    return out.getvalue()


COMMANDS = [(page.name, module, flags) for page in PAGES for module, flags in shown_commands(page)]


def test_the_pages_show_commands():
    assert {"README.md", "troubleshooting.md"} <= {page for page, _, _ in COMMANDS}


@pytest.mark.parametrize("page, module, flags", COMMANDS, ids=lambda v: str(v))
def test_a_shown_command_names_a_real_module_and_real_flags(page, module, flags):
    file = ROOT / "tiny_llm" / f"{module.split()[0]}.py"
    assert file.is_file(), f"{page}: no module tiny_llm.{module}"
    if not flags:
        return  # nothing to look up (and some checks, like step 16's, start processes at once)
    known = set(FLAG.findall(help_text(module)))
    unknown = [flag for flag in flags if flag not in known]
    assert not unknown, f"{page}: tiny_llm.{module} has no {', '.join(unknown)} (see its --help)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_point_at_files_that_exist(page):
    targets = [t.split("#")[0] for t in LINK.findall(page.read_text())
               if not t.startswith(("http://", "https://", "mailto:", "#"))]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"
