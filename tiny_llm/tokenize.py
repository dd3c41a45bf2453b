"""Step 02: from text to token ids and back.

A GPT reads and writes integers, not characters. A tokenizer turns text into a list of ids from
a fixed vocabulary and back. We build one from scratch first (byte-level byte pair encoding with
GPT-2's pre-tokenizer and special tokens, in plain Python: tiny_llm/bpe.py), then the production
one with Hugging Face `tokenizers`, which runs the same algorithm in Rust.

Run the check:  uv run python -m tiny_llm.tokenize
Compare our merges with Hugging Face's on sample stories (the chapter's optional section):
    uv run python -m tiny_llm.tokenize --compare
Time ours against Hugging Face's on a corpus:
    uv run python -m tiny_llm.tokenize --corpus TinyStories-train.txt --stories 364
"""

import argparse
import hashlib
import json
import time
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tiny_llm.bpe import (
    GPT2_SPLIT_PATTERN,
    BytePairEncoder,
    HFTieBreakBPE,
    scratch_merges,
    token_bytes,
)
from tiny_llm.files import atomic_path
from tiny_llm.paths import DATA_DIR
from tiny_llm.sample_stories import generate_stories

EOT = "<|endoftext|>"  # marks the end of one story; always id 0
VOCAB_SIZE = 4096
MAX_VOCAB_SIZE = 2**16  # step 03 stores ids as uint16, which holds 0..65,535


# ---------------------------------------------------------------------------------------------
# The production tokenizer: the same idea, in Rust, through Hugging Face `tokenizers`


def check_vocab_size(vocab_size):
    """Raise unless 257 <= vocab_size <= 65,536: 256 bytes + EOT, and ids must fit uint16."""
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
        raise TypeError(f"vocab_size must be an int, got {vocab_size!r}")
    if vocab_size < 257:
        raise ValueError(f"vocab_size={vocab_size} is too small: the 256 bytes and {EOT} need 257")
    if vocab_size > MAX_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size={vocab_size} does not fit the uint16 token files (at most "
            f"{MAX_VOCAB_SIZE:,} ids): pick a smaller vocab_size such as {VOCAB_SIZE}"
        )


def train_tokenizer(texts, vocab_size=VOCAB_SIZE, path=None):
    """Train a byte-level BPE tokenizer on `texts` (an iterable of str, read once); EOT gets id 0.

    If `path` is given, the tokenizer is saved there as JSON (atomically).
    """
    check_vocab_size(vocab_size)
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be an iterable of strings (one per story), not one string: "
                        "wrap it in a list, e.g. train_tokenizer([text])")
    tokenizer = Tokenizer(models.BPE())
    # Split into words (GPT-2's rule, spaces stay attached to the next word), map bytes to
    # printable characters so every byte is a symbol, and map them back when decoding.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],  # special tokens come first, so EOT is id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen or not
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if path is not None:
        with atomic_path(path) as tmp:
            tokenizer.save(str(tmp))
    return tokenizer


def tokenizer_path(path=None):
    """The tokenizer file to read: `path`, else DATA_DIR/tokenizer.json; a clear error if absent."""
    path = Path(path) if path is not None else DATA_DIR / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no tokenizer at {path}: run `uv run python -m tiny_llm.data` to prepare the data "
            "(it trains and saves the tokenizer), or pass the path of a tokenizer.json"
        )
    return path


def load_tokenizer(path=None):
    """Load a saved tokenizer (default DATA_DIR/tokenizer.json) and check it fits the course."""
    path = tokenizer_path(path)
    tokenizer = Tokenizer.from_file(str(path))
    if tokenizer.get_vocab_size() > MAX_VOCAB_SIZE:
        raise ValueError(
            f"{path} has {tokenizer.get_vocab_size():,} tokens, more than uint16 token files hold "
            f"({MAX_VOCAB_SIZE:,}): retrain it with a smaller vocab_size"
        )
    if tokenizer.token_to_id(EOT) != 0:
        raise ValueError(f"{path} does not have {EOT} as id 0: retrain it with train_tokenizer()")
    return tokenizer


def tokenizer_sha256(path=None):
    """sha256 hex digest of the tokenizer file: a fingerprint that checkpoints remember."""
    return hashlib.sha256(tokenizer_path(path).read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# One algorithm, two implementations: our BPE against the Hugging Face trainer (--compare,
# --corpus; the chapter's optional section)


def hf_merges(tokenizer):
    """A Hugging Face BPE's merges in the order learned, as pairs of bytes: [(b' ', b't'), ...]."""
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return [tuple(token_bytes(t) for t in m) for m in merges]


def agreement(ours, theirs):
    """(merges equal from the first one on, merges of ours the other learned at any place).

    >>> agreement([(b"a", b"b"), (b"c", b"d"), (b"e", b"f")], [(b"a", b"b"), (b"e", b"f")])
    (1, 2)
    """
    same = [a == b for a, b in zip(ours, theirs, strict=False)] + [False]
    return same.index(False), len(set(ours) & set(theirs))


def train_both(stories, vocab_size):
    """Train our BPE and the Hugging Face one on the same stories: (ours, theirs, seconds each)."""
    start = time.perf_counter()
    ours = BytePairEncoder([EOT]).train(EOT.join(stories), vocab_size)
    middle = time.perf_counter()
    theirs = train_tokenizer(stories, vocab_size)  # HF does not split EOT out of training text
    return ours, theirs, (middle - start, time.perf_counter() - middle)


# ---------------------------------------------------------------------------------------------
# The check

TOY_TEXT = (
    "The cat sat on the mat. The dog sat on the log. The cat and the dog are friends. "
    "Then the cat saw the dog and the dog saw the cat, and they sat together in the sun."
)
DOG_NAMES = ["My", "Your", "Her", "His", "Our", "Big", "Old", "Sad", "Wet", "Fat", "Shy", "Red"]
DOG_TEXT = " ".join(f"{w} dog{end}" for w, end in zip(DOG_NAMES, ".!?" * 4, strict=True))
COMPARE_STORIES = 1000
SAMPLE_TRAIN_STORIES = 5000  # the train split of step 03's `--source sample` (seed 0)
SENTENCE = "Once upon a time, a tiny dragon found a shiny rock."
TRICKY = ("café crème brûlée", "日本語のテキスト", "emoji 😀🐉👩‍👩‍👧", "tabs\tand\nnewlines  ",
          "Ω≈ç√∫")


def bytes_per_token(texts, ids):
    """UTF-8 bytes of `texts` over the tokens in `ids` (one list per text); 1.0 = no compression."""
    return sum(len(t.encode("utf-8")) for t in texts) / sum(len(i) for i in ids)


def show_scratch_bpe():
    """Train the from-scratch BPE on tiny texts and print what it learned."""
    bpe = BytePairEncoder().train("aaabdaaabac", vocab_size=259)
    print(f"{'text':<18} 'aaabdaaabac' (11 bytes)")
    for i, ((a, b), new_id) in enumerate(bpe.merges.items(), start=1):
        print(f"{f'merge {i}':<18} ({a}, {b}) -> {new_id}  {bpe.vocab[new_id]!r}")
    ids = bpe.encode("aaabdaaabac")
    print(f"{'encoded':<18} {ids} ({len(ids)} tokens)")

    for name, pattern in [("no pre-tokenizer", None), ("GPT-2 pre-tokens", GPT2_SPLIT_PATTERN)]:
        bpe = BytePairEncoder(pattern=pattern).train(DOG_TEXT, vocab_size=256 + 8)
        print(f"{name:<18} {[bpe.decode([i]) for i in bpe.encode('A dog. A dog! A dog?')]}")

    bpe = BytePairEncoder([EOT]).train(TOY_TEXT, vocab_size=256 + 40 + 1)
    first = [bpe.vocab[i].decode("utf-8") for i in range(256, 266)]
    print(f"{'toy text':<18} {len(TOY_TEXT.encode('utf-8'))} bytes, {len(bpe.merges)} merges")
    print(f"{'first merges':<18} {first}")
    print(f"{'bytes per token':<18} {bytes_per_token([TOY_TEXT], [bpe.encode(TOY_TEXT)]):.2f}")
    print(f"{'EOT':<18} {EOT!r} -> {bpe.encode(EOT)}")
    ok = all(bpe.decode(bpe.encode(t)) == t for t in TRICKY)
    print(f"{'round trip':<18} {'OK' if ok else 'FAILED'} on {len(TRICKY)} unseen UTF-8 strings")


def print_agreement(ours, theirs, stories, vocab_size):
    """Print how our merges compare with Hugging Face's, then with our BPE on HF's tie rule."""
    mine, hf = scratch_merges(ours), hf_merges(theirs)
    in_order, anywhere = agreement(mine, hf)
    hf_rule = HFTieBreakBPE([EOT]).train(EOT.join(stories), vocab_size)
    same_hf_rule, _ = agreement(scratch_merges(hf_rule), hf)
    print(f"{'same order':<18} the first {in_order:,}")
    print(f"{'same merges':<18} {anywhere:,} of {len(mine):,}, in any order")
    print(f"{'with HF tie rule':<18} {same_hf_rule:,} of {len(mine):,} in the same order")


def show_comparison(stories, sentence, vocab_size=1000):
    """Train both implementations on `stories`, print how their merges and tokens compare."""
    ours, theirs, _ = train_both(stories, vocab_size)
    print(f"{'trained on':<18} {len(stories):,} sample stories, vocab {vocab_size:,} each")
    print(f"{'merges':<18} {len(ours.merges)} ours, {len(hf_merges(theirs))} Hugging Face")
    print_agreement(ours, theirs, stories, vocab_size)
    print(f"{'sentence':<18} {sentence!r}")
    print(f"{'ours':<18} {[ours.decode([i]) for i in ours.encode(sentence)]}")
    hf_tokens = [token_bytes(t).decode("utf-8", "replace") for t in theirs.encode(sentence).tokens]
    print(f"{'Hugging Face':<18} {hf_tokens}")


def show_production_tokenizer(sentence):
    """Load the prepared tokenizer (or train one on sample stories) and print what it does."""
    path = DATA_DIR / "tokenizer.json"
    if path.is_file():
        tokenizer, where = load_tokenizer(path), str(path)
    else:  # before step 03: train the tokenizer `--source sample` would, in about a second
        tokenizer = train_tokenizer(generate_stories(SAMPLE_TRAIN_STORIES, seed=0))
        where = f"none at {path}, trained one on {SAMPLE_TRAIN_STORIES:,} sample stories"
    encoding = tokenizer.encode(sentence)
    print(f"{'tokenizer':<18} {where}")
    print(f"{'vocab size':<18} {tokenizer.get_vocab_size():,}")
    print(f"{'sentence':<18} {sentence!r} ({len(sentence.encode('utf-8'))} bytes)")
    print(f"{'tokens':<18} {encoding.tokens} ({len(encoding.ids)} tokens)")
    print(f"{'EOT':<18} {EOT!r} -> {tokenizer.encode(EOT).ids}")
    texts = [sentence, *TRICKY]
    ok = all(tokenizer.decode(tokenizer.encode(t).ids) == t for t in texts)
    print(f"{'round trip':<18} {'OK' if ok else 'FAILED'} on {len(texts)} UTF-8 strings")
    stories = list(generate_stories(200, seed=1))  # seed 1: not among the training stories
    ids = [e.ids for e in tokenizer.encode_batch(stories)]
    print(f"{'bytes per token':<18} {bytes_per_token(stories, ids):.2f} on 200 sample stories")


def first_stories(path, n_stories):
    """The first `n_stories` of a text file with stories separated by EOT, reading no further."""
    text = ""
    with open(path, encoding="utf-8") as f:  # a corpus file can be gigabytes
        while text.count(EOT) < n_stories and (chunk := f.read(2**20)):
            text += chunk
    if text.count(EOT) < n_stories:
        raise ValueError(f"{path} holds {text.count(EOT)} stories ending in {EOT}, fewer than "
                         f"--stories {n_stories}: ask for fewer")
    return text.split(EOT)[:n_stories]


def compare_on_file(path, n_stories, vocab_size):
    """Time our BPE against Hugging Face's on the first `n_stories` stories of a text file."""
    stories = first_stories(path, n_stories)
    ours, theirs, (t_ours, t_theirs) = train_both(stories, vocab_size)
    print(f"{'text':<18} {len(EOT.join(stories).encode('utf-8')):,} bytes, {n_stories:,} stories")
    print(f"{'ours':<18} {len(ours.merges):,} merges in {t_ours:.2f} s")
    print(f"{'Hugging Face':<18} {len(hf_merges(theirs)):,} merges in {t_theirs:.2f} s")
    print_agreement(ours, theirs, stories, vocab_size)


def main():
    parser = argparse.ArgumentParser(description="Step 02: BPE from scratch, then the real one.")
    parser.add_argument("--text", default=SENTENCE, help="a sentence to show as tokens")
    parser.add_argument("--compare", action="store_true", help="instead: our merges against "
                        f"Hugging Face's on {COMPARE_STORIES:,} sample stories")
    parser.add_argument("--corpus", help="instead: time our BPE against HF's on this text file "
                        f"(stories separated by {EOT})")
    parser.add_argument("--stories", type=int, default=364, help="with --corpus: stories to use")
    parser.add_argument("--vocab-size", type=int, default=757, help="with --corpus (757: 500 "
                        "merges + 256 bytes + EOT)")
    args = parser.parse_args()
    if args.corpus:
        try:
            return compare_on_file(args.corpus, args.stories, args.vocab_size)
        except (OSError, ValueError) as err:
            parser.error(str(err))
    if args.compare:
        print("One algorithm, two implementations (ours and Hugging Face's)")
        return show_comparison(list(generate_stories(COMPARE_STORIES, seed=0)), args.text)
    print("BPE from scratch")
    show_scratch_bpe()
    print()
    print("Production tokenizer (Hugging Face tokenizers)")
    show_production_tokenizer(args.text)


if __name__ == "__main__":
    main()
