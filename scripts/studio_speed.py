"""The story studio's speed against the generate command's, on one checkpoint.

    uv run python scripts/studio_speed.py --checkpoint runs/cpu/ckpt.pt [--rounds 3]

Times the first token and the tokens per second after it, both ways, with the same prompt,
sampling and seed: `stream_sample` (what `uv run python -m tiny_llm.generate` prints through)
in this process, and the studio's /api/generate stream from a `tiny_llm.studio` server started
as its own process, as a browser would read it. It also checks that both wrote the same tokens.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

from tiny_llm.checkpoint import model_from_checkpoint
from tiny_llm.generate import DEFAULTS, stream_sample
from tiny_llm.paths import DATA_DIR
from tiny_llm.studio import listening_socket
from tiny_llm.tokenize import load_tokenizer

PROMPT, SEED = "Once upon a time", 1337


def time_generate(model, tokenizer, n):
    """(new ids, seconds to the first new token, tokens/s after it) of stream_sample."""
    times = []
    start = time.perf_counter()
    ids = stream_sample(model, tokenizer, PROMPT, n, lambda _: times.append(time.perf_counter()),
                        torch.Generator().manual_seed(SEED), **DEFAULTS)
    end, made = time.perf_counter(), ids[len(tokenizer.encode(PROMPT).ids):]
    return made, times[1] - start, (len(made) - 1) / (end - times[1])  # times[0]: the prompt


def time_studio(client, url, n):
    """The same three numbers for one story streamed from the studio."""
    got = []
    start = time.perf_counter()
    body = {"prompt": PROMPT, "max_new_tokens": n, "seed": SEED, **DEFAULTS}
    with client.stream("POST", f"{url}/api/generate", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if "id" in (message := json.loads(line)):
                got.append((time.perf_counter(), message["id"]))
    end = time.perf_counter()
    return [i for _, i in got], got[0][0] - start, (len(got) - 1) / (end - got[0][0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model, _ = model_from_checkpoint(args.checkpoint, "cpu", data_dir=args.data_dir)
    tokenizer = load_tokenizer(args.data_dir / "tokenizer.json")
    for r in range(args.rounds):
        expected, first, rate = time_generate(model, tokenizer, args.max_new_tokens)
        print(f"generate  round {r}: {len(expected)} tokens, first after {first * 1000:.1f} ms, "
              f"then {rate:.0f} tokens/s")
    with listening_socket("127.0.0.1", 0) as free:  # a port nobody listens on now
        port = free.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tiny_llm.studio", "--port", str(port),
                               "--checkpoint", args.checkpoint, "--data-dir", str(args.data_dir)])
    client, url = httpx.Client(), f"http://127.0.0.1:{port}"  # made before any timing
    try:
        for _ in range(600):  # until it listens
            try:
                client.get(f"{url}/api/info")
                break
            except httpx.ConnectError:
                time.sleep(0.1)
        for r in range(args.rounds):
            made, first, rate = time_studio(client, url, args.max_new_tokens)
            print(f"studio    round {r}: {len(made)} tokens, first after {first * 1000:.1f} ms, "
                  f"then {rate:.0f} tokens/s; same tokens as generate: {made == expected}")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
