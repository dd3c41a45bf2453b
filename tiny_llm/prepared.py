"""Shared helper: whether a prepared data folder can be trusted, and how to rebuild it.

A prepared folder (step 03) holds four files; meta.json, written last, is the one thing trusted:
it records the source, the vocabulary size, the tokenizer's sha256 and the token counts, and
`load_meta` checks the other files against it before any step uses them.
"""

import json
import shlex
from pathlib import Path

from tiny_llm.paths import DATA_DIR, check_data_dir
from tiny_llm.tokenize import load_tokenizer, tokenizer_sha256

FILES = ("tokenizer.json", "train.bin", "valid.bin", "meta.json")
MAKE_IT = "prepare the data with `uv run python -m tiny_llm.data`"


def missing_files(data_dir=DATA_DIR):  # the prepared files that are not there
    return [name for name in FILES if not (Path(data_dir) / name).is_file()]


def read_meta(data_dir=DATA_DIR):
    """The dict in data_dir/meta.json as it stands: source, vocab size, tokenizer sha256, counts
    per split. load_meta() also checks the files beside it."""
    path = Path(check_data_dir(data_dir)) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"no {path}: {MAKE_IT}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}): it was cut short or edited; prepare "
                         f"the data again with {rebuild_command(data_dir)}") from None


def load_meta(data_dir=DATA_DIR):
    """read_meta(), once the files beside meta.json are checked to be the ones it describes:
    a folder missing some of them, or holding another tokenizer, is refused with the fix."""
    missing = missing_files(check_data_dir(data_dir))
    if len(missing) == len(FILES):
        raise FileNotFoundError(f"no prepared data in {data_dir}: {MAKE_IT}")
    meta = read_meta(data_dir) if "meta.json" not in missing else None
    if missing:
        present = [name for name in FILES if name not in missing]
        raise FileNotFoundError(
            f"{data_dir} holds {', '.join(present)} but not {', '.join(missing)}: a preparation "
            "was interrupted, or a file was moved or deleted. Nothing was changed there (the "
            f"files may come from your own corpus); prepare it again with "
            f"{rebuild_command(data_dir, meta)}")
    check_files(data_dir, meta)
    return meta


def check_files(data_dir, meta):
    """Raise unless the files are the ones meta.json describes: the token files of the sizes it
    records, and the tokenizer of the sha256 it records (ids mean something only under the
    tokenizer that wrote them)."""
    for split in ("train", "valid"):
        tokens, expected = Path(data_dir, f"{split}.bin").stat().st_size // 2, meta[split]["tokens"]
        if tokens != expected:
            raise ValueError(f"{data_dir}/{split}.bin holds {tokens:,} tokens, meta.json says "
                             f"{expected:,}: the file is truncated or stale; prepare the folder "
                             f"again with {rebuild_command(data_dir, meta)}")
    path = Path(data_dir) / "tokenizer.json"
    found = tokenizer_sha256(path)
    if found == meta["tokenizer_sha256"]:
        return
    try:
        vocab = f"{load_tokenizer(path).get_vocab_size():,} tokens"
    except Exception:  # not a tokenizer the course can use: the message still names its hash
        vocab = "not a readable tokenizer"
    raise ValueError(
        f"{path} is not the tokenizer the token files in {data_dir} were written with: its "
        f"sha256 is {found[:12]}... ({vocab}), meta.json records {meta['tokenizer_sha256'][:12]}"
        f"... ({meta['vocab_size']:,} tokens). Training or evaluating on the pair would give "
        "garbage. Put back the tokenizer.json that came with the files, or prepare the folder "
        f"again with {rebuild_command(data_dir, meta)}")


def rebuild_command(data_dir, meta=None):
    """The command that prepares data_dir again, from what its meta.json says when it is there."""
    meta = meta or {}
    words = ["uv run python -m tiny_llm.data --source", shlex.quote(meta.get("source", "SOURCE"))]
    if Path(data_dir).resolve() != DATA_DIR.resolve():
        words += ["--data-dir", shlex.quote(str(data_dir))]
    for split, n in (meta.get("first_stories") or {}).items():
        words += [f"--{split}-stories", str(n)]
    command = f"`{' '.join(words)}`"
    if "source" not in meta:
        command += " (SOURCE: sample, tinystories, or the corpus file the folder was made from)"
    return command
