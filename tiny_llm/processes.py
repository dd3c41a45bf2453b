"""Shared helper: a lock on the run folder, so that two runs never write one folder at once;
and (step 16) the hooks the training loop calls where several processes would differ.
"""

import os
from contextlib import contextmanager, nullcontext
from pathlib import Path

from tiny_llm.files import lock_holder, take_lock

LOCK_NAME = "train.lock"


class FolderInUse(FileExistsError):
    """Another live process holds the run folder's lock."""


@contextmanager
def hold_run_folder(folder):
    """Hold `folder`/train.lock, which holds this process's PID, for the length of the block.

    Two runs writing one folder would overwrite each other's checkpoints, each believing its
    own was saved. The lock is created with O_EXCL, which the operating system makes atomic:
    of two processes creating it at once, exactly one succeeds. A lock whose process is dead
    (a run killed by kill -9 or a power cut) is stale and taken over. Creating it is also the
    first write into the folder, so a folder that cannot be written is found here, before the
    first step, not at the first save. The lock goes when the block ends, Ctrl-C included.
    """
    lock = Path(folder) / LOCK_NAME
    created = not lock.parent.exists()
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        take_lock(lock, lambda who: FolderInUse(
            f"{lock.parent} is in use by {who}, another training run (its lock: {lock}): wait "
            f"for it to end, stop it, or pass another --out. If no such process is training, "
            f"delete {lock}"))
    except FolderInUse:
        raise
    except OSError as err:  # read-only, not a folder, no permission, disk full
        raise PermissionError(
            f"cannot write to the run folder {lock.parent} ({err.strerror or err}): a run saves "
            "its checkpoints there; pass an --out you can write to") from None
    try:
        yield lock
    finally:
        if lock_holder(lock) == os.getpid():  # ours still: not deleted and taken by another
            lock.unlink(missing_ok=True)
        if created and not any(lock.parent.iterdir()):  # a run that failed to start leaves
            lock.parent.rmdir()  # no empty folder behind


# --- step 16: what the training loop needs to know about other processes ------------------

class OneProcess:
    """Where step 16 (tiny_llm.scale) plugs in training on several processes, called ranks.
    On one process every hook does nothing; step 16's DataParallel fills them in."""

    rank, world_size = 0, 1

    def wrap(self, model):  # -> the module to train: DistributedDataParallel or FSDP2's shards
        return model

    def no_sync(self, model, sync):  # a context: skip the gradient all-reduce unless sync
        return nullcontext()

    def mean(self, value):  # a float averaged over the ranks
        return value

    def state_dicts(self, model, optimizer):  # full state dicts, gathered for a checkpoint
        return model.state_dict(), optimizer.state_dict()

    def unwrap(self, model):  # -> the GPT itself, for its config and for evaluation
        return model

    def load_optimizer(self, model, optimizer, state):
        optimizer.load_state_dict(state)


ONE_PROCESS = OneProcess()
