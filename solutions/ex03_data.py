"""Solutions to the exercises of step 03 (steps/03-data.md).

Run them:  uv run python -m solutions.ex03_data      (on the prepared data in DATA_DIR)
The picture of exercise 5:
    uv run python -m solutions.ex03_data --plot steps/images/03-token-ranks.png --data-dir DIR ...
"""

import argparse
from pathlib import Path

import numpy as np
import torch

from tiny_llm.data import DATA_DIR, NextTokenDataset, get_batch, load_meta, load_token_array
from tiny_llm.files import save_figure
from tiny_llm.tokenize import load_tokenizer


def exercise_1_windows(n_tokens, seq_len):
    """A window of T inputs needs T + 1 tokens (its targets reach one further), so it can start at
    0 .. N-T-1: N - T windows. Cutting the file into blocks gives only N // T, each token then
    sits at one fixed position; random starts show the model every token at every position."""
    n_windows = len(NextTokenDataset(np.zeros(n_tokens, dtype=np.uint16), seq_len))
    assert n_windows == n_tokens - seq_len
    return n_windows, n_tokens // seq_len


def exercise_2_batch_bytes(batch_size, seq_len):
    """x and y are (B, T) int64, 8 bytes an entry: 2·B·T·8 bytes in memory. On disk the same
    B·(T+1) tokens take 2 bytes each, which is why the file is uint16 and the batch is not."""
    x, y = get_batch(np.arange(seq_len + 1, dtype=np.uint16), batch_size, seq_len)
    in_memory = x.element_size() * x.nelement() + y.element_size() * y.nelement()
    assert in_memory == 2 * batch_size * seq_len * 8
    return in_memory, batch_size * (seq_len + 1) * 2


def token_counts(data_dir=DATA_DIR, chunk=1 << 20):
    """How often each id occurs in train.bin, counted one chunk at a time: memory stays flat."""
    data = load_token_array(Path(data_dir) / "train.bin")
    counts = np.zeros(load_meta(data_dir)["vocab_size"], dtype=np.int64)
    for start in range(0, len(data), chunk):
        counts += np.bincount(data[start : start + chunk], minlength=len(counts))
    return counts


def exercise_3_most_common_tokens(data_dir=DATA_DIR, k=5):
    """Count every id with np.bincount, chunk by chunk (token_counts). On the sample corpus '.'
    comes first: its sentences are short."""
    counts = token_counts(data_dir)
    tokenizer = load_tokenizer(Path(data_dir) / "tokenizer.json")
    top = np.argsort(-counts, kind="stable")[:k]
    return [(tokenizer.decode([int(i)], skip_special_tokens=False), int(counts[i])) for i in top]


def exercise_4_every_token_seen(n_tokens=10_000, batch_size=8, seq_len=64, seed=0):
    """How many random batches until every token has been inside some x? One epoch's worth of
    batches, N / (B·T), leaves about e^-1 ≈ 37% unseen: random windows overlap and miss."""
    data = np.arange(n_tokens, dtype=np.uint16)  # token i is i: x holds the positions it read
    seen = np.zeros(n_tokens, dtype=bool)
    generator = torch.Generator().manual_seed(seed)
    epoch = n_tokens // (batch_size * seq_len)
    for _ in range(epoch):
        x, _ = get_batch(data, batch_size, seq_len, generator=generator)
        seen[x.flatten().numpy()] = True
    return epoch, float(1 - seen.mean())


def exercise_5_plot_token_ranks(path, data_dirs=(DATA_DIR,)):
    """Each token's count against its rank, on log-log axes: a few tokens are very common, most
    are rare, and the counts fall roughly as a power of the rank (Zipf's law). Not every id is
    used: merges that only served as steps towards longer tokens never appear in the output."""
    from matplotlib.figure import Figure  # imported here: only this picture needs it

    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.subplots()
    for data_dir in data_dirs:
        counts = np.sort(token_counts(data_dir))[::-1]
        counts = counts[counts > 0]
        label = f"{load_meta(data_dir)['source'].split('/')[-1]} ({len(counts):,} ids used)"
        ax.loglog(np.arange(1, len(counts) + 1), counts, label=label)
    ax.set(xlabel="rank of the token (1 = most common)", ylabel="count in train.bin",
           title="token counts by rank")
    ax.legend()
    save_figure(fig, path, dpi=80)
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--plot", help="save the picture of exercise 5 here")
    parser.add_argument("--data-dir", nargs="+", type=Path, default=[DATA_DIR],
                        help="prepared data folders to draw (default: DATA_DIR)")
    args = parser.parse_args()
    if args.plot:
        print("exercise 5:", "saved", exercise_5_plot_token_ranks(args.plot, args.data_dir))
    n_windows, n_blocks = exercise_1_windows(1_000_000, 256)
    print("exercise 1:", f"N=1,000,000, T=256: {n_windows:,} windows (N - T), {n_blocks:,} blocks")
    in_memory, on_disk = exercise_2_batch_bytes(32, 256)
    print("exercise 2:", f"B=32, T=256: {in_memory:,} bytes as int64 x and y, {on_disk:,} on disk")
    print("exercise 3:", exercise_3_most_common_tokens())
    epoch, unseen = exercise_4_every_token_seen()
    print("exercise 4:", f"after {epoch} batches (one epoch of tokens) {unseen:.0%} never seen")
