"""Nothing lost, nothing trusted that should not be: the course's promises on bad input.

Each test is one promise, named after it; read the names as the list. They come from a probe of
99 things a learner does wrong (issue 20): a corrupt or half-prepared data folder, a swapped
tokenizer, a killed run, a hostile checkpoint, a typo in --out, a full or read-only disk.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict

import numpy as np
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


def save_small_checkpoint(path, data_dir, max_seq_len=8, **extra):
    """A 1-layer GPT checkpoint made with data_dir's tokenizer; returns the model."""
    vocab_size = load_meta(data_dir)["vocab_size"]
    model = GPT(GPTConfig(vocab_size=vocab_size, max_seq_len=max_seq_len, d_model=16, n_layers=1,
                          n_heads=2))
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


# --- the second probe (issue 26): checkpoints checked part by part ------------------------------


def edited_checkpoint(folder, tmp_path, edit):
    """A small checkpoint, loaded, changed by `edit(state)`, written back as a hand would."""
    save_small_checkpoint(tmp_path / "ckpt.pt", folder)
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    edit(state)
    torch.save(state, tmp_path / "ckpt.pt")
    return tmp_path / "ckpt.pt"


@pytest.mark.parametrize("edit, says", [
    (lambda s: s["config"].pop("n_heads"), r"lacks n_heads\. It was made by another version of "
                                           r"tiny-llm, or edited by hand"),
    (lambda s: s["config"].update(colour="red"), r"it has colour, which GPTConfig does not know"),
    (lambda s: s["config"].update(n_heads="2"), r"holds a config this GPTConfig refuses: "
                                                r"GPTConfig.n_heads must be an int, got '2'"),
    (lambda s: s.update(step="1"), r"its 'step' is str '1', not a int"),
    (lambda s: s.update(config=[1, 2]), r"its 'config' is list"),
    (lambda s: s.update(format=2), r"has checkpoint format 2; this tiny-llm reads format 1 and "
                                   r"older: it was made by another \(newer\) version"),
    (lambda s: s.update(format=1.0), r"has checkpoint format 1\.0, a float; tiny-llm writes a "
                                     r"whole number from 1 .* edited by hand or damaged"),
    (lambda s: s.update(format="1"), r"format '1', a str; .* set \"format\" back to 1"),
    (lambda s: s.update(format=True), r"format True, a bool; .* edited by hand"),
    (lambda s: s.update(format=0), r"format 0, a int; .* edited by hand"),
], ids=["missing-field", "unknown-field", "field-type", "step-as-text", "config-a-list", "newer",
        "format-float", "format-text", "format-bool", "format-zero"])
def test_an_edited_checkpoint_is_refused_naming_what_is_wrong(folder, tmp_path, edit, says):
    path = edited_checkpoint(folder, tmp_path, edit)
    with pytest.raises(ValueError, match=says):
        model_from_checkpoint(path, data_dir=folder)  # what generate, evaluate, export call


def test_a_checkpoint_carries_its_format_and_one_without_is_read_with_a_note(folder, tmp_path,
                                                                             capsys):
    from tiny_llm.checkpoint import FORMAT_VERSION

    save_small_checkpoint(tmp_path / "ckpt.pt", folder)
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["format"] == FORMAT_VERSION == 1
    assert "note" not in capsys.readouterr().err
    path = edited_checkpoint(folder, tmp_path, lambda s: s.pop("format"))  # as before issue 26
    model, _ = model_from_checkpoint(path, data_dir=folder)
    assert model.config.n_heads == 2
    assert "has no format version" in capsys.readouterr().err


# --- export --import writes new files only; export --out a link -------------------------------


@pytest.mark.parametrize("existing", ["ckpt.pt", "tokenizer.json"])
def test_an_import_never_replaces_a_checkpoint_or_a_tokenizer(folder, tmp_path, existing):
    from tiny_llm.export import import_gpt2

    run = tmp_path / "run"
    run.mkdir()
    (run / existing).write_bytes(b"a trained run's file")
    (tmp_path / "not-a-model").mkdir()  # never reached: the check comes before any work
    with pytest.raises(FileExistsError, match=rf"run/{existing} exists .*an import writes only "
                                              r"new files"):
        import_gpt2(tmp_path / "not-a-model", run / "ckpt.pt")
    assert [p.name for p in run.iterdir()] == [existing]
    assert (run / existing).read_bytes() == b"a trained run's file"


def test_export_refuses_an_out_that_is_a_link_before_any_work(tmp_path):
    with atomic_folder(tmp_path / "first"):  # an earlier export, which may be replaced
        pass
    (tmp_path / "latest").symlink_to(tmp_path / "first")
    with pytest.raises(FileExistsError, match=r"latest is a symbolic link .*pick a new --out"):
        export(tmp_path / "no-such-ckpt.pt", tmp_path / "latest")
    assert (tmp_path / "latest").is_symlink()


# --- the forward checks its targets ------------------------------------------------------------


@pytest.mark.parametrize("targets, error, says", [
    (torch.full((2, 8), 64), ValueError, r"token ids in \[0, 64\) or -1 \(ignored\), got values "
                                         r"from 64 to 64"),
    (torch.zeros(2, 8, dtype=torch.uint8), TypeError, r"got torch.uint8: cross_entropy takes "
                                                       r"int64"),
    (torch.full((2, 8), -1), ValueError, r"every target is -1 \(ignored\): the mean loss over no "
                                         r"token is nan"),
], ids=["equal-to-vocab", "uint8", "all-ignored"])
def test_the_forward_names_bad_targets(targets, error, says):
    model = GPT(GPTConfig(vocab_size=64, max_seq_len=8, d_model=16, n_layers=1, n_heads=2))
    with pytest.raises(error, match=says):
        model(torch.zeros(2, 8, dtype=torch.long), targets)


def test_the_forward_refuses_an_empty_batch_instead_of_a_nan_loss():
    model = GPT(GPTConfig(vocab_size=64, max_seq_len=8, d_model=16, n_layers=1, n_heads=2))
    empty = torch.zeros(0, 8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"the batch is empty \(targets of shape \(0, 8\)\)"):
        model(empty, empty)


# --- data: two preparations at once; a corpus too small -----------------------------------------


def test_a_second_preparation_of_one_folder_at_once_is_refused(folder, monkeypatch):
    before = contents(folder)
    (folder / ".prepare.lock").write_text("1\n")  # process 1 lives as long as the machine
    monkeypatch.setattr(data, "train_tokenizer", never)
    monkeypatch.setattr(sys, "argv", ["data", "--source", "sample", "--data-dir", str(folder)])
    with pytest.raises(SystemExit, match=r"^error: .*data is being prepared by process 1 "
                                         r"already: wait for it to end"):
        data.main()  # exits non-zero, with the message
    (folder / ".prepare.lock").unlink()
    assert contents(folder) == before


def test_a_lock_left_by_a_killed_preparation_is_taken_over(folder):
    (folder / ".prepare.lock").write_text(f"{dead_pid()}\n")
    prepare_small(folder)
    assert not (folder / ".prepare.lock").exists()


def test_an_empty_lock_left_by_a_crash_is_taken_over_once_it_is_old(folder):
    """A preparation killed between creating its lock and writing its PID leaves an empty file:
    taken over after files.lock_holder's grace, as a training run's lock is."""
    lock = folder / ".prepare.lock"
    lock.write_text("")
    old = lock.stat().st_mtime - 60
    os.utime(lock, (old, old))
    prepare_small(folder)
    assert not lock.exists()


def test_a_corpus_too_small_for_a_window_warns_when_prepared_naming_the_fix(tmp_path, capsys):
    (tmp_path / "two.txt").write_text(f"Tom ran.\n{EOT}\nAnn sat down and smiled.\n")
    prepare_data(tmp_path / "two.txt", data_dir=tmp_path / "d", vocab_size=300, progress=False)
    err = capsys.readouterr().err
    assert "warning: " in err and ".bin holds only" in err and "no preset fits it" in err
    assert "-stories)" in err and "seq_len" not in err


# --- every model through every command: ModernGPT's attention and positions ----------------------


def tiny_modern(vocab_size=64):
    from tiny_llm.modern import PRESETS as MODERN

    torch.manual_seed(0)
    return MODERN["tiny"].__class__(**{**asdict(MODERN["tiny"]), "vocab_size": vocab_size})


def test_attention_maps_of_a_modern_gpt_are_causal_rows_per_query_head():
    from tiny_llm.evaluate import attention_maps
    from tiny_llm.modern import ModernGPT

    model = ModernGPT(tiny_modern())
    c = model.config
    maps = attention_maps(model, torch.randint(0, 64, (1, 10)))
    assert maps.shape == (c.n_layers, c.n_heads, 10, 10)
    assert torch.allclose(maps.sum(-1), torch.ones(c.n_layers, c.n_heads, 10))
    assert maps.triu(1).abs().max() == 0  # no query looks ahead
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert sdpa.__name__ == "scaled_dot_product_attention"  # put back


def test_attention_maps_of_the_gpt_are_the_explicit_paths_weights():
    from tiny_llm.evaluate import attention_maps

    model = GPT(GPTConfig(vocab_size=64, max_seq_len=8, d_model=16, n_layers=2, n_heads=2)).eval()
    idx = torch.randint(0, 64, (1, 8))
    maps = attention_maps(model, idx)
    x = model.embed(idx)
    attn = model.blocks[0].attn
    q, k, _ = attn.qkv(model.blocks[0].ln_1(x)).split(16, dim=2)
    q, k = (t.view(1, 8, 2, 8).transpose(1, 2) for t in (q, k))
    scores = (q @ k.transpose(-2, -1) / 8 ** 0.5).masked_fill(~attn.mask[:8, :8], float("-inf"))
    assert torch.allclose(maps[0], torch.softmax(scores, -1)[0], atol=1e-6)


def test_evaluate_draws_a_modern_gpts_attention_and_says_it_has_no_position_table(
        folder, tmp_path, monkeypatch, capsys):
    from tiny_llm import evaluate
    from tiny_llm.modern import ModernGPT

    model = ModernGPT(tiny_modern(load_meta(folder)["vocab_size"]))
    save_checkpoint(tmp_path / "ckpt.pt", {
        "model": model.state_dict(), "config": asdict(model.config), "step": 1,
        "model_class": class_path(model), "data_source": "sample",
        "tokenizer_sha256": tokenizer_sha256(folder / "tokenizer.json")})
    drawn = []  # the maps the picture gets (drawing it is plots.py's, tested there)
    monkeypatch.setattr(evaluate, "plot_attention_maps", lambda maps, *a: drawn.append(maps.shape))
    monkeypatch.setattr(sys, "argv", [
        "evaluate", "--checkpoint", str(tmp_path / "ckpt.pt"), "--data-dir", str(folder),
        "--max-batches", "1", "--batch-size", "1", "--samples", "0", "--attention-plot",
        str(tmp_path / "a.png"), "--positions-plot", str(tmp_path / "p.png")])
    evaluate.main()
    out = capsys.readouterr().out
    c = model.config
    assert drawn[0][:2] == (c.n_layers, c.n_heads) and not (tmp_path / "p.png").exists()
    assert "positions plot   none: this ModernGPT has no learned position table" in out


def test_evaluate_checks_the_picture_folders_before_scoring(folder, tmp_path, monkeypatch):
    from tiny_llm import evaluate

    save_small_checkpoint(tmp_path / "ckpt.pt", folder)
    (tmp_path / "log.jsonl").write_text('{"step": 0, "train_loss": 5.0, "val_loss": 5.0}\n')

    def refused(*args, **kwargs):  # what a read-only folder does (root may write anywhere)
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(files.tempfile, "TemporaryFile", refused)
    monkeypatch.setattr(evaluate, "evaluate_loss", never)
    monkeypatch.setattr(sys, "argv", ["evaluate", "--checkpoint", str(tmp_path / "ckpt.pt"),
                                      "--data-dir", str(folder)])
    with pytest.raises(SystemExit, match=r"^error: cannot write in .* the folder of the --plot "
                                         r"picture \(pass --plot PATH to save it elsewhere\)"):
        evaluate.main()


# --- generate's command line --------------------------------------------------------------------


def test_generate_refuses_a_seed_a_generator_cannot_hold(monkeypatch, capsys):
    from tiny_llm import generate

    monkeypatch.setattr(sys, "argv", ["generate", "--seed", "99999999999999999999"])
    with pytest.raises(SystemExit):
        generate.parse_args()
    assert "--seed must be below 2**64" in capsys.readouterr().err


def test_generate_reads_the_prompt_from_a_pipe_or_with_dash(tmp_path):
    import io
    import os

    from tiny_llm.generate import PROMPT, read_prompt

    assert read_prompt("-", stdin=io.StringIO("Zebra\n")) == "Zebra"
    assert read_prompt("A cat", stdin=io.StringIO("Zebra\n")) == "A cat"  # --prompt wins
    r, w = os.pipe()
    os.write(w, b"Zebra\n")
    os.close(w)
    with os.fdopen(r) as piped:  # echo Zebra | generate
        assert read_prompt(None, stdin=piped) == "Zebra"
    with open(os.devnull) as nothing:  # < /dev/null, as a test harness or cron gives
        assert read_prompt(None, stdin=nothing) == PROMPT
    r, w = os.pipe()  # a pipe that stays open and silent: not waited on for long
    with os.fdopen(r) as silent:
        assert read_prompt(None, stdin=silent, wait_s=0.01) == PROMPT
    os.close(w)


def test_generate_says_a_long_prompt_is_cut_to_the_context(folder, monkeypatch, capsys):
    from tiny_llm import generate

    monkeypatch.setattr(sys, "argv", ["generate", "--data-dir", str(folder), "--max-new-tokens",
                                      "1", "--prompt", "the cat sat on the mat. " * 40])
    generate.main()  # an untrained tiny GPT: a 64-token context
    err = capsys.readouterr().err
    assert "note: the prompt is" in err
    assert "the model reads at most 64: it writes from the prompt's last 64 tokens" in err


def test_a_bad_omp_num_threads_is_said_to_be_ignored(monkeypatch):
    from tiny_llm import device

    monkeypatch.setattr(device.torch, "set_num_threads", lambda n: None)
    for value in ("0", "abc", "-1"):
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        threads, why = device.pick_threads()
        assert threads == device.usable_cores()
        assert f"OMP_NUM_THREADS='{value}' was ignored: it must be a whole number >= 1" in why
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert device.pick_threads()[1] == "OMP_NUM_THREADS"


def test_a_run_folder_is_taken_where_a_checkpoint_is_asked(folder, tmp_path):
    """--init-from runs/base, generate --checkpoint runs/base: the folder --out named."""
    save_small_checkpoint(tmp_path / "base" / "ckpt.pt", folder)
    model, ckpt = model_from_checkpoint(tmp_path / "base", data_dir=folder)
    assert model.config.n_heads == 2 and ckpt["step"] == load_checkpoint(
        tmp_path / "base" / "ckpt.pt")["step"]
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path)  # a folder without one is still no checkpoint


# --- issue 36: request data (step 17) -------------------------------------------------------------


def test_a_field_after_the_story_is_a_field_not_story_text():
    from tiny_llm.instruct import parse_record

    request, story = parse_record("Words: dog, sun\nStory:\nThe dog ran.\nIt was fun.\n"
                                  "Summary: A dog runs.\n")
    assert story == "The dog ran.\nIt was fun."
    assert request["summary"] == "A dog runs." and request["words"] == ("dog", "sun")


def instruct_file(path, stories):
    path.write_text("".join(f"Words: dog\nStory:\n{s}\n{EOT}\n" for s in stories))
    return str(path)


def test_records_without_a_story_are_skipped_and_a_file_of_none_refused(prepared, tmp_path,
                                                                        capsys):
    from tiny_llm.instruct import instruct_records
    from tiny_llm.tokenize import load_tokenizer

    tokenizer = load_tokenizer(prepared / "tokenizer.json")
    with pytest.raises(ValueError, match=r"4 records have nothing after 'Story:', and too few "
                                         r"have a story.*every record needs its story"):
        instruct_records(instruct_file(tmp_path / "empty.txt", [""] * 4), tokenizer)
    records = instruct_records(instruct_file(tmp_path / "some.txt", ["", "A dog.", "", "A cat.",
                                                                      "A sun."]), tokenizer)
    assert sum(map(len, records.values())) == 3
    assert "2 records have nothing after 'Story:': skipped" in capsys.readouterr().err


def test_a_request_longer_than_the_context_is_named(prepared, tmp_path):
    from tiny_llm.instruct import rows_of
    from tiny_llm.tokenize import load_tokenizer

    tokenizer = load_tokenizer(prepared / "tokenizer.json")
    long = {"words": ("dog",), "features": (), "sentence": None, "summary": "dog " * 60}
    short = {"words": ("dog",), "features": (), "sentence": None, "summary": None}
    story = np.array(tokenizer.encode("The dog ran.").ids)
    with pytest.raises(ValueError, match=r"request 2 is \d+ tokens and a row holds 48: no story "
                                         r"would be trained behind it.*'Words: dog\\nSummary: dog"):
        rows_of([(short, story), (long, story)], tokenizer, 48)


@pytest.mark.parametrize("source, says", [
    ("derivd", r"--requests 'derivd' is no file, and not one of derived or tinystories-instruct: "
               r"did you mean --requests derived\?"),
    ("tinystories_instruct", r"did you mean --requests tinystories-instruct\?"),
    ("my-requests.txt", r"is no file, .*: pass a TinyStories-Instruct text file"),
])
def test_a_mistyped_requests_source_names_the_flag_it_belongs_to(prepared, source, says):
    from tiny_llm.instruct import instruct_records
    from tiny_llm.tokenize import load_tokenizer

    with pytest.raises(FileNotFoundError, match=says) as refused:
        instruct_records(source, load_tokenizer(prepared / "tokenizer.json"))
    assert "--source" not in str(refused.value)


# --- issue 36: generate and a request (step 17) ---------------------------------------------------


def generate_main(monkeypatch, *flags):
    """Step 17's `instruct write`: generate with a request."""
    from tiny_llm import instruct

    instruct.main(["write", "--max-new-tokens", "2", "--device", "cpu", *flags])


def test_a_request_and_a_prompt_together_are_refused(folder, monkeypatch, capsys):
    with pytest.raises(SystemExit):
        generate_main(monkeypatch, "--data-dir", str(folder), "--prompt", "Once", "--words",
                      "dog,moon")
    assert "--prompt and a request (--words, --features, --sentence) both say what to write " \
           "from: give one of them" in capsys.readouterr().err


def test_a_request_to_a_model_never_tuned_says_it_is_zero_shot(folder, tmp_path, monkeypatch,
                                                                capsys):
    save_small_checkpoint(tmp_path / "base" / "ckpt.pt", folder, max_seq_len=64)
    generate_main(monkeypatch, "--data-dir", str(folder), "--checkpoint",
                  str(tmp_path / "base" / "ckpt.pt"), "--words", "dog")
    out = capsys.readouterr()
    assert ("was never fine-tuned on requests: it reads this one as plain text (zero-shot)"
            in out.err)
    assert "'Words: dog\\nStory:\\n'" in out.out


def test_a_feature_the_model_was_not_taught_is_refused(folder, tmp_path, monkeypatch, capsys):
    save_small_checkpoint(tmp_path / "tuned" / "ckpt.pt", folder, max_seq_len=64,
                          train_config={"requests": "derived"})
    flags = ["--data-dir", str(folder), "--checkpoint", str(tmp_path / "tuned" / "ckpt.pt")]
    with pytest.raises(SystemExit, match=r"^error: .*ckpt.pt was never taught Twist: its requests "
                                         r"held words, sentence and Dialogue; leave the rest out"):
        generate_main(monkeypatch, *flags, "--words", "dog", "--features", "Twist")
    generate_main(monkeypatch, *flags, "--words", "dog", "--features", "Dialogue")  # taught
    assert "note:" not in capsys.readouterr().err


def test_a_request_longer_than_the_context_is_refused_not_echoed(folder, tmp_path, monkeypatch,
                                                                 capsys):
    save_small_checkpoint(tmp_path / "tuned" / "ckpt.pt", folder,
                          train_config={"requests": "derived"})
    with pytest.raises(SystemExit, match=r"^error: the request is [\d,]+ tokens and the model "
                                         r"reads at most 8: shorten --sentence"):
        generate_main(monkeypatch, "--data-dir", str(folder), "--checkpoint",
                      str(tmp_path / "tuned" / "ckpt.pt"), "--words", "dog", "--sentence",
                      "The dog ran. " * 8000)
    out = capsys.readouterr()
    assert len(out.out) + len(out.err) < 2000


def test_an_edited_request_format_keeps_only_what_step_17_knows():
    from tiny_llm.instruct import learned_requests

    edited = {"requests": {"fields": ["words", "colour", {}], "features": "Dialogue"}}
    assert learned_requests(edited) == {"fields": ["words"], "features": []}
    assert learned_requests({"train_config": {"requests": None}}) is None
