import math

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
    assert sum(p.numel() for p in emb.parameters()) == 532_480 == 4096 * 128 + 64 * 128


def test_tables_start_as_small_normals(emb):
    for table in (emb.tok_emb.weight, emb.pos_emb.weight):
        assert abs(table.std().item() - 0.02) < 0.001
        assert abs(table.mean().item()) < 0.001


def test_output_is_token_row_plus_position_row(emb):
    idx = torch.randint(0, 4096, (3, 10))
    x = emb(idx)
    assert x.shape == (3, 10, 128) and x.dtype == torch.float32
    expected = emb.tok_emb.weight[idx[1, 4]] + emb.pos_emb.weight[4]
    assert torch.equal(x[1, 4], expected)
    assert abs(x.std().item() - math.sqrt(2) * 0.02) < 0.002  # two N(0, 0.02²) added


def test_same_token_differs_by_position_and_tokens_differ(emb):
    x = emb(torch.tensor([[5, 5, 6]]))[0]
    assert not torch.allclose(x[0], x[1])
    assert torch.allclose(x[1] - x[0], emb.pos_emb.weight[1] - emb.pos_emb.weight[0])
    assert not torch.allclose(x[1], x[2])


def test_worked_example_sums_by_hand(capsys):
    from tiny_llm.embed import worked_example

    worked_example()
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        "t=1  id=1   tok [0.30, 0.40, 0.50] + pos [0.03, 0.04, 0.05] = [0.33, 0.44, 0.55]"
    )
    assert lines[3].endswith("= [0.39, 0.50, 0.61]")  # token 1 again, now at position 3


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
    assert ex04_embed.exercise_1_parameter_count(4096, 128, 64) == 532_480
    assert ex04_embed.exercise_1_parameter_count(50257, 768, 1024) == 39_383_808  # GPT-2 small
    same, cosines = ex04_embed.exercise_2_untrained_cosines()
    assert same == pytest.approx(1.0)
    assert max(abs(c) for c in cosines) < 0.5  # random vectors: near-orthogonal, meaning nothing
    assert ex04_embed.exercise_3_one_hot_is_a_lookup() == (0.0, 524_288)
    assert ex04_embed.exercise_4_add_versus_concatenate(128) == (128, 256, 0.0)
    message, shape = ex04_embed.exercise_5_too_long(64)
    assert "T=65 exceeds max_seq_len=64" in message and shape == (1, 64, 128)
