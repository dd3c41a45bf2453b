"""Solutions to the exercises of step 18 (steps/18-reward.md).

Run them:  uv run python -m solutions.ex18_reward   (seconds, no data needed)
"""

import torch

from tiny_llm.request_data import score_story
from tiny_llm.reward import advantages, reward


def exercise_1_population_or_sample(group_size=2):
    """How much larger the advantages are when the spread is the group's own standard deviation
    (divide by G) than a sample's (divide by G - 1): sqrt(G / (G - 1)), 1.414 for a pair."""
    rewards = torch.zeros(1, group_size)
    rewards[0, 0] = 1.0
    sample = (rewards - rewards.mean()) / rewards.std(correction=1)
    return (advantages(rewards)[0, 0] / sample[0, 0]).item()


def exercise_2_groups_that_agree(p=0.1, sizes=(4, 16), trials=4000, seed=0):
    """A story gets reward 1 with probability p, else 0. The share of groups whose stories all
    agree (advantage 0 everywhere: nothing learned), measured and by formula p^G + (1 - p)^G,
    for each group size."""
    generator = torch.Generator().manual_seed(seed)
    found = []
    for g in sizes:
        rewards = (torch.rand(trials, g, generator=generator) < p).float()
        measured = (advantages(rewards) == 0).all(dim=1).float().mean().item()
        found.append((measured, p**g + (1 - p) ** g))
    return found


def exercise_3_a_list_of_the_words():
    """'Dog moon brave.' scored by step 17's word count (every word there: 1.0) and by the
    reward (no sentence uses them, and the only sentence is a pile: 0.0), and the shortest
    story found that the reward gives 1.0: each word inside a sentence of 7 words, of which
    fewer than half are the asked-for words. Returns (word count, reward, that story)."""
    request = {"words": ("dog", "moon", "brave"), "features": (), "sentence": None,
               "summary": None}
    shortest = "The brave dog looked at the moon."
    assert reward(request, shortest) == 1.0
    story = "Dog moon brave."
    return score_story(request, story)["words"], reward(request, story), shortest


if __name__ == "__main__":
    print(f"exercise 1  population over sample advantages, a pair: "
          f"{exercise_1_population_or_sample():.3f}")
    for g, (measured, formula) in zip((4, 16), exercise_2_groups_that_agree(), strict=True):
        print(f"exercise 2  groups of {g:>2} that agree: {measured:.3f} (formula {formula:.3f})")
    print(f"exercise 3  a list of the words: reward {exercise_3_a_list_of_the_words()}")
