"""Step 12: generating with a key/value cache.

Step 09's `generate` runs the whole context through the model for every new token, although
only the last position's logits are used and every earlier position computes exactly what it
computed one step before. Causal attention is why: position t only ever looks at positions
<= t, so its keys and values never change once computed. Keep them (the cache), and each new
token costs one position's worth of work: its own q, k, v, attention over the cached keys, and
the MLP for that one position.

`KVCache` holds the keys and values. The model needs no second forward for it: step 08's
`GPT.forward(idx, cache=cache)` reads the new positions only, every attention layer appends its
keys and values and attends over all of them. `generate_cached` is step 09's loop handed a
cache. Greedy output is the same, token for token.

When the text outgrows max_seq_len, `generate` crops the context to the last max_seq_len
tokens. That moves every token to a new position, and with learned absolute positions every
cached key and value changes, so we do the same: rebuild the cache from the last max_seq_len
tokens, one full forward per new token, exactly what `generate` computes (no speed-up there).

Run the check:  uv run python -m tiny_llm.kvcache
"""

import argparse
import time
from dataclasses import replace

import torch

from tiny_llm.checkpoint import model_from_checkpoint
from tiny_llm.device import pick_device, seed_everything, synchronize
from tiny_llm.generate import generate
from tiny_llm.gpt import DEFAULT_PRESET, GPT, PRESETS
from tiny_llm.paths import DATA_DIR
from tiny_llm.tokenize import load_tokenizer


class KVCache:
    """Keys and values of every layer for up to max_seq_len positions, allocated once.

    k[layer] and v[layer] are (B, n_kv_heads, max_seq_len, head_size); the first `length`
    positions are filled. n_kv_heads is n_heads for step 08's GPT (fewer with step 15's
    grouped-query attention). Memory: 2 · n_layers · B · max_seq_len · n_kv_heads · head_size.
    The model's forward fills it (step 08: `model(idx, cache=cache)`) and advances `length`.
    """

    def __init__(self, config, batch_size=1, device="cpu", dtype=torch.float32):
        c = config
        n_kv_heads = getattr(c, "n_kv_heads", c.n_heads)
        shape = (c.n_layers, batch_size, n_kv_heads, c.max_seq_len, c.d_model // c.n_heads)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_seq_len = c.max_seq_len
        self.length = 0  # positions filled so far, the same for every layer

    def append(self, layer, k, v):
        """Store (B, n_kv_heads, t, head_size) k and v after the filled positions of `layer`;
        return all keys and values so far, (B, n_kv_heads, length + t, head_size) each."""
        start, t = self.length, k.shape[2]
        self.k[layer].narrow(2, start, t).copy_(k)  # positions start .. start + t - 1
        self.v[layer].narrow(2, start, t).copy_(v)
        return self.k[layer].narrow(2, 0, start + t), self.v[layer].narrow(2, 0, start + t)

    def reset(self):
        """Forget every position (the memory stays allocated)."""
        self.length = 0

    def nbytes(self):
        return self.k.nbytes + self.v.nbytes


def fresh_cache(model, batch_size=1):
    """An empty KVCache for `model`, on its device and in its dtype: what a command that writes
    hands step 09's sampler (the studio, `instruct write`; step 18 writes a group at once)."""
    weight = next(model.parameters())
    return KVCache(model.config, batch_size, device=weight.device, dtype=weight.dtype)


def generate_cached(model, idx, max_new_tokens, **sampling):
    """Step 09's `generate`, same arguments and result, reading every token once through a
    fresh KVCache. Past max_seq_len the cache is rebuilt from the last max_seq_len tokens at
    every step, which is what `generate`'s cropping computes."""
    return generate(model, idx, max_new_tokens, cache=fresh_cache(model), **sampling)


def timed(device, fn, *args, **kwargs):
    """Run fn(*args, **kwargs); return (its result, seconds), waiting for a GPU to finish."""
    synchronize(device)
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    synchronize(device)
    return out, time.perf_counter() - start


def compare(model, idx, max_new_tokens, device, rounds=2):
    """Greedy both ways, the faster of `rounds` timings each (a busy machine only slows a run
    down); returns (uncached ids, cached ids, uncached s, cached s)."""
    greedy = {"temperature": 0, "eot_id": None}  # eot_id=None: always max_new_tokens tokens
    generate_cached(model, idx, max_new_tokens, **greedy)  # warm up: first calls allocate
    runs = {}
    for fn in (generate, generate_cached) * rounds:
        out, seconds = timed(device, fn, model, idx, max_new_tokens, **greedy)
        runs[fn] = (out, min(seconds, runs.get(fn, (None, seconds))[1]))
    (slow, slow_s), (fast, fast_s) = runs[generate], runs[generate_cached]
    return slow, fast, slow_s, fast_s


def memory_line(config):
    """The cache's size as factors that multiply to its bytes: "2 x 4 layers x 256 positions x
    128 x 4 bytes = 1,048,576 bytes". Each position keeps n_kv_heads x head_size numbers per
    tensor: d_model when every head has its own keys (step 08), fewer with step 15's groups."""
    c, cache = config, KVCache(config)
    n_kv_heads, head_size = getattr(c, "n_kv_heads", c.n_heads), c.d_model // c.n_heads
    width = f"{c.d_model}" if n_kv_heads == c.n_heads else f"{n_kv_heads} kv heads x {head_size}"
    return (f"2 x {c.n_layers} layers x {c.max_seq_len} positions x {width} x "
            f"{cache.k.element_size()} bytes = {cache.nbytes():,} bytes")


def window_model(model):
    """A fresh model of `model`'s class at its `tiny` preset (max_seq_len 64) and vocabulary:
    the window rule is the class's code, so a small one runs 150 tokens past it in seconds."""
    cls = type(model)
    return cls(replace(cls.presets["tiny"], vocab_size=model.config.vocab_size))


def draw_cache(path, prompt=("Once", " upon", " a", " time"), next_tokens=(",", " there")):
    """Draw prefill and one decode step with the default preset's cache sizes; save a PNG."""
    from tiny_llm.course.diagrams import cache_diagram
    from tiny_llm.files import save_figure

    c = PRESETS[DEFAULT_PRESET]
    sizes = {"name": f"{DEFAULT_PRESET} preset", "prompt": list(prompt), "next": list(next_tokens),
             "layers": c.n_layers, "T_max": c.max_seq_len, "d": c.d_model,
             "nbytes": KVCache(c).nbytes()}
    return save_figure(cache_diagram(sizes), path, dpi=90)


def main():
    parser = argparse.ArgumentParser(description="Step 12: generation with a KV cache.")
    parser.add_argument("--diagram", metavar="PNG", help="draw prefill and decode there and stop")
    parser.add_argument("--checkpoint", default=None, help="a trained ckpt.pt (default: an "
                        f"untrained {DEFAULT_PRESET} GPT; speed does not depend on the weights)")
    parser.add_argument("--prompt", default="Once upon a time")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    args = parser.parse_args()
    if args.diagram:
        print(f"{'diagram':<16} {draw_cache(args.diagram)}")
        return
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    try:
        device = pick_device(args.device)
        tokenizer = load_tokenizer(DATA_DIR / "tokenizer.json")
        if args.checkpoint:
            model, _ = model_from_checkpoint(args.checkpoint, device, data_dir=DATA_DIR)
        else:
            seed_everything(1337)
            config = replace(PRESETS[DEFAULT_PRESET], vocab_size=tokenizer.get_vocab_size())
            model = GPT(config).to(device).eval()
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    idx = torch.tensor([tokenizer.encode(args.prompt).ids], device=device)
    slow, fast, slow_s, fast_s = compare(model, idx, args.max_new_tokens, device)
    n_new, c = slow.shape[1] - idx.shape[1], model.config
    text = lambda ids: repr(tokenizer.decode(ids[0].tolist())[:60]) + "..."  # noqa: E731
    print(f"{'model':<16} {args.checkpoint or f'untrained {DEFAULT_PRESET} GPT (seed 1337)'}, "
          f"{model.num_params():,} parameters, max_seq_len {c.max_seq_len}")
    print(f"{'prompt':<16} {args.prompt!r}, {idx.shape[1]} tokens; {n_new} new tokens, greedy")
    print(f"{'uncached':<16} {text(slow)}")
    print(f"{'cached':<16} {text(fast)}")
    print(f"{'same tokens':<16} {torch.equal(slow, fast)}")
    print(f"{'uncached time':<16} {slow_s:.2f} s, {n_new / slow_s:,.0f} tokens/s")
    print(f"{'cached time':<16} {fast_s:.2f} s, {n_new / fast_s:,.0f} tokens/s")
    print(f"{'speed-up':<16} {slow_s / fast_s:.1f}x")
    print(f"{'cache memory':<16} {memory_line(c)}")
    # past the window: a tiny model of the same class writes 150 tokens after a 1-token prompt
    seed_everything(0)
    tiny = window_model(model).to(device).eval()
    start = torch.zeros(1, 1, dtype=torch.long, device=device)
    slow, fast, _, _ = compare(tiny, start, 150, device, rounds=1)
    print(f"{'past the window':<16} tiny {type(tiny).__name__}, max_seq_len "
          f"{tiny.config.max_seq_len}, 151 tokens: same tokens {torch.equal(slow, fast)}")


if __name__ == "__main__":
    main()
