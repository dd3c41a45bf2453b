"""Records stay records, and chapters stay teaching: every record in docs/records/ says what,
the command, the machine, the date and the result, the index lists it, a chapter links to it;
every chapter's teaching text (everything before its exercises) stays under 3,500 words."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDS = sorted((ROOT / "docs" / "records").glob("[0-9][0-9]-*.md"))
CHAPTERS = sorted((ROOT / "steps").glob("[0-9][0-9]-*.md"))
SECTIONS = ["## What", "## Command", "## Machine", "## Date", "## Result"]
WORDS = 3500


def teaching_words(chapter):
    """Words before the `## Exercises` heading, code blocks included (wc -w counts the same)."""
    return len(chapter.read_text().split("\n## Exercises", 1)[0].split())


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: p.name)
def test_every_record_says_what_how_where_when_and_the_result(record):
    text = record.read_text()
    at = [text.find(f"\n{s}\n") for s in SECTIONS]
    missing = [s for s, i in zip(SECTIONS, at, strict=True) if i < 0]
    assert not missing, f"{record.name} lacks {missing}"
    assert at == sorted(at), f"{record.name}: the sections are not in the order {SECTIONS}"
    assert re.search(r"20\d\d-\d\d", text[at[3]:at[4]]), f"{record.name}: the Date has no date"


def test_the_index_lists_every_record_and_a_chapter_links_to_each():
    index = (ROOT / "docs" / "records" / "README.md").read_text()
    linked = "\n".join(c.read_text() for c in CHAPTERS)
    for record in RECORDS:
        assert f"]({record.name})" in index, f"docs/records/README.md does not list {record.name}"
        assert f"records/{record.name}" in linked, f"no chapter links to {record.name}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name[:2])
def test_every_chapters_teaching_text_is_under_3500_words(chapter):
    assert teaching_words(chapter) < WORDS, (
        f"{chapter.name} has {teaching_words(chapter):,} words before its exercises: move "
        "records to docs/records/ and tangents to an optional section after the exercises")


def test_the_course_machine_has_one_name():
    """The chapters and the README name today's machine; a record may say what it was called."""
    for page in [*CHAPTERS, ROOT / "README.md"]:
        assert "Xeon" not in page.read_text(), f"{page.name} calls the course's AMD EPYC a Xeon"
