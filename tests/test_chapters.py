"""The checked-chapters rule: what a chapter shows is what the code is and prints.

See tests/chapters.py for the rules and steps/README.md for how to write a checked chapter.
"""

import os
import shlex

import pytest
from chapters import (
    ROOT,
    chapters,
    commands,
    console_blocks,
    line_matches,
    missing_piece,
    output_matches,
    run_python,
    source_blocks,
)


def test_every_chapter_has_run_command_output_and_exercises():
    assert chapters(), "no chapters found in steps/"
    for chapter in chapters():
        text = chapter.read_text()
        assert "## Exercises" in text, f"{chapter.name} has no '## Exercises' section"
        has_console = any(b.chapter == chapter for b in console_blocks())
        assert has_console, f"{chapter.name} has no console block"


@pytest.mark.parametrize("block", source_blocks(), ids=lambda b: b.where)
def test_source_block_appears_in_its_file(block):
    problem = missing_piece(block)
    assert problem is None, problem


def run_command(command, work, data_dir, warm_python=None):
    """Run a chapter command the way a learner would, in the folder `work`; return stdout."""
    argv = shlex.split(command)
    if argv[:3] != ["uv", "run", "python"]:
        pytest.fail(f"chapter commands start with `uv run python`, got: {command}")
    env = {**os.environ, "TINY_LLM_DATA_DIR": str(data_dir), "PYTHONHASHSEED": "0"}
    proc = run_python(argv[3:], work, env, timeout=300, warm=warm_python)
    assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.parametrize("block", console_blocks(), ids=lambda b: b.where)
def test_console_block_matches_a_real_run(block, sample_data_dir, tmp_path, warm_python):
    """The commands of one block run in order in one scratch folder, as a learner types them."""
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    (tmp_path / "steps").symlink_to(ROOT / "steps")
    rtol = float(block.options["rtol"]) if "rtol" in block.options else None
    for command, expected in commands(block):
        actual = run_command(command, tmp_path, sample_data_dir, warm_python).splitlines()
        assert output_matches(actual, expected, rtol), (
            f"{block.where}: `{command}` printed\n" + "\n".join(actual)
            + "\n\nbut the chapter expects\n" + "\n".join(expected)
        )


def test_output_matching_rules_can_fail():
    assert line_matches("params  532,480", "params 532,480")
    assert not line_matches("params  532,481", "params 532,480")
    assert line_matches("std 0.0283", "std 0.0281")
    assert not line_matches("std 0.0350", "std 0.0281")
    assert line_matches("loss 3.30", "loss 3.10", rtol=0.1)
    assert line_matches("torch 2.15.0+cu132", "torch ...")
    assert not line_matches("shape (2, 12, 64)", "shape (2, 12)")
    assert output_matches(["a 1", "x", "y", "b 2"], ["a 1", "...", "b 2"])
    assert not output_matches(["a 1", "b 3"], ["a 1", "...", "b 2"])
