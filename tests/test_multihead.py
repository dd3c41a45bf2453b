import pytest
import torch

from solutions import ex06_multihead
from tiny_llm.multihead import MultiHeadAttention


def make(d_model=32, n_heads=4, max_seq_len=16, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, n_heads, max_seq_len, dropout).eval()


def both_paths(attn, x):
    attn.use_sdpa = False
    explicit = attn(x)
    attn.use_sdpa = True
    return attn(x), explicit


def test_sdpa_path_equals_explicit_path():
    attn = make()
    x = torch.randn(3, 16, 32)
    sdpa, explicit = both_paths(attn, x)
    assert sdpa.shape == (3, 16, 32)
    torch.testing.assert_close(sdpa, explicit, atol=1e-6, rtol=0)


def test_paths_agree_for_shorter_sequences_and_in_eval_mode_with_dropout():
    attn = make(dropout=0.3)  # eval(): dropout is off on both paths
    x = torch.randn(2, 5, 32)
    sdpa, explicit = both_paths(attn, x)
    torch.testing.assert_close(sdpa, explicit, atol=1e-6, rtol=0)


@pytest.mark.parametrize("use_sdpa", [True, False])
def test_output_at_t_ignores_later_positions(use_sdpa):
    attn = make()
    attn.use_sdpa = use_sdpa
    x = torch.randn(2, 12, 32)
    changed = x.clone()
    changed[:, 7:] = torch.randn(2, 5, 32)
    before, after = attn(x), attn(changed)
    assert torch.allclose(before[:, :7], after[:, :7], atol=1e-6, rtol=0)
    assert not torch.allclose(before[:, 7:], after[:, 7:])


def test_heads_split_the_model_dimension_and_parameters_follow_the_formula():
    attn = make(d_model=48, n_heads=6)
    assert attn.head_size == 8
    assert attn.qkv.weight.shape == (3 * 48, 48) and attn.proj.weight.shape == (48, 48)
    assert sum(p.numel() for p in attn.parameters()) == 4 * 48**2 + 4 * 48


def test_the_causal_mask_is_a_buffer_not_saved_with_the_weights():
    attn = make()
    assert attn.mask.dtype == torch.bool and attn.mask.shape == (16, 16)
    assert torch.equal(attn.mask, torch.tril(attn.mask))
    assert set(attn.state_dict()) == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}


def test_dropout_is_random_in_training_and_off_in_eval():
    attn = make(dropout=0.5).train()
    x = torch.randn(2, 8, 32)
    assert not torch.equal(attn(x), attn(x))
    attn.eval()
    assert torch.equal(attn(x), attn(x))


def test_gradients_reach_every_parameter():
    attn = make()
    attn(torch.randn(2, 8, 32)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in attn.parameters())


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
    with pytest.raises(ValueError, match="last dimension is 31, but this layer has d_model=32"):
        attn(torch.randn(1, 4, 31))
    with pytest.raises(TypeError, match="expects a float tensor, got torch.int64"):
        attn(torch.zeros(1, 4, 32, dtype=torch.long))


def test_solutions():
    formula, counted = ex06_multihead.exercise_1_parameters(64)
    assert formula == 16_640 and set(counted.values()) == {16_640}
    assert ex06_multihead.exercise_2_one_head_is_step_05() < 1e-6
    assert ex06_multihead.exercise_3_head_size_one() == 1.0
    memory = ex06_multihead.exercise_4_score_memory()
    assert memory["MiB per layer"] == 32.0 and memory["T doubled"] == 4 * 32.0
