"""Shared helper: write a file so that a reader never sees it half-written.

Every command in the course that writes something a later step reads (the tokenizer, the token
files, checkpoints, plots) writes to a temporary name beside the target and renames it when the
write is complete. A rename within one folder is atomic, so an interrupted run leaves either the
old file or no file, never a truncated one.
"""

import os
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds.

    >>> with atomic_path("data/train.bin") as tmp:   # tmp = data/.train.bin.tmp-1234
    ...     write_everything_to(tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


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
