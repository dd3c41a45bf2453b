import doctest
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from solutions import ex01_device
from tiny_llm.autograd import (
    Bigram,
    cross_entropy_by_hand,
    fit_bigram,
    grad_by_hand,
    sgd_step,
    softmax,
    softmax_grad_size,
    three_gradients,
)
from tiny_llm.device import matmul_gflops, pick_device, seed_everything

CHAPTER = Path(__file__).resolve().parents[1] / "steps" / "01-setup.md"


def test_pick_device_honours_a_name_and_the_environment(monkeypatch):
    got = pick_device("cpu")
    assert got == torch.device("cpu"), f"pick_device('cpu') gave {got!r}, want device('cpu')"
    monkeypatch.setenv("TINY_LLM_DEVICE", "cpu")
    assert pick_device() == torch.device("cpu"), (
        f"with TINY_LLM_DEVICE=cpu, pick_device() gave {pick_device()}: read the variable when "
        "no name is given")


def test_pick_device_rejects_unknown_and_unavailable_devices():
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        pick_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            pick_device("cuda")


def test_seed_everything_replays_the_same_numbers():
    seed_everything(3)
    a = torch.randn(4)
    seed_everything(3)
    b = torch.randn(4)
    assert torch.equal(a, b), f"seed 3 drew {a.tolist()}, then {b.tolist()}: seed torch too"


def test_seed_everything_rejects_a_bad_seed():
    with pytest.raises(ValueError, match="non-negative int, got -1"):
        seed_everything(-1)


def test_matmul_gflops_is_a_positive_finite_rate():
    # A loaded machine can be very slow, so only sanity bounds: no CPU does 10^7 GFLOP/s.
    rate = matmul_gflops(torch.device("cpu"), n=64, repeats=2)
    assert 0 < rate < 1e7, f"matmul_gflops gave {rate} GFLOP/s, want a rate above 0 and finite"


# The foundations: a Bigram, the softmax and the cross-entropy by hand, their gradient, one step.


def short(t):
    """A tensor's numbers rounded to 4 decimals, as lists: short enough to read in a message."""
    def rounded(v):
        return [rounded(x) for x in v] if isinstance(v, list) else round(v, 4)

    return rounded(t.detach().tolist())


def bigram(vocab_size):
    """Bigram(vocab_size), with PyTorch's error for a forgotten super().__init__() made the fix."""
    try:
        return Bigram(vocab_size)
    except AttributeError as err:
        pytest.fail(f"call super().__init__() first in Bigram.__init__: Bigram({vocab_size}) "
                    f"raised AttributeError: {err}")


def test_bigram_has_one_table_of_zeros():
    model = bigram(5)
    named = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert named == {"table": (5, 5)}, (
        ("wrap the table in nn.Parameter, or PyTorch does not see it: " if not named else "")
        + f"Bigram(5)'s parameters are {named}, want {{'table': (5, 5)}}")
    assert torch.count_nonzero(model.table) == 0, (
        f"Bigram(5).table starts at {short(model.table)}, want zeros: no token favoured yet")


def test_bigram_gives_each_id_its_row():
    model = bigram(4)
    with torch.no_grad():
        model.table.copy_(torch.arange(16.0).view(4, 4))
    out = model(torch.tensor([3, 0, 3]))
    assert out.shape == (3, 4), f"Bigram(4) on 3 ids gave shape {tuple(out.shape)}, want (3, 4)"
    want = torch.tensor([[12.0, 13, 14, 15], [0, 1, 2, 3], [12, 13, 14, 15]])
    assert torch.equal(out, want), (
        f"Bigram(4) on ids [3, 0, 3] gave {short(out)}, want rows 3, 0, 3 of the table: "
        f"{short(want)}")


def test_softmax_rows_are_probabilities():
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 4.0]])  # 2 rows of 3: not square
    try:
        probs = softmax(logits)
    except RuntimeError as err:
        if "must match the size" in str(err):
            pytest.fail(f"sum with keepdim=True, so the (2, 1) sums broadcast over each row: "
                        f"softmax of a (2, 3) tensor raised '{err}'")
        raise
    want = F.softmax(logits, dim=-1)
    if torch.allclose(probs.sum(dim=0), torch.ones(3)) and not torch.allclose(probs, want):
        pytest.fail(f"normalise over dim=-1, the scores of one row: softmax gave {short(probs)}, "
                    "each column summing to 1")
    assert torch.allclose(probs, want, atol=1e-6), (
        f"softmax of {short(logits)} gave {short(probs)}, want {short(want)} (rows sum to "
        f"{short(probs.sum(-1))}, want 1 each)")


def test_softmax_does_not_overflow():
    probs = softmax(torch.tensor([[1000.0, 0.0]]))
    assert torch.allclose(probs, torch.tensor([[1.0, 0.0]])), (
        f"subtract each row's max before exp: exp(1000) overflows to inf, and softmax of "
        f"[[1000, 0]] gave {short(probs)}, want [[1, 0]]")


def test_cross_entropy_by_hand_equals_pytorchs():
    logits = torch.tensor([[2.0, 1.0, 0.1, -1.0], [0.5, 0.5, 3.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    targets = torch.tensor([0, 3, 1])
    got, want = cross_entropy_by_hand(logits, targets).item(), F.cross_entropy(logits, targets)
    why = ""
    if math.isclose(got, 3 * want, rel_tol=1e-5):
        why = "take the mean, not the sum (it is 3 times the mean over 3 rows): "
    elif math.isclose(got, -want, rel_tol=1e-5):
        why = "the sign: the loss is minus the log of the probability; "
    assert math.isclose(got, want, rel_tol=1e-5), (
        f"{why}cross_entropy_by_hand gave {got:.5f}, F.cross_entropy {want:.5f}")


def autograds(logits, targets):
    """The gradient of F.cross_entropy at `logits`, by PyTorch's autograd: the reference."""
    leaf = logits.clone().requires_grad_()
    F.cross_entropy(leaf, targets).backward()
    return leaf.grad


def test_grad_by_hand_equals_autograds():
    logits = torch.tensor([[2.0, 1.0, 0.1, -1.0, 0.5], [0.0, 0.3, 0.0, 2.0, -2.0]])
    targets = torch.tensor([0, 4])
    got, want = grad_by_hand(logits, targets), autograds(logits, targets)
    why = ""
    if torch.allclose(got, 2 * want, atol=1e-6):
        why = "divide by N, the mean's 1/N (it is N = 2 times autograd's): "
    elif torch.allclose(got, -want, atol=1e-6):
        why = "softmax minus one_hot, not one_hot minus softmax (it is autograd's negated): "
    assert torch.allclose(got, want, atol=1e-6), (
        f"{why}grad_by_hand gave {short(got)}, autograd {short(want)}")


def step(model, idx, targets, lr):
    """sgd_step, with PyTorch's error for an update outside no_grad turned into the fix."""
    try:
        return sgd_step(model, idx, targets, lr)
    except RuntimeError as err:
        if "leaf Variable" in str(err):
            pytest.fail(f"do the update inside `with torch.no_grad():`: sgd_step raised '{err}'")
        raise


def cycle(vocab_size=5):
    idx = torch.arange(vocab_size)
    return idx, (idx + 1) % vocab_size


def test_sgd_step_returns_the_loss_and_lowers_it():
    model, (idx, targets) = bigram(5), cycle()
    first = step(model, idx, targets, lr=1.0)
    assert isinstance(first, float), f"sgd_step returned a {type(first).__name__}, want a float"
    assert math.isclose(first, math.log(5), rel_tol=1e-5), (
        f"the first sgd_step returned {first:.5f}, want ln 5 = {math.log(5):.5f}: the loss "
        "before the update")
    second = step(model, idx, targets, lr=1.0)
    assert second < first, (
        f"move against the gradient, p -= lr * p.grad: the loss rose from {first:.4f} to "
        f"{second:.4f} after one sgd_step")


def test_sgd_step_leaves_no_gradient_behind():
    model, (idx, targets) = bigram(5), cycle()
    step(model, idx, targets, lr=1.0)
    left = model.table.grad
    assert left is None or torch.count_nonzero(left) == 0, (
        f"zero the gradients after the update (p.grad = None), or the next backward adds onto "
        f"them: after sgd_step, table.grad still holds numbers (largest {left.abs().max():.4f})")


def by_hand(steps, lr, sign=-1, zeroed=True):
    """The table of a Bigram(5) on cycle() after `steps` updates worked out with autograd's
    reference gradient: downhill (sign -1) or up, the gradients zeroed after each or summed."""
    (idx, targets), table, total = cycle(), torch.zeros(5, 5), torch.zeros(5, 5)
    for _ in range(steps):
        grad = autograds(table[idx], targets)  # each id once: the rows are the whole table
        total = total * (not zeroed) + grad
        table = table + sign * lr * total
    return table


def test_two_sgd_steps_equal_two_by_hand():
    model, (idx, targets), lr = bigram(5), cycle(), 2.0
    for _ in range(2):
        step(model, idx, targets, lr)
    got, want = model.table.detach(), by_hand(2, lr)
    why = ""
    if torch.allclose(got, by_hand(2, lr, sign=1), atol=1e-5):
        why = "each step went uphill; move against the gradient, p -= lr * p.grad. "
    elif torch.allclose(got, by_hand(2, lr, zeroed=False), atol=1e-5):
        why = ("the second step used the first step's gradient too; zero the gradients after "
               "the update (p.grad = None). ")
    assert torch.allclose(got, want, atol=1e-5), (
        f"{why}After two sgd_steps at lr {lr} the table's row 0 is {short(got[0])}, want "
        f"{short(want[0])}")


def test_three_gradients_agree_and_the_loss_is_ln_v_at_zeros():
    got = three_gradients(torch.zeros(2, 5), torch.tensor([1, 3]))
    assert math.isclose(got["loss"], math.log(5), rel_tol=1e-6), (
        f"the loss of equal scores over 5 tokens is {got['loss']}, want ln 5")
    for way in ("autograd", "nudging"):
        gap = (got["hand"].double() - got[way].double()).abs().max().item()
        assert gap < 1e-6, f"grad_by_hand and {way} differ by up to {gap}, want under 1e-6"


def test_bad_logits_and_targets_are_refused_before_any_work():
    with pytest.raises(ValueError, match=r"logits must be a \(N, V\) float tensor.*unsqueeze"):
        three_gradients(torch.zeros(5), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"targets must be \(1,\) integer ids"):
        three_gradients(torch.zeros(1, 5), torch.tensor([0.0]))
    with pytest.raises(ValueError, match="target 5 is not a token id of a vocabulary of 5"):
        three_gradients(torch.zeros(1, 5), torch.tensor([5]))


def test_fit_bigram_lowers_the_loss_from_ln_v():
    losses = fit_bigram(steps=5, lr=5.0)
    assert math.isclose(losses[0], math.log(5), rel_tol=1e-5) and losses[-1] < 0.3, (
        f"five sgd_steps at lr 5 should take the loss from ln 5 = 1.6094 to under 0.3: "
        f"fit_bigram's losses are {[round(v, 4) for v in losses]}")
    falling = sorted(set(losses), reverse=True)
    assert losses == falling, f"fit_bigram's losses {losses} do not fall at every step"


def test_a_softmax_of_large_scores_passes_almost_no_gradient():
    sizes = {scale: softmax_grad_size(scale) for scale in (1, 10, 100)}
    assert sizes[1] > 0.5 and sizes[10] < 0.02 and sizes[100] < 1e-20, (
        f"softmax_grad_size gave {sizes}, want above 0.5 at scale 1, under 0.02 at 10 and "
        "under 1e-20 at 100")


def test_the_chapters_python_sessions_print_what_they_show():
    """The ```pycon blocks of chapter 01 are doctests: each prints what the chapter shows."""
    sessions = re.findall(r"^```pycon\n(.*?)^```", CHAPTER.read_text(), re.S | re.M)
    assert sessions, "chapter 01 shows no ```pycon session"
    parser, globs = doctest.DocTestParser(), {}
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    runner = doctest.DocTestRunner(optionflags=flags)
    for n, text in enumerate(sessions, 1):  # one namespace: a later session uses earlier names
        test = parser.get_doctest(text, globs, f"01-setup.md session {n}", str(CHAPTER), 0)
        runner.run(test, clear_globs=False)
        globs = test.globs
    failed, tried = runner.summarize(verbose=False)
    assert failed == 0, f"{failed} of {tried} lines of chapter 01's sessions print otherwise"


def test_solutions():
    assert ex01_device.exercise_1_matmul_flops(512) == 268_435_456
    same = ex01_device.exercise_2_same_seed_same_numbers()
    assert same == (True, False), f"same seed equal, other seed equal: {same}, want (True, False)"
    rates = ex01_device.exercise_3_gflops_by_size(sizes=(16, 256))
    assert set(rates) == {16, 256} and all(r > 0 for r in rates.values()), f"rates {rates}"
    sums = ex01_device.exercise_4_gradient_rows_sum_to_zero()
    assert sums.abs().max() < 1e-6, f"the gradient's rows sum to {sums.tolist()}, want 0 each"
    scale = ex01_device.exercise_5_where_the_softmax_saturates()
    assert 8 < scale < 16, f"the gradient falls under 1% of scale 1's at scale {scale}"
