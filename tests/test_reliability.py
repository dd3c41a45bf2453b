"""Nothing lost, nothing trusted that should not be: the course's promises on bad input.

Each test is one promise, named after it; read the names as the list. They come from a probe of
99 things a learner does wrong (issue 20): a corrupt or half-prepared data folder, a swapped
tokenizer, a killed run, a hostile checkpoint, a typo in --out, a full or read-only disk.
"""

import errno
import json
import shutil
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch

from tiny_llm import data, files
from tiny_llm.checkpoint import (
    MODEL_CLASSES,
    MODELS,
    class_path,
    load_checkpoint,
    model_class,
    model_from_checkpoint,
    save_checkpoint,
)
from tiny_llm.data import FILES, ensure_data, load_meta, prepare_data
from tiny_llm.export import MARKER, atomic_folder, export
from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.tokenize import EOT, tokenizer_sha256

FIRST = {"train": 40, "valid": 4}  # 40 sample stories: prepared in a fraction of a second


def prepare_small(folder, vocab_size=300):
    return prepare_data("sample", data_dir=folder, vocab_size=vocab_size, progress=False,
                        first=FIRST)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A small prepared data folder; each test works on its own copy (see `folder`)."""
    folder = tmp_path_factory.mktemp("prepared") / "data"
    prepare_small(folder)
    return folder


@pytest.fixture
def folder(prepared, tmp_path):
    return shutil.copytree(prepared, tmp_path / "data")


def contents(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def never(*args, **kwargs):
    pytest.fail("this must not run")


def dead_pid():
    """The id of a process that has ended."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def save_small_checkpoint(path, data_dir, **extra):
    """A 1-layer GPT checkpoint made with data_dir's tokenizer; returns the model."""
    vocab_size = load_meta(data_dir)["vocab_size"]
    model = GPT(GPTConfig(vocab_size=vocab_size, max_seq_len=8, d_model=16, n_layers=1, n_heads=2))
    save_checkpoint(path, {"model": model.state_dict(), "config": asdict(model.config),
                           "step": 1, "data_source": "sample", "model_class": class_path(model),
                           "tokenizer_sha256": tokenizer_sha256(data_dir / "tokenizer.json"),
                           **extra})
    return model


# --- data: a prepared folder is never rewritten unasked ------------------------------------------


def test_train_refuses_a_folder_without_meta_json_and_rewrites_nothing(folder, tmp_path,
                                                                        monkeypatch):
    from tiny_llm.train import TrainConfig, train

    (folder / "meta.json").unlink()
    before = contents(folder)
    monkeypatch.setattr(data, "prepare_data", never)
    cfg = TrainConfig(preset="tiny", max_steps=1, data_dir=str(folder), out=str(tmp_path / "run"))
    with pytest.raises(FileNotFoundError, match=r"holds tokenizer.json, train.bin, valid.bin but "
                       r"not meta.json.*`uv run python -m tiny_llm.data --source SOURCE "
                       r"--data-dir .*data`"):
        train(cfg)
    assert contents(folder) == before


def test_the_rebuild_command_names_the_source_when_meta_json_is_there(folder):
    (folder / "train.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"but not train.bin.*--source sample --data-dir "
                       r"\S+ --train-stories 40 --valid-stories 4`"):
        ensure_data(folder)


def test_the_data_check_without_source_refuses_a_half_prepared_folder(folder, monkeypatch):
    (folder / "meta.json").unlink()
    monkeypatch.setattr(data, "prepare_data", never)
    monkeypatch.setattr(sys, "argv", ["data", "--data-dir", str(folder)])
    with pytest.raises(SystemExit, match="^error: .* but not meta.json"):
        data.main()


def test_an_absent_data_folder_is_still_prepared(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "hub_reachable", lambda timeout=3.0: False)
    monkeypatch.setattr(data, "SAMPLE", {"train": (40, 0), "valid": (4, 1)})
    assert ensure_data(tmp_path / "new")["source"] == "sample"
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == sorted(FILES)


# --- data: the tokenizer is the one the token files were written with ----------------------------


@pytest.fixture
def swapped(folder, tmp_path):
    """`folder` with the tokenizer of another preparation (290 tokens) put in place."""
    prepare_small(tmp_path / "other", vocab_size=290)
    shutil.copy(tmp_path / "other" / "tokenizer.json", folder / "tokenizer.json")
    return folder


def test_train_refuses_a_swapped_tokenizer_naming_both(swapped):
    meta = json.loads((swapped / "meta.json").read_text())
    found = tokenizer_sha256(swapped / "tokenizer.json")
    with pytest.raises(ValueError, match=rf"sha256 is {found[:12]}\.\.\. \(290 tokens\), meta.json "
                       rf"records {meta['tokenizer_sha256'][:12]}\.\.\. \(300 tokens\).*Put back "
                       r"the tokenizer.json.*--source sample"):
        ensure_data(swapped)  # what train calls


def test_evaluate_refuses_a_swapped_tokenizer(swapped):
    with pytest.raises(ValueError, match="is not the tokenizer the token files .* were written"):
        load_meta(swapped)  # what evaluate reads the counts from


def test_a_checkpoint_is_refused_with_another_tokenizer_naming_both(folder, tmp_path):
    prepare_small(tmp_path / "other", vocab_size=290)
    save_small_checkpoint(tmp_path / "ckpt.pt", tmp_path / "other")  # trained on the 290-token one
    with pytest.raises(ValueError, match=r"different tokenizer .*290 tokens\) from the one "
                       r"prepared in .*300 tokens\)"):
        model_from_checkpoint(tmp_path / "ckpt.pt", data_dir=folder)  # what generate calls


# --- data: switching to a new prepared set is one step -------------------------------------------


def test_a_run_killed_between_renames_leaves_a_folder_that_is_refused_not_mixed(folder,
                                                                                monkeypatch):
    renames = []

    def killed_after_one_rename(src, dst):
        if renames:
            raise KeyboardInterrupt  # as if killed between the tokenizer and train.bin
        renames.append(dst)
        shutil.move(src, dst)

    monkeypatch.setattr(files.os, "replace", killed_after_one_rename)
    with pytest.raises(KeyboardInterrupt):
        prepare_small(folder, vocab_size=290)
    monkeypatch.undo()
    assert [p.name for p in renames] == ["tokenizer.json"]  # the new tokenizer, old token files
    with pytest.raises(FileNotFoundError, match="but not meta.json"):  # the old one went first
        ensure_data(folder)
    assert not list(folder.glob(".*"))  # no temporary file left either


def test_meta_json_is_the_last_file_to_arrive(folder, monkeypatch):
    order = []
    real_replace = files.os.replace
    monkeypatch.setattr(files.os, "replace", lambda s, d: (order.append(d.name),
                                                           real_replace(s, d)))
    prepare_small(folder, vocab_size=290)
    assert order[-1] == "meta.json" and sorted(order) == sorted(FILES)


def test_a_token_file_that_disagrees_with_meta_json_is_refused(folder):
    (folder / "valid.bin").write_bytes((folder / "valid.bin").read_bytes()[:-2])
    with pytest.raises(ValueError, match=r"valid.bin holds [\d,]+ tokens, meta.json says"):
        ensure_data(folder)


def test_temporary_files_of_killed_runs_are_removed_and_live_ones_kept(folder):
    stale = folder / f".train.bin.tmp-{dead_pid()}"
    live = folder / ".train.bin.tmp-1"  # process 1 lives as long as the machine
    stale.write_bytes(b"\0" * 1000)
    live.write_bytes(b"")
    prepare_small(folder)
    assert not stale.exists() and live.exists()


# --- data: bad sources and flags -----------------------------------------------------------------


@pytest.mark.parametrize("content", [b"Caf\xe9 au lait.\n" + EOT.encode() + b"\nTwo.\n",
                                     bytes(range(256)) * 8], ids=["latin-1", "binary"])
def test_a_source_that_is_not_utf8_is_named_with_the_fix(tmp_path, content):
    (tmp_path / "stories.txt").write_bytes(content)
    with pytest.raises(ValueError, match=r"stories.txt is not UTF-8 text .*iconv -f latin1 -t "
                       r"utf-8 stories.txt > stories-utf8.txt"):
        prepare_data(tmp_path / "stories.txt", data_dir=tmp_path / "d", vocab_size=300,
                     progress=False)


@pytest.mark.parametrize("n", ["-1", "0"])
def test_train_stories_below_one_is_refused(tmp_path, monkeypatch, n):
    monkeypatch.setattr(data, "train_tokenizer", never)
    argv = ["data", "--source", "sample", "--train-stories", n, "--data-dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match=rf"^error: --train-stories .* at least 1, got {n}"):
        data.main()


def test_a_jsonl_row_whose_text_is_null_is_named(tmp_path):
    rows = [{"text": "One."}, {"text": None}, {"text": "Three."}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match=r"c.jsonl, row 2: 'text' is None, not a story"):
        prepare_data(tmp_path / "c.jsonl", data_dir=tmp_path / "d", vocab_size=300,
                     progress=False)


# --- data: the disk ------------------------------------------------------------------------------


def test_a_read_only_data_folder_is_refused_before_the_tokenizer_trains(tmp_path, monkeypatch):
    def refused(*args, **kwargs):  # what a read-only folder does (root may write anywhere)
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(files.tempfile, "TemporaryFile", refused)
    monkeypatch.setattr(data, "train_tokenizer", never)
    with pytest.raises(PermissionError, match=r"cannot write in .*ro \(Permission denied\): the "
                       r"data folder must be a folder you can write"):
        prepare_small(tmp_path / "ro")


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   OSError("155202 requested and 57554 written")],
                         ids=["ENOSPC", "numpy-short-write"])
def test_a_full_disk_says_so_and_how_much_is_needed(folder, monkeypatch, error):
    before = contents(folder)

    def disk_fills_up(tokenizer, pairs, paths, progress=True, first=None):
        paths["train"].write_bytes(b"\0" * 1000)
        raise error

    monkeypatch.setattr(data, "encode_to_files", disk_fills_up)
    with pytest.raises(OSError, match=r"the disk holding .*data is full: this needs about "
                       r"[\d.]+ MB there, and [\d.]+ [KMG]?B was free"):
        prepare_small(folder)
    assert contents(folder) == before  # the old set, and no temporary file


def test_a_data_dir_variable_naming_a_file_is_refused(tmp_path, monkeypatch):
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.setenv("TINY_LLM_DATA_DIR", str(tmp_path / "notes.txt"))
    with pytest.raises(ValueError, match=r"notes.txt is a file, not a folder\. "
                       r"TINY_LLM_DATA_DIR names it"):
        ensure_data(tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine"


# --- checkpoints ---------------------------------------------------------------------------------


def test_a_checkpoint_naming_another_module_imports_nothing(folder, tmp_path, monkeypatch):
    (tmp_path / "payload.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('pwned').touch()\nGPT = object\n")
    monkeypatch.syspath_prepend(tmp_path)  # as `python -m` puts the working directory there
    monkeypatch.chdir(tmp_path)
    save_small_checkpoint(tmp_path / "ckpt.pt", folder, model_class="payload.GPT")
    with pytest.raises(ValueError, match=r"unknown model class 'payload.GPT'.*no code it names"):
        model_from_checkpoint(tmp_path / "ckpt.pt", data_dir=folder)
    assert not (tmp_path / "pwned").exists() and "payload" not in sys.modules


def test_every_model_the_course_builds_is_in_the_registry():
    assert set(MODELS.values()) <= set(MODEL_CLASSES)  # what --model names can be loaded back
    for name in MODEL_CLASSES:
        assert f"{model_class(name).__module__}.{model_class(name).__qualname__}" == name


class Gadget:  # a class no tiny-llm checkpoint holds
    pass


def test_a_checkpoint_refused_by_safe_loading_keeps_pytorchs_whole_reason(tmp_path):
    torch.save({"model": {}, "gadget": Gadget()}, tmp_path / "odd.pt")
    with pytest.raises(ValueError) as refused:
        load_checkpoint(tmp_path / "odd.pt")
    message = str(refused.value)
    assert "could run code" in message and "arbitrary code execution" in message
    assert "Unsupported global: GLOBAL test_reliability.Gadget" in message


# --- export --------------------------------------------------------------------------------------


def test_export_never_replaces_a_folder_it_did_not_write(tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "notes.md").write_text("my notes")
    with pytest.raises(FileExistsError, match="is not a model folder: pick a new --out"):
        export(tmp_path / "no-such-ckpt.pt", out)  # refused before any work
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "notes.md"]


def test_export_replaces_its_own_folder_but_not_files_added_to_it(tmp_path):
    out = tmp_path / "hf"
    for _ in range(2):  # the second export replaces the first
        with atomic_folder(out) as tmp:
            (tmp / "config.json").write_text("{}")
    assert (out / MARKER).read_text().split() == ["config.json"]
    (out / "notes.md").write_text("my notes")
    with pytest.raises(FileExistsError, match=r"files that export did not write \(notes.md\)"):
        with atomic_folder(out):
            pass
    assert (out / "notes.md").read_text() == "my notes"


# --- library: a model fed bad ids says what it got ------------------------------------------------


@pytest.mark.parametrize("ids, error, says", [
    (torch.tensor([[1.0, 2.0]]), TypeError, "must be integers, got dtype torch.float32"),
    (torch.tensor([[1, 64]]), ValueError, "token id 64 is outside the vocabulary [0, 64)"),
    (torch.tensor([[-3, 1]]), ValueError, "token id -3 is outside the vocabulary [0, 64)"),
    (torch.tensor([1, 2]), ValueError, "got shape (2,): for one sequence use idx.unsqueeze(0)"),
    (torch.zeros(2, 4, 4, dtype=torch.long), ValueError, "got shape (2, 4, 4)"),
])
def test_a_model_fed_bad_ids_names_what_it_got_and_the_fix(ids, error, says):
    model = GPT(GPTConfig(vocab_size=64, max_seq_len=8, d_model=16, n_layers=1, n_heads=2))
    with pytest.raises(error) as raised:
        model(ids)
    assert says in str(raised.value)
