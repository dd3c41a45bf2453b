"""Shared helper: a model's mean loss over token windows, the one evaluator of steps 10, 11, 14.

`mean_loss` averages the cross-entropy over every target of any (x, y) batches: step 10 hands
it a few random batches while training. `evaluate_loss` cuts a whole token file into windows
of seq_len and scores every target once: step 11 scores a checkpoint with it, step 14 scores a
position scheme at lengths it never trained on.
"""

import numpy as np
import torch

from tiny_llm.device import autocast


@torch.no_grad()
def mean_loss(model, batches, device="cpu", dtype="float32"):
    """Mean cross-entropy, nats per target, over `batches` of (x, y) (B, T) int64 ids;
    returns (loss, number of targets). The model scores in eval mode and goes back after."""
    was_training = model.training
    model.eval()
    total, n_targets = 0.0, 0
    for x, y in batches:
        with autocast(torch.device(device), dtype):
            _, loss = model(x.to(device), y.to(device))  # the mean over B·T targets
        total += loss.item() * y.numel()  # in Python's float64: exact over a long file
        n_targets += y.numel()
    model.train(was_training)
    return total / n_targets, n_targets


def window_spans(n_tokens, seq_len):
    """Cut a file of n_tokens into (start, length) windows whose targets cover it exactly once.

    Token 0 is never a target (nothing comes before it); tokens 1..n-1 each are, once:
    window_spans(10, 4) -> [(0, 4), (4, 4), (8, 1)]   (x = data[s:s+len], y = data[s+1:s+len+1])
    """
    if n_tokens < 2:
        raise ValueError(f"need at least 2 tokens to score one prediction, got {n_tokens}")
    n_targets = n_tokens - 1
    return [(start, min(seq_len, n_targets - start)) for start in range(0, n_targets, seq_len)]


def evaluate_loss(model, data, batch_size=16, max_batches=None, device="cpu", seq_len=None,
                  dtype="float32"):
    """Mean cross-entropy, nats per token, of `model` on a 1-D token array.

    Windows of seq_len tokens (default: the model's max_seq_len), none overlapping, batch_size
    at a time (the last, shorter window alone); max_batches stops early.
    Returns {"loss", "targets", "windows"}.
    """
    seq_len = seq_len or model.config.max_seq_len
    spans = window_spans(len(data), seq_len)
    full = [s for s, n in spans if n == seq_len]
    batches = [full[i : i + batch_size] for i in range(0, len(full), batch_size)]
    batches += [[s] for s, n in spans if n < seq_len]  # the tail window
    batches = batches[:max_batches]

    def rows(starts):  # (B, T + 1) ids -> x, y (B, T) each, y one token ahead
        length = min(seq_len, len(data) - 1 - starts[0])
        ids = np.stack([data[s : s + length + 1] for s in starts]).astype(np.int64)
        return torch.from_numpy(ids[:, :-1]), torch.from_numpy(ids[:, 1:])

    loss, n_targets = mean_loss(model, map(rows, batches), device, dtype)
    return {"loss": loss, "targets": n_targets, "windows": sum(map(len, batches))}
