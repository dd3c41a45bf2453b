import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from solutions import ex09_generate
from tiny_llm.generate import (
    complete,
    generate,
    next_token_probs,
    plot_sampling,
    top_k_filter,
    top_p_filter,
)
from tiny_llm.gpt import GPT, GPTConfig


class FixedLogits(nn.Module):
    """A stand-in model: the same next-token logits at every position; records input lengths."""

    def __init__(self, logits, max_seq_len=8):
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits), requires_grad=False)
        self.config = SimpleNamespace(max_seq_len=max_seq_len, vocab_size=len(logits))
        self.seen_lengths = []

    def forward(self, idx, targets=None):
        self.seen_lengths.append(idx.shape[1])
        B, T = idx.shape
        return self.logits.expand(B, T, -1), None


def tiny_gpt(seed=0, max_seq_len=16):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=50, max_seq_len=max_seq_len, d_model=16, n_layers=1,
                         n_heads=2)).eval()


def test_top_k_never_samples_outside_the_k_largest():
    torch.manual_seed(0)
    logits = torch.randn(1, 100)
    allowed = set(torch.topk(logits, 5).indices[0].tolist())
    probs = next_token_probs(logits, top_k=5)
    generator = torch.Generator().manual_seed(1)
    draws = torch.multinomial(probs, 2000, replacement=True, generator=generator)
    outside = sorted(set(draws[0].tolist()) - allowed)
    smallest = set(torch.topk(logits, 5, largest=False).indices[0].tolist())
    assert not outside, (
        f"top_k=5 drew tokens {outside[:8]}, outside the 5 largest logits {sorted(allowed)}"
        + (": it keeps the 5 smallest; torch.topk gives the largest unless told otherwise"
           if set(torch.nonzero(probs[0]).flatten().tolist()) == smallest else ""))
    kept = int((probs > 0).sum())
    assert kept == 5, f"top_k=5 left {kept} tokens with a probability above 0, not 5"
    total = probs.sum().item()
    assert math.isclose(total, 1.0, rel_tol=1e-6), f"the probabilities sum to {total}, not 1"


def test_top_k_keeps_exactly_k_even_with_ties_and_clamps_to_the_vocabulary():
    distinct = int(torch.isfinite(top_k_filter(torch.tensor([[3.0, 2.0, 1.0, 0.0]]), 2)).sum())
    assert distinct == 2, f"top_k_filter([[3, 2, 1, 0]], 2) kept {distinct} tokens, not 2" + (
        ": one token too many; torch.topk(logits, top_k), not top_k + 1" if distinct == 3 else "")
    logits = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    kept = int(torch.isfinite(top_k_filter(logits, 2)).sum())
    assert kept == 2, f"top_k_filter([[1, 1, 1, 0]], 2) kept {kept} tokens, not 2" + (
        ": a comparison with the k-th largest value keeps every tie; keep the k indices that "
        "torch.topk gives" if kept > 2 else "")
    try:
        wide = top_k_filter(logits, 10)
    except RuntimeError as err:
        raise AssertionError(f"top_k=10 on 4 tokens failed ({err}): clamp top_k to "
                             "logits.shape[-1] first, so a top_k above V keeps every token"
                             ) from err
    assert torch.equal(wide, logits), "top_k=10 on 4 tokens must keep all 4 as they are"


@pytest.mark.parametrize("top_p, kept", [(0.5, [0]), (0.75, [0, 1]), (0.76, [0, 1, 2]),
                                         (1.0, [0, 1, 2, 3]), (1e-9, [0])])
def test_top_p_keeps_the_smallest_set_whose_mass_reaches_p(top_p, kept):
    # probabilities 0.5, 0.25, 0.125, 0.125 are exact in binary, so the edges are sharp
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.125]]).log()
    probs = next_token_probs(logits, top_p=top_p)
    got = torch.nonzero(probs[0]).flatten().tolist()
    hint = (": every token was dropped, so the softmax gives NaN; the most likely token always "
            "stays, as a token stays while the mass of the tokens ranked above it (cumsum - "
            "probs) is below top_p" if probs.isnan().any() else
            ": the token that makes the mass reach top_p is dropped; a token stays while the "
            "mass of the tokens ranked above it (cumsum - probs) is below top_p"
            if len(got) < len(kept) else
            ": one token too many; drop a token once the mass above it reaches top_p (>=)"
            if len(got) > len(kept) else "")
    assert got == kept, f"top_p={top_p} on probabilities [0.5, 0.25, 0.125, 0.125] kept " \
                        f"tokens {got}, not {kept}{hint}"
    total = probs.sum().item()
    assert math.isclose(total, 1.0, rel_tol=1e-6), f"the kept probabilities sum to {total}, not 1"


def test_top_p_works_on_unsorted_logits_row_by_row():
    logits = torch.tensor([[0.0, 3.0, 1.0], [3.0, 0.0, 1.0]])
    kept = torch.isfinite(top_p_filter(logits, 0.9))  # probabilities 0.84, 0.11, 0.04
    hint = (": the kept logits come back in sorted order; scatter them back to their tokens "
            "with the sort's indices" if kept.tolist() == [[True, True, False]] * 2 else "")
    assert kept.tolist() == [[False, True, True], [True, False, True]], (
        f"top_p_filter kept {kept.tolist()}{hint}")


def test_temperature_zero_is_argmax():
    model = FixedLogits([0.1, 2.0, 1.9, -1.0])
    out = generate(model, torch.tensor([[0]]), 5, temperature=0, eot_id=None)
    assert out[0, 1:].tolist() == [1] * 5, (
        f"temperature 0 wrote {out[0, 1:].tolist()}, not token 1 (the argmax) five times")


class LastPositionKnows(FixedLogits):
    """A stand-in model whose last position alone prefers token 2; every other prefers 1."""

    def forward(self, idx, targets=None):
        logits, _ = super().forward(idx)
        logits = logits.clone()
        logits[:, -1] = torch.tensor([0.0, 0.0, 5.0])
        return logits, None


def test_the_next_token_comes_from_the_last_position():
    out = generate(LastPositionKnows([0.0, 5.0, 0.0]), torch.tensor([[0, 0, 0]]), 2,
                   temperature=0, eot_id=None)
    assert out[0, 3:].tolist() == [2, 2], (
        f"greedy wrote {out[0, 3:].tolist()}, not [2, 2]"
        + (": the token came from another position's logits; only the last position predicts "
           "the next token, logits[:, -1, :]" if 1 in out[0, 3:].tolist() else ""))


def test_low_temperature_sharpens_and_high_temperature_flattens():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    sums = [next_token_probs(logits, temperature=t).sum().item() for t in (0.5, 1.0, 2.0)]
    assert all(math.isclose(v, 1.0, rel_tol=1e-5) for v in sums), (
        f"at temperatures 0.5, 1, 2 the probabilities sum to {[round(v, 4) for v in sums]}, not "
        "1: the temperature divides the logits before the softmax, not the probabilities after")
    top = [next_token_probs(logits, temperature=t)[0, 0].item() for t in (0.5, 1.0, 2.0)]
    hint = (": divide the logits by the temperature, do not multiply them"
            if top[0] < top[1] < top[2] else "")
    assert top[0] > top[1] > top[2] > 1 / 3, (
        f"the top token's probability at temperatures 0.5, 1, 2 is {top}: it should fall{hint}")


def test_the_same_seed_gives_the_same_text():
    model = tiny_gpt()
    prompt = torch.tensor([[1, 2, 3]])
    runs = [generate(model, prompt, 20, generator=torch.Generator().manual_seed(s), eot_id=None)
            for s in (7, 7, 8)]
    assert torch.equal(runs[0], runs[1]), (
        f"seed 7 wrote {runs[0][0, 3:].tolist()} and then {runs[1][0, 3:].tolist()}: draw with "
        "torch.multinomial(..., generator=generator)")
    assert not torch.equal(runs[0], runs[2]), "seeds 7 and 8 wrote the same text"


def test_generation_stops_after_the_eot_token():
    model = FixedLogits([10.0, 0.0, 0.0])  # id 0, the EOT, is by far the most likely
    out = generate(model, torch.tensor([[1, 2]]), 10, generator=torch.Generator().manual_seed(0))
    hint = {(1, 2): ": it stopped before appending eot_id; append it, then stop"}.get(
        tuple(out[0].tolist()), ": stop after appending eot_id" if out.shape[1] > 3 else "")
    assert out.tolist() == [[1, 2, 0]], f"generate gave {out.tolist()}{hint}"
    longer = generate(model, torch.tensor([[1, 2]]), 10, temperature=0, eot_id=None)
    assert longer.shape == (1, 12), (
        f"with eot_id=None generate gave {tuple(longer.shape)}, not (1, 12): never stop early")


def test_context_is_cropped_to_max_seq_len():
    model = FixedLogits([0.0, 1.0], max_seq_len=8)
    out = generate(model, torch.ones(1, 20, dtype=torch.long), 5, temperature=0, eot_id=None)
    assert out.shape == (1, 25), (
        f"5 new tokens after 20 gave {tuple(out.shape)}, not (1, 25): crop what the model reads, "
        "not the text you return")
    assert max(model.seen_lengths) == 8, (
        f"the model was fed {max(model.seen_lengths)} tokens, more than max_seq_len=8: feed "
        "only the last max_seq_len tokens, idx[:, -max_seq_len:]")
    gpt = tiny_gpt(max_seq_len=8)  # a real GPT refuses T > 8, so cropping is what makes this work
    shape = tuple(generate(gpt, torch.tensor([[1, 2, 3]]), 12, eot_id=None).shape)
    assert shape == (1, 15), f"a GPT of max_seq_len 8 wrote {shape}, not (1, 15)"


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -1.0}, "temperature must be a number >= 0"),
    ({"temperature": float("nan")}, "temperature must be a number >= 0"),
    ({"top_k": 0}, "top_k must be a positive int"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"max_new_tokens": -1}, "max_new_tokens must be an int >= 0"),
])
def test_bad_sampling_settings_are_refused(kwargs, match):
    args = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate(tiny_gpt(), torch.tensor([[1]]), **args)


def test_prompt_must_be_one_row_of_ids():
    with pytest.raises(ValueError, match=r"\((1|B), T\) tensor.*got \(3,\)"):  # B: step 18
        generate(tiny_gpt(), torch.tensor([1, 2, 3]), 2)
    with pytest.raises(ValueError, match=r"got \(1, 0\).*\[\[eot_id\]\]"):
        generate(tiny_gpt(), torch.zeros(1, 0, dtype=torch.long), 2)
    vocab_size = tiny_gpt().config.vocab_size
    with pytest.raises(ValueError, match=f"token id {vocab_size} is outside the vocabulary"):
        generate(tiny_gpt(), torch.tensor([[1, vocab_size]]), 2)  # checked once, not every step


def test_complete_starts_an_empty_prompt_from_eot():
    class Chars:
        def encode(self, text):
            return SimpleNamespace(ids=[ord(c) - 96 for c in text])

        def decode(self, ids):
            return "".join(chr(i + 96) for i in ids if i)

        def token_to_id(self, token):
            return 0  # <|endoftext|>, as in every tokenizer the course trains

    text = complete(FixedLogits([0.0, 0.0, 5.0]), Chars(), "", 3, temperature=0, eot_id=None)
    assert text == "bbb", f"complete wrote {text!r}, not 'bbb'"  # the leading EOT decodes to ''


def test_plot_sampling_writes_a_png(tmp_path):
    plot_sampling(tmp_path / "sampling.png")
    head = (tmp_path / "sampling.png").read_bytes()[:4]
    assert head == b"\x89PNG", f"sampling.png starts with {head!r}, not a PNG's signature"


def test_solutions():
    kept = ex09_generate.exercise_1_top_p_by_hand()
    wanted = {0.3: [0], 0.5: [0, 1], 0.75: [0, 1, 2], 0.95: [0, 1, 2, 3]}
    assert kept == wanted, f"exercise 1 kept {kept}, not {wanted}"
    entropies = ex09_generate.exercise_2_entropy_by_temperature()
    values = list(entropies.values())
    assert list(entropies) == [0.25, 0.5, 1.0, 2.0, 4.0] and values == sorted(values) and (
        values[-1] < math.log(5) + 1e-9), (
        f"exercise 2: {entropies}: entropy rises with the temperature, below ln 5")
    assert ex09_generate.exercise_3_loop_top_p_matches(trials=50), (
        "exercise 3: the loop's top-p kept other tokens than top_p_filter")
    share = ex09_generate.exercise_4_untrained_greedy_repeats()
    assert share > 0.5, f"exercise 4: {share:.2f} of greedy picks repeat, not most (chance: 1/4096)"
