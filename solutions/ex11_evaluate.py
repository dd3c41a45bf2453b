"""Solutions to the exercises of step 11 (steps/11-evaluate.md).

Run them:  uv run python -m solutions.ex11_evaluate
"""

import argparse
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tiny_llm.checkpoint import DEFAULT_MODEL_CLASS, build_model, model_from_checkpoint
from tiny_llm.data import load_meta, load_token_array
from tiny_llm.evaluate import bits_per_byte
from tiny_llm.paths import DATA_DIR
from tiny_llm.tokenize import load_tokenizer

WORDS = (" Lily", " Max", " dog", " happy", " ball", " said")  # in the sample and TinyStories


def exercise_1_perplexity(loss):
    """Perplexity is e^loss: a loss of ln 10 = 2.303 nats is as unsure as 10 equal choices."""
    return math.exp(loss)


def exercise_1_loss_for_perplexity(perplexity):
    """The other way: the loss at which the model is as unsure as `perplexity` equal choices."""
    return math.log(perplexity)


def exercise_2_uniform_bits_per_byte(vocab_size, tokens, n_bytes):
    """A model that gives every token 1/vocab_size pays log2(vocab_size) bits per token."""
    return bits_per_byte(math.log(vocab_size), tokens, n_bytes)


def exercise_3_compare_tokenizers():
    """Model A: 2.0 nats/token, 4 bytes/token. Model B: 1.6 nats/token, 3 bytes/token.

    B has the lower loss, but its tokens are shorter: per byte of text, A is better.
    Returns (bits per byte of A, of B).
    """
    return bits_per_byte(2.0, 1, 4), bits_per_byte(1.6, 1, 3)


def exercise_4_unigram_baseline(data_dir=DATA_DIR):
    """A model with no context at all: each token's probability is its share of train.bin
    (plus one, so no token has probability 0). Returns its (nats per token, bits per byte)
    on valid.bin; a trained GPT must do much better than this."""
    data_dir = Path(data_dir)
    meta = load_meta(data_dir)
    counts = np.bincount(load_token_array(data_dir / "train.bin"), minlength=meta["vocab_size"])
    log_probs = np.log((counts + 1) / (counts.sum() + len(counts)))
    valid = load_token_array(data_dir / "valid.bin")
    loss = float(-log_probs[valid[1:]].mean())  # the tokens a model is asked to predict
    return loss, bits_per_byte(loss, meta["valid"]["tokens"], meta["valid"]["bytes"])


def exercise_5_nearest_neighbours(model, tokenizer, words=WORDS, k=5):
    """The k tokens whose rows of the token table (the tied `head.weight`, one row per token)
    point most like each word's row, by cosine similarity, nearest first, the word left out.
    Each word must be one token, its leading space included. Returns {word: [(token, cos)]}."""
    table = F.normalize(model.lm_head.weight.detach().float(), dim=1)  # (V, C), rows of length 1
    found = {}
    for word in words:
        ids = tokenizer.encode(word).ids
        if len(ids) != 1:
            raise ValueError(f"{word!r} is {len(ids)} tokens in this tokenizer, not one")
        cos = table @ table[ids[0]]  # (V,): the cosine of every row with the word's row
        cos[ids[0]] = -math.inf  # not itself
        best = cos.topk(k)
        found[word] = [(tokenizer.decode([i]), round(c, 3))
                       for i, c in zip(best.indices.tolist(), best.values.tolist(), strict=True)]
    return found


def exercise_5_trained_and_untrained(checkpoint, data_dir=DATA_DIR, words=WORDS, k=5):
    """Nearest neighbours in a trained checkpoint and in an untrained model of the same
    configuration (seed 0): (trained, untrained), each as exercise_5_nearest_neighbours gives."""
    model, ckpt = model_from_checkpoint(checkpoint, data_dir=data_dir)
    tokenizer = load_tokenizer(Path(data_dir) / "tokenizer.json")
    torch.manual_seed(0)
    untrained = build_model(ckpt.get("model_class", DEFAULT_MODEL_CLASS), ckpt["config"]).eval()
    return (exercise_5_nearest_neighbours(model, tokenizer, words, k),
            exercise_5_nearest_neighbours(untrained, tokenizer, words, k))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Step 11's exercises.")
    parser.add_argument("--checkpoint", default="runs/tiny/ckpt.pt", help="for exercise 5")
    args = parser.parse_args()
    print("exercise 1:", f"loss 2.0 -> perplexity {exercise_1_perplexity(2.0):.2f}; "
          f"perplexity 10 -> loss {exercise_1_loss_for_perplexity(10):.3f}")
    print("exercise 2:", f"uniform over 4096 tokens at 4 bytes/token: "
          f"{exercise_2_uniform_bits_per_byte(4096, 1, 4):.2f} bits per byte")
    a, b = exercise_3_compare_tokenizers()
    print("exercise 3:", f"A {a:.3f} bits per byte, B {b:.3f}: A compresses better")
    loss, bpb = exercise_4_unigram_baseline()
    print("exercise 4:", f"unigram baseline {loss:.3f} nats per token, {bpb:.3f} bits per byte")
    if Path(args.checkpoint).is_file():
        trained, untrained = exercise_5_trained_and_untrained(args.checkpoint)
        for name, found in (("trained", trained), ("untrained twin of", untrained)):
            print(f"exercise 5: {name} {args.checkpoint}")
            for word, near in found.items():
                print(f"  {word!r:9} " + "  ".join(f"{t!r} {c:.2f}" for t, c in near))
    else:
        print(f"exercise 5: no checkpoint at {args.checkpoint}: train one (step 10) or name one")
