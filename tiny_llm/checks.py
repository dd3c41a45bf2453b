"""The input checks of step 04, shared by every model that reads token ids, and of the steps
after it: given code, so the bodies a learner writes are the model, not its armour.

A wrong input to an embedding fails deep inside PyTorch (on a GPU as an unreadable "device-side
assert"). These three say what was wrong, the value seen and the fix. `check_batch` and
`check_length` read only a tensor's dtype and shape, which is free, so every forward calls them;
`check_ids` looks at every id, which makes a GPU stop and report back, so it runs once where ids
enter the program (a prompt, a data file) and when a lookup has already failed.
"""

import math

import torch


def check_batch(idx):
    """Raise a clear error unless `idx` is a (B, T) tensor of integer ids; return T.

    Only the dtype and the shape are read: free, so every forward can afford it."""
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"token ids must be a torch.Tensor, got {type(idx).__name__}: "
                        "use torch.tensor(ids) or the batches from get_batch")
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise TypeError(f"token ids must be integers, got dtype {idx.dtype}: pass the ids "
                        "themselves (int64), e.g. idx.long() if they are whole numbers")
    if idx.dim() != 2:
        raise ValueError(f"expected a (B, T) batch of token ids, got shape {tuple(idx.shape)}: "
                         "for one sequence use idx.unsqueeze(0)")
    return idx.shape[1]


def check_ids(idx, vocab_size, max_seq_len):
    """check_batch, the length, and every id in [0, vocab_size): for ids from outside.

    Called where ids enter (a prompt, a data file) and when a lookup fails: min() and max()
    wait for the device, so they run once per input, not in every training step."""
    check_length(check_batch(idx), max_seq_len)
    if idx.numel() > 0:
        low, high = idx.min().item(), idx.max().item()
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size}): "
                             "use the tokenizer the model was built for (same vocab_size)")


def check_length(T, max_seq_len):
    """Raise a clear error if T positions do not fit a table of max_seq_len; free to call."""
    if T > max_seq_len:
        raise ValueError(f"sequence length T={T} exceeds max_seq_len={max_seq_len}: there is no "
                         f"position vector past {max_seq_len - 1}; keep the last {max_seq_len} "
                         f"tokens (idx[:, -{max_seq_len}:]) or build with a larger max_seq_len")


# The checks of steps 07-09, called first in a body the learner writes (the skeleton keeps them).


def check_n_layers(n_layers):
    """Raise a clear error unless `n_layers`, a depth, is a positive int (step 07's init)."""
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive int, got {n_layers!r}")


def check_config_type(model, config):
    """Raise a clear error unless `config` is the configuration class `model` is built from
    (step 08's GPT: a GPTConfig); a dict of its fields is the usual slip."""
    wanted, name = model.config_class.__name__, type(model).__name__
    if not isinstance(config, model.config_class):
        raise TypeError(f"{name} expects a {wanted}, got {type(config).__name__}: use "
                        f"{name}({wanted}(...)) or one of its presets")


def check_prompt(idx, max_new_tokens, vocab_size, rows=1):
    """Raise a clear error unless `idx` is a prompt to write from (step 09): a (rows, T) tensor
    of ids in [0, vocab_size) with T >= 1 (rows=None: any B >= 1), and `max_new_tokens` an
    int >= 0. A prompt longer than the context is fine: the sampler crops it."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
            max_new_tokens < 0):
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or 0 in idx.shape or (
            rows is not None and idx.shape[0] != rows):
        shape = tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__
        which = "(B, T) tensor of token ids with B, T" if rows is None else \
            f"({rows}, T) tensor of token ids with T"
        raise ValueError(f"idx must be a {which} >= 1, got {shape}: for an empty prompt start "
                         "from [[eot_id]]")
    check_ids(idx, vocab_size, math.inf)  # every id once; the length is cropped, not refused
