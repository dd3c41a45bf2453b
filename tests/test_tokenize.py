import doctest
import random

import pytest
from tokenizers import Tokenizer, models, trainers

from solutions import ex02_tokenize
from tiny_llm import bpe as bpe_module
from tiny_llm import tokenize
from tiny_llm.bpe import (
    GPT2_SPLIT_PATTERN,
    BytePairEncoder,
    HFTieBreakBPE,
    bytes_to_unicode,
    count_words,
    get_stats,
    merge,
    most_frequent,
    pretokenize,
    scratch_merges,
    split_special,
    token_bytes,
)
from tiny_llm.sample_stories import generate_stories
from tiny_llm.tokenize import (
    EOT,
    VOCAB_SIZE,
    agreement,
    hf_merges,
    load_tokenizer,
    tokenizer_sha256,
    train_both,
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


def test_bpe_rejects_bad_special_tokens():
    with pytest.raises(TypeError, match="list of non-empty strings, got '<|endoftext|>'"):
        BytePairEncoder(EOT)
    with pytest.raises(TypeError, match="list of non-empty strings"):
        BytePairEncoder([""])
    with pytest.raises(ValueError, match=r"int >= 257 \(256 bytes \+ 1 special tokens\), got 256"):
        BytePairEncoder([EOT, EOT]).train("abc", vocab_size=256)


def test_bpe_rejects_bad_training_input():
    with pytest.raises(ValueError, match="vocab_size must be an int >= 256.*got 100"):
        BytePairEncoder().train("abc", vocab_size=100)
    with pytest.raises(TypeError, match="needs a str, got bytes"):
        BytePairEncoder().train(b"abc", vocab_size=300)


def test_docstring_examples_hold():
    for module in (bpe_module, tokenize):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def random_unicode(rng, length):
    """A random string mixing ASCII, white space, Latin, kana, CJK, digits and emoji."""
    ranges = [(0x20, 0x7E), (0x09, 0x0D), (0xA0, 0x24F), (0x3040, 0x30FF), (0x4E00, 0x9FFF),
              (0x1F300, 0x1FAFF), (0x30, 0x39), (0x0300, 0x036F)]
    return "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(length))


@pytest.fixture(scope="module")
def stories():
    return list(generate_stories(300, seed=0))


@pytest.fixture(scope="module")
def both(stories):
    """Our BPE, the Hugging Face one and ours with HF's tie rule, all on the same 300 stories."""
    ours, theirs, _ = train_both(stories, vocab_size=400)
    hf_rule = HFTieBreakBPE([EOT]).train(EOT.join(stories), vocab_size=400)
    return ours, theirs, hf_rule


def test_pretokenize_splits_words_numbers_and_punctuation_losslessly():
    text = "The dog's ball. 42 dogs!  Why?\n"
    pieces = pretokenize(text)
    assert pieces == ["The", " dog", "'s", " ball", ".", " 42", " dogs", "!", " ", " Why", "?",
                      "\n"]
    assert pretokenize(text, pattern=None) == [text]
    rng = random.Random(0)
    for _ in range(100):
        text = random_unicode(rng, rng.randint(0, 40))
        assert "".join(pretokenize(text)) == text  # nothing is lost or added


def test_merges_stay_inside_pre_tokens(stories):
    text = "\n".join(stories[:20])
    bpe = BytePairEncoder().train(text, vocab_size=350)
    words = list(count_words(text))
    for new_id in bpe.merges.values():
        token = bpe.vocab[new_id]
        assert any(token in word for word in words), token
    assert all(b". " not in bpe.vocab[i] for i in bpe.merges.values())
    crossing = BytePairEncoder(pattern=None).train(text, vocab_size=350)  # the textbook BPE
    assert any(b". " in crossing.vocab[i] for i in crossing.merges.values())


def test_split_special_keeps_special_tokens_whole():
    assert split_special("a<|endoftext|><|endoftext|>b", [EOT]) == ["a", EOT, EOT, "b"]
    assert split_special("<|x|><|xy|>", ["<|x|>", "<|xy|>"]) == ["<|x|>", "<|xy|>"]
    assert split_special("no specials", []) == ["no specials"]
    assert count_words("ab<|endoftext|>ab", [EOT]) == {b"ab": 2}


def test_special_token_is_never_merged_and_gets_its_own_id():
    text = EOT.join(["<|the cat|>", "the cat", "the hat"] * 20)
    bpe = BytePairEncoder([EOT]).train(text, vocab_size=263)
    eot_id = 256 + 6
    assert len(bpe.merges) == 6 and bpe.special_tokens == {EOT: eot_id} and len(bpe.vocab) == 263
    assert not any(bpe.vocab[i] in b"endoftext" for i in bpe.merges.values())
    assert bpe.encode(EOT) == [eot_id]
    ids = bpe.encode("The end." + EOT + "Once" + EOT)
    assert ids.count(eot_id) == 2 and ids[-1] == eot_id
    assert bpe.decode(ids) == "The end." + EOT + "Once" + EOT
    plain = BytePairEncoder().train(text, vocab_size=263)  # no special tokens: EOT is just text
    assert any(plain.vocab[i] in b"endoftext" for i in plain.merges.values())
    assert len(plain.encode(EOT)) > 1


def test_ties_go_to_the_greater_pair_of_byte_strings():
    vocab = {97: b"a", 98: b"b", 256: b"ab"}
    assert most_frequent({(97, 98): 3, (98, 97): 3, (256, 97): 1}, vocab) == (98, 97)
    assert most_frequent({(97, 98): 3, (256, 97): 3}, vocab) == (256, 97)  # b"ab" > b"a"
    bpe = BytePairEncoder().train("ab cd", vocab_size=257)  # three pairs, each seen once
    assert bpe.merges == {(99, 100): 256}


def naive_train(text, n_merges):
    """The textbook trainer: recount every pair of every pre-token after every merge."""
    words = {w: n for w, n in count_words(text).items()}
    pieces, vocab, merges = [list(w) for w in words], {i: bytes([i]) for i in range(256)}, []
    for new_id in range(256, 256 + n_merges):
        counts = {}
        for piece, n in zip(pieces, words.values(), strict=True):
            for pair, c in get_stats(piece).items():
                counts[pair] = counts.get(pair, 0) + c * n
        if not counts:
            break
        pair = most_frequent(counts, vocab)
        vocab[new_id] = vocab[pair[0]] + vocab[pair[1]]
        merges.append(pair)
        pieces = [merge(p, pair, new_id) for p in pieces]
    return merges


def test_incremental_training_learns_what_recounting_learns(stories):
    text = "\n".join(stories[:40])
    bpe = BytePairEncoder().train(text, vocab_size=256 + 150)
    assert list(bpe.merges) == naive_train(text, 150)


def test_training_stops_when_every_piece_is_one_token():
    bpe = BytePairEncoder([EOT]).train("ab ab ab", vocab_size=1000)
    assert bpe.merges == {(97, 98): 256, (32, 256): 257}  # 'ab', then ' ab': nothing is left
    assert bpe.encode("ab ab") == [256, 257]
    assert bpe.special_tokens == {EOT: 258} and len(bpe.vocab) == 259


def test_encode_caches_each_pre_token(stories):
    bpe = BytePairEncoder().train("\n".join(stories[:50]), vocab_size=400)
    first = bpe.encode("the dog and the cat and the dog")
    assert " dog" in bpe.cache and "the" in bpe.cache
    assert bpe.encode("the dog and the cat and the dog") == first
    dog = bpe.encode(" dog")
    bpe.encode_word(" dog").append(-1)  # a caller changing what it got back...
    assert bpe.encode(" dog") == dog  # ...does not change the cache


def test_bpe_round_trips_random_unicode(both):
    ours = both[0]
    rng = random.Random(1)
    for _ in range(200):
        text = random_unicode(rng, rng.randint(0, 50))
        assert ours.decode(ours.encode(text)) == text, repr(text)


def test_bytes_to_unicode_is_gpt2s_printable_alphabet():
    chars = bytes_to_unicode()
    assert len(set(chars.values())) == 256 and all(c.isprintable() for c in chars.values())
    assert chars[ord(" ")] == "Ġ" and chars[ord("a")] == "a" and chars[ord("\n")] == "Ċ"
    assert token_bytes("Ġupon") == b" upon"


def test_hf_trainer_learns_our_merges_up_to_tie_breaking(both):
    ours, theirs, hf_rule = both
    mine, hf = scratch_merges(ours), hf_merges(theirs)
    assert len(mine) == len(hf) == 400 - 257
    in_order, anywhere = agreement(mine, hf)
    assert 10 < in_order < len(mine)  # they part at the first tie...
    assert anywhere > 0.9 * len(mine)  # ...but learn nearly the same merges
    assert scratch_merges(hf_rule) == hf  # with HF's tie rule: every merge, in the same order


def test_same_merges_encode_every_text_the_same_way(both, stories):
    _, theirs, hf_rule = both
    rng = random.Random(2)
    texts = [random_unicode(rng, rng.randint(0, 40)) for _ in range(100)]
    texts += list(generate_stories(20, seed=1)) + ["The end." + EOT + "Once"]
    for text in texts:
        ours = [hf_rule.vocab[i] for i in hf_rule.encode(text)]
        assert ours == [token_bytes(t) for t in theirs.encode(text).tokens], repr(text)


def test_compare_on_file_reads_only_the_first_stories(tmp_path, capsys):
    path = tmp_path / "stories.txt"
    path.write_text("".join(f"{story}\n{EOT}\n" for story in generate_stories(30, seed=3)))
    stories = tokenize.first_stories(path, 20)
    assert len(stories) == 20 and stories[1].startswith("\n") and EOT not in "".join(stories)
    tokenize.compare_on_file(path, 30, vocab_size=300)
    out = capsys.readouterr().out
    assert "43 merges in" in out and "with HF tie rule   43 of 43 in the same order" in out
    with pytest.raises(ValueError, match="holds 30 stories .* fewer than --stories 31"):
        tokenize.first_stories(path, 31)


def test_check_output_pre_tokenization_and_comparison(capsys):
    tokenize.show_scratch_bpe()
    out = capsys.readouterr().out
    assert "no pre-tokenizer   ['A', ' dog. ', 'A', ' dog! ', 'A', ' dog?']" in out
    assert "GPT-2 pre-tokens   ['A', ' dog', '.', ' ', 'A', ' dog', '!', ' '," in out
    assert GPT2_SPLIT_PATTERN.startswith("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+")


def test_the_comparison_is_its_own_command_not_part_of_the_check(monkeypatch, capsys):
    monkeypatch.setattr(tokenize, "COMPARE_STORIES", 40)  # a few stories: the output's shape
    monkeypatch.setattr("sys.argv", ["tokenize", "--compare"])
    tokenize.main()
    out = capsys.readouterr().out
    assert "trained on         40 sample stories" in out and "with HF tie rule" in out
    assert "BPE from scratch" not in out and "Production tokenizer" not in out


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
    pieces, spanning = ex02_tokenize.exercise_3_pre_tokens(n_train=10)
    assert pieces[5:9] == [" I", " DON", "'", "T"] and pieces[11:13] == [" ", " It"]
    assert spanning["with"] == [] and len(spanning["without"]) > 10
    result = ex02_tokenize.exercise_4_special_tokens(n_train=60)
    assert result["special"][1:] == (1, [])
    assert result["plain text"][1] > 1 and b"<|" in result["plain text"][2]
    by_vocab = ex02_tokenize.exercise_5_bytes_per_token_by_vocab((300, 600), n_train=300)
    assert 1.0 < by_vocab[300] < by_vocab[600]
    assert 1000 < ex02_tokenize.exercise_6_vocab_saturates(n_train=500) < 4096
    assert ex02_tokenize.exercise_7_eot_is_always_zero() == ([0, 0, 0], 0)
