"""Solutions to the exercises of step 08 (steps/08-gpt.md).

Run them:  uv run python -m solutions.ex08_gpt
"""

import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from tiny_llm.device import seed_everything
from tiny_llm.gpt import GPT, PRESETS


def exercise_1_count_by_hand(config=PRESETS["small"]):
    """V·d (tok_emb = head) + T·d (pos_emb) + L·(12·d² + 13·d) (blocks) + 2·d (ln_f)."""
    V, T, d, L = config.vocab_size, config.max_seq_len, config.d_model, config.n_layers
    by_hand = V * d + T * d + L * (12 * d * d + 13 * d) + 2 * d
    return by_hand, GPT(config).num_params()


def exercise_2_tying_saves(config=PRESETS["small"]):
    """An untied head is a second (V, d) matrix. Returns (saved, share of the untied model)."""
    tied = GPT(config).num_params()
    saved = config.vocab_size * config.d_model
    return saved, saved / (tied + saved)


def exercise_3_initial_loss(config=PRESETS["tiny"], seed=0):
    """Uniform logits give exactly ln V. Our init is close; N(0, 1) embeddings are far worse.

    With the tied head, logit v = ln_f(x) · tok_emb[v]: ln_f(x) has entries of size 1, so the
    logits' spread is about √d · (embedding std). 0.02 keeps it small (a near-uniform guess);
    std 1 makes the model confidently wrong about random tokens.
    """
    seed_everything(seed)
    idx = torch.randint(0, config.vocab_size, (4, config.max_seq_len))
    targets = torch.randint(0, config.vocab_size, (4, config.max_seq_len))
    uniform = F.cross_entropy(torch.zeros(idx.numel(), config.vocab_size), targets.flatten())
    model = GPT(config)
    with torch.no_grad():
        _, ours = model(idx, targets)
        torch.nn.init.normal_(model.embed.tok_emb.weight, std=1.0)
        _, big = model(idx, targets)
    return {"ln V": math.log(config.vocab_size), "uniform logits": uniform.item(),
            "init std 0.02": ours.item(), "embeddings std 1": big.item()}


def exercise_4_flops_per_token(config=PRESETS["small"]):
    """Training FLOPs per token: 6 per weight of a matmul (2 forward, 4 backward) + attention.

    The weights a token is multiplied by: 12·d² per block and the head's V·d. Attention scores
    and the weighted sum add 4·T·d per layer forward, 12·T·d with backward. In the small preset
    the head is a large share of the work: the vocabulary is wide compared with the model.
    """
    V, T, d, L = config.vocab_size, config.max_seq_len, config.d_model, config.n_layers
    flops = {"blocks": 6 * L * 12 * d * d, "head": 6 * V * d, "attention": 12 * L * T * d}
    flops["total"] = sum(flops.values())
    return flops, flops["head"] / flops["total"]


def exercise_5_ignore_index(config=PRESETS["tiny"], seed=0):
    """Targets of -1 drop out of the mean: the loss equals the loss of the other positions."""
    seed_everything(seed)
    model = GPT(replace(config, vocab_size=64)).eval()
    idx = torch.randint(0, 64, (2, 16))
    targets = torch.randint(0, 64, (2, 16))
    padded = targets.clone()
    padded[:, 10:] = -1  # e.g. padding after the end of a short sequence
    with torch.no_grad():
        logits, loss = model(idx, padded)
        kept = F.cross_entropy(logits[:, :10].flatten(0, 1), targets[:, :10].flatten())
    return loss.item(), kept.item()


if __name__ == "__main__":
    print("exercise 1:", "by hand {:,}, num_params {:,}".format(*exercise_1_count_by_hand()))
    saved, share = exercise_2_tying_saves()
    print("exercise 2:", f"tying saves {saved:,} parameters, {share:.0%} of an untied small GPT")
    for name, value in exercise_3_initial_loss().items():
        print("exercise 3:", f"{name:<18} {value:.3f}")
    flops, head_share = exercise_4_flops_per_token()
    for name, value in flops.items():
        print("exercise 4:", f"{name:<10} {value / 1e6:6.2f} MFLOP per token")
    print("exercise 4:", f"the head's share: {head_share:.0%}")
    print("exercise 5:", "loss with -1 targets {:.4f}, loss of the kept positions {:.4f}".format(
        *exercise_5_ignore_index()))
