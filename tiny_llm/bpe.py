"""Byte-level BPE from scratch: the algorithm of GPT-2's tokenizer in plain Python (step 02).

Step 02 builds it up: pair counts and merges on "aaabdaaabac", then what every production
byte-level BPE adds to that textbook loop: a pre-tokenizer whose pieces merges never cross,
special tokens that are never split, and a trainer that recounts only the pairs a merge changed.

Comparison with Hugging Face `tokenizers`: the optional section of steps/02-tokenize.md; its
speed record: docs/records/02-bpe-vs-hugging-face.md.
"""

import collections
import itertools

import regex  # like `re`, plus the Unicode classes \p{L} (letters) and \p{N} (numbers)

# GPT-2's pre-tokenizer pattern, as published in openai/gpt-2 src/encoder.py: English
# contractions, then an optional space followed by letters, by digits or by other symbols,
# then white space (a run of spaces keeps its last space for the word that follows).
GPT2_SPLIT_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)


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


def pretokenize(text, pattern=GPT2_SPLIT_PATTERN):
    """Split `text` into the pieces BPE may merge inside; `pattern=None` keeps it whole.

    >>> pretokenize("The dog's ball. 42 dogs!")
    ['The', ' dog', "'s", ' ball', '.', ' 42', ' dogs', '!']
    """
    if pattern is None:
        return [text] if text else []
    return regex.findall(pattern, text)


def split_special(text, special_tokens):
    """Cut `text` around the special tokens, which become pieces of their own.

    >>> split_special("The end.<|endoftext|>Once", ["<|endoftext|>"])
    ['The end.', '<|endoftext|>', 'Once']
    """
    if not special_tokens:
        return [text] if text else []
    # longest first, so that a special token containing another one wins
    alternatives = sorted(special_tokens, key=len, reverse=True)
    pattern = "(" + "|".join(regex.escape(s) for s in alternatives) + ")"
    return [part for part in regex.split(pattern, text) if part]


def count_words(text, special_tokens=(), pattern=GPT2_SPLIT_PATTERN):
    """Each distinct pre-token once, as UTF-8 bytes, with how often it occurs; specials skipped.

    >>> count_words("the cat<|endoftext|>the hat", ["<|endoftext|>"])
    {b'the': 2, b' cat': 1, b' hat': 1}
    """
    counts = collections.Counter()
    for part in split_special(text, special_tokens):
        if part not in special_tokens:
            counts.update(pretokenize(part, pattern))
    return {word.encode("utf-8"): n for word, n in counts.items()}


def most_frequent(counts, vocab):
    """The pair with the highest count; a tie goes to the greater pair of byte strings.

    >>> most_frequent({(97, 98): 2, (98, 99): 2, (99, 97): 1}, {97: b"a", 98: b"b", 99: b"c"})
    (98, 99)
    """
    top = max(counts.values())
    tied = (pair for pair, n in counts.items() if n == top)
    return max(tied, key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))


class BytePairEncoder:
    """Byte-level BPE: ids 0..255 are the bytes, each merge adds one id, special tokens come last.

    `pattern` is the pre-tokenizer (None: the text is one piece, the textbook BPE). Any text is
    a sequence of UTF-8 bytes, so any text can be encoded: there is no unknown token.

    >>> bpe = BytePairEncoder(["<|endoftext|>"]).train("aaabdaaabac", vocab_size=260)
    >>> bpe.encode("aaab<|endoftext|>"), bpe.decode([258, 259])
    ([258, 259], 'aaab<|endoftext|>')
    """

    def __init__(self, special_tokens=(), pattern=GPT2_SPLIT_PATTERN):
        if isinstance(special_tokens, str) or not all(
                isinstance(s, str) and s for s in special_tokens):
            raise TypeError(f"special_tokens must be a list of non-empty strings, got "
                            f"{special_tokens!r}: write e.g. BytePairEncoder(['<|endoftext|>'])")
        self.pattern = pattern
        self.special_names = list(dict.fromkeys(special_tokens))  # without repeats, in order
        self.reset()

    def reset(self):
        """Forget everything learned: 256 byte tokens, no merges, no special ids yet."""
        self.merges = {}  # (id, id) -> new id, in the order they were learned
        self.vocab = {i: bytes([i]) for i in range(256)}  # id -> the bytes it stands for
        self.special_tokens = {}  # "<|endoftext|>" -> id, set at the end of training
        self.cache = {}  # pre-token -> its ids, so a repeated word is encoded once

    def train(self, text, vocab_size):
        """Learn `vocab_size - 256 - len(special_tokens)` merges from `text` (fewer if the pieces
        run out of pairs), then give each special token the next id."""
        n_merges = self.check_vocab_size(text, vocab_size)
        self.reset()
        words = count_words(text, self.special_names, self.pattern)
        pieces, freqs = [list(w) for w in words], list(words.values())
        counts, where = collections.Counter(), collections.defaultdict(set)
        for i, piece in enumerate(pieces):
            add_pairs(counts, where, i, piece, freqs[i])
        for new_id in range(256, 256 + n_merges):
            if not counts:
                break  # every piece is one token: nothing left to merge
            pair = self.pick_pair(counts)
            self.merges[pair] = new_id
            self.vocab[new_id] = self.vocab[pair[0]] + self.vocab[pair[1]]
            for i in where.pop(pair):  # only the pieces holding the pair change
                add_pairs(counts, where, i, pieces[i], -freqs[i])
                pieces[i] = merge(pieces[i], pair, new_id)
                add_pairs(counts, where, i, pieces[i], freqs[i])
        for name in self.special_names:
            self.special_tokens[name] = len(self.vocab)
            self.vocab[len(self.vocab)] = name.encode("utf-8")
        return self

    def pick_pair(self, counts):
        """The pair to merge next: the most frequent, a tie to the greater pair of byte strings."""
        return most_frequent(counts, self.vocab)

    def check_vocab_size(self, text, vocab_size):
        """Raise unless `text` is a str and `vocab_size` leaves room for the bytes and specials."""
        if not isinstance(text, str):
            raise TypeError(f"train() needs a str, got {type(text).__name__}")
        least = 256 + len(self.special_names)
        if not isinstance(vocab_size, int) or vocab_size < least:
            raise ValueError(f"vocab_size must be an int >= {least} (256 bytes + "
                             f"{len(self.special_names)} special tokens), got {vocab_size!r}")
        return vocab_size - least

    def encode(self, text):
        """str -> list of ids: special tokens first, then each pre-token on its own."""
        ids = []
        for part in split_special(text, self.special_tokens):
            if part in self.special_tokens:
                ids.append(self.special_tokens[part])
            else:
                for word in pretokenize(part, self.pattern):
                    ids.extend(self.encode_word(word))
        return ids

    def encode_word(self, word):
        """One pre-token -> ids, applying the merges by rank: the earliest learned goes first."""
        if word not in self.cache:  # a corpus repeats its common words over and over
            ids = list(word.encode("utf-8"))
            while len(ids) >= 2:
                stats = get_stats(ids)
                pair = min(stats, key=lambda p: self.merges.get(p, float("inf")))
                if pair not in self.merges:
                    break
                ids = merge(ids, pair, self.merges[pair])
            self.cache[word] = ids
        return list(self.cache[word])

    def decode(self, ids):
        """list of ids -> str. A cut through a multi-byte character shows up as '\ufffd'."""
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")


def add_pairs(counts, where, i, piece, freq):
    """Add piece `i`'s pairs, `freq` times each (negative: remove them), to the pair counts and
    to the index `where` (pair -> the pieces that hold it).

    >>> counts, where = collections.Counter(), collections.defaultdict(set)
    >>> add_pairs(counts, where, 0, [97, 97, 97], 5)
    >>> dict(counts), dict(where)
    ({(97, 97): 10}, {(97, 97): {0}})
    """
    for pair, n in get_stats(piece).items():
        counts[pair] += n * freq
        if freq > 0:
            where[pair].add(i)
        else:
            if counts[pair] == 0:
                del counts[pair]
            if pair in where:  # the pair just merged is already out of the index
                where[pair].discard(i)


# ---------------------------------------------------------------------------------------------
# Reading Hugging Face's byte-level BPE in the same terms (step 02 compares the two)


def scratch_merges(bpe):
    """Our BytePairEncoder's merges in the order learned, as pairs of bytes."""
    return [(bpe.vocab[a], bpe.vocab[b]) for a, b in bpe.merges]


def bytes_to_unicode():
    """GPT-2's map from the 256 bytes to printable characters: {33: '!', ..., 32: 'Ġ', ...}.

    The 188 printable bytes keep their own character; the other 68 (controls, the space, a few
    Latin-1 ones) get chr(256), chr(257), ... in byte order, which makes the space 'Ġ'.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in chars]
    chars.update({b: chr(256 + i) for i, b in enumerate(others)})
    return chars


BYTE_OF_CHAR = {c: b for b, c in bytes_to_unicode().items()}


def token_bytes(token):
    """A Hugging Face byte-level token -> the bytes it stands for: 'Ġupon' -> b' upon'."""
    return bytes(BYTE_OF_CHAR[c] for c in token)


class HFTieBreakBPE(BytePairEncoder):
    """Our BPE with the Hugging Face trainer's tie rule: of equally frequent pairs, the one with
    the smaller ids there. Its ids number the bytes in the order of their bytes_to_unicode()
    characters (after EOT, id 0), then the merges in the order learned."""

    HF_BYTE_ID = {b: 1 + rank for rank, (b, _) in
                  enumerate(sorted(bytes_to_unicode().items(), key=lambda bc: bc[1]))}

    def pick_pair(self, counts):
        top = max(counts.values())
        tied = (pair for pair, n in counts.items() if n == top)
        return min(tied, key=lambda pair: (self.hf_id(pair[0]), self.hf_id(pair[1])))

    def hf_id(self, i):
        return self.HF_BYTE_ID[i] if i < 256 else i + 1  # HF's merges start at 257, ours at 256
