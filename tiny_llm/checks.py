"""The input checks of step 04, shared by every model that reads token ids.

A wrong input to an embedding fails deep inside PyTorch (on a GPU as an unreadable "device-side
assert"). These three say what was wrong, the value seen and the fix. `check_batch` and
`check_length` read only a tensor's dtype and shape, which is free, so every forward calls them;
`check_ids` looks at every id, which makes a GPU stop and report back, so it runs once where ids
enter the program (a prompt, a data file) and when a lookup has already failed.
"""

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
