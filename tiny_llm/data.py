"""Step 03: from stories to a file of token ids, and from that file to training batches.

Preparing reads a corpus one story at a time, trains the tokenizer on the train split, encodes
the stories in parallel batches, and appends their ids (each story followed by one EOT) to
train.bin and valid.bin as uint16. Training then opens those files as memory maps and cuts
random windows out of them: x is a window, y is the same window shifted by one token.

Run the check:  uv run python -m tiny_llm.data            (prepares data the first time)
Prepare again:  uv run python -m tiny_llm.data --source sample | tinystories | PATH [--valid PATH]
"""

import argparse
import collections
import itertools
import json
import os
import socket
import sys
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import torch
from tqdm import tqdm

from tiny_llm.files import atomic_path
from tiny_llm.paths import DATA_DIR
from tiny_llm.sample_stories import generate_stories
from tiny_llm.tokenize import EOT, VOCAB_SIZE, load_tokenizer, tokenizer_sha256, train_tokenizer

FILES = ("tokenizer.json", "train.bin", "valid.bin", "meta.json")
SAMPLE_STORIES = {"train": 5000, "valid": 500}  # about 3 MB and 0.3 MB of text
SAMPLE_SEEDS = {"train": 0, "valid": 1}  # different seeds: no story appears in both splits
TOKENIZER_MAX_BYTES = 20_000_000  # the tokenizer learns from at most this much train text
VALID_TAIL_MAX = 1000  # a PATH without --valid: its last 5% of stories, at most this many
BATCH_STORIES = 1024  # stories per encode_batch call
OFFLINE_HINT = ("use `--source sample` (the offline corpus) or `--source PATH` (a local .txt with "
                f"stories separated by {EOT} lines, or .jsonl/.json/.parquet with a 'text' field)")


# ---------------------------------------------------------------------------------------------
# Sources: each yields (split, story) pairs, train first, one story at a time


def hub_reachable(timeout=3.0):
    """True if a connection to the Hugging Face Hub opens within `timeout` seconds."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def tinystories_stories():
    """roneneldan/TinyStories through `datasets` (downloaded once, then read from its cache)."""
    import datasets  # imported here: it is slow to import and only preparing needs it

    if not hub_reachable():
        raise ConnectionError(f"cannot reach the Hugging Face Hub to download TinyStories: {OFFLINE_HINT}")
    try:
        splits = datasets.load_dataset("roneneldan/TinyStories")
    except OSError as error:  # ConnectionError and the Hub's HTTP errors are OSErrors
        raise ConnectionError(f"downloading TinyStories failed ({error}): {OFFLINE_HINT}") from error
    for split, name in (("train", "train"), ("valid", "validation")):
        for rows in splits[name].iter(batch_size=1000):  # row batches: the table stays on disk
            yield from ((split, text) for text in rows["text"])


READERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def corpus_file(path):
    """Check a local corpus file; return (Path, name of the `datasets` loader that reads it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no corpus file at {path}: give an existing file, or {OFFLINE_HINT}")
    if path.suffix not in READERS:
        raise ValueError(f"cannot read {path} (suffix {path.suffix!r}): use a .txt, .jsonl, .json "
                         "or .parquet file")
    return path, READERS[path.suffix]


def file_stories(path):
    """Stories of a local file: .txt with EOT lines between stories, or .jsonl/.json/.parquet rows."""
    import datasets

    path, reader = corpus_file(path)
    rows = datasets.load_dataset(reader, data_files=str(path), split="train", streaming=True)
    if reader != "text":
        for row in rows:
            if "text" not in row:
                raise ValueError(f"{path} has no 'text' field (its fields: {', '.join(row)})")
            yield row["text"]
        return
    lines = []  # the lines of one story, up to the next EOT line
    for row in rows:  # the "text" loader gives one row per line
        if row["text"].strip() == EOT:
            yield "\n".join(lines)
            lines = []
        else:
            lines.append(row["text"])
    yield "\n".join(lines)  # text after the last EOT line (usually none)


def split_tail(stories, path):
    """Label stories "train", except the last 5% (1 to VALID_TAIL_MAX of them) labelled "valid".

    Only the last VALID_TAIL_MAX stories wait in memory; when the count is known at the end, the
    head of that queue goes to train and its tail to valid.
    """
    queue, n = collections.deque(), 0
    for n, story in enumerate(stories, start=1):
        queue.append(story)
        if len(queue) > VALID_TAIL_MAX:
            yield "train", queue.popleft()
    if n < 2:
        raise ValueError(f"{path} holds {n} stories: a train and a valid split need at least 2")
    n_valid = min(VALID_TAIL_MAX, max(1, n // 20))
    for i, story in enumerate(queue):
        yield ("train" if i < len(queue) - n_valid else "valid"), story


def sample_pairs():
    for split, n in SAMPLE_STORIES.items():
        yield from ((split, story) for story in generate_stories(n, seed=SAMPLE_SEEDS[split]))


def open_source(source, valid=None):
    """A function that yields (split, story) pairs, train first, empty stories left out."""
    if source in ("sample", "tinystories"):
        if valid is not None:
            raise ValueError(f"valid={str(valid)!r} goes with a PATH source: {source!r} has its own "
                             "validation split")
        pairs = sample_pairs if source == "sample" else tinystories_stories
    else:
        corpus_file(source)  # a missing file fails now, not after the tokenizer has trained
        if valid is None:
            pairs = lambda: split_tail(nonempty(file_stories(source)), source)  # noqa: E731
        else:
            corpus_file(valid)
            pairs = lambda: itertools.chain(  # noqa: E731
                (("train", s) for s in nonempty(file_stories(source))),
                (("valid", s) for s in nonempty(file_stories(valid))))
    return lambda: ((split, story.strip()) for split, story in pairs() if story.strip())


def nonempty(stories):
    return (story for story in stories if story.strip())


# ---------------------------------------------------------------------------------------------
# Preparing: train the tokenizer, encode, write, all under temporary names


def train_prefix(pairs, max_bytes, seen):
    """The train stories at the start of `pairs` until `max_bytes` of text; `seen` counts them."""
    for split, story in pairs:
        if split != "train" or seen["bytes"] >= max_bytes:
            return
        seen["stories"] += 1
        seen["bytes"] += len(story.encode("utf-8"))
        yield story


def batched_by_split(pairs, size):
    """[("train", "a"), ("train", "b"), ("valid", "c")], 2 -> ("train", ["a", "b"]), ("valid", ["c"])."""
    for split, group in itertools.groupby(pairs, key=lambda pair: pair[0]):
        stories = (story for _, story in group)
        while batch := list(itertools.islice(stories, size)):
            yield split, batch


def encode_to_files(tokenizer, pairs, paths, progress=True):
    """Encode (split, story) pairs batch by batch; append ids + one EOT per story to paths[split].

    Returns {split: {"stories", "tokens", "bytes"}}. Only one batch is ever held in memory.
    """
    eot_id = tokenizer.token_to_id(EOT)
    # encode_batch_fast (tokenizers >= 0.21) skips the character offsets we do not need
    encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    counts = {split: {"stories": 0, "tokens": 0, "bytes": 0} for split in paths}
    with ExitStack() as stack:
        files = {split: stack.enter_context(open(path, "wb")) for split, path in paths.items()}
        bar = stack.enter_context(tqdm(desc="encoding", unit=" stories", disable=not progress))
        for split, batch in batched_by_split(pairs, BATCH_STORIES):
            encodings = encode_batch(batch)  # runs in Rust, on every core
            ids = itertools.chain.from_iterable((*e.ids, eot_id) for e in encodings)
            ids = np.fromiter(ids, dtype=np.uint16)
            ids.tofile(files[split])
            count = counts[split]
            count["stories"] += len(batch)
            count["tokens"] += len(ids)
            count["bytes"] += sum(len(story.encode("utf-8")) for story in batch)
            bar.update(len(batch))
    return counts


def prepare_data(source=None, valid=None, data_dir=DATA_DIR, vocab_size=VOCAB_SIZE, progress=True):
    """Write data_dir/{tokenizer.json, train.bin, valid.bin, meta.json} from `source`; return meta.

    source: "tinystories", "sample", a file path, or None for TinyStories when the Hub can be
    reached and the sample otherwise. valid: a file of validation stories for a path source.
    """
    if source is None:
        source = "tinystories" if hub_reachable() else "sample"
        if source == "sample":
            print("notice: the Hugging Face Hub is unreachable, preparing the offline sample "
                  "corpus instead (--source sample)", file=sys.stderr)
    pairs = open_source(source, valid)
    data_dir = Path(data_dir)
    with ExitStack() as stack:  # on leaving, files are renamed in reverse order: meta.json last
        tmp = {name: stack.enter_context(atomic_path(data_dir / name)) for name in reversed(FILES)}
        seen = {"stories": 0, "bytes": 0}
        tokenizer = train_tokenizer(train_prefix(pairs(), TOKENIZER_MAX_BYTES, seen), vocab_size)
        if seen["stories"] == 0:
            raise ValueError(f"no stories found in {source}: check the file's format")
        if tokenizer.get_vocab_size() > 2**16 or tokenizer.token_to_id(EOT) != 0:
            raise ValueError(f"the tokenizer ({tokenizer.get_vocab_size():,} tokens) must fit "
                             f"uint16 and have {EOT} as id 0")
        tokenizer.save(str(tmp["tokenizer.json"]))
        bins = {"train": tmp["train.bin"], "valid": tmp["valid.bin"]}
        counts = encode_to_files(tokenizer, pairs(), bins, progress)
        if counts["valid"]["stories"] == 0:
            raise ValueError(f"no validation stories found in {valid or source}")
        meta = {"source": str(source), "valid_source": valid_source(source, valid, counts),
                "vocab_size": tokenizer.get_vocab_size(), "eot_id": 0,
                "tokenizer_sha256": tokenizer_sha256(tmp["tokenizer.json"]), "dtype": "uint16",
                "tokenizer_trained_on": seen, **counts}
        tmp["meta.json"].write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def valid_source(source, valid, counts):
    """Where the validation stories came from, in words, for meta.json."""
    if valid is not None:
        return str(valid)
    if source in ("sample", "tinystories"):
        return f"the {source} validation split"
    return f"the last {counts['valid']['stories']:,} stories of {source}"


# ---------------------------------------------------------------------------------------------
# Reading: the meta, the token files, batches


def missing_files(data_dir=DATA_DIR):
    return [name for name in FILES if not (Path(data_dir) / name).is_file()]


def load_meta(data_dir=DATA_DIR):
    """The dict in data_dir/meta.json (what was prepared, from where, how many tokens)."""
    path = Path(data_dir) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"no {path}: prepare the data with `uv run python -m tiny_llm.data`")
    return json.loads(path.read_text())


def ensure_data(data_dir=DATA_DIR):
    """Return the meta of the prepared data, preparing it first if any file is missing."""
    if missing_files(data_dir):
        return prepare_data(None, data_dir=data_dir)
    return load_meta(data_dir)


def load_token_array(path):
    """Open a .bin token file as a read-only uint16 memory map of shape (N,): nothing is read yet."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no token file at {path}: prepare the data with "
                                "`uv run python -m tiny_llm.data`")
    size = path.stat().st_size
    if size % 2 or size == 0:
        raise ValueError(f"{path} has {size:,} bytes, not a whole number of uint16 tokens: it is "
                         "truncated or empty; prepare it again with `uv run python -m tiny_llm.data`")
    meta_path = path.parent / "meta.json"
    if meta_path.is_file() and path.stem in ("train", "valid"):
        expected = json.loads(meta_path.read_text())[path.stem]["tokens"]
        if size // 2 != expected:
            raise ValueError(f"{path} has {size // 2:,} tokens but meta.json says {expected:,}: it "
                             "is truncated or stale; prepare again with `uv run python -m tiny_llm.data`")
    return np.memmap(path, dtype=np.uint16, mode="r")


def check_sizes(n_tokens, seq_len, batch_size=1):
    for name, value in (("seq_len", seq_len), ("batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if seq_len >= n_tokens:
        raise ValueError(f"seq_len={seq_len} needs more than {seq_len} tokens, the data has "
                         f"{n_tokens:,}: use a shorter seq_len or more data")


def get_batch(data, batch_size, seq_len, device=None, generator=None):
    """`batch_size` random windows of the token array: x (B, T) int64 and y (B, T), y = x shifted by 1.

    Each window starts anywhere in 0..N-T-1 (N - T choices), so that its target, one further, fits.
    """
    if getattr(data, "ndim", None) != 1:
        raise ValueError(f"data must be a 1-D token array, got {type(data).__name__} "
                         f"of shape {getattr(data, 'shape', None)}")
    check_sizes(len(data), seq_len, batch_size)
    starts = torch.randint(len(data) - seq_len, (batch_size,), generator=generator)
    rows = starts.numpy()[:, None] + np.arange(seq_len + 1)  # (B, T+1) positions to read
    window = torch.from_numpy(data[rows].astype(np.int64))  # reads B·(T+1) tokens from the file
    x, y = window[:, :-1].contiguous(), window[:, 1:].contiguous()
    if device is not None and torch.device(device).type == "cuda":
        # pinned (page-locked) memory lets the copy to the GPU run while Python moves on
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return (x.to(device), y.to(device)) if device is not None else (x, y)


class NextTokenDataset(torch.utils.data.Dataset):
    """Every window of a token array, for a DataLoader: item i is (data[i:i+T], data[i+1:i+T+1]).

    len = N - T windows, overlapping, each as two (T,) int64 tensors.
    """

    def __init__(self, data, seq_len):
        check_sizes(len(data), seq_len)
        self.data, self.seq_len = data, seq_len

    def __len__(self):
        return len(self.data) - self.seq_len

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(f"window {i} out of range: there are {len(self):,}")
        window = torch.from_numpy(self.data[i : i + self.seq_len + 1].astype(np.int64))
        return window[:-1], window[1:]


# ---------------------------------------------------------------------------------------------
# The check


def show(data_dir=DATA_DIR, seq_len=8):
    """Print what is prepared in data_dir and one (x, y) pair from train.bin."""
    data_dir = Path(data_dir)
    meta = load_meta(data_dir)
    tokenizer = load_tokenizer(data_dir / "tokenizer.json")
    train = load_token_array(data_dir / "train.bin")
    print(f"{'source':<12} {meta['source']} (valid: {meta['valid_source']})")
    print(f"{'tokenizer':<12} {meta['vocab_size']:,} tokens, EOT id {meta['eot_id']}, "
          f"sha256 {meta['tokenizer_sha256'][:12]}")
    for split in ("train", "valid"):
        n = meta[split]
        print(f"{split:<12} {n['stories']:>7,} stories {n['tokens']:>11,} tokens "
              f"{n['bytes']:>12,} bytes {n['bytes'] / n['tokens']:5.2f} bytes/token")
    print(f"{'train.bin':<12} {train.nbytes:,} bytes = {len(train):,} tokens x 2 bytes (uint16)")
    print(f"{'windows':<12} T=256: N - T = {len(train) - 256:,} to sample from, "
          f"N // T = {len(train) // 256:,} without overlap")
    x, y = get_batch(train, batch_size=1, seq_len=seq_len, generator=torch.Generator().manual_seed(0))
    print(f"\none (x, y) pair, seq_len={seq_len}: y is x shifted one token to the left")
    print(f"{'x':<12} {x[0].tolist()}")
    print(f"{'y':<12} {y[0].tolist()}")
    print(f"{'t':<3} {'input x[t]':<16} target y[t] (the token that comes next)")
    for t in range(seq_len):
        token = lambda i: repr(tokenizer.decode([i], skip_special_tokens=False))  # noqa: E731
        print(f"{t:<3} {token(x[0, t].item()):<16} {token(y[0, t].item())}")


def main():
    parser = argparse.ArgumentParser(description="Step 03: prepare token files, show a batch.")
    parser.add_argument("--source", help="tinystories, sample, or a .txt/.jsonl/.json/.parquet "
                        "file (default: the data already prepared, else TinyStories or the sample)")
    parser.add_argument("--valid", help="a file of validation stories, for a PATH source")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help=f"default {DATA_DIR}")
    args = parser.parse_args()
    try:
        if args.source is not None or missing_files(args.data_dir):
            prepare_data(args.source, args.valid, data_dir=args.data_dir)
        else:
            print(f"using the data prepared in {args.data_dir} (--source S prepares it again)")
        show(args.data_dir)
    except (ConnectionError, FileNotFoundError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
