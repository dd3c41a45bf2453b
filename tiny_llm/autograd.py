"""Step 01, second half: the PyTorch the course needs, on a model small enough to print.

A table of next-token scores (Bigram), the cross-entropy loss the GPT uses, its gradient worked
out by hand and shown equal to autograd's and to finite differences, one step of gradient
descent written out, and the gradient a softmax passes back as its scores grow.

Run the check:  uv run python -m tiny_llm.autograd
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Bigram(nn.Module):
    """The smallest language model: row i of `table` holds the scores (logits) of the token
    that follows token i. (N,) int64 token ids -> (N, vocab_size) logits."""

    def __init__(self, vocab_size):
        super().__init__()  # nn.Module's own set-up first: it starts the list of parameters
        self.table = nn.Parameter(torch.zeros(vocab_size, vocab_size))  # all equal: no guess yet

    def forward(self, idx):
        return self.table[idx]  # (N,) ids -> (N, V): one row of scores per id


def softmax(logits):
    """Scores -> probabilities over the last dimension: every row positive and summing to 1.

    [[0, 0], [0, 2]] -> [[0.5, 0.5], [0.1192, 0.8808]]
    """
    z = logits - logits.max(dim=-1, keepdim=True).values  # the same answer, and exp cannot overflow
    e = z.exp()
    return e / e.sum(dim=-1, keepdim=True)  # (N, V) / (N, 1): broadcasting divides each row


def cross_entropy_by_hand(logits, targets):
    """The GPT's loss, as F.cross_entropy computes it: the mean over rows of -log(probability
    of the row's target). (N, V) float logits, (N,) int64 targets -> a 0-d tensor."""
    probs = softmax(logits)
    picked = probs[torch.arange(len(targets)), targets]  # (N,): row n's probability of its target
    return -picked.log().mean()


def grad_by_hand(logits, targets):
    """d loss / d logits for cross_entropy_by_hand, from the formula (softmax - one_hot) / N.
    (N, V) float logits, (N,) int64 targets -> (N, V)."""
    one_hot = torch.zeros_like(logits)
    one_hot[torch.arange(len(targets)), targets] = 1.0
    return (softmax(logits) - one_hot) / len(targets)  # the mean's 1/N reaches every row


def sgd_step(model, idx, targets, lr):
    """One step of gradient descent: forward, loss, backward, update, zero the gradients.
    Returns the loss before the update, a float."""
    loss = cross_entropy_by_hand(model(idx), targets)  # forward: autograd records each operation
    loss.backward()  # every parameter's .grad += d loss / d parameter
    with torch.no_grad():  # the update itself is not part of the computation to differentiate
        for p in model.parameters():
            p -= lr * p.grad  # a small step downhill: against the gradient
            p.grad = None  # zero the gradients (as optimizer.zero_grad() does): backward adds
    return loss.item()


# Given: the check of what three_gradients is handed, the referee, and the check's runs.


def check_logits(logits, targets):
    """Refuse what cross_entropy_by_hand cannot score, naming it and the fix: logits must be a
    (N, V) float tensor and targets (N,) integer ids in 0..V-1."""
    if not torch.is_tensor(logits) or logits.dim() != 2 or not logits.is_floating_point():
        got = f"shape {tuple(logits.shape)}, {logits.dtype}" if torch.is_tensor(logits) else (
            type(logits).__name__)
        raise ValueError(f"logits must be a (N, V) float tensor, one row of scores per position; "
                         f"got {got} (one row: logits.unsqueeze(0); whole numbers: .float())")
    if not torch.is_tensor(targets) or targets.shape != logits.shape[:1] or (
            targets.is_floating_point() or targets.dtype == torch.bool):
        got = f"shape {tuple(targets.shape)}, {targets.dtype}" if torch.is_tensor(targets) else (
            type(targets).__name__)
        raise ValueError(f"targets must be ({logits.shape[0]},) integer ids, one per row of "
                         f"logits; got {got}")
    if len(targets) and not 0 <= int(targets.min()) <= int(targets.max()) < logits.shape[1]:
        bad = int(targets.min()) if int(targets.min()) < 0 else int(targets.max())
        raise ValueError(f"target {bad} is not a token id of a vocabulary of "
                         f"{logits.shape[1]}: ids run from 0 to {logits.shape[1] - 1}")


def grad_by_nudging(f, x, eps=1e-6):
    """d f / d x by finite differences, the referee that needs no calculus: each entry of x
    nudged up and down by eps, (f(x + eps) - f(x - eps)) / (2 eps), in float64. Two calls of f
    per entry: fine for 5 numbers, hopeless for a million."""
    x = x.detach().double()
    grad = torch.zeros_like(x)
    for i in range(x.numel()):
        nudge = torch.zeros_like(x)
        nudge.view(-1)[i] = eps
        grad.view(-1)[i] = (f(x + nudge) - f(x - nudge)) / (2 * eps)
    return grad


def three_gradients(logits, targets):
    """The gradient of cross_entropy_by_hand at `logits` three ways: {"hand": grad_by_hand,
    "autograd": loss.backward()'s, "nudging": grad_by_nudging's}, with {"loss": its value}."""
    check_logits(logits, targets)
    leaf = logits.detach().float().requires_grad_()  # a leaf: backward fills its .grad
    loss = cross_entropy_by_hand(leaf, targets)
    loss.backward()
    return {"loss": loss.item(), "hand": grad_by_hand(logits.detach().float(), targets),
            "autograd": leaf.grad,
            "nudging": grad_by_nudging(lambda z: cross_entropy_by_hand(z, targets), logits)}


def fit_bigram(steps=5, lr=5.0, vocab_size=5):
    """Train a Bigram with sgd_step on the text 0 1 2 ... V-1 0 1 ... (each token's next is the
    one after it): the loss before each of `steps` updates, from ln V down."""
    model = Bigram(vocab_size)
    idx = torch.arange(vocab_size)
    targets = (idx + 1) % vocab_size
    return [sgd_step(model, idx, targets, lr) for _ in range(steps)]


def softmax_grad_size(scale, scores=(1.0, 0.5, -0.5, -1.0), values=(1.0, -1.0, 2.0, 0.0)):
    """How much gradient a softmax passes back when its scores are `scale` times `scores`: the
    size (norm) of d(softmax(s) @ values) / d s. Large scores make one probability near 1 and the
    rest near 0, and then no small change of a score moves the output: a saturated softmax."""
    s = (scale * torch.tensor(scores, dtype=torch.float64)).requires_grad_()
    (torch.softmax(s, dim=-1) @ torch.tensor(values, dtype=torch.float64)).backward()
    return s.grad.norm().item()


def main():
    """One cross-entropy's gradient three ways, a Bigram's loss over five sgd_steps, and the
    gradient a softmax passes back as its scores grow."""
    argparse.ArgumentParser(description="Step 01, second half: a gradient by hand, then by "
                            "autograd; one training step; a saturated softmax.").parse_args()
    logits, targets = torch.tensor([[2.0, 1.0, 0.1, -1.0, 0.5]]), torch.tensor([0])
    got = three_gradients(logits, targets)
    print(f"{'loss by hand':<16} {got['loss']:.4f}   "
          f"F.cross_entropy {F.cross_entropy(logits, targets).item():.4f}")
    for way in ("hand", "autograd", "nudging"):
        print(f"{'grad ' + way:<16} {'  '.join(f'{v:7.4f}' for v in got[way].flatten().tolist())}")
    for way in ("autograd", "nudging"):
        gap = (got["hand"].double() - got[way].double()).abs().max().item()
        said = "yes, within 1e-6" if gap <= 1e-6 else f"NO: they differ by up to {gap:.4f}"
        print(f"{'hand = ' + way:<16} {said}")
    losses = fit_bigram(steps=5, lr=5.0)
    print(f"{'bigram losses':<16} {'  '.join(f'{v:.4f}' for v in losses)}")
    sizes = ", ".join(f"scale {s}: {softmax_grad_size(s):.3g}" for s in (1, 10, 100))
    print(f"{'softmax grad':<16} {sizes}")


if __name__ == "__main__":
    main()
