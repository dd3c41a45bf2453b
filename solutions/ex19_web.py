"""Solutions to the exercises of step 19 (steps/19-web.md).

Run them:  uv run python -m solutions.ex19_web   (a minute: one export to ONNX, no data needed)
"""

import tempfile
from collections import Counter
from pathlib import Path

import torch
from tokenizers import pre_tokenizers

from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.web import export_onnx, onnx_logits, quantize_int8, session


def small_model(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=512, max_seq_len=32, d_model=64, n_layers=2, n_heads=2)).eval()


def exercise_1_what_the_graph_holds(model, onnx_file):
    """The graph's five most common operators, and how many numbers its initializers (the
    weights stored in the file) hold against model.num_params(): the tied embedding is stored
    once if they are equal."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(onnx_file).graph
    ops = Counter(node.op_type for node in graph.node).most_common(5)
    stored = sum(numpy_helper.to_array(t).size for t in graph.initializer)
    return ops, stored, model.num_params()


def exercise_2_int8_against_float(model, onnx_file, tokens=50):
    """Quantise to int8; return (largest |logit difference| against float32 on a full window,
    how many of `tokens` greedy tokens from token 1 agree with the float model's)."""
    M = model.config.max_seq_len
    int8_file = Path(onnx_file).with_name("int8.onnx")
    exact, small = session(onnx_file), session(quantize_int8(onnx_file, int8_file))
    ids = torch.randint(0, model.config.vocab_size, (1, M), generator=torch.Generator()
                        .manual_seed(0))
    gap = (onnx_logits(exact, ids) - onnx_logits(small, ids)).abs().max().item()
    runs = []
    for sess in (exact, small):
        out = [1]
        for _ in range(tokens):
            out.append(int(onnx_logits(sess, [out[-M:]])[0].argmax()))
        runs.append(out[1:])
    return gap, sum(a == b for a, b in zip(*runs, strict=True))


def exercise_3_byte_alphabet():
    """GPT-2's byte alphabet written out: bytes 33-126, 161-172 and 174-255 stand for
    themselves, the other 68 move to 256 and up. Returns (how many characters, whether the set
    equals tokenizers' ByteLevel.alphabet(), the character for a space, for a newline)."""
    kept = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = {b: chr(b) for b in kept}
    moved = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + moved)
            moved += 1
    same = set(chars.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    return len(chars), same, chars[ord(" ")], chars[ord("\n")]


if __name__ == "__main__":
    model = small_model()
    with tempfile.TemporaryDirectory() as folder:
        onnx_file = export_onnx(model, Path(folder) / "model.onnx")
        ops, stored, params = exercise_1_what_the_graph_holds(model, onnx_file)
        print(f"exercise 1  most common operators {ops}; {stored:,} numbers stored, "
              f"{params:,} parameters")
        gap, agree = exercise_2_int8_against_float(model, onnx_file)
        print(f"exercise 2  int8 against float32: logits differ by up to {gap:.3f}; "
              f"{agree} of 50 greedy tokens agree")
    size, same, space, newline = exercise_3_byte_alphabet()
    print(f"exercise 3  {size} characters, the same set as tokenizers': {same}; "
          f"space -> {space!r}, newline -> {newline!r}")
