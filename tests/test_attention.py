import math

import pytest
import torch

from solutions import ex05_attention
from tiny_llm.attention import CausalSelfAttention, plot_weights


@pytest.fixture
def attn():
    torch.manual_seed(0)
    return CausalSelfAttention(d_model=16, max_seq_len=8)


def seen(attn, x, weights=None, out=None):
    """Name the mistake the head's weights (or output) show on input x: ": ..." or ""."""
    with torch.no_grad():
        q, k, v = attn.query(x), attn.key(x), attn.value(x)
        raw, T = q @ k.transpose(-2, -1), x.shape[1]
        future = ~torch.tril(torch.ones(T, T, dtype=torch.bool))  # s > t: the true future
        C = x.shape[-1]
        if not torch.equal(attn.mask[:T, :T], ~future):
            return (": mask is not the lower triangle: mask[t, s] must be True where s <= t, "
                    "torch.tril(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool))")

        def masked(scores):
            return scores.masked_fill(future, float("-inf"))

        right = torch.softmax(masked(raw / math.sqrt(C)), dim=-1)
        mistakes = [
            (torch.softmax(raw / math.sqrt(C), dim=-1),
             "the causal mask is missing: set the scores where mask[:T, :T] is False to -inf"),
            (torch.softmax(raw / math.sqrt(C), dim=-1).masked_fill(future, 0.0),
             "the mask is applied after the softmax, so rows no longer sum to 1: set the scores "
             "to -inf before it"),
            (torch.softmax((raw / math.sqrt(C)).masked_fill(future, 0.0), dim=-1),
             "the future scores are set to 0, not -inf: exp(0) = 1 still gives the future "
             "weight; masked_fill(..., float(\"-inf\"))"),
            (torch.softmax(masked(raw), dim=-1), "the scores are not divided by sqrt(C)"),
            (torch.softmax(masked(raw * math.sqrt(C)), dim=-1),
             "the scores are multiplied by sqrt(C): divide them by it"),
            (torch.softmax(masked(raw / C), dim=-1),
             "the scores are divided by C: divide them by sqrt(C)"),
            (torch.softmax(masked(raw / math.sqrt(C)), dim=-2).nan_to_num(0.0),
             "the softmax runs over dim -2 (the queries): take it over dim=-1, the keys, so "
             "each row sums to 1"),
        ]
        if weights is None:
            weights = attn(x, return_weights=True)[1]
        if out is not None and torch.allclose(weights, right, atol=1e-6):
            if torch.allclose(out, right @ v, atol=1e-6):
                return ": the output is weights @ v without proj: return self.proj(weights @ v)"
            return ""
        for wrong, said in mistakes:
            if weights.shape == wrong.shape and torch.allclose(weights, wrong, atol=1e-6):
                return f": {said}"
    return ""


def test_shapes_and_parameters(attn):
    x = torch.randn(3, 5, 16)
    out, weights = attn(x, return_weights=True)
    assert out.shape == (3, 5, 16) and weights.shape == (3, 5, 5), (
        f"(3, 5, 16) in gave out {tuple(out.shape)} and weights {tuple(weights.shape)}, not "
        "(3, 5, 16) and (3, 5, 5)")
    assert torch.equal(attn(x), out), "attn(x) is not the out of attn(x, return_weights=True)"
    counted = sum(p.numel() for p in attn.parameters())
    assert counted == 4 * (16 * 16 + 16), (
        f"{counted:,} parameters, not 4 x (16 x 16 + 16) = 1,088: four nn.Linear(16, 16) with "
        f"biases; yours: { {n: tuple(p.shape) for n, p in attn.named_parameters()} }")


def test_rows_sum_to_one_and_the_future_gets_nothing(attn):
    x = torch.randn(2, 8, 16)
    _, weights = attn(x, return_weights=True)
    why = seen(attn, x, weights)
    assert torch.allclose(weights.sum(dim=-1), torch.ones(2, 8)), f"rows do not sum to 1{why}"
    assert torch.equal(weights.triu(diagonal=1), torch.zeros(2, 8, 8)), (
        f"positions take weight from later positions{why}")
    assert torch.equal(weights[:, 0, 0], torch.ones(2)), (  # position 0 can only see itself
        f"position 0 does not put all its weight on itself{why}")


def test_changing_a_later_position_leaves_earlier_outputs_alone(attn):
    x = torch.randn(2, 8, 16)
    changed = x.clone()
    changed[:, 5] += 1.0
    before, after = attn(x), attn(changed)
    assert torch.equal(before[:, :5], after[:, :5]), (
        f"changing position 5 changed the outputs at 0..4{seen(attn, x, out=before)}")
    moved = (before[:, 5:] - after[:, 5:]).abs().max()
    assert moved > 1e-3, f"changing position 5 moved the outputs at 5..7 by {moved:.1e} only"


def test_without_the_mask_shuffling_the_input_shuffles_the_output(attn):
    x = torch.randn(1, 8, 16)
    perm = torch.randperm(8)
    assert torch.allclose(attn(x[:, perm], causal=False), attn(x, causal=False)[:, perm],
                          atol=1e-6), "with causal=False, attention is not order-blind: " \
                                      "mask the scores only when causal is true"
    # with the mask it is not a plain shuffle: position t sees only what came before it
    assert not torch.allclose(attn(x[:, perm]), attn(x)[:, perm], atol=1e-3), (
        f"with the mask, shuffling the input only shuffles the output{seen(attn, x)}")


def test_with_the_mask_the_last_position_sees_a_set(attn):
    x = torch.randn(1, 8, 16)
    shuffle = torch.tensor([3, 0, 6, 1, 5, 2, 4, 7])  # earlier positions shuffled, last stays
    out = attn(x)
    assert torch.allclose(attn(x[:, shuffle])[:, -1], out[:, -1], atol=1e-6), (
        f"the last position's output depends on the order before it{seen(attn, x, out=out)}")


def test_scores_are_scaled_by_sqrt_d_model(attn):
    x = torch.randn(1, 3, 16)
    q, k = attn.query(x), attn.key(x)
    scores = q @ k.transpose(-2, -1) / math.sqrt(16)
    expected = torch.softmax(scores.masked_fill(~attn.mask[:3, :3], float("-inf")), dim=-1)
    _, weights = attn(x, return_weights=True)
    assert torch.allclose(weights, expected), (
        f"the weights are not softmax(q kᵀ / sqrt(C)) with the mask{seen(attn, x, weights)}")


def test_the_output_is_the_projection_of_the_weighted_values(attn):
    x = torch.randn(2, 6, 16)
    out, weights = attn(x, return_weights=True)
    expected = attn.proj(weights @ attn.value(x))
    assert torch.allclose(out, expected, atol=1e-6), (
        f"the output is not proj(weights @ v){seen(attn, x, out=out)}")


def test_mask_is_a_buffer_that_is_not_learned(attn):
    buffers, params = dict(attn.named_buffers()), dict(attn.named_parameters())
    assert "mask" in buffers and "mask" not in params, (
        f"buffers {sorted(buffers)}, parameters {sorted(params)}: register the mask with "
        "self.register_buffer(\"mask\", mask, persistent=False)")
    assert attn.mask.shape == (8, 8) and attn.mask.dtype == torch.bool, (
        f"mask is {tuple(attn.mask.shape)} {attn.mask.dtype}, not (8, 8) torch.bool")
    assert torch.equal(attn.mask, torch.tril(torch.ones(8, 8, dtype=torch.bool))), (
        "mask is not the lower triangle: mask[t, s] must be True where s <= t (torch.tril)")
    assert "mask" not in attn.state_dict(), "mask is saved with the weights: persistent=False"


@pytest.mark.parametrize(
    "x, error, match",
    [
        (torch.randn(2, 9, 16), ValueError, "T=9 exceeds max_seq_len=8"),
        (torch.randn(2, 4, 12), ValueError, "C = d_model = 16 .* got C=12"),
        (torch.randn(4, 16), ValueError, r"\(B, T, C\) batch .* got shape \(4, 16\).*unsqueeze"),
        (torch.zeros(2, 4, 16, dtype=torch.long), TypeError, "float vectors, got torch.int64"),
        ([[0.0] * 16], TypeError, "float vectors, got list"),
    ],
)
def test_bad_input_is_refused_with_the_fix(attn, x, error, match):
    with pytest.raises(error, match=match):
        attn(x)


def test_attention_map_is_written(tmp_path):
    weights = torch.tril(torch.ones(4, 4)) / torch.arange(1, 5).unsqueeze(1)
    path = plot_weights(weights, tmp_path / "map.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    written = [p.name for p in tmp_path.iterdir()]
    assert written == ["map.png"], f"the folder holds {written}, not just map.png"


def test_solutions():
    torch.manual_seed(0)
    head, x = CausalSelfAttention(16, 8), torch.randn(1, 8, 16)
    why = seen(head, x, out=head(x))  # your head's mistake, if it makes one
    got = ex05_attention.exercise_1_shapes_and_parameters()
    assert got == (16_640, (2, 12, 12), 1_048_576), (
        f"exercise 1: got {got}, not (16,640, (2, 12, 12), 1,048,576){why}")
    without, with_positions = ex05_attention.exercise_2_order_blindness()
    assert without < 1e-6 and with_positions > 0.01, (
        f"exercise 2: the last output moves by {without:.1e} without positions (want < 1e-6) "
        f"and {with_positions:.1e} with them (want > 0.01){why}")
    message = ex05_attention.exercise_3_too_long(64)
    assert "T=65 exceeds max_seq_len=64" in message, f"exercise 3: got {message!r}{why}"
    stds = ex05_attention.exercise_4_why_scale_by_sqrt_c()
    for C, (raw, scaled) in stds.items():
        assert raw == pytest.approx(math.sqrt(C), rel=0.05) and scaled == pytest.approx(
            1, rel=0.05), f"exercise 4: C={C}: std {raw:.2f} raw, {scaled:.2f} scaled; want " \
                          f"{math.sqrt(C):.2f} and 1"
    masked, unmasked = ex05_attention.exercise_5_the_mask_stops_leaks()
    assert masked == 0.0 and unmasked > 0.01, (
        f"exercise 5: position 0 moves by {masked:.1e} with the mask (want 0) and {unmasked:.1e} "
        f"without (want > 0.01): the mask does not stop leaks{why}")
