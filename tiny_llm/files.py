"""Shared helper: write a file so that a reader never sees it half-written.

Every command in the course that writes something a later step reads (the tokenizer, the token
files, checkpoints, plots) writes to a temporary name beside the target and renames it when the
write is complete. A rename within one folder is atomic, so an interrupted run leaves either the
old file or no file, never a truncated one.

A run killed outright (kill -9, a power cut) cannot delete its temporary file: the next write of
the same target removes it, once the process named in its name is gone. The helpers at the end
turn the two failures a learner meets on a real disk, no permission and no space, into messages.
"""

import errno
import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path


def temporary_name(path, pid=None):
    """Where a write of `path` goes first: data/train.bin -> data/.train.bin.tmp-1234 (hidden)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid() if pid is None else pid}")


def process_alive(pid):
    """True unless process `pid` is known to be gone (on Windows, where os.kill would end the
    process instead of asking about it, every process counts as alive). No process has a PID
    of 0 or less: such a number is a garbled record, and its process is gone."""
    if pid <= 0:
        return False
    if os.name == "nt":
        return True
    try:
        os.kill(pid, 0)  # signal 0: nothing is sent, only whether the process exists is checked
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, run by another user
        return True
    return True


def remove_stale_temporaries(path):
    """Delete what killed runs left beside `path` (.NAME.tmp-PID files or folders whose process is
    gone); return their paths. A live run's temporary file is never touched."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.tmp-(\d+)")
    removed = []
    for tmp in path.parent.glob(f".{glob_escape(path.name)}.tmp-*"):
        match = pattern.fullmatch(tmp.name)
        if match and not process_alive(int(match.group(1))):
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)  # another process may have removed it first
            removed.append(tmp)
    return removed


def glob_escape(name):  # a file name matched literally by Path.glob: "[" would start a class
    return re.sub(r"([*?\[])", r"[\1]", name)


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds.

    >>> with atomic_path("data/train.bin") as tmp:   # tmp = data/.train.bin.tmp-1234
    ...     write_everything_to(tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)  # a killed run's file can be as large as the corpus
    tmp = temporary_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def check_writable(folder, what="this folder"):
    """Make `folder` if needed and prove a file can be created in it, before any long work.

    Raises PermissionError naming the folder and what to do; `what` says what it is for."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file, not a folder: {what} must be a folder "
                                 "(it is made if missing)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # created and removed at once
            pass
    except OSError as err:
        raise PermissionError(f"cannot write in {folder} ({err.strerror or err}): {what} must be "
                              "a folder you can write; change its permissions (chmod u+w) or "
                              "pick another") from None
    return folder


def is_disk_full(err):
    """True if an error means the disk is full: ENOSPC (or EDQUOT, a quota), the same said in
    words (tokenizers' "os error 28"), NumPy's short write ("155202 requested and 57554
    written") or torch.save's (a RuntimeError from its zip writer), which carry no errno."""
    codes = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
    text = str(err)
    return (getattr(err, "errno", None) in codes or "No space left on device" in text
            or bool(re.search(r"\d+ requested and \d+ written", text))
            or any(s in text for s in ("inline_container", "PytorchStreamWriter",
                                       "file write failed")))


@contextmanager
def explain_full_disk(folder, needed):
    """Turn a full disk met inside the block into an OSError that says so: where, about how much
    the work needs (`needed` bytes) and how much was free when it began, not a raw write error."""
    free = shutil.disk_usage(folder).free  # at the start: by the failure, the block has used it
    try:
        yield
    except Exception as err:  # tokenizers and NumPy report a full disk without an OSError's errno
        if not is_disk_full(err):
            raise
        raise OSError(f"the disk holding {folder} is full: this needs about "
                      f"{human_bytes(needed)} there, and {human_bytes(free)} was free. Make room, "
                      "or use a folder on another disk; what was there before is unchanged"
                      ) from None


def human_bytes(n):
    """1536 -> '1.5 KB', 2_300_000_000 -> '2.3 GB' (powers of 1,000, as disks are sold)."""
    for unit in ("bytes", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000


def save_figure(fig, path, dpi=80):
    """Save a matplotlib figure as a PNG, atomically and with the same bytes on every run.

    PNG files normally carry a "Software" stamp with matplotlib's version; leaving it out means
    a re-run that draws the same picture writes the same file. The figure is closed afterwards.
    """
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    return Path(path)


def take_lock(lock, in_use):
    """Create `lock` with this PID in it, taking over a stale one (its process has ended).
    Else raise in_use(who): the exception, with its message, that the folder's owner chooses
    (a training run's folder, a data folder being prepared)."""
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            pid = lock_holder(lock)
            if pid is None or process_alive(pid):
                raise in_use(f"process {pid}" if pid else "a process that is starting") from None
            lock.unlink(missing_ok=True)  # stale: its process died without removing it
            print(f"note: {lock} was left by process {pid}, which has ended (it was killed): "
                  "taken over", file=sys.stderr)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        return
    raise in_use("other processes that keep taking it; try again")


def lock_holder(lock, grace_s=10.0):
    """The PID written in `lock`. None while a new lock may still be getting its PID (an empty
    file younger than grace_s); 0, which no process has, for an older empty or garbled one."""
    try:
        text = lock.read_text().strip()
        if text:
            return int(text)
        starting = time.time() - lock.stat().st_mtime < grace_s
    except (OSError, ValueError):  # gone meanwhile, or not a number
        return 0
    return None if starting else 0


def check_replaceable(out, marker, writer, kind):
    """Raise unless the folder `out` is absent, empty, or holds only what `writer` (a command:
    "export") wrote there earlier: its `marker` file lists the names. A typo in --out deletes no
    one's files, not even beside files that look like a `kind` ("a model folder")."""
    out = Path(out)
    if out.is_symlink():  # replacing it would swap the link for a folder, after the work
        raise FileExistsError(f"{out} is a symbolic link (to {os.readlink(out)}): {writer} "
                              "writes a real folder and replaces only one it wrote; pick a new "
                              "--out")
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not (out.is_dir() and (out / marker).is_file()):
        raise FileExistsError(f"{out} exists and is not {kind}: pick a new --out. Only a folder "
                              f"that {writer} wrote (it holds {marker}) is replaced")
    ours = set((out / marker).read_text().splitlines()) | {marker}
    if other := sorted(p.name for p in out.iterdir() if p.name not in ours):
        raise FileExistsError(f"{out} holds files that {writer} did not write ({', '.join(other)}):"
                              " move them out of it, or pick a new --out")


@contextmanager
def atomic_folder(out, marker, writer, kind):
    """Yield a temporary folder beside `out`, renamed to `out` only if the block succeeds, with
    `marker` listing what it holds. Only a folder that check_replaceable() allows is replaced."""
    out = Path(out)
    check_replaceable(out, marker, writer, kind)
    remove_stale_temporaries(out)  # folders that killed runs left
    tmp = temporary_name(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        (tmp / marker).write_text("".join(f"{p.name}\n" for p in sorted(tmp.iterdir())))
        shutil.rmtree(out, ignore_errors=True)  # the old folder; a reader never sees half of one
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

def file_sha256(path):
    """The sha256 hex digest of a file, read in 1 MiB pieces: a fingerprint that tells a file
    from one put in its place (a run that starts from a checkpoint remembers it)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()


def refuse_nul(stories, path, row=None):
    """The stories, refusing one with a NUL byte: no text holds one, and a model would learn to
    write them."""
    for i, story in enumerate(stories, start=1):
        if "\x00" in story:
            where = f"row {row}" if row else f"story {i:,}"
            raise ValueError(
                f"{path}, {where}, holds NUL bytes (\\x00), which no text holds: the file is "
                f"binary, damaged or in UTF-16. If the rest is text, remove them with `tr -d "
                f"'\\000' < {path.name} > {path.stem}-clean{path.suffix}` and pass the new file")
        yield story


def check_text_file(path):
    """Refuse, by its first bytes, a text file that is compressed or in UTF-16, naming the
    command that makes it UTF-8 text."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] == b"\x1f\x8b":
        raise ValueError(f"{path} is compressed with gzip (it starts with the bytes 1f 8b), not "
                         f"text: unpack it first, `gunzip -c {path.name} > {path.stem}-text"
                         f"{path.suffix}`, and pass the unpacked file")
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise ValueError(f"{path} is UTF-16 text (it starts with a UTF-16 byte-order mark): "
                         f"convert it to UTF-8 first, `iconv -f utf-16 -t utf-8 {path.name} > "
                         f"{path.stem}-utf8{path.suffix}`, and pass the new file")


def split_at(lines, marker):
    """The pieces of a text read line by line, cut at every `marker`, on a line of its own or
    inside one (a story file of one line: 'A.<|endoftext|>B.' -> 'A.', 'B.'); blank pieces are
    left out."""
    piece = []
    for line in lines:
        *ended, rest = line.split(marker)
        for part in ended:
            text = "\n".join([*piece, part] if part else piece)
            if text.strip():
                yield text
            piece = []
        if rest or not ended:  # a marker's line adds no blank line of its own
            piece.append(rest)
    if "\n".join(piece).strip():
        yield "\n".join(piece)
