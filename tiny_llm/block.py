"""Step 07: the transformer block.

A GPT is the same block stacked n_layers times. Each block reads the *residual stream* x, lets
attention mix information across positions, then lets an MLP think about each position on its
own, and adds both results back onto x:

    x = x + attn(ln_1(x))      # talk to the other positions
    x = x + mlp(ln_2(x))       # compute, one position at a time

LayerNorm keeps what each sublayer reads at a steady scale; the additions keep a straight path
from the input to the output for the gradient. `init_weights` starts the weights small and the
residual output projections smaller still, so the stream does not grow with depth.

Run the check:  uv run python -m tiny_llm.block   (--plot FILE.png also draws the std curves;
--scales shows what LayerNorm is for; --why norm and --why width train small models to show
why pre-norm and why the MLP is 4x wide)
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from tiny_llm.checks import check_n_layers
from tiny_llm.device import seed_everything
from tiny_llm.embed import Embed
from tiny_llm.files import save_figure
from tiny_llm.multihead import MultiHeadAttention


class LayerNorm(nn.Module):
    """Normalise each position's vector to mean 0 and variance 1, then scale and shift it.

    (..., d_model) in, same shape out. `weight` (the gain, starts at 1) and `bias` (starts at 0)
    are learned per channel, so the model can undo the normalisation where that helps.
    """

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps  # keeps the division finite when a vector is constant
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def written_out(self, x):
        """The normalisation one visible operation at a time: the reference for `forward`."""
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)  # divide by d_model, as nn.LayerNorm does
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias

    def forward(self, x):
        # the same arithmetic as written_out, in PyTorch's one fused kernel (the check compares)
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class MLP(nn.Module):
    """Position-wise feed-forward network: d_model -> 4·d_model -> GELU -> d_model.

    (B, T, d_model) in, (B, T, d_model) out; each position is computed on its own.
    """

    def __init__(self, d_model, dropout=0.0):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)  # widen: room for many features per token
        self.gelu = nn.GELU()
        self.proj = nn.Linear(4 * d_model, d_model)  # back to the residual stream
        self.proj.residual_output = True  # init_weights starts it smaller
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.proj(self.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: (B, T, d_model) -> (B, T, d_model)."""

    def __init__(self, d_model, n_heads, max_seq_len, dropout=0.0, attn=None):
        """`attn`: an attention of your own (step 14's position schemes); default step 06's."""
        super().__init__()
        self.ln_1 = LayerNorm(d_model)
        self.attn = attn or MultiHeadAttention(d_model, n_heads, max_seq_len, dropout)
        self.ln_2 = LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x, cache=None, layer=0):
        """`cache` and `layer` pass through to attention: step 12's KV cache."""
        x = x + self.attn(self.ln_1(x), cache, layer)
        x = x + self.mlp(self.ln_2(x))
        return x


def init_weights(module, n_layers):
    """GPT-2's initialisation of every weight in `module`, in place; returns `module`.

        part                                   weight                         bias
        nn.Embedding (tok_emb, pos_emb)        N(0, 0.02²)                    -
        nn.Linear                              N(0, 0.02²)                    0
        nn.Linear with residual_output = True  N(0, (0.02 / √(2·n_layers))²)  0
        LayerNorm (RMSNorm, step 15)           gain 1, as built               0

    The residual outputs (attention's and the MLP's last projection, marked where they are
    built) are added onto the stream 2·n_layers times; the smaller std keeps the summed variance
    the same whatever the depth. The first loop gives every Linear the plain std; the second
    redraws the marked ones with the smaller std.
    """
    check_n_layers(n_layers)
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
    for m in module.modules():
        if getattr(m, "residual_output", False):
            nn.init.normal_(m.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))
    return module


def residual_stds(n_layers=12, scaled=True, d_model=128, n_heads=4, seq_len=64, seed=1337):
    """Std of the residual stream after each of `n_layers` freshly initialised blocks.

    The stream starts as step 04's embedding does: two N(0, 0.02²) tables added. With
    scaled=False the residual projections get the plain N(0, 0.02²) like every other weight.
    """
    seed_everything(seed)
    x = torch.randn(16, seq_len, d_model) * 0.02 * math.sqrt(2)  # (B, T, C)
    blocks = [Block(d_model, n_heads, seq_len) for _ in range(n_layers)]
    for block in blocks:
        init_weights(block, n_layers)
        if not scaled:
            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=0.02)
            nn.init.normal_(block.mlp.proj.weight, mean=0.0, std=0.02)
    stds = []
    with torch.no_grad():
        for block in blocks:
            x = block(x)
            stds.append(x.std().item())
    return stds


def read_at_scales(scales=(0.03, 1.0, 30.0), d_model=128, n_heads=4, seq_len=64, seed=1337):
    """What a fresh block's sublayers make of a stream of each std in `scales`, read through
    their LayerNorm (as the block does) and raw (no LayerNorm): {scale: {"LayerNorm": (top
    weight, mlp std), "raw": (...)}}. The top weight is attention's largest weight in the last
    row, averaged over the batch and heads (1/seq_len: an even average; 1: one position only);
    mlp std is the std of what the MLP would add to the stream."""
    seed_everything(seed)
    block = init_weights(Block(d_model, n_heads, seq_len), n_layers=12)
    attn, H = block.attn, n_heads
    stream = torch.randn(16, seq_len, d_model)  # (B, T, C), std 1: scaled below
    out = {}
    with torch.no_grad():
        for scale in scales:
            x = stream * scale
            out[scale] = {}
            reads = {"LayerNorm": (block.ln_1(x), block.ln_2(x)), "raw": (x, x)}
            for name, (a, m) in reads.items():
                q, k, _ = attn.qkv(a).split(d_model, dim=2)
                q = q.view(16, seq_len, H, -1).transpose(1, 2)[:, :, -1:]  # the last query
                k = k.view(16, seq_len, H, -1).transpose(1, 2)
                weights = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_model // H), dim=-1)
                out[scale][name] = (weights.amax(-1).mean().item(), block.mlp(m).std().item())
    return out


class PostNormBlock(Block):
    """The 2017 arrangement, for `--why norm` only: LayerNorm after each addition, on the stream."""

    def forward(self, x):
        x = self.ln_1(x + self.attn(x))
        return self.ln_2(x + self.mlp(x))


def fit_previous_token(post, n_layers, warmup=0, steps=100, lr=3e-2, vocab=16, seq_len=16,
                       d_model=32, seed=1337):
    """Train a small stack of pre-norm (or post-norm) blocks to output the previous token.

    Adam at `lr`, reached linearly over the first `warmup` steps (0: from the first step).
    Returns the mean loss of the last 10 steps; ln(vocab) = 2.77 is a guess at random.
    """
    seed_everything(seed)
    embed = Embed(vocab, d_model, seq_len)
    blocks = nn.Sequential(*[(PostNormBlock if post else Block)(d_model, 4, seq_len)
                             for _ in range(n_layers)])
    ln_f, head = LayerNorm(d_model), nn.Linear(d_model, vocab)
    model = init_weights(nn.ModuleList([embed, blocks, ln_f, head]), n_layers)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        opt.param_groups[0]["lr"] = lr * min(1.0, (step + 1) / warmup) if warmup else lr
        x = torch.randint(0, vocab, (16, seq_len))  # (B, T)
        logits = head(ln_f(blocks(embed(x))))  # (B, T, vocab)
        loss = F.cross_entropy(logits[:, 1:].reshape(-1, vocab), x[:, :-1].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return sum(losses[-10:]) / 10


def memorise_table(width, n_ids=256, d_model=16, steps=200, lr=1e-2, seed=1337):
    """Train only an MLP of hidden size width·d_model to store a random table id -> target id.

    Each of `n_ids` ids has a fixed random vector on the stream; a fixed random output map reads
    `x + mlp(x)` as scores over the targets, so what is stored, the MLP stores. Full batch, Adam,
    `steps` steps. Returns (final loss, share of ids mapped right, the MLP's parameters).
    """
    seed_everything(seed)
    table = torch.randn(n_ids, d_model)  # (N, C): each id's vector, never trained
    targets = torch.randint(0, n_ids, (n_ids,))
    head = torch.randn(d_model, n_ids) / math.sqrt(d_model)  # (C, N): fixed too
    mlp = MLP(d_model)
    mlp.fc = nn.Linear(d_model, width * d_model)  # the one change: width instead of 4
    mlp.proj = nn.Linear(width * d_model, d_model)
    opt = torch.optim.Adam(mlp.parameters(), lr=lr)
    for _ in range(steps):
        logits = (table + mlp(table)) @ head  # (N, N)
        loss = F.cross_entropy(logits, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    stored = (logits.argmax(-1) == targets).float().mean().item()
    return loss.item(), stored, sum(p.numel() for p in mlp.parameters())


def plot_stds(plain, scaled, path):
    """Draw both std curves and save them as a PNG; return the path."""
    from matplotlib.figure import Figure  # imported here: only the check draws pictures

    layers = range(1, len(plain) + 1)
    fig = Figure(figsize=(6, 3.6), layout="constrained")
    ax = fig.subplots()
    ax.plot(layers, plain, "o-", label="every weight N(0, 0.02²)")
    ax.plot(layers, scaled, "s-", label="residual projections 0.02/√(2·n_layers)")
    ax.axhline(0.02 * math.sqrt(2), color="gray", ls=":", label="the embedding's std")
    ax.set(xlabel="after block", ylabel="std of the residual stream", ylim=(0, None),
           title=f"Residual stream at initialisation, {len(plain)} blocks, d_model 128")
    ax.legend(loc="upper left")
    save_figure(fig, path, dpi=100)
    return path


def draw_block(path, batch_size=4, seq_len=16, d_model=128, n_heads=4):
    """Draw one pre-norm Block with the check's shapes and its parameter counts; save a PNG."""
    from tiny_llm.course.diagrams import block_diagram

    block = Block(d_model, n_heads, max_seq_len=seq_len)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    sizes = {"B": batch_size, "T": seq_len, "d": d_model, "heads": n_heads, "ln": count(block.ln_1),
             "attn": count(block.attn), "mlp": count(block.mlp), "total": count(block)}
    return save_figure(block_diagram(sizes), path, dpi=90)


def main():
    parser = argparse.ArgumentParser(description="Step 07: LayerNorm, MLP, Block, init.")
    parser.add_argument("--plot", default=None, help="also save the std curves to this PNG")
    parser.add_argument("--diagram", metavar="PNG", help="draw the block's diagram there and stop")
    parser.add_argument("--scales", action="store_true",
                        help="what the sublayers read at three stream scales, with and without "
                             "LayerNorm, and stop")
    parser.add_argument("--why", choices=["norm", "width"],
                        help="norm: pre-norm against post-norm in a short fit without warmup; "
                             "width: what an MLP 1, 2, 4 or 8 times as wide stores in equal "
                             "steps; then stop")
    args = parser.parse_args()
    if args.diagram:
        print(f"{'diagram':<28} {draw_block(args.diagram)}")
        return
    if args.scales:
        print(f"{'stream std':<12} {'top attention weight':>22} {'MLP output std':>24}")
        print(f"{'':<12} {'LayerNorm':>11} {'raw':>10} {'LayerNorm':>13} {'raw':>10}")
        for scale, seen in read_at_scales().items():
            (w_ln, m_ln), (w_raw, m_raw) = seen["LayerNorm"], seen["raw"]
            print(f"{scale:<12g} {w_ln:>11.3f} {w_raw:>10.3f} {m_ln:>13.4f} {m_raw:>10.4f}")
        return
    if args.why:
        torch.set_num_threads(1)  # training runs: the same digits on every CPU
    if args.why == "norm":
        print(f"{'blocks':<8} {'pre-norm':>9} {'post-norm':>10} {'post-norm, warmup 50':>21}")
        for n in (2, 4):
            losses = (fit_previous_token(False, n), fit_previous_token(True, n),
                      fit_previous_token(True, n, warmup=50))
            print(f"{n:<8} {losses[0]:>9.2f} {losses[1]:>10.2f} {losses[2]:>21.2f}")
        return
    if args.why == "width":
        print(f"{'MLP width':<12} {'parameters':>10} {'final loss':>11} {'ids stored':>11}")
        for width in (1, 2, 4, 8):
            loss, stored, params = memorise_table(width)
            print(f"{f'{width}·d_model':<12} {params:>10,} {loss:>11.2f} {stored:>11.2f}")
        return

    seed_everything(1337)
    x = torch.randn(4, 16, 128) * 3 + 1  # (B, T, C), far from mean 0 / std 1 on purpose
    ours, reference = LayerNorm(128), nn.LayerNorm(128)
    largest_fused = (ours.written_out(x) - ours(x)).abs().max().item()
    block = Block(d_model=128, n_heads=4, max_seq_len=64)
    init_weights(block, n_layers=12)
    params = sum(p.numel() for p in block.parameters())
    y = ours.written_out(x)
    largest = (y - reference(x)).abs().max().item()
    print(f"{'input mean, std':<28} {x.mean().item():.3f}, {x.std().item():.3f}")
    print(f"{'LayerNorm mean, std':<28} {abs(y.mean().item()):.3f}, {y.std().item():.3f}")
    print(f"{'max |ours - nn.LayerNorm|':<28} {largest:.1e}")
    print(f"{'agree within 1e-5':<28} {largest < 1e-5}")
    print(f"{'max |written out - fused|':<28} {largest_fused:.1e} (forward uses the fused kernel)")
    print(f"{'block in, out':<28} {tuple(x.shape)} -> {tuple(block(x).shape)}")
    print(f"{'block parameters':<28} {params:,}")
    print(f"{'12·d² + 13·d':<28} {12 * 128**2 + 13 * 128:,}")
    print(f"{'init std qkv, attn.proj':<28} {block.attn.qkv.weight.std().item():.4f}, "
          f"{block.attn.proj.weight.std().item():.4f}")
    print()
    plain, scaled = residual_stds(scaled=False), residual_stds(scaled=True)
    print(f"{'std after block':<16} {'plain init':>12} {'scaled init':>12}")
    for i, (a, b) in enumerate(zip(plain, scaled, strict=True), start=1):
        print(f"{i:<16} {a:>12.4f} {b:>12.4f}")
    if args.plot:
        print(f"{'plot':<16} {plot_stds(plain, scaled, args.plot)}")


if __name__ == "__main__":
    main()
