import math
from dataclasses import asdict, replace

import pytest
import torch

from solutions import ex08_gpt
from tiny_llm.checks import check_ids
from tiny_llm.gpt import DEFAULT_PRESET, GPT, PRESETS, GPTConfig, check_targets

SMALL_VOCAB = replace(PRESETS["tiny"], vocab_size=256)  # the tiny preset with a narrow head: fast


def make(config=SMALL_VOCAB, seed=0):
    torch.manual_seed(seed)
    return GPT(config)


def test_presets_are_valid_configs_and_the_default_is_one_of_them():
    assert DEFAULT_PRESET == "small" and {"tiny", "small"} <= set(PRESETS), (
        f"the default preset is {DEFAULT_PRESET!r} of {sorted(PRESETS)}; wanted 'small'")
    for name, config in PRESETS.items():
        assert isinstance(config, GPTConfig) and config.vocab_size == 4096, (
            f"preset {name!r} is {config!r}: a GPTConfig with vocab_size 4096")
    tiny, small = (GPT(PRESETS[n]).num_params() for n in ("tiny", "small"))
    assert tiny < small, f"tiny has {tiny:,} parameters, small {small:,}"


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"d_model": 100, "n_heads": 3}, ValueError, "d_model=100 is not divisible by n_heads=3"),
        ({"n_layers": 0}, ValueError, "n_layers must be at least 1, got 0"),
        ({"vocab_size": 4096.0}, TypeError, "vocab_size must be an int, got 4096.0"),
        ({"max_seq_len": True}, TypeError, "max_seq_len must be an int, got True"),
        ({"dropout": 1.0}, ValueError, r"dropout must be a number in \[0, 1\), got 1.0"),
    ],
)
def test_config_errors_name_the_field_and_the_value(changes, error, message):
    with pytest.raises(error, match=message):
        GPTConfig(**changes)


def test_gpt_wants_a_config():
    with pytest.raises(TypeError, match=r"GPT expects a GPTConfig, got dict"):
        GPT(asdict(PRESETS["tiny"]))


def test_forward_gives_logits_for_every_position_and_loss_only_with_targets():
    model = make()
    idx = torch.randint(0, 256, (2, 10))
    logits, loss = model(idx)
    assert logits.shape == (2, 10, 256) and loss is None, (
        f"without targets forward gave logits {tuple(logits.shape)} and loss {loss!r}; wanted "
        "(2, 10, 256) and None")
    _, loss = model(idx, torch.randint(0, 256, (2, 10)))
    assert torch.is_tensor(loss) and loss.dim() == 0 and torch.isfinite(loss), (
        f"with targets the loss is {loss!r}, not one finite number: the mean over B·T positions")


TIE = ("lm_head.weight is not embed.tok_emb.weight: tie them by assigning the Parameter, "
       "self.lm_head.weight = self.embed.tok_emb.weight (a copy of the values is two matrices)")


def test_head_weight_is_the_token_embedding():
    model = make()
    assert model.lm_head.weight is model.embed.tok_emb.weight, TIE
    assert model.lm_head.weight.data_ptr() == model.embed.tok_emb.weight.data_ptr(), TIE


def test_a_gradient_step_keeps_the_tied_weights_one_matrix():
    model = make()
    assert model.lm_head.weight is model.embed.tok_emb.weight, TIE
    before = model.lm_head.weight.detach().clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _, loss = model(torch.randint(0, 256, (2, 8)), torch.randint(0, 256, (2, 8)))
    loss.backward()
    optimizer.step()
    assert not torch.equal(model.lm_head.weight, before), "a step left lm_head.weight as it was"
    assert torch.equal(model.lm_head.weight, model.embed.tok_emb.weight), (
        "after one step lm_head.weight and embed.tok_emb.weight differ: " + TIE)
    assert model.lm_head.weight.data_ptr() == model.embed.tok_emb.weight.data_ptr(), TIE


def test_tying_survives_a_state_dict_round_trip():
    model, other = make(seed=0), make(seed=1)
    other.load_state_dict(model.state_dict())
    assert other.lm_head.weight is other.embed.tok_emb.weight, TIE
    assert torch.equal(other.lm_head.weight, model.lm_head.weight), (
        "load_state_dict did not bring the tied matrix over")


def test_initial_loss_is_near_ln_vocab_size():
    model = make(PRESETS["tiny"])
    idx, targets = torch.randint(0, 4096, (2, 64)), torch.randint(0, 4096, (2, 64))
    with torch.no_grad():
        _, loss = model(idx, targets)
    std = model.embed.tok_emb.weight.std().item()
    hint = (f": tok_emb starts with std {std:.2f}, not 0.02: call init_weights(self, n_layers) "
            "last in __init__" if abs(std - 0.02) > 0.005 else "")
    assert abs(loss.item() - math.log(4096)) < 0.1, (
        f"the initial loss is {loss.item():.3f}, not near ln 4096 = 8.318{hint}")


def forward_by_hand(model, idx):
    """The logits of step 08's forward, computed here; the same without ln_f; without blocks."""
    x = model.drop(model.embed(idx))
    unchanged = model.lm_head(model.ln_f(x))
    for block in model.blocks:
        x = block(x)
    return model.lm_head(model.ln_f(x)), model.lm_head(x), unchanged


def test_logits_are_the_head_of_the_final_norm_of_the_blocks():
    model = make().eval()
    idx = torch.randint(0, 256, (2, 10))
    with torch.no_grad():
        logits = model(idx)[0]
        right, without_ln_f, without_blocks = forward_by_hand(model, idx)
    assert not torch.allclose(logits, without_ln_f, atol=1e-5), (
        "ln_f is skipped: the logits are lm_head(ln_f(x)) after the last block")
    why = (": the blocks' outputs are thrown away; keep each, x = block(x)"
           if torch.allclose(logits, without_blocks, atol=1e-5) else "")
    assert torch.allclose(logits, right, atol=1e-5), (
        "the logits are not lm_head(ln_f(blocks(drop(embed(idx))))), the blocks in order; they "
        f"differ by up to {(logits - right).abs().max().item():.2e}{why}")


def loss_seen():
    """The loss of a fresh model against the mean cross-entropy at each position:
    (loss, expected, what a difference shows, or "")."""
    model = make().eval()
    idx, targets = torch.randint(0, 256, (2, 10)), torch.randint(0, 256, (2, 10))
    with torch.no_grad():
        try:
            logits, loss = model(idx, targets)
        except (RuntimeError, ValueError) as err:
            if "target" not in str(err).lower() or "match idx shape" in str(err):
                raise
            raise AssertionError(
                f"cross_entropy refused the shapes ({err}): it reads dim 1 as the classes, so "
                "flatten the logits to (B·T, V) and the targets to (B·T,): logits.flatten(0, 1), "
                "targets.flatten()") from err
    flat = logits.flatten(0, 1)
    wrong = {
        "the targets are shifted again: targets[b, t] already is the token after idx[b, t] "
        "(get_batch's y), so score logits[:, t] against targets[:, t]":
            torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                              targets[:, 1:].flatten()),
        "the loss is summed over the positions: take the mean (cross_entropy's default)":
            torch.nn.functional.cross_entropy(flat, targets.flatten(), reduction="sum"),
    }
    said = [why for why, value in wrong.items() if torch.allclose(loss, value, atol=1e-5)]
    return (loss, torch.nn.functional.cross_entropy(flat, targets.flatten()),
            "".join(f": {why}" for why in said))


def test_the_loss_is_the_mean_cross_entropy_at_each_position():
    """targets[b, t] is the token after idx[b, t] (step 03's y): logits[b, t] is scored
    against it, at the same position."""
    loss, expected, why = loss_seen()
    assert torch.allclose(loss, expected, atol=1e-5), (
        f"the loss is {loss.item():.4f}, not the mean cross-entropy {expected.item():.4f} of "
        f"each position's logits against its target{why}")


def test_the_forward_checks_its_targets():
    model = make()
    idx = torch.randint(0, 256, (2, 8))
    with pytest.raises(ValueError, match=r"targets shape \(2, 7\) does not match idx shape"):
        model(idx, idx[:, :7])  # check_targets(idx, targets, vocab_size, ...) before the loss


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_parameter_counts_follow_the_formula(name):
    c = PRESETS[name]
    V, T, d, L = c.vocab_size, c.max_seq_len, c.d_model, c.n_layers
    model = GPT(c)
    non_embedding = L * (12 * d * d + 13 * d) + 2 * d
    blocks = sum(p.numel() for p in model.blocks.parameters())
    counted = (model.num_params(non_embedding=True), model.num_params())
    assert blocks == L * (12 * d * d + 13 * d), (
        f"the blocks hold {blocks:,} parameters, not n_layers · (12·d² + 13·d)"
        + (": the n_layers blocks are one Block repeated; build a new one for each layer"
           if len({id(b) for b in model.blocks}) < L else ""))
    assert counted[0] == non_embedding, (
        f"num_params(non_embedding=True) is {counted[0]:,}, not {non_embedding:,}: leave out "
        "embed's parameters, both tables")
    total = non_embedding + V * d + T * d  # the tied matrix counted once
    assert counted[1] == total, (
        f"num_params() is {counted[1]:,}, not {total:,}"
        + (": the tied matrix is counted twice; self.parameters() yields it once"
           if counted[1] == total + V * d else ""))


def test_the_model_is_causal():
    model = make().eval()
    idx = torch.randint(0, 256, (1, 12))
    changed = idx.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 256
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-5), (
        "changing tokens 8.. changed the logits at positions 0..7 by up to "
        f"{(a[:, :8] - b[:, :8]).abs().max().item():.2e}: a position sees later ones")
    assert not torch.allclose(a[:, 8:], b[:, 8:]), "changing tokens 8.. changed no logits there"


def test_targets_of_minus_one_are_ignored():
    try:
        loss, kept = ex08_gpt.exercise_5_ignore_index()
    except (IndexError, RuntimeError) as err:
        if "out of bounds" not in str(err) and "-1" not in str(err):
            raise
        raise AssertionError(f"a target of -1 broke the loss ({err}): pass ignore_index=-1 to "
                             "F.cross_entropy") from err
    why = loss_seen()[2] or ": targets of -1 count in the loss: pass ignore_index=-1 to " \
                            "F.cross_entropy"
    assert loss == pytest.approx(kept, abs=1e-6), f"exercise 5's two losses differ{why}"


def test_bad_idx_and_targets_are_refused_where_they_enter():
    model = make()
    idx = torch.randint(0, 256, (2, 8))
    with pytest.raises(ValueError, match=r"targets shape \(2, 7\) does not match idx shape"):
        check_targets(idx, idx[:, :7], 256)
    with pytest.raises(TypeError, match="targets must be integer token ids, got torch.float32"):
        check_targets(idx, idx.float(), 256)
    outside = torch.zeros(2, 8, dtype=torch.long)
    outside[1, 3] = 256
    with pytest.raises(ValueError, match=r"or -1 \(ignored\), got values from 0 to 256"):
        check_targets(idx, outside, 256)
    with pytest.raises(ValueError, match="token id 256 is outside the vocabulary"):
        check_ids(torch.full((1, 4), 256), 256, 64)
    with pytest.raises(ValueError, match="T=65 exceeds max_seq_len=64"):  # the forward's one check
        model(torch.zeros(1, 65, dtype=torch.long))


def test_a_tiny_gpt_memorises_one_batch_in_50_adam_steps():
    model = make()
    idx, targets = torch.randint(0, 256, (4, 32)), torch.randint(0, 256, (4, 32))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(50):
        _, loss = model(idx, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(256), abs=0.1), (
        f"the first loss is {losses[0]:.3f}, not near ln 256 = {math.log(256):.3f}")
    assert losses[-1] < 0.5, (  # random targets: only memorising them gets the loss this low
        f"after 50 Adam steps on one batch the loss is {losses[-1]:.3f}, not below 0.5 "
        f"(every 10th: {[round(v, 2) for v in losses[::10]]}): the gradient does not reach "
        "every weight, or the loss is not the model's")


def test_solutions():
    by_hand, counted = ex08_gpt.exercise_1_count_by_hand()
    assert by_hand == counted == 1_350_400, f"exercise 1: {by_hand:,} by hand, {counted:,} " \
                                            "counted; wanted 1,350,400"
    saved, share = ex08_gpt.exercise_2_tying_saves()
    assert saved == 4096 * 128 and 0.27 < share < 0.29, (
        f"exercise 2: saves {saved:,} ({share:.1%}); wanted 524,288 (28%)")
    losses = ex08_gpt.exercise_3_initial_loss()
    assert losses["uniform logits"] == pytest.approx(math.log(4096), abs=1e-4), (
        f"exercise 3: {losses}")
    assert abs(losses["init std 0.02"] - losses["ln V"]) < 0.1, f"exercise 3: {losses}"
    assert losses["embeddings std 1"] > 2 * losses["ln V"], f"exercise 3: {losses}"
    flops, head_share = ex08_gpt.exercise_4_flops_per_token()
    wanted = 6 * (4 * 12 * 128**2 + 4096 * 128) + 12 * 4 * 256 * 128
    assert flops["total"] == wanted, f"exercise 4: {flops}; wanted a total of {wanted:,}"
    assert 0.3 < head_share < 0.4, f"exercise 4: the head's share is {head_share:.1%}, not a third"
