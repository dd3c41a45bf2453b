"""Step 18's table: how often a story does what was asked, and what it costs in bits per byte.

    uv run python scripts/measure_reward.py --data-dir DIR --n 100 \\
        base=runs/cpu/ckpt.pt shared=runs/shared/ckpt.pt \\
        finetuned=runs/requests/ckpt.pt reward=runs/reward/ckpt.pt

For each checkpoint, on N held-out requests (read off the validation stories, never trained on)
and N free requests (a noun, a verb and an adjective from FREE_WORDS below, none of them among
COMMON_WORDS, which step 18's run asks for): the share of requested words used, the share of
stories with every word, sentence inclusion, the share of stories with quoted speech when
Dialogue was asked and when it was not, bits per byte on the plain validation stories, and on
the free requests the share of words used inside a sentence (step 18's in_a_sentence: not in a
pile, not over and over), the stories with all three so, step 11's key-free grades (repeated
4-grams, distinct-2) and step 18's reward. The
first checkpoint is also prompted with "Once upon a time" (the chance rate). --boost S adds
a row for each checkpoint with the sampler steered by step 18's WordBoost of strength S (the
same model; only the sampling changes). --stories FILE keeps every story; --json FILE the
table's numbers.
"""

import argparse
import json
import random
import re
from pathlib import Path

import torch

from tiny_llm.checkpoint import model_from_checkpoint
from tiny_llm.data import load_token_array
from tiny_llm.evaluate import bits_per_byte, story_grades
from tiny_llm.generate import DEFAULTS, complete
from tiny_llm.instruct import derived_records, measure, render_request
from tiny_llm.kvcache import fresh_cache
from tiny_llm.loss import evaluate_loss
from tiny_llm.prepared import load_meta
from tiny_llm.request_data import COMMON_WORDS, in_a_sentence, score_story, uses_word
from tiny_llm.reward import WordBoost, reward
from tiny_llm.tokenize import load_tokenizer

# Common words of children's stories that COMMON_WORDS does not hold, several of them rarer in
# TinyStories than any of COMMON_WORDS (kite, carrot, beach): a request no run was trained on.
FREE_WORDS = {
    "noun": ("kite", "carrot", "beach", "bread", "chair", "cloud", "cookie", "drum", "duck",
             "farm", "frog", "hill", "lamp", "leaf", "milk", "pond", "rabbit", "rock", "shell",
             "snow", "star", "train", "truck", "window", "horse", "bear", "bus", "sock"),
    "verb": ("climb", "dance", "draw", "dig", "fly", "hide", "kick", "laugh", "paint", "swim",
             "throw", "wash", "bake", "build", "catch", "push"),
    "adjective": ("soft", "loud", "tall", "tiny", "warm", "cold", "green", "yellow", "quiet",
                  "funny", "sleepy", "wet", "round", "fast", "hungry"),
}
assert not set().union(*FREE_WORDS.values()) & set(COMMON_WORDS)
QUOTES = re.compile(r"\"[^\"]+\"")


def free_requests(n, seed=0):
    """n requests of a noun, a verb and an adjective from FREE_WORDS, nothing else."""
    rng = random.Random(f"free-words:{seed}")
    return [{"words": tuple(rng.choice(FREE_WORDS[k]) for k in FREE_WORDS), "features": (),
             "sentence": None, "summary": None} for _ in range(n)]


def boosted(model, tokenizer, requests, max_new_tokens, seed, strength):
    """instruct.measure's numbers and stories, the sampler steered by a WordBoost."""
    generator, cache = torch.Generator().manual_seed(seed), fresh_cache(model)
    scores, stories = [], []
    for request in requests:
        prompt = render_request(**request)
        steer = WordBoost(tokenizer, request["words"], strength, len(tokenizer.encode(prompt).ids))
        story = complete(model, tokenizer, prompt, max_new_tokens, generator, cache=cache,
                         steer=steer, **DEFAULTS)[len(prompt):]
        scores.append(score_story(request, story))
        stories.append(story)
    means = {k: [s[k] for s in scores if s[k] is not None] for k in scores[0]}
    return {k: sum(v) / len(v) if v else None for k, v in means.items()}, stories


def table_row(requests, stories):
    """The table's numbers for one set of requests and the stories written for them."""
    pairs = list(zip(requests, stories, strict=True))
    every = [all(uses_word(s, w) for w in r["words"]) for r, s in pairs]
    in_sentence = [[in_a_sentence(s, w, r["words"]) for w in r["words"]] for r, s in pairs]
    grades = [story_grades(s) for s in stories]
    asked = [bool(QUOTES.search(s)) for r, s in zip(requests, stories, strict=True)
             if "Dialogue" in r["features"]]
    unasked = [bool(QUOTES.search(s)) for r, s in zip(requests, stories, strict=True)
               if "Dialogue" not in r["features"]]
    share = lambda flags: sum(flags) / len(flags) if flags else None  # noqa: E731
    return {"all_words": share(every), "quotes_asked": share(asked),
            "quotes_unasked": share(unasked),
            "in_sentence": share([x for row in in_sentence for x in row]),
            "all_in_sentence": share([all(row) for row in in_sentence]),
            "repeated_4grams": share([g["repeated 4-grams"] for g in grades]),
            "distinct_2": share([g["distinct-2"] for g in grades]),
            "reward": share([reward(r, s) for r, s in pairs])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="name=checkpoint, the first one the base model")
    parser.add_argument("--data-dir", type=Path, required=True)
    for flag, kind, default in [("--n", int, 100), ("--max-new-tokens", int, 150),
                                ("--seed", int, 0), ("--stories", Path, None),
                                ("--boost", float, 0.0),
                                ("--json", Path, None)]:  # --stories, --json: files to write
        parser.add_argument(flag, type=kind, default=default)
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.data_dir / "tokenizer.json")
    valid = load_token_array(args.data_dir / "valid.bin")
    meta = load_meta(args.data_dir)
    held_out = [r for r, _ in derived_records(valid, tokenizer, 128, seed=12345)[: args.n]]
    free = free_requests(args.n, args.seed)
    head = ("held words", "held all 3", "sentence", "quotes asked", "quotes unasked",
            "free words", "free all 3", "in a sentence", "all 3 so", "rep 4-grams",
            "distinct-2", "reward", "bits/byte")
    print(f"{'model':<24} " + " ".join(f"{h:>14}" for h in head))
    kept, numbers = {}, {}
    for i, (name, path) in enumerate(run.split("=", 1) for run in args.runs):
        model, _ = model_from_checkpoint(path, data_dir=args.data_dir)
        loss = evaluate_loss(model, valid)["loss"]
        bpb = bits_per_byte(loss, meta["valid"]["tokens"], meta["valid"]["bytes"])
        rows = [("chance", True)] * (i == 0) + [("request", False)]
        for label, plain in rows + [(f"boost {args.boost:g}", None)] * (args.boost > 0):
            if plain is None:  # the same model, the sampler steered towards the words
                held, s1 = boosted(model, tokenizer, held_out, args.max_new_tokens, args.seed,
                                   args.boost)
                freed, s2 = boosted(model, tokenizer, free, args.max_new_tokens, args.seed,
                                    args.boost)
            else:
                held, s1 = measure(model, tokenizer, held_out, args.max_new_tokens, args.seed,
                                   plain)
                freed, s2 = measure(model, tokenizer, free, args.max_new_tokens, args.seed,
                                    plain)
            row = {"held_words": held["words"], **{f"held_{k}": v for k, v in
                                                   table_row(held_out, s1).items()},
                   "sentence": held["sentence"], "free_words": freed["words"],
                   **{f"free_{k}": v for k, v in table_row(free, s2).items()},
                   "bits_per_byte": bpb}
            numbers[f"{name}, {label}"] = row
            kept[f"{name}, {label}"] = {"held_out": list(zip(held_out, s1, strict=True)),
                                        "free": list(zip(free, s2, strict=True))}
            cells = [row["held_words"], row["held_all_words"], row["sentence"],
                     row["held_quotes_asked"], row["held_quotes_unasked"], row["free_words"],
                     row["free_all_words"], row["free_in_sentence"], row["free_all_in_sentence"],
                     row["free_repeated_4grams"], row["free_distinct_2"], row["free_reward"]]
            print(f"{name + ', ' + label:<24} "
                  + " ".join(f"{c:>14.1%}" if c is not None else f"{'-':>14}" for c in cells)
                  + f" {bpb:>14.4f}", flush=True)
    if args.stories:
        args.stories.write_text(json.dumps(kept, indent=1))
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=1))


if __name__ == "__main__":
    main()
