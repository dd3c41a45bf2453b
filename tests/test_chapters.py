"""The checked-chapters rule: what a chapter shows is what the code is and prints.

See tests/chapters.py for the rules and steps/README.md for how to write a checked chapter.
"""

import os
import re

import pytest
from chapters import (
    ROOT,
    chain_keys,
    chapter_step,
    chapters,
    command_modules,
    commands,
    console_blocks,
    folder_files,
    learner_checked,
    line_matches,
    missing_piece,
    output_matches,
    places,
    put_folder_files,
    python_argv,
    repeated_keys,
    run_python,
    same_at_head,
    source_blocks,
)

from tiny_llm.course import buildup


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
    argv = python_argv(command)
    if argv is None:
        pytest.fail(f"chapter commands start with `uv run python` or `uv run workalong`, got: "
                    f"{command}")
    env = {**os.environ, "TINY_LLM_DATA_DIR": str(data_dir), "PYTHONHASHSEED": "0"}
    proc = run_python(argv, work, env, timeout=300, warm=warm_python)
    assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc.stdout


RUNS = {}  # chain key -> (what the command printed, its folder after): runs to replay


def run_or_replay(command, key, work, data_dir, warm_python):
    """Run a block's command, or replay the run of this test process that had its chain key
    (tests/chapters.py, Replays): what it printed, and its folder as that run left it."""
    if key in RUNS:
        out, after = RUNS[key]
        put_folder_files(work, after)
        return out
    out = run_command(command, work, data_dir, warm_python)
    if key in repeated_keys():  # kept only where another block's run will ask for it
        RUNS[key] = out, folder_files(work)
    return out


@pytest.mark.parametrize("block", [b for b in console_blocks() if places(b)],
                         ids=lambda b: b.where)
def test_console_block_matches_a_real_run(block, sample_data_dir, tmp_path, warm_python):
    """The commands of one block run in order in one scratch folder, as a learner types them,
    with the package as it stands at the chapter's step (`python -m` finds the folder's own
    tiny_llm/ first): what chapter 04 shows is what step 04's code prints. A reader runs the
    repository's head, so the block must print the same there: where every tiny_llm module its
    commands import is byte-identical at the step and at the head (same_at_head), the one run
    proves both; otherwise the block runs a second time, on the head's package."""
    if "tiny_llm.web" in block.body:  # step 19's page needs onnxruntime-web from npm
        from test_web import require_web_runtime

        require_web_runtime()
    packages = places(block)
    rtol = float(block.options["rtol"]) if "rtol" in block.options else None
    for where, package in packages:
        work = tmp_path / ("head" if package else "state")
        work.mkdir()
        (work / "scripts").symlink_to(ROOT / "scripts")
        (work / "steps").symlink_to(ROOT / "steps")
        if package:
            (work / "tiny_llm").symlink_to(package)
        else:
            buildup.write_state(chapter_step(block.chapter), work)
        keys = chain_keys(block, package)
        for (command, expected), key in zip(commands(block), keys, strict=True):
            actual = run_or_replay(command, key, work, sample_data_dir, warm_python).splitlines()
            assert output_matches(actual, expected, rtol), (
                f"{block.where}: `{command}` at {where} printed\n" + "\n".join(actual)
                + "\n\nbut the chapter expects\n" + "\n".join(expected)
            )


def test_a_run_is_replayed_only_after_the_same_commands_on_the_same_package(tmp_path):
    """Chapters 17 and 18 both begin with a base model and its tuning: at the head those two
    commands have one chain key, and the third (17's story, 18's reward run) has its own; at
    step 17's state the package differs, and so does every key. A replay leaves the folder as
    the run left it, files removed since included."""
    def block(chapter, words):
        return next(b for b in console_blocks() if b.chapter.name.startswith(chapter)
                    and words in b.body)
    requests, reward = block("17", "instruct write"), block("18", "reward write")
    head = ROOT / "tiny_llm"
    ours, theirs = chain_keys(requests, head), chain_keys(reward, head)
    assert ours[:2] == theirs[:2] and ours[2] != theirs[2]
    assert set(ours[:2]) <= repeated_keys() and ours[2] not in repeated_keys()
    assert not set(chain_keys(requests, None)) & set(ours)
    run = tmp_path / "run"
    (run / "runs" / "base").mkdir(parents=True)
    (run / "runs" / "base" / "ckpt.pt").write_bytes(b"weights")
    (run / "steps").symlink_to(ROOT / "steps")  # a link to the repository: never a run's file
    after = folder_files(run)
    assert after == {os.path.join("runs", "base", "ckpt.pt"): b"weights"}
    again = tmp_path / "again"
    (again / "runs").mkdir(parents=True)
    (again / "runs" / "stale.txt").write_text("left by nothing the chain ran")
    put_folder_files(again, after)
    assert folder_files(again) == after


def test_a_block_runs_again_at_the_head_only_where_its_modules_differ():
    """same_at_head reads the modules a command imports: step 15's `tiny_llm.modern` check and
    step 16's `tiny_llm.scale` are the head's own; step 10's train gains step 13-16's changes."""
    by_chapter = {b.chapter.name[:2]: b for b in reversed(console_blocks())}
    assert same_at_head(by_chapter[f"{len(buildup.STEPS):02d}"])  # the last step is the head
    assert not same_at_head(next(b for b in console_blocks() if b.chapter.name.startswith("10")
                                 and "tiny_llm.train" in b.body))
    assert command_modules("uv run python -m tiny_llm.gpt", buildup.finished()) >= {
        "gpt", "embed", "block"}


def test_the_learner_path_runs_exactly_the_state_blocks_left_out_here():
    """Steps 04-10's state runs are test_learner_path's: every block workalong checks there, and
    nothing of another step, so no block goes unchecked at its state."""
    from tiny_llm.course import workalong

    for step in range(1, len(buildup.STEPS) + 1):
        blocks = [b for b in console_blocks() if chapter_step(b.chapter) == step]
        left_out = [b for b in blocks if learner_checked(b)]
        expected = len(workalong.check_blocks(step)) if step in range(4, 11) else 0
        assert len(left_out) == expected, f"step {step:02d}: {[b.where for b in left_out]}"


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


def expected_messages(test_file):
    """The message patterns a test file matches errors against: `pytest.raises(..., match=...)`
    constants and the `match` column of `pytest.mark.parametrize` tables."""
    import ast

    found, tree = [], ast.parse(test_file.read_text())
    tables = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name)}  # BAD_IDS = [...] used by a table
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        if name.endswith("raises"):
            found += [k.value.value for k in node.keywords if k.arg == "match"
                      and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)]
        if name.endswith("parametrize") and isinstance(node.args[0], ast.Constant):
            columns = [c.strip() for c in str(node.args[0].value).split(",")]
            rows = node.args[1]
            rows = tables.get(rows.id, rows) if isinstance(rows, ast.Name) else rows
            if "match" in columns and isinstance(rows, (ast.List, ast.Tuple)):
                at = columns.index("match")
                for row in rows.elts:
                    if isinstance(row, ast.Tuple) and isinstance(row.elts[at], ast.Constant):
                        found.append(row.elts[at].value)
    return found


WORD = r"[A-Za-z_][A-Za-z_0-9]*"
PLACEHOLDER = r"\{[^{}\n]*\}"


def said_in(pattern, text):
    """Whether each literal piece of a regex `pattern` is said in `text`, word for word, where
    an f-string placeholder of the text ({value!r}) may stand for a word or for nothing."""
    text = re.sub(r"\b(?:rb|br|fr|rf|[frb])(?=[\"'])", "", text)  # f"...": the f is no word
    tokens = re.findall(f"{PLACEHOLDER}|{WORD}", text)
    for piece in re.split(r"\.\*\??|\.\+|\|", pattern):
        piece = re.sub(r"\\[dwsDWS]|\{\d+(,\d*)?\}|\[[^\]]*\]", " ", piece)  # classes, counts
        words = re.findall(WORD, re.sub(r"\\(.)", r"\1", piece))
        if words and not any(_match_from(tokens, i, words) for i in range(len(tokens))):
            return False
    return True


def _match_from(tokens, i, words):
    """Whether `words` are said from tokens[i] on; a placeholder stands for 0 to 5 words."""
    if not words:
        return True
    if i >= len(tokens):
        return False
    if tokens[i].startswith("{"):
        return any(_match_from(tokens, i + 1, words[k:]) for k in range(min(5, len(words)) + 1))
    return tokens[i] == words[0] and _match_from(tokens, i + 1, words[1:])


@pytest.mark.parametrize("chapter", chapters(), ids=lambda c: c.name[:2])
def test_every_message_the_steps_tests_expect_is_said_in_its_chapter(chapter):
    """A learner who writes a step meets its tests' expected errors in the chapter (or in one
    read before it), word for word: never by reading the tests."""
    module = buildup.STEPS[chapter_step(chapter) - 1]
    read = "\n".join(c.read_text() for c in chapters() if chapter_step(c) <= chapter_step(chapter))
    unsaid = [m for m in expected_messages(ROOT / "tests" / f"test_{module}.py")
              if not said_in(m, read)]
    assert not unsaid, (f"tests/test_{module}.py expects these messages, but {chapter.name} "
                        f"never says them (show the code that raises them, or quote them): "
                        f"{unsaid}")


def test_a_message_is_said_when_its_words_are_there_in_order():
    assert said_in("max_seq_len must be a positive int, got 0",
                   'raise ValueError(f"{name} must be a positive int, got {value!r}")')
    assert said_in(r"T=65 exceeds max_seq_len=64", "sequence length T={T} exceeds max_seq_len={m}")
    assert not said_in("n_layers must be a positive int", "n_layers must be positive")
    assert said_in(r"got shape \(3,\).*unsqueeze", "got shape {s}: use idx.unsqueeze(0)")
    assert said_in("got dtype torch.float32", "got dtype {idx.dtype}: pass the ids")
    assert said_in("positions 16..16 do not fit", "positions {start}..{start + T - 1} do not fit")
