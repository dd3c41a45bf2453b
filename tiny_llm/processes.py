"""Shared helper: the hooks step 10's training loop calls where several processes would differ.

Step 10 trains in one process, so every hook here does nothing; step 16 (tiny_llm.scale)
subclasses `OneProcess` with PyTorch's DistributedDataParallel or FSDP2 filled in, and hands
that object to the same loop. The loop is written once; only these few places change.
"""

from contextlib import nullcontext


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
