import io
import math
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from solutions import ex14_posenc_lab
from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.loss import evaluate_loss
from tiny_llm.posenc import (
    LearnedPositionalEncoding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_bias,
    alibi_slopes,
    draw_figures,
    plot_sinusoidal,
    sinusoidal_table,
)
from tiny_llm.posenc_lab import (
    QUICK,
    SCHEMES,
    SINUSOIDAL_SCALE,
    Experiment,
    LabConfig,
    LabGPT,
    main,
    print_report,
    rebuilt_longer,
    run_lab,
    train_scheme,
)

TINY = dict(vocab_size=50, max_seq_len=16, d_model=32, n_layers=2, n_heads=4)


@pytest.fixture(scope="module")
def quick_lab(sample_data_dir):
    """The --quick experiment on the sample corpus, 40 steps a scheme instead of 100 (the whole
    of it is chapter 14's console block), run once for the tests below."""
    return run_lab(replace(QUICK, steps=40), sample_data_dir, torch.device("cpu"))


def test_sinusoidal_encoding_adds_the_closed_form():
    enc = SinusoidalPositionalEncoding(max_len=50, d_model=16)
    out = enc(torch.zeros(2, 50, 16))
    for t in (0, 1, 7, 49):
        for i in range(8):
            angle = t / 10000 ** (2 * i / 16)
            assert out[1, t, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert out[1, t, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_sinusoidal_table_is_a_buffer_not_a_parameter():
    enc = SinusoidalPositionalEncoding(max_len=8, d_model=4)
    assert list(enc.parameters()) == [] and "table" in dict(enc.named_buffers())
    assert enc.state_dict() == {}  # rebuilt from the formula, never saved


def test_sinusoidal_scale_multiplies_the_table_and_the_lab_matches_the_embeddings():
    full = SinusoidalPositionalEncoding(16, 8)(torch.zeros(1, 16, 8))
    small = SinusoidalPositionalEncoding(16, 8, scale=0.5)(torch.zeros(1, 16, 8))
    torch.testing.assert_close(small, 0.5 * full)
    rms = (SINUSOIDAL_SCALE * sinusoidal_table(100, 64)).pow(2).mean().sqrt().item()
    assert rms == pytest.approx(0.02)  # sin² + cos² = 1: each entry 0.02 on average, as learned


def test_learned_positions_reject_a_sequence_longer_than_max_len():
    enc = LearnedPositionalEncoding(max_len=8, d_model=4)
    assert enc(torch.zeros(1, 8, 4)).shape == (1, 8, 4)
    with pytest.raises(ValueError, match="T=9 exceeds max_len=8: a learned table has no vector"):
        enc(torch.zeros(1, 9, 4))


def test_rope_keeps_vector_norms_and_leaves_position_zero_alone():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 40, 16)
    y = RotaryEmbedding(head_size=16, max_len=40)(x)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0])
    assert not torch.allclose(y[:, :, 1:], x[:, :, 1:])


def test_rope_scores_depend_only_on_the_offset():
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 1, 1, 8)
    rope = RotaryEmbedding(head_size=8, max_len=32)
    scores = rope(q.expand(1, 1, 32, 8))[0, 0] @ rope(k.expand(1, 1, 32, 8))[0, 0].T  # (32, 32)
    for offset in (-5, 0, 1, 17):
        diagonal = scores.diagonal(offset)  # every (p, p + offset) pair
        torch.testing.assert_close(diagonal, diagonal[0].expand_as(diagonal), atol=1e-5, rtol=0)
    assert scores.diagonal(0)[0] != pytest.approx(scores.diagonal(1)[0].item())


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_alibi_slopes_follow_the_geometric_rule_for_powers_of_two(n):
    expected = torch.tensor([2 ** (-8 * i / n) for i in range(1, n + 1)])
    torch.testing.assert_close(alibi_slopes(n), expected)


def test_alibi_slopes_for_other_head_counts_interleave_the_next_power():
    assert alibi_slopes(6).tolist() == [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    assert len(alibi_slopes(12)) == 12 and alibi_slopes(12).max() < 1
    with pytest.raises(ValueError, match="n_heads must be a positive int, got 0"):
        alibi_slopes(0)


def test_alibi_bias_is_linear_in_distance_and_causal():
    bias = alibi_bias(2, 5)
    assert bias.shape == (2, 5, 5)
    assert bias[0, 4, 1].item() == pytest.approx(-3 * 2**-4)  # slope 1/16, distance 3
    assert torch.isinf(bias[:, 1, 2]).all() and (bias.diagonal(dim1=1, dim2=2) == 0).all()


def test_lab_config_rejects_bad_schemes():
    with pytest.raises(ValueError, match="pos must be one of .* got 'relative'"):
        LabConfig(**TINY, pos="relative")
    with pytest.raises(ValueError, match="head size must be even; got d_model // n_heads = 5"):
        LabConfig(vocab_size=50, d_model=20, n_heads=4, pos="rope")


def test_learned_is_step_08s_gpt_and_the_other_schemes_share_their_first_weights():
    models = {}
    for pos in SCHEMES:
        torch.manual_seed(0)
        models[pos] = LabGPT(LabConfig(**TINY, pos=pos))
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**TINY)).state_dict()
    learned = models["learned"].state_dict()
    assert learned.keys() == gpt.keys()  # embed.tok_emb, embed.pos_emb, blocks..., lm_head
    assert all(torch.equal(learned[k], gpt[k]) for k in gpt)
    for pos in ("sinusoidal", "rope", "alibi"):  # no table to draw: the same weights as none
        torch.testing.assert_close(models[pos].blocks[1].mlp.fc.weight,
                                   models["none"].blocks[1].mlp.fc.weight)
    assert "embed.pos_emb.weight" not in models["rope"].state_dict()


@pytest.mark.parametrize("pos", [p for p in SCHEMES if p != "learned"])
def test_stretch_rebuilds_a_formula_scheme_without_changing_it(pos):
    torch.manual_seed(0)
    model = LabGPT(LabConfig(**TINY, pos=pos)).eval()
    idx = torch.randint(0, 50, (2, 16))
    longer = rebuilt_longer(model, 64)
    torch.testing.assert_close(longer(idx)[0], model(idx)[0])
    assert longer(torch.randint(0, 50, (1, 64)))[0].shape == (1, 64, 50)
    with pytest.raises(ValueError, match="T=17 exceeds max_(seq_)?len=16"):
        model(torch.randint(0, 50, (1, 17)))


def test_stretch_refuses_learned_positions():
    model = LabGPT(LabConfig(**TINY, pos="learned"))
    with pytest.raises(ValueError, match="learned positions cannot be stretched"):
        rebuilt_longer(model, 32)


def test_every_scheme_trains_with_a_falling_loss(quick_lab):
    exp, meta, results = quick_lab
    assert list(results) == list(SCHEMES)
    for pos, r in results.items():
        losses = r["losses"]
        assert len(losses) == exp.steps
        assert sum(losses[-5:]) / 5 < losses[0] - 1.0, f"{pos}: {losses[0]:.3f} -> {losses[-1]:.3f}"


def test_scores_at_longer_lengths_and_the_learned_refusal(quick_lab):
    exp, meta, results = quick_lab
    for r in results.values():
        assert list(r["scores"]) == [exp.seq_len, 2 * exp.seq_len, 4 * exp.seq_len]
        assert 0 < r["scores"][exp.seq_len] < math.log(meta["vocab_size"])
    assert "T=64 exceeds max_seq_len=32" in results["learned"]["scores"][64]
    assert all(isinstance(v, float) for v in results["alibi"]["scores"].values())


def test_the_report_names_every_scheme(quick_lab, capsys):
    print_report(*quick_lab, seconds=1.0)
    out = capsys.readouterr().out
    for pos in ("none", "learned", "sinusoidal", "rope", "alibi"):
        assert f"\n{pos} " in out
    assert "cannot" in out and "learned at T=64: ValueError:" in out


def test_main_rejects_a_bad_step_count_and_unknown_schemes(capsys):
    with pytest.raises(SystemExit):
        main(["--quick", "--steps", "0"])
    assert "--steps must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--quick", "--schemes", "rope", "relative"])
    assert "invalid choice: 'relative'" in capsys.readouterr().err


def test_figures_are_drawn(tmp_path):
    paths = draw_figures(tmp_path)
    assert [p.name for p in paths] == ["14-sinusoidal.png", "14-position-signals.png",
                                       "14-similarity.png",
                                       "14-alibi-bias.png", "14-rope-rotation.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(tmp_path.iterdir()) == sorted(paths)  # no temporary files left behind


def test_solutions():
    formula, measured = ex14_posenc_lab.exercise_1_slowest_wavelength(64)
    assert round(formula) == 47117 and measured == pytest.approx(formula, rel=1e-3)
    scores = ex14_posenc_lab.exercise_2_rope_depends_on_offset()
    assert max(scores) - min(scores) < 1e-4
    assert ex14_posenc_lab.exercise_3_alibi_slopes_for_6_heads() == [
        1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    assert ex14_posenc_lab.exercise_4_untrained_rows(max_len=16, trained_len=8) == (8, 8)
    moved, shrink = ex14_posenc_lab.exercise_4_adamw_rows(max_len=16, trained_len=8, steps=20)
    assert moved == 16 and shrink == pytest.approx(0.99**20, rel=1e-4)  # 0.818: decay alone
    assert ex14_posenc_lab.exercise_5_position_from_the_causal_mask(4) == pytest.approx(
        [1, 1 / 2, 1 / 3, 1 / 4])


def test_solution_loss_by_position_averages_to_the_lab_loss():
    model = ex14_posenc_lab.demo_model("rope", T=16)
    data = np.random.default_rng(0).integers(0, 100, 1025).astype(np.uint16)
    by_t = ex14_posenc_lab.exercise_6_loss_by_position(model, data, T=16, n_tokens=1024)
    assert by_t.shape == (16,)
    assert by_t.mean().item() == pytest.approx(
        evaluate_loss(model, data[:1025], seq_len=16)["loss"], rel=1e-5)


def test_quick_budget_is_small():
    assert QUICK.steps * QUICK.batch_size * QUICK.seq_len <= 30_000
    assert QUICK.schemes == SCHEMES == ("none", "learned", "sinusoidal", "rope", "alibi")


# a lab small enough to train twice in well under a second
NANO = Experiment(d_model=16, n_layers=1, n_heads=2, seq_len=8, steps=30, batch_size=4,
                  eval_tokens=2048)


def test_solution_6_trains_two_schemes_and_plots_their_curves(sample_data_dir, tmp_path):
    curves = ex14_posenc_lab.exercise_6_curves(sample_data_dir, ("sinusoidal", "alibi"), NANO)
    assert list(curves) == ["sinusoidal", "alibi"]
    for losses in curves.values():
        assert losses.shape == (32,) and torch.isfinite(losses).all()  # 4x the trained length
    assert not torch.equal(curves["sinusoidal"], curves["alibi"])
    path = ex14_posenc_lab.plot_curves(curves, NANO.seq_len, tmp_path / "curves.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_bar_shows_on_a_terminal_only(monkeypatch, capsys):
    data = np.arange(1000, dtype=np.uint16) % 50
    nano = replace(NANO, steps=2)
    train_scheme("none", nano, data, 50, torch.device("cpu"))
    assert capsys.readouterr().err == ""  # stderr is a pipe here: no bar to flood it
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    train_scheme("none", nano, data, 50, torch.device("cpu"))
    assert "none:   0%" in terminal.getvalue()  # the bar, drawn (and cleared: leave=False)


def test_sinusoidal_table_matches_its_closed_form():
    with pytest.raises(ValueError, match="d_model must be a positive even int.*got 7"):
        sinusoidal_table(4, 7)
    table = sinusoidal_table(50, 16)
    for p in (0, 1, 7, 49):
        for i in range(8):
            angle = p / 10000 ** (2 * i / 16)
            assert table[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_plot_is_written_and_identical_each_time(tmp_path):
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    plot_sinusoidal(a, max_len=32, d_model=16)
    plot_sinusoidal(b, max_len=32, d_model=16)
    assert a.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert a.read_bytes() == b.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png"]  # no temp files left
