import json
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader

from solutions import ex03_data
from tiny_llm import data
from tiny_llm.data import (
    NextTokenDataset,
    ensure_data,
    get_batch,
    load_meta,
    load_token_array,
    prepare_data,
)
from tiny_llm.sample_stories import generate_stories
from tiny_llm.tokenize import EOT, load_tokenizer, tokenizer_sha256

STORIES = list(generate_stories(40, seed=7))
SMALL_VOCAB = 300  # enough for tests on a few stories, and quick to train


def write_txt(path, stories):
    path.write_text("".join(f"{story}\n{EOT}\n" for story in stories))
    return path


def bin_stories(path, tokenizer):
    """Decode a .bin file back into its stories, splitting at the EOT ids."""
    ids = load_token_array(path).tolist()
    assert ids[-1] == 0, "every story, the last one too, ends with EOT"
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return text.split(EOT)[:-1]


# --- the prepared sample corpus ------------------------------------------------------------------


def test_meta_agrees_with_the_files(sample_data_dir):
    meta = load_meta(sample_data_dir)
    assert meta["source"] == "sample" and meta["dtype"] == "uint16" and meta["eot_id"] == 0
    assert meta["tokenizer_sha256"] == tokenizer_sha256(sample_data_dir / "tokenizer.json")
    assert meta["vocab_size"] == load_tokenizer(sample_data_dir / "tokenizer.json").get_vocab_size()
    for split, (n_stories, seed) in data.SAMPLE.items():
        stories = list(generate_stories(n_stories, seed))
        assert meta[split]["stories"] == n_stories
        assert meta[split]["bytes"] == sum(len(s.encode("utf-8")) for s in stories)
        assert meta[split]["tokens"] == (sample_data_dir / f"{split}.bin").stat().st_size // 2
    assert meta["tokenizer_trained_on"]["stories"] == data.SAMPLE["train"][0]  # all of it


def test_each_story_is_followed_by_one_eot(sample_data_dir):
    train = load_token_array(sample_data_dir / "train.bin")
    assert (train == 0).sum() == data.SAMPLE["train"][0]
    assert train[-1] == 0
    tokenizer = load_tokenizer(sample_data_dir / "tokenizer.json")
    first_eot = int(np.argmax(train == 0))
    first_story = tokenizer.decode(train[:first_eot].tolist())
    assert first_story == next(generate_stories(1, seed=0))


def test_ensure_data_reads_what_is_prepared(sample_data_dir):
    before = (sample_data_dir / "train.bin").stat().st_mtime_ns
    assert ensure_data(sample_data_dir) == load_meta(sample_data_dir)
    assert (sample_data_dir / "train.bin").stat().st_mtime_ns == before


def test_the_check_shows_the_shift_without_preparing_again(sample_data_dir, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["data", "--data-dir", str(sample_data_dir)])
    monkeypatch.setattr(data, "prepare_data", lambda *a, **k: pytest.fail("prepared again"))
    data.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("prepared data found in")
    header = next(i for i, line in enumerate(lines) if line.startswith("t "))
    rows = [line.split() for line in lines[header + 1 :]]
    assert len(rows) == 8
    for row, next_row in zip(rows, rows[1:], strict=False):
        assert row[2] == next_row[1]  # y[t] is x[t+1]


# --- preparing local files through `datasets` ----------------------------------------------------


def test_text_file_without_valid_keeps_its_last_5_percent(tmp_path):
    meta = prepare_data(write_txt(tmp_path / "c.txt", STORIES), data_dir=tmp_path / "d",
                        vocab_size=SMALL_VOCAB, progress=False)
    assert (meta["train"]["stories"], meta["valid"]["stories"]) == (38, 2)
    tokenizer = load_tokenizer(tmp_path / "d" / "tokenizer.json")
    assert bin_stories(tmp_path / "d" / "train.bin", tokenizer) == STORIES[:38]
    assert bin_stories(tmp_path / "d" / "valid.bin", tokenizer) == STORIES[38:]
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == sorted(data.FILES)


def test_jsonl_parquet_and_text_give_the_same_tokens(tmp_path):
    with open(tmp_path / "c.jsonl", "w") as f:
        f.writelines(json.dumps({"id": i, "text": s}) + "\n" for i, s in enumerate(STORIES))
    pd.DataFrame({"text": STORIES}).to_parquet(tmp_path / "c.parquet")
    sources = [write_txt(tmp_path / "c.txt", STORIES), tmp_path / "c.jsonl", tmp_path / "c.parquet"]
    files = []
    for i, source in enumerate(sources):
        prepare_data(source, data_dir=tmp_path / str(i), vocab_size=SMALL_VOCAB, progress=False)
        files.append([(tmp_path / str(i) / name).read_bytes() for name in data.FILES[:3]])
    assert files[0] == files[1] == files[2]


def test_a_valid_file_becomes_the_valid_split(tmp_path):
    train = write_txt(tmp_path / "t.txt", STORIES)
    valid = write_txt(tmp_path / "v.txt", STORIES[:3])
    meta = prepare_data(train, valid, tmp_path / "d", vocab_size=SMALL_VOCAB, progress=False)
    assert (meta["train"]["stories"], meta["valid"]["stories"]) == (40, 3)


def test_blank_lines_and_stray_eot_lines_make_no_empty_stories(tmp_path):
    text = f"\n{EOT}\nOne.\n\nTwo lines.\n{EOT}\n{EOT}\n  \n{EOT}\nThree.\n{EOT}\nFour.\n"
    (tmp_path / "c.txt").write_text(text)
    meta = prepare_data(tmp_path / "c.txt", data_dir=tmp_path / "d", vocab_size=SMALL_VOCAB,
                        progress=False)
    tokenizer = load_tokenizer(tmp_path / "d" / "tokenizer.json")
    assert bin_stories(tmp_path / "d" / "train.bin", tokenizer) == ["One.\n\nTwo lines.", "Three."]
    assert meta["valid"]["stories"] == 1  # "Four.", after the last EOT line



def test_first_stories_keeps_the_start_of_each_split_as_a_shorter_file_would(tmp_path):
    """--train-stories/--valid-stories: the first N stories of the source's splits, as if the
    corpus had been cut to them (how a learner makes the chapters' TinyStories prefixes)."""
    train = write_txt(tmp_path / "t.txt", STORIES)
    valid = write_txt(tmp_path / "v.txt", STORIES[:9])
    first = {"train": 25, "valid": 4}
    meta = prepare_data(train, valid, tmp_path / "cut", SMALL_VOCAB, progress=False, first=first)
    assert meta["first_stories"] == first
    assert meta["tokenizer_trained_on"]["stories"] == 25  # the tokenizer saw only the prefix too
    assert (meta["train"]["stories"], meta["valid"]["stories"]) == (25, 4)
    tokenizer = load_tokenizer(tmp_path / "cut" / "tokenizer.json")
    assert bin_stories(tmp_path / "cut" / "train.bin", tokenizer) == STORIES[:25]
    assert bin_stories(tmp_path / "cut" / "valid.bin", tokenizer) == STORIES[:4]
    short_train = write_txt(tmp_path / "t25.txt", STORIES[:25])
    short_valid = write_txt(tmp_path / "v4.txt", STORIES[:4])
    prepare_data(short_train, short_valid, tmp_path / "short", SMALL_VOCAB, progress=False)
    for name in data.FILES[:3]:
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "short" / name).read_bytes()


def test_first_stories_from_the_command_on_the_sample(tmp_path, monkeypatch, capsys):
    argv = ["data", "--source", "sample", "--train-stories", "300", "--valid-stories", "20",
            "--data-dir", str(tmp_path), "--vocab-size", str(SMALL_VOCAB)]
    monkeypatch.setattr(sys, "argv", argv)
    data.main()
    meta = load_meta(tmp_path)
    assert (meta["train"]["stories"], meta["valid"]["stories"]) == (300, 20)
    assert meta["first_stories"] == {"train": 300, "valid": 20}
    assert "train 300 stories" in " ".join(capsys.readouterr().out.split())
    tokenizer = load_tokenizer(tmp_path / "tokenizer.json")
    assert bin_stories(tmp_path / "valid.bin", tokenizer) == list(generate_stories(20, seed=1))


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, content, error, match", [
    ("missing.txt", None, FileNotFoundError, "no corpus file at .*missing.txt.*--source sample"),
    ("c.csv", "text\nhello\n", ValueError, "must end in .txt, .jsonl, .json, .parquet"),
    ("c.jsonl", '{"story": "hi"}\n', ValueError, "no 'text' field \\(its fields: story\\)"),
    ("c.txt", "", ValueError, "holds 0 stories"),
    ("c.txt", f"Only one.\n{EOT}\n", ValueError, "holds 1 stories"),
])
def test_bad_corpus_files_are_refused(tmp_path, name, content, error, match):
    if content is not None:
        (tmp_path / name).write_text(content)
    with pytest.raises(error, match=match):
        prepare_data(tmp_path / name, None, tmp_path / "d", vocab_size=SMALL_VOCAB, progress=False)
    assert not any((tmp_path / "d").glob("*")), "nothing is left behind"


def test_valid_goes_only_with_a_path_and_vocab_must_fit_uint16(tmp_path):
    with pytest.raises(ValueError, match="goes with a PATH source"):
        prepare_data("sample", valid=tmp_path / "v.txt", data_dir=tmp_path / "d")
    with pytest.raises(ValueError, match="uint16"):
        prepare_data(write_txt(tmp_path / "c.txt", STORIES), data_dir=tmp_path / "d",
                     vocab_size=70_000, progress=False)


def test_tinystories_without_internet_fails_fast_naming_the_alternatives(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "hub_reachable", lambda timeout=3.0: False)
    # fast means: before any download is tried (a clock would depend on the machine's load)
    monkeypatch.setattr(data, "tinystories_pairs", lambda: pytest.fail("a download was tried"))
    with pytest.raises(ConnectionError, match="--source sample.*--source PATH"):
        prepare_data("tinystories", data_dir=tmp_path / "d", progress=False)
    assert not any((tmp_path / "d").glob("*"))


def test_the_command_without_internet_exits_with_a_message(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not data.hub_reachable()  # HF_HUB_OFFLINE=1 counts as no Hub, without a network probe
    argv = ["data", "--source", "tinystories", "--data-dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="^error: cannot reach the Hugging Face Hub.*sample"):
        data.main()


def test_no_source_and_no_hub_prepares_the_sample_with_a_notice(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(data, "hub_reachable", lambda timeout=3.0: False)
    monkeypatch.setattr(data, "SAMPLE", {"train": (40, 0), "valid": (4, 1)})
    meta = ensure_data(tmp_path)
    assert meta["source"] == "sample" and meta["train"]["stories"] == 40
    assert "notice:" in capsys.readouterr().err


def test_a_failure_halfway_leaves_the_old_files_and_no_temporary_ones(tmp_path, monkeypatch):
    source = write_txt(tmp_path / "c.txt", STORIES)
    prepare_data(source, data_dir=tmp_path / "d", vocab_size=SMALL_VOCAB, progress=False)
    before = {p.name: p.read_bytes() for p in (tmp_path / "d").iterdir()}

    def broken(*args, **kwargs):
        raise KeyboardInterrupt  # as if Ctrl-C was pressed after the .bin files were written
    monkeypatch.setattr(data, "tokenizer_sha256", broken)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(source, data_dir=tmp_path / "d", vocab_size=SMALL_VOCAB + 50, progress=False)
    assert {p.name: p.read_bytes() for p in (tmp_path / "d").iterdir()} == before


# --- reading: load_token_array, get_batch, NextTokenDataset ---------------------------------------


def test_load_token_array_is_a_read_only_uint16_memmap(sample_data_dir):
    train = load_token_array(sample_data_dir / "valid.bin")
    assert isinstance(train, np.memmap) and train.dtype == np.uint16 and not train.flags.writeable


def test_load_token_array_refuses_missing_and_truncated_files(tmp_path, sample_data_dir):
    with pytest.raises(FileNotFoundError, match="uv run python -m tiny_llm.data"):
        load_token_array(tmp_path / "train.bin")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(ValueError, match="3 bytes, not a whole number of uint16 tokens"):
        load_token_array(tmp_path / "odd.bin")
    (tmp_path / "meta.json").write_text((sample_data_dir / "meta.json").read_text())
    (tmp_path / "valid.bin").write_bytes((sample_data_dir / "valid.bin").read_bytes()[:-2])
    with pytest.raises(ValueError, match="meta.json says .*truncated or stale"):
        load_token_array(tmp_path / "valid.bin")


def test_get_batch_shapes_and_the_one_token_shift(sample_data_dir):
    valid = load_token_array(sample_data_dir / "valid.bin")
    x, y = get_batch(valid, batch_size=4, seq_len=16, generator=torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    starts = torch.randint(len(valid) - 16, (4,), generator=torch.Generator().manual_seed(1))
    for row, start in zip(x, starts.tolist(), strict=True):
        assert row.tolist() == valid[start : start + 16].tolist()


def test_get_batch_is_reproducible_with_a_generator():
    tokens = np.arange(1000, dtype=np.uint16)
    a = get_batch(tokens, 8, 32, generator=torch.Generator().manual_seed(3))
    b = get_batch(tokens, 8, 32, generator=torch.Generator().manual_seed(3))
    c = get_batch(tokens, 8, 32, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])


def test_get_batch_with_one_possible_window():
    tokens = np.arange(9, dtype=np.uint16)
    x, y = get_batch(tokens, 2, 8, device="cpu")
    assert x.tolist() == [list(range(8))] * 2 and y.tolist() == [list(range(1, 9))] * 2


@pytest.mark.parametrize("args, match", [
    ((np.arange(10, dtype=np.uint16), 2, 10), "seq_len=10 needs at least 11 tokens, the data has"),
    ((np.arange(10, dtype=np.uint16), 0, 4), "batch_size must be a positive int, got 0"),
    ((np.arange(10, dtype=np.uint16), 2, 4.0), "seq_len must be a positive int, got 4.0"),
    ((np.zeros((2, 10), dtype=np.uint16), 2, 4), "1-D numpy token array"),
    ((list(range(10)), 2, 4), "got list"),
])
def test_get_batch_refuses_bad_sizes(args, match):
    with pytest.raises(ValueError, match=match):
        get_batch(*args)


def test_next_token_dataset_has_n_minus_t_windows_for_a_dataloader():
    tokens = np.arange(100, dtype=np.uint16)
    dataset = NextTokenDataset(tokens, seq_len=10)
    assert len(dataset) == 90
    x, y = dataset[89]
    assert x.tolist() == list(range(89, 99)) and y.tolist() == list(range(90, 100))
    with pytest.raises(IndexError, match="window 90 is out of range"):
        dataset[90]
    x, y = next(iter(DataLoader(dataset, batch_size=4)))
    assert x.shape == (4, 10) and x.dtype == torch.int64 and torch.equal(x[:, 1:], y[:, :-1])
    assert sum(len(x) for x, _ in DataLoader(dataset, batch_size=32)) == 90


# --- exercises ------------------------------------------------------------------------------------


def test_exercise_1_windows():
    assert ex03_data.exercise_1_windows(1_000_000, 256) == (999_744, 3_906)
    assert ex03_data.exercise_1_windows(10, 9) == (1, 1)


def test_exercise_2_batch_bytes():
    assert ex03_data.exercise_2_batch_bytes(32, 256) == (131_072, 16_448)


def test_exercise_3_most_common_tokens(sample_data_dir):
    top = ex03_data.exercise_3_most_common_tokens(sample_data_dir, k=5)
    counts = np.bincount(load_token_array(sample_data_dir / "train.bin"))
    assert [n for _, n in top] == sorted(counts, reverse=True)[:5]
    assert top[0][0] == "."


def test_exercise_4_every_token_seen():
    epoch, unseen = ex03_data.exercise_4_every_token_seen()
    assert epoch == 19 and 0.25 < unseen < 0.5  # about 1/e of the tokens never made it into x


def test_exercise_5_plot_token_ranks(sample_data_dir, tmp_path):
    counts = ex03_data.token_counts(sample_data_dir, chunk=1000)  # small chunks, same counts
    assert counts.sum() == len(load_token_array(sample_data_dir / "train.bin"))
    assert 0 < (counts > 0).sum() < load_meta(sample_data_dir)["vocab_size"]  # not every id occurs
    path = ex03_data.exercise_5_plot_token_ranks(tmp_path / "ranks.png", [sample_data_dir])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the fourth probe (issue 45): files that look like text and are not -----------------------


def test_a_one_line_file_is_split_at_every_eot(tmp_path):
    one_line = tmp_path / "one.txt"
    one_line.write_text(EOT.join(STORIES[:20]) + "\n")  # no newline around the EOTs
    meta = prepare_data(one_line, None, tmp_path / "d", vocab_size=SMALL_VOCAB, progress=False)
    assert meta["train"]["stories"] + meta["valid"]["stories"] == 20
    eots = sum(int((load_token_array(tmp_path / "d" / f"{s}.bin") == meta["eot_id"]).sum())
               for s in ("train", "valid"))
    assert eots == 20  # one after each story, none inside one


@pytest.mark.parametrize("content, said", [
    (None, r"one.txt is compressed with gzip \(it starts with the bytes 1f 8b\), not text: "
           r"unpack it first, `gunzip -c one.txt > one-text.txt`"),
    (EOT.join(STORIES[:4]).encode("utf-16"), r"one.txt is UTF-16 text \(it starts with a UTF-16 "
                                             r"byte-order mark\): .*`iconv -f utf-16 -t utf-8 "
                                             r"one.txt > one-utf8.txt`"),
    (f"{STORIES[0]}\n{EOT}\nA\x00B\n{EOT}\n{STORIES[1]}".encode(),
     r"one.txt, story 2, holds NUL bytes \(\\x00\), which no text holds: .*`tr -d '\\000' < "
     r"one.txt > one-clean.txt`"),
], ids=["gzip", "utf-16", "nul"])
def test_gzip_utf16_and_nul_bytes_are_refused_with_their_own_fix(tmp_path, content, said):
    import gzip

    path = tmp_path / "one.txt"
    path.write_bytes(content if content is not None else
                     gzip.compress(EOT.join(STORIES[:4]).encode()))
    with pytest.raises(ValueError, match=said):
        prepare_data(path, None, tmp_path / "d", vocab_size=SMALL_VOCAB, progress=False)
    assert not any((tmp_path / "d").glob("*")), "nothing is left behind"
