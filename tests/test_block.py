import itertools
import math

import pytest
import torch
import torch.nn as nn

from solutions import ex07_block
from tiny_llm.block import MLP, Block, LayerNorm, init_weights, plot_stds, residual_stds


def test_layernorm_equals_nn_layernorm_with_learned_gain_and_bias():
    torch.manual_seed(0)
    ours, reference = LayerNorm(16), nn.LayerNorm(16)
    with torch.no_grad():
        reference.weight.normal_()
        reference.bias.normal_()
    ours.load_state_dict(reference.state_dict())  # same names: weight (the gain) and bias
    x = torch.randn(3, 5, 16) * 4 + 2
    torch.testing.assert_close(ours.written_out(x), reference(x), atol=1e-5, rtol=0)


def test_the_fused_forward_equals_the_written_out_layernorm():
    torch.manual_seed(0)
    norm = LayerNorm(16)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(3, 5, 16) * 4 + 2
    torch.testing.assert_close(norm(x), norm.written_out(x), atol=1e-5, rtol=0)
    assert not torch.equal(norm(x), LayerNorm(16)(x))  # the gain and shift are applied


def test_layernorm_gives_each_position_mean_0_and_variance_1():
    x = torch.randn(2, 7, 32) * 10 - 3
    y = LayerNorm(32)(x)
    assert y.mean(-1).abs().max() < 1e-5
    assert (y.var(-1, unbiased=False) - 1).abs().max() < 1e-3


def test_mlp_widens_four_times_and_keeps_the_shape():
    mlp = MLP(16)
    assert mlp.fc.weight.shape == (64, 16) and mlp.proj.weight.shape == (16, 64)
    assert mlp(torch.randn(2, 3, 16)).shape == (2, 3, 16)
    assert sum(p.numel() for p in mlp.parameters()) == 8 * 16**2 + 5 * 16


def test_block_parameters_follow_12_d_squared_plus_13_d():
    block = Block(64, n_heads=4, max_seq_len=8)
    assert sum(p.numel() for p in block.parameters()) == 12 * 64**2 + 13 * 64


def test_block_is_the_identity_when_both_sublayers_output_zero():
    """Pre-norm residual: x + attn(ln_1(x)) + mlp(...); zero output projections leave x as is."""
    block = Block(32, n_heads=4, max_seq_len=8)
    for proj in (block.attn.proj, block.mlp.proj):
        nn.init.zeros_(proj.weight)
        nn.init.zeros_(proj.bias)
    x = torch.randn(2, 8, 32)
    assert torch.equal(block(x), x)


def test_block_is_causal():
    torch.manual_seed(0)
    block = Block(32, n_heads=4, max_seq_len=8).eval()
    x = torch.randn(1, 8, 32)
    changed = x.clone()
    changed[:, 5:] = 0.0
    assert torch.allclose(block(x)[:, :5], block(changed)[:, :5], atol=1e-6)


def test_init_weights_gives_residual_projections_the_smaller_std():
    torch.manual_seed(0)
    block = init_weights(Block(256, n_heads=4, max_seq_len=8), n_layers=8)
    small = 0.02 / math.sqrt(2 * 8)  # 0.005
    assert block.attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert block.mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert block.attn.proj.weight.std().item() == pytest.approx(small, rel=0.03), (
        "attn.proj is not marked residual_output: apply step 07's diff to multihead.py")
    assert block.mlp.proj.weight.std().item() == pytest.approx(small, rel=0.03)
    for name, p in block.named_parameters():
        if name.endswith("bias"):
            assert torch.all(p == 0), name
    assert torch.all(block.ln_1.weight == 1) and torch.all(block.ln_2.weight == 1)


def test_init_weights_covers_embeddings_and_refuses_a_bad_depth():
    torch.manual_seed(0)
    emb = init_weights(nn.Embedding(1000, 64), n_layers=2)
    assert emb.weight.std().item() == pytest.approx(0.02, rel=0.03)
    with pytest.raises(ValueError, match="n_layers must be a positive int, got 0"):
        init_weights(emb, n_layers=0)


def test_scaled_init_keeps_the_residual_stream_from_growing_with_depth():
    plain = residual_stds(8, scaled=False, d_model=32, seq_len=16)
    scaled = residual_stds(8, scaled=True, d_model=32, seq_len=16)
    assert all(b > a for a, b in itertools.pairwise(plain))  # plain: grows block after block
    assert plain[-1] > 1.5 * scaled[-1]
    assert scaled[-1] < 2.5 * 0.02 * math.sqrt(2)  # still the embedding's order of size


def test_residual_stds_are_seeded():
    assert residual_stds(2, d_model=16, seq_len=8) == residual_stds(2, d_model=16, seq_len=8)


def test_plot_stds_writes_a_png(tmp_path):
    path = plot_stds([0.1, 0.2], [0.03, 0.04], tmp_path / "stds.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_solutions():
    parts, counted, mlp_counted = ex07_block.exercise_1_block_parameters(128)
    assert parts["total = 12·d² + 13·d"] == counted == 198_272 and mlp_counted == parts["mlp"]
    flops, crossover = ex07_block.exercise_2_flops_per_token(d_model=128, T=256)
    assert flops["mlp"] == 2 * flops["attention projections"] and crossover == 512
    assert ex07_block.exercise_3_why_eps() == (True, True)
    depth = ex07_block.exercise_4_depth(depths=(2, 16), d_model=32)
    assert depth[16][0] > 1.5 * depth[2][0]  # plain grows with depth
    assert depth[16][1] == pytest.approx(depth[2][1], rel=0.15)  # scaled stays put
