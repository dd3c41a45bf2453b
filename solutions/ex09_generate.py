"""Solutions to the exercises of step 09 (steps/09-generate.md).

Run them:  uv run python -m solutions.ex09_generate
"""

import math

import torch

from tiny_llm.generate import next_token_probs, top_p_filter
from tiny_llm.gpt import GPT, PRESETS


def exercise_1_top_p_by_hand(probs=(0.4, 0.3, 0.2, 0.1), ps=(0.3, 0.5, 0.75, 0.95)):
    """By hand: walk down the sorted list adding probabilities until the sum reaches p.

    0.3: 0.4 already reaches it -> [0].   0.5: 0.4 + 0.3 = 0.7 -> [0, 1].
    0.75: 0.7 + 0.2 = 0.9 -> [0, 1, 2].   0.95: only all four (1.0) reach it -> [0, 1, 2, 3].
    The code agrees:
    """
    logits = torch.tensor([probs]).log()
    return {p: torch.nonzero(next_token_probs(logits, top_p=p)[0]).flatten().tolist() for p in ps}


def exercise_2_entropy_by_temperature(logits=(2.0, 1.0, 0.5, 0.0, -1.0),
                                      temperatures=(0.25, 0.5, 1.0, 2.0, 4.0)):
    """Entropy (nats) of the distribution at each temperature: it grows towards ln(5) = 1.609
    (uniform) as the temperature rises, and falls towards 0 (greedy) as it drops."""
    logits = torch.tensor([logits])
    entropies = {}
    for t in temperatures:
        p = next_token_probs(logits, temperature=t)[0]
        entropies[t] = -(p * p.log()).sum().item()
    return entropies


def loop_top_p(probs, top_p):
    """Top-p with a plain loop: the set of kept token ids for one row of probabilities."""
    kept, mass = [], 0.0
    for i in sorted(range(len(probs)), key=lambda i: -probs[i]):
        kept.append(i)
        mass += probs[i]
        if mass >= top_p:
            break
    return sorted(kept)


def exercise_3_loop_top_p_matches(trials=200, vocab_size=20):
    """The loop and the sort-and-cumsum version keep the same tokens on random distributions."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(trials):
        logits = 3 * torch.randn(1, vocab_size, generator=generator, dtype=torch.float64)
        top_p = torch.rand(1, generator=generator).item()
        probs = torch.softmax(logits, dim=-1)[0].tolist()
        fast = torch.nonzero(torch.isfinite(top_p_filter(logits, top_p))[0]).flatten().tolist()
        if fast != loop_top_p(probs, top_p):
            return False
    return True


@torch.no_grad()
def exercise_4_untrained_greedy_repeats(n_tokens=500, seed=0):
    """How often an untrained GPT's most likely next token is the token it was just given.

    The head is the token embedding (tied), so the logit of token v is roughly the dot product
    of the input's vector with v's own vector, and the input token matches itself best: greedy
    decoding of an untrained model repeats its prompt's last token.
    """
    torch.manual_seed(seed)
    model = GPT(PRESETS["tiny"]).eval()
    ids = torch.randint(0, model.config.vocab_size, (n_tokens, 1))  # n one-token prompts
    predicted = model(ids)[0][:, -1, :].argmax(dim=-1)
    return (predicted == ids[:, 0]).float().mean().item()


if __name__ == "__main__":
    print("exercise 1:", exercise_1_top_p_by_hand())
    for t, h in exercise_2_entropy_by_temperature().items():
        print("exercise 2:", f"temperature {t:<5} entropy {h:.3f} nats (ln 5 = {math.log(5):.3f})")
    print("exercise 3:", "loop and vectorised top-p agree:", exercise_3_loop_top_p_matches())
    repeats = exercise_4_untrained_greedy_repeats()
    print("exercise 4:", f"untrained greedy repeats its input {repeats:.0%} of the time")
