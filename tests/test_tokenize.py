import pytest
from tokenizers import Tokenizer, models, trainers

from solutions import ex02_tokenize
from tiny_llm import tokenize
from tiny_llm.sample_stories import generate_stories
from tiny_llm.tokenize import (
    EOT,
    VOCAB_SIZE,
    BytePairEncoder,
    get_stats,
    load_tokenizer,
    merge,
    tokenizer_sha256,
    train_tokenizer,
)

TRICKY = [
    "",
    "a",
    "Hello, world!",
    "café crème brûlée, naïve Ångström",
    "日本語のテキストと한국어",
    "emoji 😀🐉 and a family 👩‍👩‍👧",
    "  leading and trailing spaces  \n\ttabs\r\nCRLF",
    "mixed: Ω≈ç√∫ ٱلعربية עברית",
    "\x00 a NUL and a replacement char \ufffd",
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(generate_stories(300, seed=0), vocab_size=1000)


def test_get_stats_counts_adjacent_pairs():
    assert get_stats([1, 2, 3, 1, 2]) == {(1, 2): 2, (2, 3): 1, (3, 1): 1}
    assert get_stats([5]) == {}


def test_merge_replaces_left_to_right():
    assert merge([1, 2, 3, 1, 2], (1, 2), 4) == [4, 3, 4]
    assert merge([7, 7, 7], (7, 7), 9) == [9, 7]  # overlapping pairs: the leftmost wins


def test_bpe_learns_the_classic_example_merge_by_merge():
    bpe = BytePairEncoder().train("aaabdaaabac", vocab_size=259)
    assert bpe.merges == {(97, 97): 256, (256, 97): 257, (257, 98): 258}
    assert [bpe.vocab[i] for i in (256, 257, 258)] == [b"aa", b"aaa", b"aaab"]
    assert bpe.encode("aaabdaaabac") == [258, 100, 258, 97, 99]


def test_bpe_retraining_starts_from_scratch():
    bpe = BytePairEncoder().train("aaabdaaabac", vocab_size=259)
    bpe.train("xyxy", vocab_size=257)
    assert bpe.merges == {(120, 121): 256}


@pytest.mark.parametrize("text", TRICKY)
def test_bpe_round_trips_any_utf8(text):
    bpe = BytePairEncoder().train("the cat sat on the mat, the cat sat", vocab_size=280)
    ids = bpe.encode(text)
    assert all(0 <= i < 280 for i in ids)
    assert bpe.decode(ids) == text


def test_bpe_decode_replaces_a_broken_character():
    bpe = BytePairEncoder()
    assert bpe.encode("é") == [0xC3, 0xA9]
    assert bpe.decode([0xC3]) == "\ufffd"


def test_bpe_rejects_bad_training_input():
    with pytest.raises(ValueError, match="vocab_size must be an int >= 256.*got 100"):
        BytePairEncoder().train("abc", vocab_size=100)
    with pytest.raises(TypeError, match="needs a str, got bytes"):
        BytePairEncoder().train(b"abc", vocab_size=300)


@pytest.mark.parametrize("text", TRICKY)
def test_production_tokenizer_round_trips_any_utf8(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_eot_is_one_token_with_id_zero(tokenizer):
    assert tokenizer.token_to_id(EOT) == 0
    assert tokenizer.encode(EOT).ids == [0]
    ids = tokenizer.encode("The end." + EOT + "Once").ids
    assert ids.count(0) == 1
    assert tokenizer.decode(ids, skip_special_tokens=False) == "The end." + EOT + "Once"


def test_vocab_has_every_byte_and_respects_the_size(tokenizer):
    assert tokenizer.get_vocab_size() == 1000
    assert tokenizer.encode("\x01\x02").ids != []  # bytes never seen in training still encode
    assert VOCAB_SIZE == 4096


def test_train_tokenizer_reads_a_generator_once():
    tok = train_tokenizer((s for s in generate_stories(50)), vocab_size=300)
    assert tok.get_vocab_size() == 300


def test_save_load_and_sha256_round_trip(tmp_path):
    path = tmp_path / "sub" / "tokenizer.json"
    trained = train_tokenizer(generate_stories(100), vocab_size=400, path=path)
    assert [p.name for p in path.parent.iterdir()] == ["tokenizer.json"]  # no temp file left
    loaded = load_tokenizer(path)
    text = "Once upon a time, Lily found a red ball."
    assert loaded.encode(text).ids == trained.encode(text).ids
    digest = tokenizer_sha256(path)
    assert len(digest) == 64 and digest == tokenizer_sha256(str(path))
    again = train_tokenizer(generate_stories(100), vocab_size=400, path=tmp_path / "again.json")
    assert again.get_vocab() == trained.get_vocab()
    assert tokenizer_sha256(tmp_path / "again.json") == digest  # training is deterministic


def test_load_tokenizer_explains_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no tokenizer at .*`uv run python -m tiny_llm"):
        load_tokenizer(tmp_path / "tokenizer.json")
    with pytest.raises(FileNotFoundError, match="no tokenizer at"):
        tokenizer_sha256(tmp_path / "tokenizer.json")


def test_load_tokenizer_rejects_a_tokenizer_without_eot_at_zero(tmp_path):
    tok = Tokenizer(models.BPE())
    tok.train_from_iterator(["abc"], trainers.BpeTrainer(special_tokens=["<pad>", EOT]))
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"does not have <\|endoftext\|> as id 0"):
        load_tokenizer(tmp_path / "tokenizer.json")


def test_load_tokenizer_rejects_a_vocab_too_big_for_uint16(tmp_path):
    vocab = {EOT: 0, **{f"t{i}": i for i in range(1, 70_000)}}
    Tokenizer(models.BPE(vocab=vocab, merges=[])).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="70,000 tokens, more than uint16"):
        load_tokenizer(tmp_path / "tokenizer.json")


@pytest.mark.parametrize(
    "vocab_size, error, match",
    [
        (256, ValueError, "vocab_size=256 is too small"),
        (70_000, ValueError, "vocab_size=70000 does not fit the uint16"),
        (4096.0, TypeError, "vocab_size must be an int, got 4096.0"),
    ],
)
def test_train_tokenizer_rejects_bad_vocab_sizes(vocab_size, error, match):
    with pytest.raises(error, match=match):
        train_tokenizer(["abc"], vocab_size=vocab_size)


def test_train_tokenizer_rejects_a_single_string():
    with pytest.raises(TypeError, match="not one string"):
        train_tokenizer("Once upon a time")


def test_check_trains_a_tokenizer_when_none_is_prepared(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tokenize, "DATA_DIR", tmp_path)
    tokenize.show_production_tokenizer(tokenize.SENTENCE)
    out = capsys.readouterr().out
    assert f"none at {tmp_path / 'tokenizer.json'}, trained one on 5,000 sample stories" in out
    # the same tokenizer as `python -m tiny_llm.data --source sample`, so the chapter's numbers
    assert "vocab size         1,300" in out and "(16 tokens)" in out
    assert "round trip         OK" in out
    assert "'<|endoftext|>' -> [0]" in out


def test_solutions():
    assert ex02_tokenize.exercise_1_merges_to_one_token() == 7
    ids, dragon, whole, cut = ex02_tokenize.exercise_2_unseen_characters()
    assert dragon == [240, 159, 144, 137] and whole == "naïve 🐉" and cut.endswith("\ufffd")
    by_vocab = ex02_tokenize.exercise_3_bytes_per_token_by_vocab((300, 600), n_train=300)
    assert 1.0 < by_vocab[300] < by_vocab[600]
    assert 1000 < ex02_tokenize.exercise_4_vocab_saturates(n_train=500) < 4096
    assert ex02_tokenize.exercise_5_eot_is_always_zero() == ([0, 0, 0], 0)
