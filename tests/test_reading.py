"""Each chapter opens with how long it takes, and the reading time stays true.

The line sits right after the title, on its own: `*Reading: 14 min · hands-on: 25 min*`.
Reading time is the time to read a chapter to learn from it, the way its reader must: the
prose (everything outside code blocks, HTML tags and image links) at PROSE_PACE words a minute,
every line of code at CODE_SECONDS, every line of shown output at OUTPUT_SECONDS (the rates and
why: steps/README.md). Hands-on time is HANDS_ON_MINUTES: typing the step's bodies (or reading
them), running its check and its tests, and the exercises, as a first try of the course took; a
long run a chapter starts (step 10's main job) is counted apart.
"""

import re

import pytest
from chapters import chapters

from tiny_llm.course.buildup import FENCE

PROSE_PACE = 150  # words a minute: technical prose read to learn it, not skimmed
CODE_SECONDS = 6  # a line of code: read, its shapes followed, matched with the prose
OUTPUT_SECONDS = 2  # a line a command prints (console, text blocks): compared at a glance
OUTPUT_BLOCKS = ("console", "text")
HANDS_ON_MINUTES = {1: 25, 2: 30, 3: 25, 4: 25, 5: 25, 6: 30, 7: 30, 8: 25, 9: 25, 10: 30,
                    11: 20, 12: 25, 13: 20, 14: 20, 15: 30, 16: 25, 17: 30, 18: 30,
                    19: 25, 20: 30}
TIME_LINE = re.compile(r"^\*Reading: (\d+) min · hands-on: (\d+) min\*$")
ANY_TIME_LINE = re.compile(r"^\*Reading: .*\*$", re.M)
NOT_PROSE = re.compile(r"<[^>]+>|!\[[^\]]*\]\([^)]*\)")  # HTML tags (<details>) and pictures


def teaching_words(text):
    """How many words a reader reads: code blocks, tags, pictures and the time line left out.

    >>> teaching_words("# Title\\n\\nTwo words.\\n\\n```python\\nx = 1\\n```\\n")
    3
    """
    prose = NOT_PROSE.sub(" ", FENCE.sub(" ", ANY_TIME_LINE.sub(" ", text)))
    return sum(1 for word in prose.split() if any(c.isalnum() for c in word))


def block_lines(text):
    """(lines of code, lines of output): the non-blank lines inside the fenced blocks.

    >>> block_lines("```python\\nx = 1\\n\\ny = 2\\n```\\n```console\\n$ uv run x\\nok\\n```\\n")
    (2, 2)
    """
    code = output = 0
    for block in FENCE.finditer(text):
        lines = sum(1 for line in block.group(3).splitlines() if line.strip())
        if block.group(2).strip() in OUTPUT_BLOCKS:
            output += lines
        else:
            code += lines
    return code, output


def minutes_to_read(text):
    """The prose at PROSE_PACE, code and output at their seconds a line: minutes, a float."""
    code, output = block_lines(text)
    return teaching_words(text) / PROSE_PACE + (code * CODE_SECONDS
                                                + output * OUTPUT_SECONDS) / 60


def reading_minutes(text):
    return max(1, round(minutes_to_read(text)))


def time_line(text):
    """The chapter's third line, which must be the time line (the title, a blank, then it)."""
    lines = text.split("\n")
    return lines[2] if len(lines) > 2 else ""


@pytest.mark.parametrize("chapter", chapters(), ids=lambda c: c.name[:2])
def test_chapter_opens_with_true_reading_and_hands_on_times(chapter):
    text = chapter.read_text()
    step = int(chapter.name[:2])
    want = f"*Reading: {reading_minutes(text)} min · hands-on: {HANDS_ON_MINUTES[step]} min*"
    found = TIME_LINE.match(time_line(text))
    assert found, f"{chapter.name}: line 3 should be the time line, e.g. {want}"
    stated, hands_on = int(found[1]), int(found[2])
    minutes, (code, output) = minutes_to_read(text), block_lines(text)
    assert abs(stated - minutes) <= max(1.0, 0.15 * minutes), (
        f"{chapter.name}: says {stated} min of reading, but its {teaching_words(text):,} words "
        f"of prose at {PROSE_PACE} a minute, {code} lines of code at {CODE_SECONDS} s and "
        f"{output} lines of output at {OUTPUT_SECONDS} s take {minutes:.1f} min: write {want}")
    assert hands_on == HANDS_ON_MINUTES[step], (
        f"{chapter.name}: says {hands_on} min hands-on, HANDS_ON_MINUTES says "
        f"{HANDS_ON_MINUTES[step]}: write {want}")


def test_teaching_words_leave_out_code_tags_and_pictures():
    text = ("# Step 99: a title\n\n*Reading: 1 min · hands-on: 5 min*\n\nOne two three.\n\n"
            "```python\n# tiny_llm/x.py\nnot prose at all\n```\n\n<details>\n<summary>The code"
            "</summary>\n\n</details>\n\n![a picture of many words](images/x.png)\n")
    assert teaching_words(text) == 4 + 3 + 2  # the title, the prose, "The code"
    assert teaching_words("a " * 1500) == 1500 and reading_minutes("a " * 1500) == 10


def test_code_and_output_take_their_own_time():
    code = "```python\n# tiny_llm/x.py\n" + "x = 1\n" * 99 + "```\n"  # 100 lines: 10 min
    output = "```console\n$ uv run python -m tiny_llm.x\n" + "ok\n" * 29 + "```\n"  # 1 min
    assert block_lines(code + output) == (100, 30)
    assert reading_minutes("word " * 150 + "\n" + code + output) == 1 + 10 + 1
