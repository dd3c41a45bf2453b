"""Shared helper (step 17): the story studio, a page where your own model writes in the browser.

    uv run python -m tiny_llm.studio --checkpoint runs/cpu/ckpt.pt [--checkpoint2 OTHER.pt]

It serves one page on 127.0.0.1 (any free port unless --port says) and prints its address. The
story streams in token by token through step 12's KV cache, drawn by step 09's sampler
(`sample_tokens`, `next_token_probs`), so a seed gives the very tokens `tiny_llm.generate` prints.
Every token is shaded by the probability the model gave it; selecting one shows the ten most
likely candidates before and after temperature, top-k and top-p, and where the position that
chose it attended, per layer and head (steps 05 and 06). A checkpoint fine-tuned to take
requests (step 17) gets a form for words, features and a sentence; a second checkpoint writes
beside the first, from the same prompt and seed.

Safe by default: only this machine can connect (another --host is a choice you make, with a
warning), prompts, stories and the number of stories written at once are capped, a closed tab
or the stop button ends its story, and the page can name no file: the checkpoints are the ones
on the command line, checked (step 09's checkpoint checks) before the server starts.

The server is FastAPI on uvicorn: a few lines per endpoint, a test client that runs the app
without a network, and streaming responses that end when the browser goes away. The page is
tiny_llm/studio.html: plain HTML and JavaScript, no build step, nothing from the internet.
"""

import argparse
import functools
import ipaddress
import json
import socket
import sys
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from tiny_llm.checkpoint import model_from_checkpoint
from tiny_llm.device import pick_device
from tiny_llm.evaluate import attention_maps
from tiny_llm.generate import DEFAULTS, check_sampling, next_token_probs, sample_tokens
from tiny_llm.instruct import FEATURES, render_request, takes_requests
from tiny_llm.kvcache import fresh_cache
from tiny_llm.paths import DATA_DIR
from tiny_llm.tokenize import EOT, tokenizer_path

PAGE = Path(__file__).with_name("studio.html")
LIMITS = {"prompt_chars": 2000, "max_new_tokens": 1000, "running": 2}  # what one server allows
TOP = 10  # candidates shown for a token


@dataclass
class Writer:
    """One checkpoint the studio writes with (chosen on the command line, never by the page)."""

    name: str
    model: torch.nn.Module
    tokenizer: Tokenizer
    requests: bool  # fine-tuned to take requests: the page shows the request form


def load_writer(path, device="cpu", data_dir=DATA_DIR):
    """A Writer from a checkpoint, after the project's checks (readable, the right keys, trained
    with the tokenizer prepared in data_dir); ValueError or FileNotFoundError if not."""
    model, ckpt = model_from_checkpoint(path, device, data_dir=data_dir)
    tokenizer = Tokenizer.from_file(str(tokenizer_path(Path(data_dir) / "tokenizer.json")))
    name = f"{Path(path).parent.name}/{Path(path).name} (step {ckpt['step']:,})"
    return Writer(name, model, tokenizer, takes_requests(ckpt))


def distributions(logits, temperature, top_k, top_p):
    """(V,) probabilities for (1, V) logits: the model's own softmax, and after sampling's
    reshaping, what the draw used (step 09's next_token_probs; greedy puts all on the argmax)."""
    before = F.softmax(logits.float(), dim=-1)[0]
    if temperature == 0:
        return before, F.one_hot(logits[0].argmax(), before.shape[0]).float()
    return before, next_token_probs(logits, temperature, top_k, top_p)[0]


def attention_module(block):
    """The attention layer of a block: step 07's Block calls it attn, step 15's block attention."""
    return block.attn if hasattr(block, "attn") else block.attention


def last_attention(model, idx):
    """Where the last position of a (1, T) sequence looks: (n_layers, n_heads, T) weights, each
    row summing to 1: the last row of step 11's attention_maps."""
    return attention_maps(model, idx[:, -model.config.max_seq_len:])[:, :, -1]


class Refused(ValueError):
    """A request the studio turns down; `status` is the HTTP status, the message says why."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


def prompt_text(writer, body):
    """The text a generate request starts from: the prompt, or a request rendered by step 17."""
    request = body.get("request")
    if request is None:
        prompt = body.get("prompt", "")
    elif not writer.requests:
        raise Refused(f"{writer.name} was not fine-tuned to take requests: send a plain prompt")
    else:
        words = [w.strip() for w in request.get("words") or [] if w.strip()]
        try:  # render_request refuses a feature the model was not taught, naming the choices
            prompt = render_request(words, list(request.get("features") or []),
                                    request.get("sentence") or None)
        except ValueError as err:
            raise Refused(str(err)) from None
    if not isinstance(prompt, str):
        raise Refused(f"the prompt must be text, got {type(prompt).__name__}")
    if len(prompt) > LIMITS["prompt_chars"]:
        raise Refused(f"the prompt has {len(prompt):,} characters; the studio takes at most "
                      f"{LIMITS['prompt_chars']:,} (the model reads only its last "
                      f"{writer.model.config.max_seq_len} tokens anyway)", 413)
    return prompt


def sampling_of(body):
    """(temperature, top_k, top_p, seed, max_new_tokens) from a request, checked as step 09 does."""
    temperature = body.get("temperature", DEFAULTS["temperature"])
    top_k = body.get("top_k", DEFAULTS["top_k"]) or None  # 0 or null: no limit, as on the CLI
    top_p = body.get("top_p", DEFAULTS["top_p"]) or None
    seed, n = body.get("seed", 1337), body.get("max_new_tokens", 200)
    try:
        check_sampling(temperature, top_k, top_p)
    except ValueError as err:
        raise Refused(str(err)) from None
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise Refused(f"seed must be an int >= 0, got {seed!r}")
    cap = LIMITS["max_new_tokens"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= cap:
        raise Refused(f"length must be a whole number of tokens from 1 to {cap:,}, got {n!r}")
    return temperature, top_k, top_p, seed, n


def story_lines(writer, prompt, temperature, top_k, top_p, seed, max_new_tokens):
    """The story as JSON lines: the prompt's tokens, then one line per new token (its id, text,
    probability before and after sampling's reshaping, and the top candidates), then the end."""
    model, tokenizer = writer.model, writer.tokenizer
    eot_id = tokenizer.token_to_id(EOT)
    ids = tokenizer.encode(prompt).ids or [eot_id]  # as generate does: '' starts after an EOT
    device = next(model.parameters()).device
    piece = functools.lru_cache(maxsize=None)(lambda i: tokenizer.decode([i]))
    yield {"prompt": [{"id": i, "text": piece(i)} for i in ids]}
    generator = torch.Generator(device=device).manual_seed(seed)  # the generate command's draws
    idx = torch.tensor([ids], device=device)
    made, end = 0, "length"
    for next_id, logits in sample_tokens(model, idx, max_new_tokens, temperature, top_k, top_p,
                                         generator, eot_id, fresh_cache(model)):
        i = next_id.item()
        before, after = distributions(logits, temperature, top_k, top_p)
        top = before.topk(min(TOP, before.shape[0])).indices.tolist()
        made += 1
        yield {"id": i, "text": piece(i), "eot": i == eot_id, "p": before[i].item(),
               "p_sampled": after[i].item(),
               "top": [{"id": j, "text": piece(j), "p": before[j].item(),
                        "p_sampled": after[j].item()} for j in top]}
        if i == eot_id:
            end = "eot"
    yield {"done": end, "tokens": made}


class Slots:
    """At most `n` stories written at once; a slot is freed when its story ends, however."""

    def __init__(self, n):
        self.n, self.running, self.lock = n, 0, threading.Lock()

    def take(self):
        with self.lock:
            if self.running >= self.n:
                raise Refused(f"the studio already writes {self.running} stories, its limit: "
                              "wait for one to end or press stop", 429)
            self.running += 1
        released = threading.Event()

        def release():
            with self.lock:
                if not released.is_set():
                    released.set()
                    self.running -= 1
        return release


def create_app(writers, limits=None):
    """The studio's FastAPI app for a list of Writers (the page numbers them 0, 1)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool

    limits = {**LIMITS, **(limits or {})}
    slots = Slots(limits["running"])
    app = FastAPI(title="tiny-llm story studio", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.slots = slots  # the tests look at it

    @app.exception_handler(Refused)
    async def refused(_request, err):
        return JSONResponse({"error": str(err)}, status_code=err.status)

    def writer_of(body):
        number = body.get("writer", 0)
        if type(number) is not int or number not in range(len(writers)):
            raise Refused(f"no checkpoint number {number!r}: this studio has {len(writers)}, "
                          f"numbered from 0, chosen on its command line")
        return writers[number]

    async def json_body(request):
        try:
            body = await request.json()
        except ValueError:
            raise Refused("the request body must be JSON") from None
        if not isinstance(body, dict):
            raise Refused("the request body must be a JSON object")
        return body

    @app.get("/", response_class=HTMLResponse)
    def page():
        return PAGE.read_text(encoding="utf-8")

    @app.get("/api/info")
    def info():
        return {"writers": [{"name": w.name, "requests": w.requests,
                             "max_seq_len": w.model.config.max_seq_len} for w in writers],
                "features": list(FEATURES), "limits": limits, "running": slots.running,
                "defaults": {**DEFAULTS, "seed": 1337, "max_new_tokens": 200}}

    @app.post("/api/generate")
    async def generate(request: Request):
        body = await json_body(request)
        writer = writer_of(body)
        prompt = prompt_text(writer, body)
        sampling = sampling_of(body)
        if sampling[-1] > limits["max_new_tokens"]:
            raise Refused(f"length must be at most {limits['max_new_tokens']:,} tokens here")
        release = slots.take()
        lines = story_lines(writer, prompt, *sampling)

        async def stream():  # one token a pull: a closed tab or stop means no more pulls
            try:
                while (line := await run_in_threadpool(next, lines, None)) is not None:
                    yield json.dumps(line) + "\n"
            finally:
                lines.close()
                release()

        body_iterator = stream()
        weakref.finalize(body_iterator, release)  # freed even if the stream never started
        return StreamingResponse(body_iterator, media_type="application/x-ndjson",
                                 headers={"Cache-Control": "no-store"})

    @app.post("/api/attention")
    async def attention(request: Request):
        body = await json_body(request)
        writer = writer_of(body)
        ids = body.get("ids")
        V, M = writer.model.config.vocab_size, writer.model.config.max_seq_len
        if (not isinstance(ids, list) or not 1 <= len(ids) <= M
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < V
                           for i in ids)):
            raise Refused(f"ids must be 1 to {M} token ids in [0, {V}), the text before a token")
        device = next(writer.model.parameters()).device
        idx = torch.tensor([ids], device=device)
        rows = await run_in_threadpool(last_attention, writer.model, idx)
        return {"layers": rows.tolist()}

    return app


def free_port(host):
    """A TCP port nobody listens on now (the system picks it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def main(argv=None):
    parser = argparse.ArgumentParser(description="The story studio: your model writes in the "
                                     "browser, token by token, and shows why it chose each token.")
    parser.add_argument("--checkpoint", required=True, help="a ckpt.pt from tiny_llm.train")
    parser.add_argument("--checkpoint2", default=None, help="a second one, to write side by side")
    parser.add_argument("--port", type=int, default=None, help="default: any free port")
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1: this machine only")
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="where tokenizer.json is")
    args = parser.parse_args(argv)
    if args.port is not None and not 1 <= args.port <= 65535:
        parser.error(f"--port must be from 1 to 65535, got {args.port}")
    try:
        import uvicorn
    except ImportError:
        raise SystemExit("error: the studio needs fastapi and uvicorn: run `uv sync`") from None
    try:  # every checkpoint is checked before anything listens
        device = pick_device(args.device)
        writers = [load_writer(path, device, args.data_dir)
                   for path in (args.checkpoint, args.checkpoint2) if path is not None]
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    if not is_loopback(args.host):
        print(f"warning: --host {args.host} lets other machines on the network use this studio "
              "(and your CPU); there is no password", file=sys.stderr)
    port = args.port or free_port(args.host)
    host = f"[{args.host}]" if ":" in args.host else args.host
    for i, w in enumerate(writers):
        print(f"{f'checkpoint {i + 1}':<12} {w.name}" + (", takes requests" if w.requests else ""))
    print(f"{'studio':<12} http://{host}:{port}/  (Ctrl-C stops it)", flush=True)
    uvicorn.run(create_app(writers), host=args.host, port=port, log_level="warning")


if __name__ == "__main__":
    main()
