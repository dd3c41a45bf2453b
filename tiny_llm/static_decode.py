"""Step 13's lever for decoding on a GPU: a static cache and a CUDA graph.

Step 12's decode step reads its position as a Python number (cache.length): every step has
other shapes (the keys so far) and other constants, so nothing can record it once and replay
it. The static variant here keeps every shape fixed: the keys are always all max_seq_len slots
of the cache, a mask hides the empty ones, and the position lives in a tensor on the device
that the step itself advances. Then one CUDA graph holds the whole step: one launch per token
instead of a few hundred (gpt-fast does the same with torch.compile's "reduce-overhead").

The check:  uv run python -m tiny_llm.speed --decode
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from tiny_llm.generate import generate
from tiny_llm.gpt import GPT
from tiny_llm.kvcache import KVCache, generate_cached, timed


class StaticCache(KVCache):
    """Step 12's KVCache with fixed shapes: append writes at `position`, a (,) int64 tensor on
    the cache's device, and returns every slot, (B, n_kv_heads, max_seq_len, head_size).
    `length` still counts on the host, for step 08's checks."""

    def __init__(self, config, batch_size=1, device="cpu", dtype=torch.float32):
        super().__init__(config, batch_size, device, dtype)
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.slots = torch.arange(config.max_seq_len, device=device)  # 0 .. max_seq_len - 1

    def append(self, layer, k, v):
        at = self.position + self.slots[: k.shape[2]]  # positions of the new keys, on the device
        self.k[layer].index_copy_(2, at, k)
        self.v[layer].index_copy_(2, at, v)
        return self.k[layer], self.v[layer]

    def reset(self):
        super().reset()
        self.position.zero_()


@torch.no_grad()
def static_forward(model, idx, cache):
    """`model(idx, cache=cache)` for step 08's GPT in eval mode, with shapes that do not depend
    on the position: (B, T) ids after cache.position -> ((B, T, vocab_size) logits, None).

    The same arithmetic as the model's own forward, written out so that the position comes
    from the cache's tensor: the position embeddings, the slots written, and the mask that
    lets query i see slots 0 .. position + i (the empty ones get no weight).
    """
    model._check_cache(cache, idx)  # on the host: step 08's errors (eval mode, the window)
    T = idx.shape[1]
    pos = cache.position + cache.slots[:T]  # (T,) on the device
    x = model.embed.tok_emb(idx) + model.embed.pos_emb(pos)  # (B, T, C)
    mask = cache.slots[None, :] <= pos[:, None]  # (T, max_seq_len): True where a query may look
    for layer, block in enumerate(model.blocks):
        x = x + static_attention(block.attn, block.ln_1(x), cache, layer, mask)
        x = x + block.mlp(block.ln_2(x))
    cache.position += T  # on the device: a recorded step advances it too
    cache.length += T
    return model.lm_head(model.ln_f(x)), None


def static_attention(attn, x, cache, layer, mask):
    """Step 06's attention over every slot of a StaticCache: (B, T, C) -> (B, T, C)."""
    B, T, C = x.shape
    q, k, v = attn.qkv(x).split(C, dim=2)
    q, k, v = (t.view(B, T, attn.n_heads, attn.head_size).transpose(1, 2) for t in (q, k, v))
    k, v = cache.append(layer, k, v)  # (B, n_heads, max_seq_len, head_size): all the slots
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return attn.proj(y.transpose(1, 2).reshape(B, T, C))


class GraphedDecoder(nn.Module):
    """Step 08's GPT for step 09's `generate` through a StaticCache, its one-token step
    recorded once as a CUDA graph and replayed for every token (on a CPU, and for a prompt,
    static_forward runs as it is). Write with its own cache:
    generate(decoder, idx, n, cache=decoder.cache, ...)."""

    def __init__(self, model):
        super().__init__()
        if type(model) is not GPT:
            raise ValueError(f"the static decode step is written for step 08's GPT, not "
                             f"{type(model).__name__}")
        self.model, self.config = model, model.config
        weight = next(model.parameters())
        self.cache = StaticCache(model.config, 1, weight.device, weight.dtype)
        self.token = torch.zeros(1, 1, dtype=torch.long, device=weight.device)  # the graph's input
        self.graph = self.logits = None
        self.eval()  # generate() puts back the mode it found: eval, as a cache needs

    def forward(self, idx, cache=None):
        if cache is not self.cache:
            return self.model(idx, cache=cache)
        if idx.shape[1] != 1 or idx.device.type != "cuda":
            return static_forward(self.model, idx, cache)
        self.model._check_cache(cache, idx)  # the host's checks, which a replay skips
        if self.graph is None:
            self.record()
        self.token.copy_(idx)
        self.graph.replay()  # the whole step: it writes the cache and advances cache.position
        cache.length += 1
        return self.logits.clone(), None  # the next replay overwrites self.logits

    def record(self):
        """Record one decode step at the cache's position. Warm-up steps run first (kernels
        choose their algorithms on a first call); they write slots past the position, which
        the real steps overwrite, and position and length are put back after each."""
        cache, length, position = self.cache, self.cache.length, self.cache.position.clone()

        def put_back():
            cache.length = length
            cache.position.copy_(position)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                static_forward(self.model, self.token, cache)
                put_back()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):  # runs the Python once, queues none of the work
            self.logits, _ = static_forward(self.model, self.token, cache)
        put_back()


def compare_decoding(model, max_new_tokens):
    """Greedy decoding after one token, step 12's cached loop against the static one (with a
    CUDA graph on CUDA): ([(name, tokens/s), ...], whether both wrote the same tokens)."""
    decoder = GraphedDecoder(model)
    idx = torch.zeros(1, 1, dtype=torch.long, device=decoder.token.device)
    greedy = {"temperature": 0, "eot_id": None}
    ways = (("cached", lambda: generate_cached(model, idx, max_new_tokens, **greedy)),
            ("static", lambda: generate(decoder, idx, max_new_tokens, cache=decoder.cache,
                                        **greedy)))
    rates, outs = [], []
    for name, write in ways:
        write()  # warm-up: first allocations, and the graph's recording
        out, seconds = timed(decoder.token.device, write)
        rates.append((name, max_new_tokens / seconds))
        outs.append(out)
    return rates, torch.equal(*outs)
