"""Step 02: from text to token ids and back.

A GPT reads and writes integers, not characters. A tokenizer turns text into a list of ids from
a fixed vocabulary and back. We build one from scratch first (byte-level byte pair encoding, in a
few dozen lines of plain Python), then the production one with Hugging Face `tokenizers`, which
runs the same algorithm in Rust fast enough for a whole corpus.

Run the check:  uv run python -m tiny_llm.tokenize
"""

import argparse
import hashlib
import itertools
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tiny_llm.files import atomic_path
from tiny_llm.paths import DATA_DIR
from tiny_llm.sample_stories import generate_stories

EOT = "<|endoftext|>"  # marks the end of one story; always id 0
VOCAB_SIZE = 4096
MAX_VOCAB_SIZE = 2**16  # step 03 stores ids as uint16, which holds 0..65,535


# ---------------------------------------------------------------------------------------------
# Byte pair encoding from scratch


def get_stats(ids):
    """Count how often each adjacent pair of ids occurs.

    >>> get_stats([1, 2, 3, 1, 2])
    {(1, 2): 2, (2, 3): 1, (3, 1): 1}
    """
    counts = {}
    for pair in itertools.pairwise(ids):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def merge(ids, pair, new_id):
    """Replace every occurrence of `pair` in `ids`, left to right, by `new_id`.

    >>> merge([1, 2, 3, 1, 2], (1, 2), 4)
    [4, 3, 4]
    """
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


class BytePairEncoder:
    """Byte-level BPE: ids 0..255 are the 256 byte values, each learned merge adds one id.

    Any text is a sequence of UTF-8 bytes, so any text can be encoded: there is no unknown token.
    """

    def __init__(self):
        self.merges = {}  # (id, id) -> new id, in the order they were learned
        self.vocab = {i: bytes([i]) for i in range(256)}  # id -> the bytes it stands for

    def train(self, text, vocab_size):
        """Learn `vocab_size - 256` merges from `text` (fewer if the text runs out of pairs)."""
        if not isinstance(text, str):
            raise TypeError(f"train() needs a str, got {type(text).__name__}")
        if not isinstance(vocab_size, int) or vocab_size < 256:
            raise ValueError(f"vocab_size must be an int >= 256 (the bytes), got {vocab_size!r}")
        self.merges = {}
        self.vocab = {i: bytes([i]) for i in range(256)}
        ids = list(text.encode("utf-8"))
        for new_id in range(256, vocab_size):
            stats = get_stats(ids)
            if not stats:
                break  # the whole text is one token: nothing left to merge
            pair = max(stats, key=stats.get)  # the most frequent pair; ties go to the first seen
            ids = merge(ids, pair, new_id)
            self.merges[pair] = new_id
            self.vocab[new_id] = self.vocab[pair[0]] + self.vocab[pair[1]]
        return self

    def encode(self, text):
        """str -> list of ids, applying the learned merges in the order they were learned."""
        ids = list(text.encode("utf-8"))
        while len(ids) >= 2:
            stats = get_stats(ids)
            # the earliest-learned merge present goes first, exactly as during training
            pair = min(stats, key=lambda p: self.merges.get(p, float("inf")))
            if pair not in self.merges:
                break
            ids = merge(ids, pair, self.merges[pair])
        return ids

    def decode(self, ids):
        """list of ids -> str. A cut through a multi-byte character shows up as '\ufffd'."""
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")


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
# The check

TOY_TEXT = (
    "The cat sat on the mat. The dog sat on the log. The cat and the dog are friends. "
    "Then the cat saw the dog and the dog saw the cat, and they sat together in the sun."
)
SAMPLE_TRAIN_STORIES = 5000  # the train split of step 03's `--source sample` (seed 0)
SENTENCE = "Once upon a time, a tiny dragon found a shiny rock."
TRICKY = ("café crème brûlée", "日本語のテキスト", "emoji 😀🐉👩‍👩‍👧", "tabs\tand\nnewlines  ",
          "Ω≈ç√∫")


def bytes_per_token(texts, ids):
    """UTF-8 bytes of `texts` over the tokens in `ids` (one list per text); 1.0 = no compression."""
    return sum(len(t.encode("utf-8")) for t in texts) / sum(len(i) for i in ids)


def show_scratch_bpe():
    """Train the from-scratch BPE on two tiny texts and print what it learned."""
    bpe = BytePairEncoder().train("aaabdaaabac", vocab_size=259)
    print(f"{'text':<18} 'aaabdaaabac' (11 bytes)")
    for i, ((a, b), new_id) in enumerate(bpe.merges.items(), start=1):
        print(f"{f'merge {i}':<18} ({a}, {b}) -> {new_id}  {bpe.vocab[new_id]!r}")
    ids = bpe.encode("aaabdaaabac")
    print(f"{'encoded':<18} {ids} ({len(ids)} tokens)")

    bpe = BytePairEncoder().train(TOY_TEXT, vocab_size=256 + 40)
    first = [bpe.vocab[i].decode("utf-8") for i in range(256, 266)]
    print(f"{'toy text':<18} {len(TOY_TEXT.encode('utf-8'))} bytes, {len(bpe.merges)} merges")
    print(f"{'first merges':<18} {first}")
    print(f"{'bytes per token':<18} {bytes_per_token([TOY_TEXT], [bpe.encode(TOY_TEXT)]):.2f}")
    ok = all(bpe.decode(bpe.encode(t)) == t for t in TRICKY)
    print(f"{'round trip':<18} {'OK' if ok else 'FAILED'} on {len(TRICKY)} unseen UTF-8 strings")


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


def main():
    parser = argparse.ArgumentParser(description="Step 02: BPE from scratch, then the real one.")
    parser.add_argument("--text", default=SENTENCE, help="a sentence to show as tokens")
    args = parser.parse_args()
    print("BPE from scratch")
    show_scratch_bpe()
    print()
    print("Production tokenizer (Hugging Face tokenizers)")
    show_production_tokenizer(args.text)


if __name__ == "__main__":
    main()
