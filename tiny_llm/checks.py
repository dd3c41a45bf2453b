"""The input checks of the model's steps, given: a body the learner writes starts by calling
them (the skeleton keeps those lines), so what the learner types is the model, not its armour.

A wrong input to an embedding fails deep inside PyTorch (on a GPU as an unreadable "device-side
assert"). These checks say what was wrong, the value seen and the fix. `check_batch` and
`check_length` read only a tensor's dtype and shape, which is free, so every forward calls them;
`check_ids` looks at every id, which makes a GPU stop and report back, so it runs once where ids
enter the program (a prompt, a data file); a forward reads the ids only on a CPU (`check_vocab`).
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

    Called where ids enter (a prompt, a data file): min() and max() wait for the device, so
    they run once per input, not in every training step."""
    check_length(check_batch(idx), max_seq_len)
    check_range(idx, vocab_size)


def check_length(T, max_seq_len):
    """Raise a clear error if T positions do not fit a table of max_seq_len; free to call."""
    if T > max_seq_len:
        raise ValueError(f"sequence length T={T} exceeds max_seq_len={max_seq_len}: there is no "
                         f"position vector past {max_seq_len - 1}; keep the last {max_seq_len} "
                         f"tokens (idx[:, -{max_seq_len}:]) or build with a larger max_seq_len")


def check_vocab(idx, vocab_size):
    """Raise a clear error if an id of `idx` is outside [0, vocab_size), on a CPU only: there
    min() and max() cost no wait; on a GPU they would make it stop every step, and while
    torch.compile traces they would break its graph (step 13), so there it checks nothing."""
    if idx.device.type == "cpu" and not torch.compiler.is_compiling():
        check_range(idx, vocab_size)


def check_range(idx, vocab_size):
    """Raise a clear error if an id of `idx` is outside [0, vocab_size); reads every id."""
    if idx.numel() > 0:
        low, high = (int(v) for v in torch.aminmax(idx))
        if low < 0 or high >= vocab_size:
            raise ValueError(f"token id {low if low < 0 else high} is outside the vocabulary "
                             f"[0, {vocab_size}): use the tokenizer the model was built for "
                             "(same vocab_size)")


def check_sizes(**sizes):
    """Raise a clear error unless every size given by name is a positive int:
    check_sizes(d_model=64, max_seq_len=0) -> ValueError("max_seq_len must be a positive int,
    got 0")."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def check_activations(x, d_model, max_seq_len):
    """Raise a clear error unless `x` is a (B, T, d_model) float tensor with T <= max_seq_len;
    return (B, T, C). Only the dtype and the shape are read: free, so every forward affords it."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        seen = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"attention takes float vectors, got {seen}: "
                        "embed the token ids first (Embed in step 04)")
    if x.dim() != 3:
        raise ValueError(f"expected a (B, T, C) batch of vectors, got shape {tuple(x.shape)}: "
                         "for one sequence use x.unsqueeze(0)")
    B, T, C = x.shape
    if C != d_model:
        raise ValueError(f"expected C = d_model = {d_model} features per position, got C={C}: "
                         "build the attention with the same d_model as the embedding")
    if T > max_seq_len:
        raise ValueError(f"sequence length T={T} exceeds max_seq_len={max_seq_len}: the causal "
                         f"mask stops there; keep the last {max_seq_len} positions "
                         f"(x[:, -{max_seq_len}:]) or build with a larger max_seq_len")
    return B, T, C


def check_heads(d_model, n_heads, dropout):
    """Raise a clear error unless `n_heads` divides `d_model` and `dropout` is in [0, 1)."""
    if d_model % n_heads != 0:
        raise ValueError(
            f"d_model={d_model} is not divisible by n_heads={n_heads}: every head gets "
            f"d_model // n_heads dimensions, so pick n_heads from the divisors of {d_model}"
        )
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")


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
