import math
import re
import traceback
from contextlib import contextmanager

import pytest
import torch

from solutions import ex06_multihead
from tiny_llm.multihead import MultiHeadAttention


def make(d_model=32, n_heads=4, max_seq_len=16, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, n_heads, max_seq_len, dropout).eval()


@contextmanager
def view_errors():
    """Name the mistake behind PyTorch's 'view size is not compatible' inside the block."""
    try:
        yield
    except RuntimeError as err:
        if "view size is not compatible" not in str(err):
            raise
        line = traceback.extract_tb(err.__traceback__)[-1].line or ""
        if re.search(r"\.view\([^,()]+,[^,()]+,[^,()]+\)", line):  # to 3 dimensions: the merge
            said = ("the heads are merged by a view right after transpose(1, 2): transpose "
                    "changes only the indexing, so add .contiguous() before .view(B, T, C)")
        else:
            said = ("q, k, v are split into heads by a view to (B, n_heads, T, head_size) "
                    "alone: view them as (B, T, n_heads, head_size), then transpose(1, 2)")
        raise AssertionError(f"{said} (PyTorch: view size is not compatible, at `{line}`)"
                             ) from err


def both_paths(attn, x):
    with view_errors():
        attn.use_sdpa = False
        explicit = attn(x)
        attn.use_sdpa = True
        return attn(x), explicit


def by_hand(attn, x, split=True, scale=None, mask=True, after=False, merge=True, fill=None):
    """The layer's output computed here, right by default, or with one of the mistakes."""
    B, T, C = x.shape
    H, hs = attn.n_heads, attn.head_size
    q, k, v = attn.qkv(x).split(C, dim=2)
    if split:
        q, k, v = (t.view(B, T, H, hs).transpose(1, 2) for t in (q, k, v))
    else:  # a reshape alone: rows of different positions end up in one head's row
        q, k, v = (t.reshape(B, H, T, hs) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(scale or hs)
    future = ~torch.tril(torch.ones(T, T, dtype=torch.bool))
    if fill is not None:  # the future's scores set to this instead of -inf
        scores, mask = scores.masked_fill(future, fill), False
    weights = torch.softmax(scores.masked_fill(future, float("-inf")) if mask else scores, -1)
    if after:
        weights = weights.masked_fill(future, 0.0)
    y = weights @ v
    y = y.transpose(1, 2).contiguous().view(B, T, C) if merge else y.contiguous().view(B, T, C)
    return attn.proj(y)


def seen(attn, x, out, path=""):
    """Name the mistake that the output `out` of x shows: ": ..." or ""."""
    mistakes = [
        ({}, ""),
        ({"merge": False}, "the heads are merged without transposing back: (B, n_heads, T, "
                           "head_size) needs y.transpose(1, 2) before .contiguous().view(B, T, C)"),
        ({"split": False}, "q, k, v are split into heads by a view (or reshape) to (B, "
                           "n_heads, T, head_size) alone: view them as (B, T, n_heads, "
                           "head_size), then transpose(1, 2)"),
        ({"scale": attn.d_model}, "the scores are divided by sqrt(d_model): divide by "
                                  "sqrt(head_size), the length of each head's vectors"),
        ({"scale": 1}, "the scores are not divided by sqrt(head_size)"),
        ({"mask": False}, "the causal mask is missing"),
        ({"fill": 0.0}, "the future scores are set to 0, not -inf: exp(0) = 1 still gives the "
                        "future weight; masked_fill(..., float(\"-inf\"))"),
        ({"after": True, "mask": False}, "the mask is applied after the softmax: set the "
                                         "scores to -inf before it"),
    ]
    with torch.no_grad():
        for kind, said in mistakes:
            if torch.allclose(out, by_hand(attn, x, **kind), atol=1e-5):
                return f": {path}{said}" if said else ""
    return ""


def paths_seen(attn, x):
    """What each path's output shows, e.g. ': the explicit path: the causal mask is missing'."""
    sdpa, explicit = both_paths(attn, x)
    return dropout_seen(attn, x) + "".join(
        seen(attn, x, out, f"the {name} path: ")
        for name, out in (("fast (attend)", sdpa), ("explicit", explicit)))


def dropout_seen(attn, x):
    """': ... dropout acts in evaluation ...' when a path of an eval() layer gives two
    different outputs for one input, else ''."""
    if attn.training:
        return ""
    said = ""
    for use_sdpa, path in ((True, "fast (attend)"), (False, "explicit")):
        attn.use_sdpa = use_sdpa
        with torch.no_grad():
            moved = (attn(x) - attn(x)).abs().max().item()
        if moved > 0:
            said += (f": the {path} path: in eval() two calls on one input differ by "
                     f"{moved:.2g}: dropout acts in evaluation; pass attend a dropout_p of "
                     "self.dropout only when self.training (the nn.Dropout layers switch off "
                     "with .eval() by themselves)")
    attn.use_sdpa = True
    return said


def test_sdpa_path_equals_explicit_path():
    attn = make()
    x = torch.randn(3, 16, 32)
    sdpa, explicit = both_paths(attn, x)
    assert sdpa.shape == (3, 16, 32), f"(3, 16, 32) in gave {tuple(sdpa.shape)} out"
    torch.testing.assert_close(sdpa, explicit, atol=1e-6, rtol=0,
                               msg=lambda m: f"the two paths differ{paths_seen(attn, x)}\n{m}")


def test_paths_agree_for_shorter_sequences_and_in_eval_mode_with_dropout():
    attn = make(dropout=0.3)  # eval(): dropout is off on both paths
    x = torch.randn(2, 5, 32)
    sdpa, explicit = both_paths(attn, x)
    torch.testing.assert_close(sdpa, explicit, atol=1e-6, rtol=0,
                               msg=lambda m: f"the two paths differ{paths_seen(attn, x)}\n{m}")


@pytest.mark.parametrize("use_sdpa", [True, False])
def test_output_at_t_ignores_later_positions(use_sdpa):
    attn = make()
    attn.use_sdpa = use_sdpa
    x = torch.randn(2, 12, 32)
    changed = x.clone()
    changed[:, 7:] = torch.randn(2, 5, 32)
    with view_errors():
        before, after = attn(x), attn(changed)
    path = "fast (attend)" if use_sdpa else "explicit"
    why = seen(attn, x, before, f"the {path} path: ")
    assert torch.allclose(before[:, :7], after[:, :7], atol=1e-6, rtol=0), (
        f"changing positions 7.. changed the outputs at 0..6{why or ': the mask?'}")
    assert not torch.allclose(before[:, 7:], after[:, 7:]), f"positions 7.. did not change{why}"


def test_the_heads_are_split_and_merged_at_their_positions():
    """Each head is step 05's attention on its slice of q, k and v, and the heads' outputs sit
    side by side at their own positions before proj: the explicit path, then the fast one."""
    attn = make()
    x = torch.randn(2, 6, 32)
    for use_sdpa in (False, True):
        attn.use_sdpa = use_sdpa
        with view_errors():
            out = attn(x)
        path = "fast (attend)" if use_sdpa else "explicit"
        why = (f"the {path} path is not the heads' attention side by side"
               f"{seen(attn, x, out, f'the {path} path: ')}")
        torch.testing.assert_close(out, by_hand(attn, x), atol=1e-5, rtol=0,
                                   msg=lambda m, why=why: f"{why}\n{m}")


def test_heads_split_the_model_dimension_and_parameters_follow_the_formula():
    attn = make(d_model=48, n_heads=6)
    assert attn.head_size == 8, f"d_model=48, n_heads=6: head_size is {attn.head_size}, not 8"
    shapes = {n: tuple(p.shape) for n, p in attn.named_parameters()}
    assert attn.qkv.weight.shape == (3 * 48, 48) and attn.proj.weight.shape == (48, 48), (
        f"weights {shapes}: qkv.weight must be (144, 48) (nn.Linear(48, 3 * 48)), proj.weight "
        "(48, 48)")
    counted = sum(p.numel() for p in attn.parameters())
    assert counted == 4 * 48**2 + 4 * 48, (
        f"{counted:,} parameters, not 4·48² + 4·48 = 9,408; yours: {shapes}")


def test_the_causal_mask_is_a_buffer_not_saved_with_the_weights():
    attn = make()
    assert attn.mask.dtype == torch.bool and attn.mask.shape == (16, 16), (
        f"mask is {tuple(attn.mask.shape)} {attn.mask.dtype}, not (16, 16) torch.bool")
    assert torch.equal(attn.mask, torch.tril(torch.ones(16, 16, dtype=torch.bool))), (
        "mask is not the lower triangle: mask[i, j] must be True where j <= i (torch.tril)")
    saved = set(attn.state_dict())
    assert saved == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}, (
        f"the state_dict holds {sorted(saved)}: register the mask with persistent=False")


def test_dropout_is_random_in_training_and_off_in_eval():
    attn = make(dropout=0.5).train()
    x = torch.randn(2, 8, 32)
    with view_errors():
        attn(x)
    assert not torch.equal(attn(x), attn(x)), (
        "in train() with dropout=0.5 two calls on one input give the same output: no dropout "
        "acts; pass attend self.dropout while self.training, and apply resid_dropout after proj")
    attn.eval()
    with torch.no_grad():
        moved = (attn(x) - attn(x)).abs().max().item()
    assert moved == 0, (
        f"in eval() two calls on one input differ by {moved:.2g}, not 0{dropout_seen(attn, x)}")


def test_gradients_reach_every_parameter():
    attn = make()
    with view_errors():
        attn(torch.randn(2, 8, 32)).sum().backward()
    missing = [n for n, p in attn.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert not missing, f"no gradient reaches {missing}: is each one used in forward?"


def test_bad_construction_is_refused():
    with pytest.raises(ValueError, match="d_model=30 is not divisible by n_heads=4"):
        MultiHeadAttention(30, 4, 16)
    with pytest.raises(ValueError, match="n_heads must be a positive int, got 0"):
        MultiHeadAttention(32, 0, 16)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.5"):
        MultiHeadAttention(32, 4, 16, dropout=1.5)


def test_bad_input_is_refused_with_the_fix():
    attn = make()
    with pytest.raises(ValueError, match=r"got shape \(16, 32\).*unsqueeze\(0\)"):
        attn(torch.randn(16, 32))
    with pytest.raises(ValueError, match="T=17 exceeds max_seq_len=16"):
        attn(torch.randn(1, 17, 32))
    with pytest.raises(ValueError, match="C = d_model = 32 .* got C=31"):
        attn(torch.randn(1, 4, 31))
    with pytest.raises(TypeError, match="float vectors, got torch.int64"):
        attn(torch.zeros(1, 4, 32, dtype=torch.long))


def test_solutions():
    formula, counted = ex06_multihead.exercise_1_parameters(64)
    assert formula == 16_640 and set(counted.values()) == {16_640}, (
        f"exercise 1: formula {formula:,}, counted {counted}; want 16,640 for every n_heads")
    error = ex06_multihead.exercise_2_one_head_is_step_05()
    assert error < 1e-6, f"exercise 2: one head differs from step 05 by {error:.1e}, not < 1e-6"
    agree = ex06_multihead.exercise_3_head_size_one()
    assert agree == 1.0, f"exercise 3: the keys' ranking agrees in a share {agree}, not 1.0"
    memory = ex06_multihead.exercise_4_score_memory()
    assert memory["MiB per layer"] == 32.0 and memory["T doubled"] == 4 * 32.0, (
        f"exercise 4: got {memory}, want 32.0 MiB per layer and 128.0 when T doubles")
