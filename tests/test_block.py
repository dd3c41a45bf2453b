import itertools
import math

import pytest
import torch
import torch.nn as nn

from solutions import ex07_block
from tiny_llm.block import (
    MLP,
    Block,
    LayerNorm,
    fit_previous_token,
    init_weights,
    memorise_table,
    plot_stds,
    read_at_scales,
    residual_stds,
)


def norm_seen(norm, x, out):
    """Name the mistake a LayerNorm's output `out` of x shows: ": ..." or ""."""
    def written(dims, unbiased=False, eps_inside=True, affine=True):
        mean = x.mean(dim=dims, keepdim=True)
        var = x.var(dim=dims, keepdim=True, unbiased=unbiased)
        y = (x - mean) / (torch.sqrt(var + norm.eps) if eps_inside else torch.sqrt(var) + norm.eps)
        return y * norm.weight + norm.bias if affine else y

    mistakes = [
        (written(-1), ""),
        (written(-2), "it normalises over dim -2 (the positions): take the mean and variance "
                      "over the last dimension, each position's own vector"),
        (written((-2, -1)), "it normalises over the positions and the features together: take "
                            "the mean and variance over the last dimension only"),
        (written(0), "it normalises over dim 0 (the batch): take the mean and variance over "
                     "the last dimension only"),
        (written(-1, unbiased=True), "the variance divides by d_model - 1: use "
                                     "unbiased=False, as nn.LayerNorm does"),
        (written(-1, eps_inside=False), "eps is added outside the sqrt: sqrt(var + eps)"),
        (written(-1, affine=False), "the gain `weight` and shift `bias` are not applied"),
    ]
    with torch.no_grad():
        for wrong, said in mistakes:
            if wrong.shape == out.shape and torch.allclose(out, wrong, atol=1e-5):
                return f": {said}" if said else ""
    return ""


def block_seen():
    """Name the mistake Block.forward shows on a fresh block: ": ..." or ""."""
    torch.manual_seed(1)
    block = Block(32, n_heads=4, max_seq_len=8).eval()
    for norm in (block.ln_1, block.ln_2):  # a gain and shift of their own, to tell them apart
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_()
    x = torch.randn(2, 8, 32)
    a, m, n1, n2 = block.attn, block.mlp, block.ln_1, block.ln_2
    with torch.no_grad():
        h = x + a(n1(x))
        mistakes = [
            (h + m(n2(h)), ""),
            (a(n1(x)) + m(n2(a(n1(x)))), "the residual is dropped around attention: "
                                         "x = x + self.attn(self.ln_1(x))"),
            (m(n2(h)), "the residual is dropped around the MLP: x = x + self.mlp(self.ln_2(x))"),
            (n2(n1(x + a(x)) + m(n1(x + a(x)))), "it is post-norm (the norm after the "
                                                "addition): pre-norm reads x + attn(ln_1(x))"),
            (x + a(x) + m(x + a(x)), "the LayerNorms are skipped: attn reads ln_1(x), mlp ln_2(x)"),
            (h + m(n2(x)), "the MLP reads ln_2 of the block's input: it reads the stream after "
                           "attention has been added"),
            (h + m(n1(h)), "ln_1 is used twice: the MLP reads ln_2(x)"),
            *((wrong, "the residual is added to the normalised x: add onto the stream itself, "
                       "x = x + self.attn(self.ln_1(x)), not ln_1(x) + attn(ln_1(x))")
              for h1 in [n1(x) + a(n1(x))]
              for wrong in (h1 + m(n2(h1)), n2(h1) + m(n2(h1)))),
        ]
        out = block(x)
        for wrong, said in mistakes:
            if torch.allclose(out, wrong, atol=1e-5):
                return f": {said}" if said else ""
    return ""


def test_layernorm_equals_nn_layernorm_with_learned_gain_and_bias():
    torch.manual_seed(0)
    ours, reference = LayerNorm(16), nn.LayerNorm(16)
    with torch.no_grad():
        reference.weight.normal_()
        reference.bias.normal_()
    ours.load_state_dict(reference.state_dict())  # same names: weight (the gain) and bias
    x = torch.randn(3, 5, 16) * 4 + 2
    for name, out in (("written_out", ours.written_out(x)), ("forward", ours(x))):
        why = f"LayerNorm.{name} differs from nn.LayerNorm{norm_seen(ours, x, out)}"
        torch.testing.assert_close(out, reference(x), atol=1e-5, rtol=0,
                                   msg=lambda m, why=why: f"{why}\n{m}")


def test_the_fused_forward_equals_the_written_out_layernorm():
    torch.manual_seed(0)
    norm = LayerNorm(16)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(3, 5, 16) * 4 + 2
    fused, written = norm(x), norm.written_out(x)
    torch.testing.assert_close(fused, written, atol=1e-5, rtol=0, msg=lambda m: (
        f"forward and written_out differ: forward{norm_seen(norm, x, fused) or ' looks right'}"
        f"; written_out{norm_seen(norm, x, written) or ' looks right'}\n{m}"))
    assert not torch.equal(norm(x), LayerNorm(16)(x)), "the gain `weight` and shift `bias` are " \
                                                      "not applied"


def test_layernorm_gives_each_position_mean_0_and_variance_1():
    x = torch.randn(2, 7, 32) * 10 - 3
    norm = LayerNorm(32)
    for name, y in (("forward", norm(x)), ("written_out", norm.written_out(x))):
        why = norm_seen(norm, x, y)
        assert y.mean(-1).abs().max() < 1e-5, f"{name}: a position's mean is not 0{why}"
        assert (y.var(-1, unbiased=False) - 1).abs().max() < 1e-3, (
            f"{name}: a position's variance is not 1{why}")


def test_mlp_widens_four_times_and_keeps_the_shape():
    mlp = MLP(16)
    shapes = (tuple(mlp.fc.weight.shape), tuple(mlp.proj.weight.shape))
    assert shapes == ((64, 16), (16, 64)), (
        f"MLP(16): fc and proj weights are {shapes[0]} and {shapes[1]}, not (64, 16) and "
        "(16, 64): fc = nn.Linear(d_model, 4 * d_model), proj = nn.Linear(4 * d_model, d_model)")
    out = mlp(torch.randn(2, 3, 16))
    assert out.shape == (2, 3, 16), f"MLP(16) maps (2, 3, 16) to {tuple(out.shape)}"
    count = sum(p.numel() for p in mlp.parameters())
    assert count == 8 * 16**2 + 5 * 16, f"MLP(16) has {count} parameters, not 8·d² + 5·d = 2128"


def test_block_parameters_follow_12_d_squared_plus_13_d():
    block = Block(64, n_heads=4, max_seq_len=8)
    count = sum(p.numel() for p in block.parameters())
    parts = {name: sum(p.numel() for p in part.parameters())
             for name, part in block.named_children()}
    assert count == 12 * 64**2 + 13 * 64, (
        f"Block(64, ...) has {count:,} parameters, not 12·d² + 13·d = {12 * 64**2 + 13 * 64:,}; "
        f"its parts hold {parts} (ln_1, ln_2: 128 each, attn: 16,640, mlp: 33,088)")


def test_block_is_the_identity_when_both_sublayers_output_zero():
    """Pre-norm residual: x + attn(ln_1(x)) + mlp(...); zero output projections leave x as is."""
    block = Block(32, n_heads=4, max_seq_len=8)
    for proj in (block.attn.proj, block.mlp.proj):
        nn.init.zeros_(proj.weight)
        nn.init.zeros_(proj.bias)
    x = torch.randn(2, 8, 32)
    assert torch.equal(block(x), x), f"the block is not x + attn(...) + mlp(...){block_seen()}"


def test_block_is_causal():
    torch.manual_seed(0)
    block = Block(32, n_heads=4, max_seq_len=8).eval()
    x = torch.randn(1, 8, 32)
    changed = x.clone()
    changed[:, 5:] = 0.0
    assert torch.allclose(block(x)[:, :5], block(changed)[:, :5], atol=1e-6), (
        f"changing positions 5.. changed the block's outputs at 0..4{block_seen()}")


def test_the_block_is_two_pre_norm_residual_steps():
    why = block_seen()
    assert why == "", f"the block is not x + attn(ln_1(x)), then + mlp(ln_2(x)){why}"


def test_init_weights_gives_residual_projections_the_smaller_std():
    torch.manual_seed(0)
    block = init_weights(Block(256, n_heads=4, max_seq_len=8), n_layers=8)
    small = 0.02 / math.sqrt(2 * 8)  # 0.005
    for name in ("attn.qkv", "mlp.fc"):
        std = block.get_submodule(name).weight.std().item()
        assert std == pytest.approx(0.02, rel=0.03), (
            f"{name} starts with std {std:.4f}, not 0.02: init_weights' first loop draws every "
            "nn.Linear weight from N(0, 0.02²)")
    for name in ("attn.proj", "mlp.proj"):
        layer = block.get_submodule(name)
        std = layer.weight.std().item()
        if not getattr(layer, "residual_output", False):
            why = (f"{name} is not marked residual_output"
                   + (": apply step 07's diff to multihead.py" if name == "attn.proj" else ""))
        else:
            hints = {0.02: "marked layers are not redrawn: init_weights' second loop",
                     0.02 / math.sqrt(8): "that is 0.02/√n_layers: the 2 of 2·n_layers is missing",
                     0.02 / (2 * 8): "that is 0.02/(2·n_layers): take the square root",
                     0.02 / 8: "that is 0.02/n_layers: divide by √(2·n_layers)"}
            hint = [h for value, h in hints.items() if std == pytest.approx(value, rel=0.03)]
            why = (f"{name} is marked residual_output, but starts with std {std:.4f}, not "
                   f"0.02/√(2·n_layers) = {small:.4f}" + "".join(f" ({h})" for h in hint))
        assert std == pytest.approx(small, rel=0.03), why
    biases = [n for n, p in block.named_parameters() if n.endswith("bias") and p.abs().max() > 0]
    assert biases == [], (
        f"these biases do not start at 0: {biases}: init_weights' first loop zeroes every "
        "nn.Linear bias")
    gains = [n for n in ("ln_1", "ln_2") if not torch.equal(block.get_submodule(n).weight,
                                                             torch.ones(256))]
    assert gains == [], f"the LayerNorm gains of {gains} are not all 1: init_weights leaves them"


def test_init_weights_covers_embeddings_and_refuses_a_bad_depth():
    torch.manual_seed(0)
    emb = init_weights(nn.Embedding(1000, 64), n_layers=2)
    std = emb.weight.std().item()
    assert std == pytest.approx(0.02, rel=0.03), (
        f"an nn.Embedding starts with std {std:.4f}, not 0.02: init_weights covers nn.Embedding "
        "as well as nn.Linear")
    with pytest.raises(ValueError, match="n_layers must be a positive int, got 0"):
        init_weights(emb, n_layers=0)


def test_scaled_init_keeps_the_residual_stream_from_growing_with_depth():
    plain = residual_stds(8, scaled=False, d_model=32, seq_len=16)
    scaled = residual_stds(8, scaled=True, d_model=32, seq_len=16)
    shown = f"plain {[round(v, 4) for v in plain]}, scaled {[round(v, 4) for v in scaled]}"
    falls = [i + 1 for i, (a, b) in enumerate(itertools.pairwise(plain)) if b <= a]
    assert not falls, f"the plain init's std does not grow after block(s) {falls}: {shown}"
    assert plain[-1] > 1.5 * scaled[-1], f"the scaled init ends less than 1.5 times below: {shown}"
    assert scaled[-1] < 2.5 * 0.02 * math.sqrt(2), (  # still the embedding's order of size
        f"the scaled init ends at std {scaled[-1]:.4f}, above 2.5 times the embedding's 0.028")


def test_layernorm_makes_what_the_sublayers_read_the_same_at_every_scale():
    seen = read_at_scales(d_model=32, n_heads=4, seq_len=16)
    normed = [seen[s]["LayerNorm"] for s in (0.03, 1.0, 30.0)]
    for scale, (weight, mlp) in zip((0.03, 1.0, 30.0), normed, strict=True):
        assert weight == pytest.approx(normed[1][0], rel=0.02) and mlp == pytest.approx(
            normed[1][1], rel=0.02), (f"through LayerNorm, a stream of std {scale} gives top "
                                      f"weight {weight:.3f} and MLP std {mlp:.4f}, not "
                                      f"{normed[1][0]:.3f} and {normed[1][1]:.4f} as at std 1")
    raw_small, raw_large = seen[0.03]["raw"], seen[30.0]["raw"]
    assert raw_large[0] > 0.5, f"raw, a stream of std 30 gives top weight {raw_large[0]:.3f}, " \
                               "not a saturated softmax (> 0.5)"
    assert raw_small[1] < 0.1 * normed[0][1], (
        f"raw, a stream of std 0.03 gives the MLP an output of std {raw_small[1]:.4f}, not far "
        f"below the {normed[0][1]:.4f} it gives through LayerNorm")


def test_post_norm_needs_warmup_where_pre_norm_learns_without():
    pre, post, warmed = (fit_previous_token(post, 2, warmup=warmup)
                         for post, warmup in ((False, 0), (True, 0), (True, 50)))
    assert post > 2.5 and pre < 1.0 and warmed < 1.0, (
        ("" if pre < 1.0 else "pre-norm did not learn: look at Block.forward first (its own "
         "tests say what they see); ")
        + f"2 blocks, 100 steps at lr 0.03: pre-norm ended at loss {pre:.2f}, post-norm "
        f"{post:.2f}, post-norm warmed up {warmed:.2f}; wanted post-norm alone stuck near ln 16 "
        "= 2.77")


def test_a_wider_mlp_stores_more_of_a_table_in_equal_steps():
    narrow, wide = (memorise_table(width, n_ids=128, steps=100) for width in (1, 4))
    assert wide[2] > 3 * narrow[2], f"the MLPs have {narrow[2]:,} and {wide[2]:,} parameters"
    assert wide[0] < narrow[0] and wide[1] > narrow[1] + 0.2, (
        f"in 100 steps the 1x MLP got loss {narrow[0]:.2f}, stored {narrow[1]:.2f} of the ids; "
        f"the 4x MLP {wide[0]:.2f} and {wide[1]:.2f}: wanted the wider one clearly ahead")


def test_residual_stds_are_seeded():
    first, again = (residual_stds(2, d_model=16, seq_len=8) for _ in range(2))
    assert first == again, f"two runs with one seed gave {first} and {again}"


def test_plot_stds_writes_a_png(tmp_path):
    path = plot_stds([0.1, 0.2], [0.03, 0.04], tmp_path / "stds.png")
    head = path.read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n", f"{path} starts with {head!r}, not a PNG's signature"


def test_solutions():
    parts, counted, mlp_counted = ex07_block.exercise_1_block_parameters(128)
    assert parts["total = 12·d² + 13·d"] == counted == 198_272 and mlp_counted == parts["mlp"], (
        f"exercise 1: by hand {parts}, counted {counted:,} (mlp {mlp_counted:,}); wanted 198,272")
    flops, crossover = ex07_block.exercise_2_flops_per_token(d_model=128, T=256)
    assert flops["mlp"] == 2 * flops["attention projections"] and crossover == 512, (
        f"exercise 2: {flops}, crossover T = {crossover}; wanted the MLP at twice the "
        "projections and T = 512")
    eps = ex07_block.exercise_3_why_eps()
    assert eps == (True, True), f"exercise 3 gave {eps}: zeros with eps, NaN without"
    depth = ex07_block.exercise_4_depth(depths=(2, 16), d_model=32)
    assert depth[16][0] > 1.5 * depth[2][0], f"exercise 4: plain init {depth}: grows with depth"
    assert depth[16][1] == pytest.approx(depth[2][1], rel=0.15), (
        f"exercise 4: scaled init {depth}: stays put with depth")
