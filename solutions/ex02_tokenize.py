"""Solutions to the exercises of step 02 (steps/02-tokenize.md).

Run them:  uv run python -m solutions.ex02_tokenize
"""

from tiny_llm.bpe import BytePairEncoder, pretokenize
from tiny_llm.sample_stories import generate_stories
from tiny_llm.tokenize import EOT, TOY_TEXT, bytes_per_token, train_tokenizer


def exercise_1_merges_to_one_token(text="aaabdaaabac"):
    """Merges until `text` is one token. Each merge shortens the ids by at least one, so at most
    len(bytes) - 1; 'aaabdaaabac' needs 7, not 10: the first three merges each apply twice."""
    bpe = BytePairEncoder().train(text, vocab_size=256 + 1000)  # more room than it can use
    assert len(bpe.encode(text)) == 1
    return len(bpe.merges)


def exercise_2_unseen_characters(text="naïve 🐉"):
    """Characters never seen in training fall back to their UTF-8 bytes: 'ï' is 2 tokens, the
    dragon 4. Cutting the last byte off breaks the dragon, and decode shows '\ufffd' for it."""
    bpe = BytePairEncoder().train(TOY_TEXT, vocab_size=256 + 40)
    ids = bpe.encode(text)
    dragon = bpe.encode("🐉")
    return ids, dragon, bpe.decode(ids), bpe.decode(ids[:-1])


def exercise_3_pre_tokens(text="I don't know. I DON'T know!  It's 2024", n_train=30):
    """GPT-2's pattern: contractions ("'t", "'s") first, then a space with letters, digits or
    other symbols, then white space. It only knows lower-case contractions, so "DON'T" becomes
    ' DON', "'", 'T'. Two spaces: the first is a piece, the second goes with 'It'.
    Trained without the pattern, BPE learns tokens spanning several pre-tokens; with it, none."""
    pieces = pretokenize(text)
    stories = "\n".join(generate_stories(n_train, seed=0))
    spanning = {}
    for name, pattern in [("without", None), ("with", "gpt2")]:
        bpe = BytePairEncoder() if pattern else BytePairEncoder(pattern=None)
        bpe.train(stories, vocab_size=256 + 100)
        tokens = [bpe.vocab[i].decode("utf-8", "replace") for i in bpe.merges.values()]
        spanning[name] = [t for t in tokens if len(pretokenize(t)) > 1]
    return pieces, spanning


def exercise_4_special_tokens(n_train=200):
    """With EOT as a special token it is cut out before pre-tokenizing: never counted, never
    merged, one id. Without, '<|endoftext|>' is ordinary text that occurs between every two
    stories, so BPE spends merges on its pieces and still needs several tokens for it."""
    stories = list(generate_stories(n_train, seed=0))
    text, in_stories = EOT.join(stories), "\n".join(stories).encode("utf-8")
    result = {}
    for name, specials in [("special", [EOT]), ("plain text", [])]:
        bpe = BytePairEncoder(specials).train(text, vocab_size=400)
        merged = [bpe.vocab[i] for i in bpe.merges.values()]
        from_eot = [t for t in merged if t in EOT.encode() and t not in in_stories]
        result[name] = (bpe.encode("The end." + EOT)[-3:], len(bpe.encode(EOT)), from_eot)
    return result


def exercise_5_bytes_per_token_by_vocab(vocab_sizes=(500, 1000), n_train=2000, n_test=200):
    """A bigger vocabulary packs more bytes into each token: fewer, longer tokens per story."""
    train = list(generate_stories(n_train, seed=0))
    test = list(generate_stories(n_test, seed=1))  # stories the tokenizers did not train on
    result = {}
    for vocab_size in vocab_sizes:
        tokenizer = train_tokenizer(train, vocab_size=vocab_size)
        ids = [e.ids for e in tokenizer.encode_batch(test)]
        result[vocab_size] = round(bytes_per_token(test, ids), 2)
    return result


def exercise_6_vocab_saturates(n_train=2000):
    """Asked for 4,096 tokens, the sample corpus stops near 1,300: merges never cross the word
    boundaries of the pre-tokenizer, and once every distinct word of this small corpus is one
    token there is no pair left to merge. TinyStories has far more distinct words."""
    tokenizer = train_tokenizer(generate_stories(n_train, seed=0), vocab_size=4096)
    return tokenizer.get_vocab_size()


def exercise_7_eot_is_always_zero():
    """EOT is the trainer's only special token and special tokens get ids before the bytes and
    the merges, so it is id 0 whatever the corpus or vocab size. The data files, the model and
    generate(eot_id=0) can rely on that without looking it up."""
    ids = []
    for seed, vocab_size in [(0, 300), (1, 1000), (2, 4096)]:
        tokenizer = train_tokenizer(generate_stories(200, seed=seed), vocab_size=vocab_size)
        ids.append(tokenizer.token_to_id(EOT))
    story_end = tokenizer.encode("The end." + EOT).ids[-1]
    return ids, story_end


if __name__ == "__main__":
    print("exercise 1:", exercise_1_merges_to_one_token(), "merges make 'aaabdaaabac' one token")
    ids, dragon, whole, cut = exercise_2_unseen_characters()
    print("exercise 2:", f"{ids} ({len(dragon)} for the dragon), {whole!r}, cut: {cut!r}")
    pieces, spanning = exercise_3_pre_tokens()
    print("exercise 3:", pieces)
    for name, tokens in spanning.items():
        print("exercise 3:", f"{name} the pattern, {len(tokens)} tokens span pre-tokens:",
              tokens[:6])
    for name, (ids, n_eot, from_eot) in exercise_4_special_tokens().items():
        print("exercise 4:", f"EOT as {name}: ends in {ids}, EOT is {n_eot} token(s), "
              f"merges only EOT needs: {from_eot}")
    for vocab_size, bpt in exercise_5_bytes_per_token_by_vocab().items():
        print("exercise 5:", f"vocab {vocab_size:<5} {bpt:.2f} bytes per token")
    print("exercise 6:", f"asked for 4,096, got {exercise_6_vocab_saturates():,} tokens")
    print("exercise 7:", "EOT ids", *exercise_7_eot_is_always_zero())
