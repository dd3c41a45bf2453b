"""Solutions to the exercises of the appendix (steps/20-export.md).

Run them:  uv run python -m solutions.ex20_export   (offline: every model here is made locally)
"""

import tempfile
from pathlib import Path

import torch
import torch.nn as nn

from tiny_llm.export import GPT2_NAMES, hf_name, import_gpt2, max_logit_difference, to_gpt2
from tiny_llm.gpt import GPT, GPTConfig


def exercise_1_safetensors_inventory(config=None):
    """Export a small GPT and list what model.safetensors holds.

    There is no lm_head.weight: the head is tied to wte, so the file stores the matrix once and
    transformers ties it again on loading. The tensors hold exactly num_params() numbers, and
    the four Conv1D weights per block are stored transposed: (in, out), (d, 3d) for c_attn.
    """
    from safetensors import safe_open

    config = config or GPTConfig(vocab_size=100, max_seq_len=16, d_model=32, n_layers=2,
                                 n_heads=4)
    model = GPT(config)
    with tempfile.TemporaryDirectory() as folder:
        to_gpt2(model).save_pretrained(folder)
        with safe_open(Path(folder) / "model.safetensors", framework="pt") as f:
            stored = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    transposed = [hf_name(name, GPT2_NAMES) for name, p in model.named_parameters()
                  if p.dim() == 2 and torch.equal(stored[hf_name(name, GPT2_NAMES)], p.t())]
    c_attn = stored["transformer.h.0.attn.c_attn.weight"]
    return {"tensors": len(stored), "numbers": sum(t.numel() for t in stored.values()),
            "num_params": model.num_params(), "has_lm_head": "lm_head.weight" in stored,
            "transposed": transposed, "c_attn": tuple(c_attn.shape)}


def exercise_2_gelu_gap(points=160_001):
    """The largest gap between the exact GELU and its tanh approximation, and where it is."""
    x = torch.linspace(-8, 8, points, dtype=torch.float64)
    gap = (nn.functional.gelu(x) - nn.functional.gelu(x, approximate="tanh")).abs()
    i = int(gap.argmax())
    return gap[i].item(), abs(x[i].item())


def exercise_2_tanh_gelu_import():
    """Import a random GPT-2 that uses gelu_new: the logits differ; swap in the tanh GELU and
    they agree. Returns (difference before, difference after)."""
    import transformers

    config = transformers.GPT2Config(vocab_size=97, n_positions=16, n_embd=24, n_layer=2,
                                     n_head=3, activation_function="gelu_new")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():  # larger weights than at initialisation, as training makes them
        for p in hf.parameters():
            p.mul_(3)
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        model, hf, _ = import_gpt2(folder, Path(folder) / "ckpt.pt")
    before = max_logit_difference(model, hf)
    for block in model.blocks:
        block.mlp.gelu = nn.GELU(approximate="tanh")
    return before, max_logit_difference(model, hf)


def rotate_adjacent(x, angles):
    """Ours (and Meta's LLaMA): turn the pairs (x[2i], x[2i+1]) by angles[i]. x (..., hs)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * angles.cos() - odd * angles.sin(),
                        even * angles.sin() + odd * angles.cos()), dim=-1).flatten(-2)


def rotate_halves(x, angles):
    """transformers' Llama: turn the pairs (x[i], x[i + hs/2]) by angles[i]. x (..., hs)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * angles.cos() - second * angles.sin(),
                      first * angles.sin() + second * angles.cos()), dim=-1)


def exercise_3_rope_reorder(head_size=8, positions=(0, 3, 17), seed=0):
    """Reordering a head's dimensions as export reorders wq's and wk's rows, (0, 2, 4, ...,
    1, 3, 5, ...), makes the two RoPE conventions give the same attention score q·k.

    Returns the largest |score ours - score Llama's| over the positions (float64: ~1e-15).
    """
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, head_size, generator=g, dtype=torch.float64)
    order = torch.cat((torch.arange(0, head_size, 2), torch.arange(1, head_size, 2)))
    inv_freq = 10000.0 ** (-torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)
    worst = 0.0
    for m in positions:
        for n in positions:
            ours = rotate_adjacent(q, m * inv_freq) @ rotate_adjacent(k, n * inv_freq)
            theirs = rotate_halves(q[order], m * inv_freq) @ rotate_halves(k[order], n * inv_freq)
            worst = max(worst, abs(ours - theirs).item())
    return worst


def main():
    inventory = exercise_1_safetensors_inventory()
    print(f"{'exercise 1':<12} {inventory['tensors']} tensors, {inventory['numbers']:,} numbers "
          f"(num_params {inventory['num_params']:,}), lm_head.weight stored: "
          f"{inventory['has_lm_head']}, c_attn {inventory['c_attn']}")
    names = (name.removeprefix("transformer.") for name in inventory["transposed"])
    print(f"{'':<12} stored transposed: {', '.join(names)}")
    gap, where = exercise_2_gelu_gap()
    before, after = exercise_2_tanh_gelu_import()
    print(f"{'exercise 2':<12} largest |GELU - tanh GELU| {gap:.1e} at |x| = {where:.2f}")
    print(f"{'':<12} imported gelu_new model: max logit difference {before:.1e}, "
          f"with nn.GELU(approximate='tanh') {after:.1e}")
    print(f"{'exercise 3':<12} RoPE scores, adjacent pairs vs halves after the reorder: "
          f"max difference {exercise_3_rope_reorder():.1e}")


if __name__ == "__main__":
    main()
