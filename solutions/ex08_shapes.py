"""The shape gauntlet of step 08 (steps/08-gpt.md): every tensor of one forward pass of a GPT
at B = 8, T = 128, d_model = 384 (6 heads of 64, 6 layers, V = 4096), printed as it goes by.

Run it:  uv run python -m solutions.ex08_shapes
"""

import torch

from tiny_llm.gpt import GPT, GPTConfig

B, T = 8, 128
CONFIG = GPTConfig(vocab_size=4096, max_seq_len=T, d_model=384, n_layers=6, n_heads=6)
WATCH = {  # module name -> what its output is
    "embed.tok_emb": "token vectors: one row of the (V, C) table per id",
    "embed": "+ position rows (T, C), broadcast over B",
    "blocks.0.ln_1": "block 0: LayerNorm, per position",
    "blocks.0.attn.qkv": "q, k, v side by side: 3·C",
    "blocks.0.attn": "heads side by side again, projected",
    "blocks.0.ln_2": "the stream after attention, normalised",
    "blocks.0.mlp.fc": "the MLP widens to 4·C",
    "blocks.0.mlp": "and comes back to C",
    "blocks.0": "block 0's output: the stream, same shape",
    "blocks.5": "block 5's output",
    "ln_f": "final LayerNorm",
    "lm_head": "a score for every token of the vocabulary",
}


def gauntlet(config=CONFIG, batch=B, seed=0):
    """[(name, shape, what)] for one forward pass with targets, in the order they happen."""
    torch.manual_seed(seed)
    model = GPT(config).eval()
    C, H = config.d_model, config.n_heads
    rows, hooks = [], []

    def watch(name, what):
        def hook(module, args, out):
            rows.append((name, tuple(out.shape), what))
            if name.endswith("attn.qkv"):  # inside attention, as step 06 reshapes it
                q, k, _ = out.split(C, dim=2)
                q = q.view(batch, -1, H, C // H).transpose(1, 2)  # (B, H, T, head_size)
                k = k.view(batch, -1, H, C // H).transpose(1, 2)
                rows.append(("  q (and k, v) per head", tuple(q.shape), "(B, heads, T, head_size)"))
                rows.append(("  scores q·kᵀ", tuple((q @ k.transpose(-2, -1)).shape),
                             "one (T, T) table per head"))
        return hook

    for name, module in model.named_modules():
        if name in WATCH:
            hooks.append(module.register_forward_hook(watch(name, WATCH[name])))
    idx = torch.randint(config.vocab_size, (batch, config.max_seq_len))
    rows.append(("idx", tuple(idx.shape), "token ids from get_batch (step 03)"))
    with torch.no_grad():
        _, loss = model(idx, targets=idx)
    for hook in hooks:
        hook.remove()
    rows.append(("loss", tuple(loss.shape), "one number: the mean over B·T targets"))
    return rows


if __name__ == "__main__":
    for name, shape, what in gauntlet():
        print(f"{name:<26} {str(shape):<18} {what}")
