import math
from contextlib import contextmanager

import pytest
import torch

from solutions import ex04_embed
from tiny_llm.checks import check_ids
from tiny_llm.embed import Embed


@pytest.fixture
def emb():
    torch.manual_seed(0)
    return Embed(vocab_size=4096, d_model=128, max_seq_len=64)


def test_parameter_count_is_two_tables(emb):
    counted = sum(p.numel() for p in emb.parameters())
    shapes = {name: tuple(p.shape) for name, p in emb.named_parameters()}
    assert counted == 532_480 == 4096 * 128 + 64 * 128, (
        f"Embed(4096, 128, 64) has {counted:,} parameters, not 532,480 = tok_emb (4096, 128) + "
        f"pos_emb (64, 128); its tables: {shapes}")


def test_tables_start_as_small_normals(emb):
    for name in ("tok_emb", "pos_emb"):
        table = getattr(emb, name).weight
        std, mean = table.std().item(), table.mean().item()
        assert abs(std - 0.02) < 0.001, (
            f"{name}.weight starts with std {std:.3f}, not 0.02: draw it with "
            "nn.init.normal_(table.weight, mean=0.0, std=0.02)"
            + (" (1.0 is PyTorch's own N(0, 1): the init is missing)" if std > 0.5 else ""))
        assert abs(mean) < 0.001, f"{name}.weight starts with mean {mean:.3f}, not 0: mean=0.0"


@contextmanager
def lookup_errors(emb=None):
    """Name the errors that a wrong lookup of the positions gives inside the block; with `emb`,
    a short input that fits says which wrong rows the forward looked up."""
    try:
        yield
    except IndexError as err:
        seen = probe(emb) if emb is not None else ""
        raise AssertionError(f"your forward raised IndexError on ids inside the vocabulary "
                             f"({err}){seen or ': look up pos_emb with the positions '}"
                             f"{'' if seen else 'torch.arange(T), not with the token ids'}"
                             ) from err
    except RuntimeError as err:
        if "must match the size" not in str(err):
            raise
        raise AssertionError(
            f"adding the positions failed ({err}): the positions are torch.arange(T) with "
            "T = idx.shape[1], so pos_emb gives (T, C), which broadcasts over the batch") from err


def probe(emb):
    """What the forward does with ids [[2, 0, 1]] (short, and every id a position too): the
    mistake wrong_position names, or ""."""
    try:
        x = emb(torch.tensor([[2, 0, 1]]))[0]
    except (IndexError, RuntimeError):
        return ""
    tok, pos = emb.tok_emb.weight, emb.pos_emb.weight
    return next(filter(None, (wrong_position(x[t], tok[v], pos, t, v)
                              for t, v in enumerate((2, 0, 1)))), "")


def embed(emb, idx):
    with lookup_errors(emb):
        return emb(idx)


def test_output_is_token_row_plus_position_row(emb):
    idx = torch.randint(0, 4096, (3, 10))
    x = embed(emb, idx)
    assert x.shape == (3, 10, 128) and x.dtype == torch.float32, (
        f"(3, 10) ids gave {tuple(x.shape)} {x.dtype}, not (3, 10, 128) torch.float32")
    token, position = emb.tok_emb.weight[idx[1, 4]], emb.pos_emb.weight[4]
    assert not torch.equal(x[1, 4], token), "x[1, 4] is tok_emb's row alone: add pos_emb's row 4"
    assert not torch.equal(x[1, 4], position), "x[1, 4] is pos_emb's row alone: add tok_emb's row"
    assert torch.equal(x[1, 4], token + position), (
        "x[1, 4] is not tok_emb.weight[idx[1, 4]] + pos_emb.weight[4]"
        + wrong_position(x[1, 4], token, emb.pos_emb.weight, 4, int(idx[1, 4])))
    std = x.std().item()
    assert abs(std - math.sqrt(2) * 0.02) < 0.002, (  # two N(0, 0.02²) added
        f"the output's std is {std:.3f}, not √2 · 0.02 ≈ 0.028: each table starts at std=0.02")


def wrong_position(row, token_row, pos, t, token):
    """What a learner's output row at position t says about the position row added to it."""
    def near(other):
        return torch.allclose(row, token_row + other, atol=1e-4)

    if near(pos[t]):
        return ""
    if near(torch.zeros_like(token_row)):
        return ": it is tok_emb's row alone: add pos_emb's row for each position"
    if t + 1 < len(pos) and near(pos[t + 1]):
        return (f": position {t} got pos_emb's row {t + 1}: the positions are off by one; they "
                "run 0, 1, ..., T - 1, which is torch.arange(T)")
    if t and near(pos[0]):
        return (": every position got pos_emb's row 0: the positions are torch.arange(T) with "
                "T = idx.shape[1], not the batch size idx.shape[0]")
    if token < len(pos) and near(pos[token]):
        return (f": position {t} got pos_emb's row {token}, the token id: look up pos_emb with "
                "torch.arange(T), not with the token ids")
    return ""


def test_same_token_differs_by_position_and_tokens_differ(emb):
    x = embed(emb, torch.tensor([[5, 5, 6]]))[0]
    tok, pos = emb.tok_emb.weight, emb.pos_emb.weight
    seen = wrong_position(x[1], tok[5], pos, 1, 5) or ": add pos_emb's row for each position"
    assert not torch.allclose(x[0], x[1]), f"token 5 at positions 0 and 1 gives the same " \
                                           f"vector{seen}"
    assert torch.allclose(x[1] - x[0], pos[1] - pos[0]), (
        "token 5 at positions 1 and 0 differs by something else than pos_emb's rows 1 and 0"
        f"{wrong_position(x[1], tok[5], pos, 1, 5)}")
    assert not torch.allclose(x[1], x[2]), (
        "tokens 5 and 6 at position 1 and 2 give the same vector: look up tok_emb with the ids")


def test_worked_example_sums_by_hand(capsys):
    from tiny_llm.embed import worked_example

    with lookup_errors(Embed(10, 3, 5)):
        worked_example()
    lines = capsys.readouterr().out.splitlines()
    row = torch.tensor([float(v) for v in lines[3].rsplit("[", 1)[1].strip("]").split(",")])
    tok, pos = torch.arange(30.0).view(10, 3) / 10, torch.arange(15.0).view(5, 3) / 100
    seen = wrong_position(row, tok[1], pos, 3, 1)  # token 1 at position 3
    assert lines[1] == (
        "t=1  id=1   tok [0.30, 0.40, 0.50] + pos [0.03, 0.04, 0.05] = [0.33, 0.44, 0.55]"
    ), f"each row of the output is tok + pos{seen}"
    assert lines[3].endswith("= [0.39, 0.50, 0.61]"), f"token 1 at t=3: tok + pos{seen}"


BAD_IDS = [
    (torch.zeros(1, 65, dtype=torch.long), ValueError, "T=65 exceeds max_seq_len=64"),
    (torch.tensor([[1, 4096]]), ValueError, "token id 4096 is outside the vocabulary"),
    (torch.tensor([[-1, 2]]), ValueError, "token id -1 is outside the vocabulary"),
    (torch.tensor([[1.0, 2.0]]), TypeError, "must be integers, got dtype torch.float32"),
    (torch.tensor([1, 2, 3]), ValueError, r"\(B, T\) batch .* got shape \(3,\).*unsqueeze"),
    (torch.zeros(2, 4, 4, dtype=torch.long), ValueError, r"got shape \(2, 4, 4\)"),
    ([[1, 2]], TypeError, "must be a torch.Tensor, got list"),
]


@pytest.mark.parametrize("idx, error, match", BAD_IDS)
def test_bad_ids_are_refused_with_the_fix_where_they_enter(idx, error, match):
    with pytest.raises(error, match=match):
        check_ids(idx, 4096, 64)  # where ids enter: a data file, a prompt


@pytest.mark.parametrize("idx, error, match", BAD_IDS)
def test_the_forward_refuses_the_same_ids_and_names_them(idx, error, match):
    with pytest.raises(error, match=match):
        Embed(4096, 128, 64)(idx)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="max_seq_len must be a positive int, got 0"):
        Embed(10, 3, 0)


def test_solutions():
    with lookup_errors(Embed(10, 3, 5)):  # the exercises run your Embed: a bug there is named
        check_solutions()


def check_solutions():
    for args, want in (((4096, 128, 64), 532_480), ((50257, 768, 1024), 39_383_808)):
        got = ex04_embed.exercise_1_parameter_count(*args)
        assert got == want, f"exercise 1: Embed{args} has {want:,} parameters, got {got:,}"
    same, cosines = ex04_embed.exercise_2_untrained_cosines()
    assert same == pytest.approx(1.0), f"exercise 2: a row's cosine with itself is {same}, not 1"
    assert max(abs(c) for c in cosines) < 0.5, (  # random vectors: near-orthogonal
        f"exercise 2: untrained rows have cosines {cosines}, not near 0 (about ±1/√128)")
    got = ex04_embed.exercise_3_one_hot_is_a_lookup()
    assert got == (0.0, 524_288), f"exercise 3: got {got}, not (0.0 error, 524,288 saved)"
    got = ex04_embed.exercise_4_add_versus_concatenate(128)
    assert got == (128, 256, 0.0), f"exercise 4: got {got}, not (128, 256, 0.0 error)"
    message, shape = ex04_embed.exercise_5_too_long(64)
    assert "T=65 exceeds max_seq_len=64" in message and shape == (1, 64, 128), (
        f"exercise 5: got {message!r} and {shape}, not 'T=65 exceeds max_seq_len=64' and "
        "(1, 64, 128)")
