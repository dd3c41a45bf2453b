"""Shared helper (step 17): the story studio, a page where your own model writes in the browser.

    uv run python -m tiny_llm.studio --checkpoint runs/cpu/ckpt.pt [--checkpoint2 OTHER.pt]

It serves one page on 127.0.0.1 (any free port unless --port says) and prints its address. The
story streams in token by token through step 12's KV cache, drawn by step 09's sampler
(`sample_tokens`, `next_token_probs`), so a seed gives the very tokens `tiny_llm.generate` prints.
Every token is shaded by the probability the model gave it; selecting one shows the ten most
likely candidates before and after temperature, top-k and top-p, and where the position that
chose it attended, per layer and head (steps 05 and 06). A checkpoint fine-tuned to take
requests (step 17) gets a form for words, features and a sentence (only those it was taught),
and each story of a request shows its score by step 17's rules. A second checkpoint writes
beside the first, from the same input and seed; a base model beside a fine-tuned one gets the
same request as plain text: the zero-shot row, the "before" of "before and after". Each
checkpoint reads the tokenizer it was trained with (tokenizer_folder).

It also speaks OpenAI's chat API, so `openai`'s client, step 11's judge and other tools can
talk to a course model: GET /v1/models, POST /v1/chat/completions (streamed as server-sent
events with `"stream": true`), the last user message the prompt, or a request for a model
tuned on requests; temperature, top_p, max_tokens and seed as the API names them.

Safe by default: only this machine can connect (another --host is a choice you make, with a
warning), and only a page it served can use it: a request must name the studio's own address
as its Host (a web page that rebinds its DNS name to 127.0.0.1 names another) and send JSON (a
form another site posts cannot). Prompts, bodies, stories and the number of stories written at
once are capped, a closed tab or the stop button ends its story, and the page can name no file:
the checkpoints are the ones on the command line, checked (step 09's checkpoint checks) before
the server starts.

The server is FastAPI on uvicorn: a few lines per endpoint, a test client that runs the app
without a network, and streaming responses that end when the browser goes away. The page is
tiny_llm/studio.html: plain HTML and JavaScript, no build step, nothing from the internet.
"""

import argparse
import functools
import importlib
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

from tiny_llm.checkpoint import load_checkpoint, model_from_checkpoint
from tiny_llm.device import pick_device
from tiny_llm.evaluate import attention_maps
from tiny_llm.generate import DEFAULTS, check_sampling, next_token_probs, sample_tokens
from tiny_llm.instruct import STEERS, render_request
from tiny_llm.kvcache import fresh_cache
from tiny_llm.paths import DATA_DIR
from tiny_llm.request_data import (
    FEATURES,
    check_learned,
    in_a_sentence,
    learned_requests,
    score_story,
    uses_word,
)
from tiny_llm.tokenize import EOT, tokenizer_path, tokenizer_sha256

PAGE = Path(__file__).with_name("studio.html")
LIMITS = {"prompt_chars": 2000, "max_new_tokens": 1000, "running": 2,  # what one server allows
          "body_bytes": 65_536}
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")  # the names this machine calls itself by
TOP = 10  # candidates shown for a token


@dataclass
class Writer:
    """One checkpoint the studio writes with (chosen on the command line, never by the page)."""

    name: str
    model: torch.nn.Module
    tokenizer: Tokenizer
    learned: dict | None  # what requests it was fine-tuned on (step 17), None: plain prompts
    data_dir: Path = DATA_DIR  # the folder of the tokenizer it was trained with

    @property
    def requests(self):
        return self.learned is not None


def tokenizer_folder(path, ckpt, data_dir):
    """The folder whose tokenizer.json the checkpoint was trained with: data_dir, else its
    own (one beside it, as an import has, or its run's --data-dir), so two checkpoints of two
    tokenizers write side by side; else data_dir, and the check says what is wrong."""
    beside = Path(path) if Path(path).is_dir() else Path(path).parent  # a run folder, or a file
    own = [beside, Path((ckpt.get("train_config") or {}).get("data_dir", data_dir))]
    for folder in (Path(data_dir), *own):
        file = folder / "tokenizer.json"
        if file.is_file() and tokenizer_sha256(file) == ckpt.get("tokenizer_sha256"):
            return folder
    return Path(data_dir)


def load_writer(path, device="cpu", data_dir=DATA_DIR):
    """A Writer from a checkpoint, after the project's checks (readable, the right keys, trained
    with the tokenizer prepared in data_dir or with its own: tokenizer_folder); ValueError or
    FileNotFoundError if not."""
    data_dir = tokenizer_folder(path, load_checkpoint(path, device), data_dir)
    model, ckpt = model_from_checkpoint(path, device, data_dir=data_dir)
    tokenizer = Tokenizer.from_file(str(tokenizer_path(Path(data_dir) / "tokenizer.json")))
    path = Path(path) / "ckpt.pt" if Path(path).is_dir() else Path(path)  # a run folder's
    name = f"{path.parent.name}/{path.name} (step {ckpt['step']:,})"
    return Writer(name, model, tokenizer, learned_requests(ckpt), Path(data_dir))


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


def text(value, what):
    """`value` if it is text that UTF-8 can carry (JSON may hold half a surrogate pair), else a
    Refused naming `what`."""
    if not isinstance(value, str):
        raise Refused(f"{what} must be text, got {type(value).__name__} {value!r:.60}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise Refused(f"{what} holds {value[err.start]!r}, half of a surrogate pair, which is "
                      "no character: send whole characters") from None
    return value


def request_of(body):
    """A request's fields, checked, as render_request's arguments (words, features, sentence)."""
    request = body["request"]
    if not isinstance(request, dict):
        raise Refused(f"request must be an object with words, features and sentence, got "
                      f"{request!r:.60}")
    parts = {}
    for key in ("words", "features"):
        items = request.get(key) or []
        if not isinstance(items, list):
            raise Refused(f"{key} must be a list, such as [\"dog\", \"moon\"], got "
                          f"{type(items).__name__} {items!r:.60}")
        parts[key] = [text(item, f"each of {key}").strip() for item in items]
        parts[key] = [item for item in parts[key] if item]
    sentence = request.get("sentence")
    parts["sentence"] = (text(sentence, "sentence").strip() or None) if sentence else None
    return parts


def prompt_text(writer, body):
    """(text a generate request starts from, the request or None): the prompt, or a request
    rendered by step 17. A model never tuned on requests reads the request as plain text: the
    zero-shot row of a side-by-side."""
    if body.get("request") is None:
        prompt, request = text(body.get("prompt", ""), "the prompt"), None
    else:
        request = request_of(body)
        try:  # render_request refuses an unknown feature, check_learned one it was not taught
            prompt = render_request(**request)
            if writer.requests:
                check_learned(writer.learned, request, writer.name)
        except ValueError as err:
            raise Refused(str(err)) from None
        if not request["words"]:  # nothing a story could miss: every story would score 1
            raise Refused("the request asks for no words: a request is scored on the words a "
                          "story uses, so give at least one (dog, moon)")
    if len(prompt) > LIMITS["prompt_chars"]:
        raise Refused(f"the prompt has {len(prompt):,} characters; the studio takes at most "
                      f"{LIMITS['prompt_chars']:,} (the model reads only its last "
                      f"{writer.model.config.max_seq_len} tokens anyway)", 413)
    return prompt, request


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
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise Refused(f"seed must be an int from 0 to 2**64 - 1 (what a generator holds), got "
                      f"{seed!r:.40}")
    cap = LIMITS["max_new_tokens"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= cap:
        raise Refused(f"length must be a whole number of tokens from 1 to {cap:,}, got {n!r}")
    return temperature, top_k, top_p, seed, n


def story_lines(writer, prompt, temperature, top_k, top_p, seed, max_new_tokens, request=None,
                boost=0.0):
    """The story as JSON lines: the prompt's tokens, then one line per new token (its id, text,
    probability before and after sampling's reshaping, and the top candidates), then the end;
    for a request, the end carries the story's scores (step 17's score_story)."""
    model, tokenizer = writer.model, writer.tokenizer
    eot_id = tokenizer.token_to_id(EOT)
    ids = tokenizer.encode(prompt).ids or [eot_id]  # as generate does: '' starts after an EOT
    device = next(model.parameters()).device
    piece = functools.lru_cache(maxsize=None)(lambda i: tokenizer.decode([i]))
    yield {"prompt": [{"id": i, "text": piece(i)} for i in ids]}
    generator = torch.Generator(device=device).manual_seed(seed)  # the generate command's draws
    idx = torch.tensor([ids], device=device)
    made, end, story = 0, "length", []
    steer = None
    if boost:  # step 18's word boost, lent by name through step 17's STEERS table
        module, name = STEERS["boost"]
        steer = getattr(importlib.import_module(module), name)(tokenizer, request["words"],
                                                               boost, len(ids))
    for next_id, logits in sample_tokens(model, idx, max_new_tokens, temperature, top_k, top_p,
                                         generator, eot_id, fresh_cache(model), steer):
        i = next_id.item()
        before, after = distributions(logits, temperature, top_k, top_p)
        top = before.topk(min(TOP, before.shape[0])).indices.tolist()
        made += 1
        story += [i] if i != eot_id else []
        yield {"id": i, "text": piece(i), "eot": i == eot_id, "p": before[i].item(),
               "p_sampled": after[i].item(),
               "top": [{"id": j, "text": piece(j), "p": before[j].item(),
                        "p_sampled": after[j].item()} for j in top]}
        if i == eot_id:
            end = "eot"
    yield {"done": end, "tokens": made, **scores(request, tokenizer.decode(story))}


def scores(request, story):
    """{"scores": score_story's fields, "reward": their mean} for a request's story; {} for a
    prompt. The mean of what was asked: 2 of 3 words and the dialogue right -> (2/3 + 1) / 2."""
    if request is None:
        return {}
    marks = score_story({**request, "summary": None}, story)
    asked = [v for v in marks.values() if v is not None]
    words = request["words"]
    return {"scores": marks, "reward": sum(asked) / len(asked),
            "used": [w for w in words if uses_word(story, w)],  # the page marks these
            "in_sentence": [w for w in words if in_a_sentence(story, w, words)]}


# ----- OpenAI's chat API: /v1/models and /v1/chat/completions, for clients and judges -----


def model_ids(writers):
    """The name each writer goes by in the API: its run folder ('runs/cpu/ckpt.pt' -> 'cpu'),
    numbered where two share one ('cpu', 'cpu-2')."""
    ids = []
    for w in writers:
        base = w.name.split("/")[0]
        ids.append(base if base not in ids else f"{base}-{len(ids) + 1}")
    return ids


def chat_prompt(writer, messages):
    """(prompt, request or None) for a chat: the last user message, rendered as step 17's
    request for a model tuned on requests (its content is the words: "dog, moon", or words,
    features and sentence fields as in the exported chat template), else taken as the prompt."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise Refused("messages must be a list of {\"role\": ..., \"content\": ...} objects")
    users = [m for m in messages if m.get("role") == "user"]
    if not users:
        raise Refused("messages hold no message with role user: nothing to answer")
    last = users[-1]
    content = last.get("content") or ""
    if isinstance(content, list):  # OpenAI's parts: [{"type": "text", "text": ...}, ...]
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    content = text(content, "the user message's content")
    if not writer.requests:
        return prompt_text(writer, {"prompt": content})
    words = last.get("words", [w for w in content.split(",") if w.strip()])
    return prompt_text(writer, {"request": {"words": words, "features": last.get("features"),
                                            "sentence": last.get("sentence")}})


def chat_sampling(body, limits):
    """(temperature, top_k, top_p, seed, max_new_tokens) from a chat request: OpenAI's names
    and defaults (temperature 1, top_p 1, no top-k); the seed 1337 unless one is given."""
    top_p, n = body.get("top_p", 1.0), body.get("max_tokens")
    return sampling_of({"temperature": body.get("temperature", 1.0), "top_k": None,
                        "top_p": None if top_p == 1 else top_p, "seed": body.get("seed", 1337),
                        "max_new_tokens": min(200, limits["max_new_tokens"]) if n is None else n})


def completion_pieces(writer, prompt, temperature, top_k, top_p, seed, max_new_tokens):
    """The answer's text in pieces as they are made (whole characters only), then
    ("stop" or "length", tokens made): step 09's sampler through step 12's cache."""
    model, tokenizer = writer.model, writer.tokenizer
    eot_id = tokenizer.token_to_id(EOT)
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    idx = torch.tensor([tokenizer.encode(prompt).ids or [eot_id]], device=device)
    ids, shown, end = [], "", "length"
    for next_id, _ in sample_tokens(model, idx, max_new_tokens, temperature, top_k, top_p,
                                    generator, eot_id, fresh_cache(model)):
        if next_id.item() == eot_id:
            end = "stop"
            break
        ids.append(next_id.item())
        text_now = tokenizer.decode(ids)
        if not text_now.endswith("\ufffd") and len(text_now) > len(shown):
            yield text_now[len(shown):]
            shown = text_now
    if (rest := tokenizer.decode(ids)[len(shown):]):
        yield rest
    yield end, len(ids)


def chat_reply(model_id, pieces, prompt_tokens):
    """A non-streaming chat.completion object, as OpenAI's API answers one."""
    import time

    *texts, (end, made) = pieces
    return {"id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion",
            "created": int(time.time()), "model": model_id,
            "choices": [{"index": 0, "finish_reason": end,
                         "message": {"role": "assistant", "content": "".join(texts)}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": made,
                      "total_tokens": prompt_tokens + made}}


def chat_chunks(model_id, pieces):
    """The server-sent events of a streamed answer: a chunk with the role, one per piece of
    text, one with the finish reason, then data: [DONE]."""
    import time

    head = {"id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model_id}
    event = lambda delta, end=None: "data: " + json.dumps({**head, "choices": [  # noqa: E731
        {"index": 0, "delta": delta, "finish_reason": end}]}) + "\n\n"
    yield event({"role": "assistant", "content": ""})
    for piece in pieces:
        if isinstance(piece, tuple):
            yield event({}, piece[0])
        else:
            yield event({"content": piece})
    yield "data: [DONE]\n\n"


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


def host_name(header):
    """The name in a Host header, without its port: 'localhost:8000' -> 'localhost',
    '[::1]:8000' -> '[::1]'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header.partition("]")[0] + "]"
    return header.partition(":")[0]


def host_allowed(header, names):
    """Whether a request's Host header is one of `names`; with "*" among them (--host 0.0.0.0),
    also any address written as digits: DNS rebinding needs a name, and an address is none."""
    name = host_name(header)
    if name in names:
        return True
    try:
        return "*" in names and bool(ipaddress.ip_address(name.strip("[]")))
    except ValueError:
        return False


def served_names(host):
    """The Host names the studio answers to when it listens on `host`."""
    if host in ("0.0.0.0", "::"):
        return (*LOOPBACK, "*")
    return tuple(dict.fromkeys((*LOOPBACK, f"[{host}]" if ":" in host else host.lower())))


class OwnHostOnly:
    """ASGI middleware: answer 421 to a request whose Host is not one of `names`, before any
    endpoint runs (a page on evil.example.com whose name now points at 127.0.0.1 sends
    Host: evil.example.com, and learns nothing)."""

    def __init__(self, app, names):
        self.app, self.names = app, names

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if not host_allowed(header, self.names):
                from fastapi.responses import JSONResponse
                names = ", ".join(n for n in self.names if n != "*")
                refusal = JSONResponse({"error": f"this studio answers to {names} only, not to "
                                        f"Host {header[:60]!r}: open the address it printed"},
                                       status_code=421)
                return await refusal(scope, receive, send)
        await self.app(scope, receive, send)


def create_app(writers, limits=None, host="127.0.0.1"):
    """The studio's FastAPI app for a list of Writers (the page numbers them 0, 1), answering
    to the loopback names and `host`, the address it listens on."""
    from fastapi import FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool

    limits = {**LIMITS, **(limits or {})}
    slots = Slots(limits["running"])
    app = FastAPI(title="tiny-llm story studio", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.slots = slots  # the tests look at it
    app.add_middleware(OwnHostOnly, names=served_names(host))

    @app.exception_handler(Refused)
    async def refused(request, err):
        if request.url.path.startswith("/v1/"):  # OpenAI's shape, which its clients read
            return JSONResponse({"error": {"message": str(err), "type": "invalid_request_error",
                                           "code": err.status}}, status_code=err.status)
        return JSONResponse({"error": str(err)}, status_code=err.status)

    def writer_of(body):
        number = body.get("writer", 0)
        if type(number) is not int or number not in range(len(writers)):
            raise Refused(f"no checkpoint number {number!r}: this studio has {len(writers)}, "
                          f"numbered from 0, chosen on its command line")
        return writers[number]

    async def json_body(request):
        kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind != "application/json":  # a form another site posts cannot send this type
            raise Refused(f"send the request as JSON (Content-Type: application/json), not "
                          f"{kind or 'without a type'}", 415)
        cap, data = limits["body_bytes"], b""
        if not request.headers.get("content-length", "0").isdigit() or (
                int(request.headers.get("content-length", "0")) > cap):
            raise Refused(f"the request body may hold at most {cap:,} bytes", 413)
        async for chunk in request.stream():  # counted as it comes: a false length gains nothing
            data += chunk
            if len(data) > cap:
                raise Refused(f"the request body may hold at most {cap:,} bytes", 413)
        try:
            body = json.loads(data)
        except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
            raise Refused("the request body must be JSON, a few levels deep at most") from None
        if not isinstance(body, dict):
            raise Refused("the request body must be a JSON object")
        return body

    @app.get("/", response_class=HTMLResponse)
    def page():
        return PAGE.read_text(encoding="utf-8")

    @app.get("/api/info")
    def info():
        return {"writers": [{"name": w.name, "requests": w.requests, "learned": w.learned,
                             "max_seq_len": w.model.config.max_seq_len} for w in writers],
                "features": list(FEATURES), "limits": limits, "running": slots.running,
                "defaults": {**DEFAULTS, "seed": 1337, "max_new_tokens": 200}}

    @app.post("/api/generate")
    async def generate(request: Request):
        body = await json_body(request)
        writer = writer_of(body)
        prompt, asked = prompt_text(writer, body)
        sampling = sampling_of(body)
        if sampling[-1] > limits["max_new_tokens"]:
            raise Refused(f"length must be at most {limits['max_new_tokens']:,} tokens here")
        release = slots.take()
        boost = body.get("boost", 0)
        if isinstance(boost, bool) or not isinstance(boost, (int, float)) or not 0 <= boost <= 20 \
                or (boost and asked is None):
            raise Refused(f"boost leans the sampler towards a request's words, by 0 to 20 (3 is "
                          f"plenty), got {boost!r:.40}" + ("" if asked else " for a prompt"))
        lines = story_lines(writer, prompt, *sampling, request=asked, boost=boost)

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

    ids = model_ids(writers)

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": i, "object": "model", "created": 0,
                                            "owned_by": "tiny-llm"} for i in ids]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await json_body(request)
        if body.get("model") not in ids:
            raise Refused(f"no model {body.get('model')!r:.60} here: this studio serves "
                          f"{', '.join(ids)} (GET /v1/models)", 404)
        writer = writers[ids.index(body["model"])]
        prompt, _ = chat_prompt(writer, body.get("messages"))
        sampling = chat_sampling(body, limits)
        release = slots.take()
        pieces = completion_pieces(writer, prompt, *sampling)
        if not body.get("stream"):
            try:
                made = await run_in_threadpool(list, pieces)
            finally:
                release()
            return chat_reply(body["model"], made, len(writer.tokenizer.encode(prompt).ids))
        events = chat_chunks(body["model"], pieces)

        async def stream():
            try:
                while (event := await run_in_threadpool(next, events, None)) is not None:
                    yield event
            finally:
                events.close()
                release()

        body_iterator = stream()
        weakref.finalize(body_iterator, release)
        return StreamingResponse(body_iterator, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    return app


def listening_socket(host, port):
    """A socket bound to host and port (0: any free one), before the address is printed: a
    port in use is said at once, never after the address of another server was shown."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds its own
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        taken = f"port {port} is in use (by another studio or program?)"
        raise SystemExit(f"error: cannot listen on {host}:{port}: "
                         f"{taken if port else err.strerror}: choose another --port, or leave "
                         "it out for a free one") from None
    return sock


def serve(app, sock):
    """Run the app on a bound socket until Ctrl-C."""
    import uvicorn
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


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
        import uvicorn  # noqa: F401 (serve() runs it)
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
    sock = listening_socket(args.host, args.port or 0)
    port = sock.getsockname()[1]
    host = f"[{args.host}]" if ":" in args.host else args.host
    for i, w in enumerate(writers):
        taught = w.learned and ", ".join(w.learned["fields"] + w.learned["features"])
        print(f"{f'checkpoint {i + 1}':<12} {w.name}" + (f", takes requests ({taught})"
                                                        if w.requests else "")
              + (f", its tokenizer from {w.data_dir}" if w.data_dir != args.data_dir else ""))
    print(f"{'studio':<12} http://{host}:{port}/  (Ctrl-C stops it)", flush=True)
    serve(create_app(writers, host=args.host), sock)


if __name__ == "__main__":
    main()
