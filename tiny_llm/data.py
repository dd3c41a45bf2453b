"""Step 03: from stories to a file of token ids, and from that file to training batches.

Preparing reads a corpus one story at a time, trains the tokenizer on the train split, encodes
in parallel batches and appends each story's ids and one EOT to train.bin or valid.bin (uint16).
Training memory-maps those files and cuts random windows: x a window, y the same shifted by one.

Run the check:  uv run python -m tiny_llm.data  [--source sample|tinystories|PATH [--valid PATH]]
"""

import argparse
import collections
import itertools
import json
import os
import socket
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from tiny_llm.files import (  # noqa: I001 (a corpus from outside)
    atomic_path,
    check_text_file,
    check_writable,
    explain_full_disk,
    lock_holder,
    refuse_nul,
    split_at,
    take_lock,
)
from tiny_llm.paths import DATA_DIR, check_data_dir
from tiny_llm.prepared import (  # noqa: F401 (FILES and load_meta: for the later steps' imports)
    FILES,
    MAKE_IT,
    load_meta,
    missing_files,
    read_meta,
    rebuild_command,
)
from tiny_llm.sample_stories import generate_stories
from tiny_llm.tokenize import EOT, VOCAB_SIZE, load_tokenizer, tokenizer_sha256, train_tokenizer

SAMPLE = {"train": (5000, 0), "valid": (500, 1)}  # (stories, seed): ~3 MB and ~0.3 MB of text
TOKENIZER_MAX_BYTES = 20_000_000  # the tokenizer learns from the first 20 MB of train text
VALID_TAIL_MAX = 1000  # a PATH without --valid gives its last 5% of stories, at most 1,000
BATCH_STORIES = 1024  # stories per encode_batch call
READERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
ALTERNATIVES = ("use `--source sample` (the offline corpus) or `--source PATH` (a .txt file with "
                f"stories separated by {EOT} lines, or .jsonl/.json/.parquet with a 'text' field)")
TEXT_BYTES = {"sample": 3_300_000, "tinystories": 1_920_000_000}  # to tell a full disk's need
CONTEXTS = {"cpu": 128, "tiny": 64}  # step 08's contexts: the default preset's, the shortest


def hub_reachable(timeout=3.0):
    """False if HF_HUB_OFFLINE is set or huggingface.co:443 does not answer within `timeout` s."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "false", ""):
        return False
    try:  # a connection that opens is enough: the download itself says what went wrong
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def tinystories_pairs():
    """roneneldan/TinyStories through `datasets`: downloaded once, then read from its disk cache."""
    import datasets  # slow to import, and only preparing needs it
    try:
        splits = datasets.load_dataset("roneneldan/TinyStories")
    except OSError as error:  # the Hub's connection and HTTP errors are OSErrors
        raise ConnectionError(f"downloading TinyStories failed ({error}): {ALTERNATIVES}") from None
    for split, name in (("train", "train"), ("valid", "validation")):
        for rows in splits[name].iter(batch_size=1000):  # a batch of rows at a time, not a column
            yield from ((split, text.strip()) for text in rows["text"] if text.strip())


def corpus_file(path):
    """Check a local corpus file; return (Path, the `datasets` loader that reads it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no corpus file at {path}: name another, or {ALTERNATIVES}")
    if path.suffix not in READERS:
        raise ValueError(f"cannot read {path}: the file name must end in {', '.join(READERS)}")
    return path, READERS[path.suffix]


def file_stories(path):
    """Stories of a .txt file (EOT between them, on lines of their own or not) or 'text' rows of
    .jsonl/.json/.parquet."""
    import datasets
    path, reader = corpus_file(path)
    if reader != "parquet":  # binary, and read by datasets
        check_text_file(path)
    rows = datasets.load_dataset(reader, data_files=str(path), split="train", streaming=True)
    try:
        if reader == "text":  # one row per line; a story is the text between two EOTs
            yield from refuse_nul(split_at((row["text"] for row in rows), EOT), path)
            return
        for i, row in enumerate(rows, start=1):
            if "text" not in row:
                raise ValueError(f"{path} has no 'text' field (its fields: {', '.join(row)})")
            if not isinstance(row["text"], str):
                raise ValueError(f"{path}, row {i}: 'text' is {row['text']!r}, not a story: give "
                                 "every row a string, or remove the row")
            yield from refuse_nul([row["text"]], path, i)
    except UnicodeDecodeError as err:  # a binary file, or text saved in another encoding
        raise ValueError(
            f"{path} is not UTF-8 text (byte {err.object[err.start]:#04x} is not UTF-8): text in "
            f"another encoding such as Latin-1 must be converted first, for example `iconv -f "
            f"latin1 -t utf-8 {path.name} > {path.stem}-utf8{path.suffix}`, then pass the new "
            "file; a binary file cannot be a corpus") from None


def split_tail(stories, path):
    """Label stories "train", except the last 5% (1 to VALID_TAIL_MAX), which are "valid"."""
    queue, n_stories = collections.deque(), 0  # the last stories wait here until the count is known
    for story in stories:
        n_stories += 1
        queue.append(story)
        if len(queue) > VALID_TAIL_MAX:
            yield "train", queue.popleft()
    if n_stories < 2:
        raise ValueError(f"{path} holds {n_stories} stories: train and valid need at least 2")
    n_valid = min(VALID_TAIL_MAX, max(1, n_stories // 20))
    for i, story in enumerate(queue):
        yield ("train" if i < len(queue) - n_valid else "valid"), story


def open_source(source, valid=None):
    """Return a function that yields (split, story) pairs, stories stripped, empty ones dropped."""
    if valid is not None and source in ("sample", "tinystories"):
        raise ValueError(f"valid={str(valid)!r} goes with a PATH source; {source} has its own")
    if source == "sample":
        return lambda: ((split, story) for split, (n_stories, seed) in SAMPLE.items()
                        for story in generate_stories(n_stories, seed))
    if source == "tinystories":
        if not hub_reachable():  # fail in seconds, not after datasets has retried for long
            raise ConnectionError(f"cannot reach the Hugging Face Hub: {ALTERNATIVES}")
        return tinystories_pairs
    for path in filter(None, (source, valid)):
        corpus_file(path)  # a missing file fails now, not after the tokenizer has trained
    stories = lambda path: (s.strip() for s in file_stories(path) if s.strip())  # noqa: E731
    if valid is None:
        return lambda: split_tail(stories(source), source)
    return lambda: itertools.chain((("train", s) for s in stories(source)),
                                   (("valid", s) for s in stories(valid)))


def train_prefix(pairs, max_bytes, seen, max_stories=None):
    """The train stories at the start of `pairs`, to max_bytes or max_stories; `seen` counts."""
    for split, story in pairs:
        if split != "train" or seen["bytes"] >= max_bytes or seen["stories"] == max_stories:
            return
        seen["stories"] += 1
        seen["bytes"] += len(story.encode("utf-8"))
        yield story


def encode_to_files(tokenizer, pairs, paths, progress=True, first=None):
    """Append each story's ids and one EOT to paths[split], a batch of stories in memory at a time;
    pairs are (split, story), a split's together; first[split] keeps its first N. Returns counts."""
    encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # no offsets
    counts = {split: collections.Counter() for split in paths}
    with ExitStack() as stack:
        files = {split: stack.enter_context(open(path, "wb")) for split, path in paths.items()}
        bar = stack.enter_context(tqdm(desc="encoding", unit=" stories", disable=not progress))
        for split, group in itertools.groupby(pairs, key=lambda pair: pair[0]):
            stories = itertools.islice((story for _, story in group), (first or {}).get(split))
            while batch := list(itertools.islice(stories, BATCH_STORIES)):
                encodings = encode_batch(batch)  # in Rust, on every core
                ids = itertools.chain.from_iterable((*e.ids, 0) for e in encodings)  # 0 is EOT
                ids = np.fromiter(ids, dtype=np.uint16)
                ids.tofile(files[split])
                counts[split].update(stories=len(batch), tokens=len(ids),
                                     bytes=sum(len(story.encode("utf-8")) for story in batch))
                bar.update(len(batch))
    return {split: dict(count) for split, count in counts.items()}


def prepare_data(source=None, valid=None, data_dir=DATA_DIR, vocab_size=VOCAB_SIZE, progress=True,
                 first=None):
    """Write data_dir/{tokenizer.json, train.bin, valid.bin, meta.json} from `source`; return meta.
    source: tinystories, sample, a file path, or None (TinyStories if the Hub answers, else sample);
    valid: validation stories for a path (default: its tail); first: {split: keep its first N}.
    meta.json is the one file trusted: the old one goes first, the new one comes last."""
    check_first(first)
    check_writable(check_data_dir(data_dir), "the data folder")  # before minutes of work
    with hold_data_folder(data_dir):  # two preparations at once would mix their files
        meta = prepare_in_folder(source, valid, data_dir, vocab_size, progress, first)
    warn_if_small(meta, data_dir)
    return meta


def prepare_in_folder(source, valid, data_dir, vocab_size, progress, first):
    """prepare_data(), once the data folder is ours."""
    if source is None:
        source = "tinystories" if hub_reachable() else "sample"
        if source == "sample":
            print("notice: Hub unreachable, so using the offline sample corpus", file=sys.stderr)
    pairs, first = open_source(source, valid), first or {}
    if progress:
        print(f"training a {vocab_size:,}-token BPE on the train stories", file=sys.stderr)
    with ExitStack() as stack:  # on leaving, files are renamed in reverse order: meta.json last
        tmp = {name: stack.enter_context(atomic_path(Path(data_dir, name))) for name in FILES[::-1]}
        stack.enter_context(explain_full_disk(data_dir, needed_bytes(source, valid, first)))
        seen = {"stories": 0, "bytes": 0}
        stories = train_prefix(pairs(), TOKENIZER_MAX_BYTES, seen, first.get("train"))
        tokenizer = train_tokenizer(stories, vocab_size)
        if seen["stories"] == 0:
            raise ValueError(f"found no train stories in {source}: is it empty?")
        tokenizer.save(str(tmp["tokenizer.json"]))
        bins = {split: tmp[f"{split}.bin"] for split in ("train", "valid")}
        counts = encode_to_files(tokenizer, pairs(), bins, progress, first)
        if not counts["valid"]:
            raise ValueError(f"found no validation stories in {valid or source}")
        meta = {"source": str(source), "vocab_size": tokenizer.get_vocab_size(), "eot_id": 0,
                "dtype": "uint16", "tokenizer_sha256": tokenizer_sha256(tmp["tokenizer.json"]),
                "tokenizer_trained_on": seen, **counts, "first_stories": first or None}
        tmp["meta.json"].write_text(json.dumps(meta, indent=2) + "\n")
        # The old meta.json goes before any file is replaced: until the new one arrives last,
        # a reader finds no meta.json and refuses the folder instead of mixing two sets.
        Path(data_dir, "meta.json").unlink(missing_ok=True)
    return meta


@contextmanager
def hold_data_folder(data_dir):
    """Hold data_dir/.prepare.lock (holding this PID) while preparing: a second preparation of
    the same folder at once is refused, instead of both renaming their files over each other's
    and reporting success. files.take_lock makes it atomically, the same lock a training run
    holds on its folder, and takes over the lock of a process that has ended."""
    lock = Path(data_dir) / ".prepare.lock"
    take_lock(lock, lambda who: FileExistsError(
        f"{data_dir} is being prepared by {who} already: wait for it to end, or pass another "
        f"--data-dir. If no such process runs, delete {lock}"))
    try:
        yield
    finally:
        if lock_holder(lock) == os.getpid():  # ours still: not deleted and taken by another
            lock.unlink(missing_ok=True)


def warn_if_small(meta, data_dir):
    """Warn when a split holds too few tokens for a training window, naming what to change."""
    fewest = min(("train", "valid"), key=lambda split: meta[split]["tokens"])
    tokens = meta[fewest]["tokens"]
    if tokens <= CONTEXTS["cpu"]:
        fix = (f"--preset tiny (a {CONTEXTS['tiny']}-token context) fits it" if tokens >
               CONTEXTS["tiny"] else "no preset fits it")
        print(f"warning: {Path(data_dir, fewest + '.bin')} holds only {tokens:,} tokens, and "
              f"training reads windows of context + 1 tokens ({CONTEXTS['cpu'] + 1} for the "
              f"default preset): {fix}; give it more stories (a larger corpus, --valid PATH, or "
              f"a larger --{fewest}-stories)", file=sys.stderr)


def check_first(first):
    """--train-stories/--valid-stories: each a whole number of stories, at least 1."""
    for split, n in (first or {}).items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"--{split}-stories keeps the first N {split} stories, so N must be "
                             f"at least 1, got {n!r}: leave the flag out to keep them all")


def needed_bytes(source, valid=None, first=None):
    """About what preparing `source` writes: 2-byte tokens of about 4 bytes of text each, so
    token files half the size of the text (tokenizer and meta.json are small beside them)."""
    text = TEXT_BYTES.get(str(source)) or sum(Path(p).stat().st_size
                                              for p in filter(None, (source, valid)))
    if first and len(first) == 2:  # both splits cut: TinyStories' stories average under 1 KB
        text = min(text, 1000 * sum(first.values()))
    return text // 2 + 1_000_000


def ensure_data(data_dir=DATA_DIR):
    """The meta of the prepared data in data_dir, checked. A folder holding none of the four
    files is prepared first (the default source); one holding only some of them is refused,
    never rewritten: they may come from your own corpus. Only `tiny_llm.data` prepares over them."""
    if len(missing_files(check_data_dir(data_dir))) == len(FILES):
        return prepare_data(None, data_dir=data_dir)
    return load_meta(data_dir)


def load_token_array(path):
    """A .bin token file as a read-only uint16 memory map, shape (N,): pages load when touched."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no token file at {path}: {MAKE_IT}")
    if (n_bytes := path.stat().st_size) % 2 or n_bytes == 0:
        raise ValueError(f"{path} has {n_bytes:,} bytes, not a whole number of uint16 tokens: it "
                         f"is truncated or empty; {MAKE_IT}")
    data = np.memmap(path, dtype=np.uint16, mode="r")
    if path.stem in ("train", "valid") and (path.parent / "meta.json").is_file():
        meta = read_meta(path.parent)
        if n_bytes // 2 != (expected := meta[path.stem]["tokens"]):
            raise ValueError(f"{path} holds {n_bytes // 2:,} tokens, meta.json says {expected:,}: "
                             f"the file is truncated or stale; {MAKE_IT}")
        if (top := int(data.max())) >= meta["vocab_size"]:  # one pass over the file
            raise ValueError(f"{path} holds token id {top:,}, beyond the "
                             f"{meta['vocab_size']:,} ids of its tokenizer: the file is corrupt; "
                             f"{MAKE_IT}")
    return data


def check_sizes(data, seq_len, batch_size=1):
    if not isinstance(data, np.ndarray) or data.ndim != 1:
        raise ValueError(f"data must be a 1-D numpy token array (load_token_array), got "
                         f"{type(data).__name__} of shape {getattr(data, 'shape', None)}")
    for name, value in (("seq_len", seq_len), ("batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if seq_len >= len(data):
        raise ValueError(f"seq_len={seq_len} needs at least {seq_len + 1} tokens, the data has "
                         f"{len(data):,}: prepare more stories (tiny_llm.data: a larger corpus, or "
                         f"a larger --valid-stories), or train a shorter context (--preset tiny)")


def get_batch(data, batch_size, seq_len, device=None, generator=None, part=slice(None)):
    """Random windows of a token array: x (B, T) int64 and y (B, T) int64, y = x shifted by one.

    A window starts at any of 0 .. N-T-1 (N - T choices), so that its last target exists."""
    if hasattr(data, "get_batch"):  # rows that draw their own, such as step 15's StoryRows
        return data.get_batch(batch_size, seq_len, device, generator, part)
    check_sizes(data, seq_len, batch_size)
    starts = torch.randint(len(data) - seq_len, (batch_size,), generator=generator)
    starts = starts[part]  # a rank's rows; drawing all B keeps the ranks in step
    rows = starts.numpy()[:, None] + np.arange(seq_len + 1)  # (B, T+1) positions to read
    window = torch.from_numpy(data[rows].astype(np.int64))  # reads B·(T+1) tokens from disk
    x, y = window[:, :-1].contiguous(), window[:, 1:].contiguous()
    if device is not None and torch.device(device).type == "cuda":  # page-locked memory: the
        x, y = x.pin_memory(), y.pin_memory()  # copy runs beside the GPU's work, without a wait
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return (x, y) if device is None else (x.to(device), y.to(device))


class NextTokenDataset(torch.utils.data.Dataset):
    """All N - T windows of a token array, for a DataLoader: item i is the pair
    x, y = data[i:i+T], data[i+1:i+T+1], two (T,) int64 tensors."""

    def __init__(self, data, seq_len):
        check_sizes(data, seq_len)
        self.data, self.seq_len = data, seq_len

    def __len__(self):
        return len(self.data) - self.seq_len

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(f"window {i} is out of range: there are {len(self):,}")
        window = torch.from_numpy(self.data[i : i + self.seq_len + 1].astype(np.int64))
        return window[:-1], window[1:]


def show(data_dir=DATA_DIR, seq_len=8):
    """Print what is prepared in data_dir, then one (x, y) pair from train.bin, token by token."""
    meta, tokenizer = load_meta(data_dir), load_tokenizer(Path(data_dir, "tokenizer.json"))
    train = load_token_array(Path(data_dir, "train.bin"))
    print(f"{'source':<10} {meta['source']}")
    print(f"{'tokenizer':<10} {meta['vocab_size']:,} tokens, sha256 {meta['tokenizer_sha256'][:8]}")
    for split, n in ((split, meta[split]) for split in ("train", "valid")):
        print(f"{split:<10} {n['stories']:>7,} stories {n['tokens']:>11,} tokens "
              f"{n['bytes']:>12,} bytes {n['bytes'] / n['tokens']:5.2f} bytes/token")
    print(f"{'train.bin':<10} {train.nbytes:,} bytes: {len(train):,} tokens x 2 bytes (uint16)")
    x, y = get_batch(train, 1, seq_len, generator=torch.Generator().manual_seed(0))
    print(f"\none (x, y) pair with T={seq_len}: y is x shifted left by one token")
    print(f"{'t':<3} {'x[t]':>6} {'y[t]':>6}  {'x[t] as text':<14} y[t] as text (the target)")
    text = lambda i: repr(tokenizer.decode([i], skip_special_tokens=False))  # noqa: E731
    for t in range(seq_len):
        i, j = x[0, t].item(), y[0, t].item()
        print(f"{t:<3} {i:>6} {j:>6}  {text(i):<14} {text(j)}")


def main():
    parser = argparse.ArgumentParser(description="Step 03: prepare token files, show a batch.")
    parser.add_argument("--source", help="tinystories, sample, or a .txt/.jsonl/.json/.parquet")
    parser.add_argument("--valid", help="a file of validation stories for a PATH source")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help=f"default: {DATA_DIR}")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help=f"default {VOCAB_SIZE}")
    for split in ("train", "valid"):
        parser.add_argument(f"--{split}-stories", type=int, help=f"first N {split} stories only")
    args = parser.parse_args()
    first = {s: n for s in ("train", "valid") if (n := getattr(args, f"{s}_stories")) is not None}
    try:
        nothing_yet = len(missing_files(check_data_dir(args.data_dir))) == len(FILES)
        if args.source is not None or first or nothing_yet:
            prepare_data(args.source, args.valid, args.data_dir, args.vocab_size, first=first)
        else:
            load_meta(args.data_dir)  # a folder with some of the files is refused, not rewritten
            print(f"prepared data found in {args.data_dir} (--source prepares it again)\n")
        show(args.data_dir)
    except (OSError, ValueError) as error:  # ConnectionError, FileNotFoundError: OSErrors too
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
