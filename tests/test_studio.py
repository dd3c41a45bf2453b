"""The story studio's server (tiny_llm/studio.py) through FastAPI's test client, on tiny models
built from a config and saved in the project's checkpoint format."""

import json
from dataclasses import asdict

import pytest
import torch
from fastapi.testclient import TestClient

from tiny_llm import studio
from tiny_llm.checkpoint import save_checkpoint
from tiny_llm.evaluate import attention_maps
from tiny_llm.generate import generate, stream_sample
from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.instruct import FEATURES, render_request, score_story
from tiny_llm.modern import ModernConfig, ModernGPT
from tiny_llm.request_data import uses_word
from tiny_llm.tokenize import EOT, load_tokenizer, tokenizer_sha256

SAMPLING = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 7}


def tiny_checkpoint(path, data_dir, model_class=GPT, requests=False):
    """A seeded tiny model saved as train.py saves one; max_seq_len 24 so a story slides."""
    vocab = load_tokenizer(data_dir / "tokenizer.json").get_vocab_size()
    cfg_class = ModernConfig if model_class is ModernGPT else GPTConfig
    extra = {"n_kv_heads": 1} if model_class is ModernGPT else {}
    config = cfg_class(vocab_size=vocab, max_seq_len=24, d_model=32, n_layers=2, n_heads=2,
                       **extra)
    torch.manual_seed(0)
    model = model_class(config)
    state = {"model": model.state_dict(), "config": asdict(config), "step": 5,
             "tokenizer_sha256": tokenizer_sha256(data_dir / "tokenizer.json"),
             "model_class": f"{model_class.__module__}.{model_class.__name__}",
             "train_config": {"requests": requests}}
    save_checkpoint(path, state)
    return path


@pytest.fixture(scope="module")
def writers(tmp_path_factory, sample_data_dir):
    folder = tmp_path_factory.mktemp("studio")
    gpt = tiny_checkpoint(folder / "gpt" / "ckpt.pt", sample_data_dir)
    modern = tiny_checkpoint(folder / "modern" / "ckpt.pt", sample_data_dir, ModernGPT, True)
    return [studio.load_writer(p, data_dir=sample_data_dir) for p in (gpt, modern)]


def local(app):
    """A test client that calls the studio as the page it served does: Host 127.0.0.1."""
    return TestClient(app, base_url="http://127.0.0.1:8000")


def stream(client, **body):
    """The JSON lines of one /api/generate call."""
    response = client.post("/api/generate", json=body)
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()]


def test_streamed_tokens_are_the_generate_commands_tokens(writers):
    client = local(studio.create_app(writers))
    for number, writer in enumerate(writers):
        lines = stream(client, writer=number, prompt="Once upon a time", max_new_tokens=40,
                       **SAMPLING)
        prompt = [t["id"] for t in lines[0]["prompt"]]
        made = [line["id"] for line in lines[1:-1]]
        assert lines[-1] == {"done": "length", "tokens": 40} and len(made) == 40  # 24 slides
        tok, sampling = writer.tokenizer, {k: SAMPLING[k] for k in ("temperature", "top_k",
                                                                     "top_p")}
        assert prompt == tok.encode("Once upon a time").ids
        seeded = torch.Generator().manual_seed(SAMPLING["seed"])
        out = generate(writer.model, torch.tensor([prompt]), 40, generator=seeded,
                       eot_id=tok.token_to_id(EOT), **sampling)  # no cache: step 09's way
        assert out[0, len(prompt):].tolist() == made
        seeded = torch.Generator().manual_seed(SAMPLING["seed"])  # what the command prints
        printed = stream_sample(writer.model, tok, "Once upon a time", 40, lambda _: None,
                                seeded, **sampling)
        assert printed[len(prompt):] == made


def test_inspector_probabilities_are_the_models_softmax(writers):
    client = local(studio.create_app(writers))
    lines = stream(client, prompt="The dog", max_new_tokens=6, temperature=1.0, top_k=3,
                   top_p=None, seed=1)
    ids = [t["id"] for t in lines[0]["prompt"]]
    model = writers[0].model
    for line in lines[1:-1]:
        probs = torch.softmax(model(torch.tensor([ids]))[0][0, -1], dim=-1)
        assert abs(probs.sum().item() - 1) < 1e-5
        best = probs.topk(10)
        assert [c["id"] for c in line["top"]] == best.indices.tolist()
        assert [c["p"] for c in line["top"]] == pytest.approx(best.values.tolist(), abs=1e-5)
        assert line["p"] == pytest.approx(probs[line["id"]].item(), abs=1e-5)
        # top-k 3 at temperature 1: the three most likely share all the mass, in proportion
        kept = [c["p_sampled"] for c in line["top"]]
        assert sum(kept[:3]) == pytest.approx(1, abs=1e-5) and kept[3:] == [0] * 7
        assert kept[0] / kept[1] == pytest.approx(line["top"][0]["p"] / line["top"][1]["p"],
                                                  rel=1e-4)
        assert line["id"] in [c["id"] for c in line["top"][:3]]
        ids.append(line["id"])


def test_greedy_puts_everything_on_the_argmax(writers):
    client = local(studio.create_app(writers))
    line = stream(client, prompt="The dog", max_new_tokens=1, temperature=0)[1]
    assert line["id"] == line["top"][0]["id"] and line["p_sampled"] == 1.0


@pytest.mark.parametrize("number", [0, 1])  # step 08's GPT and step 15's ModernGPT
def test_attention_weights_rebuild_each_layers_output(writers, number):
    """The inspector's weights, times each head's values, give what the layer really output."""
    model = writers[number].model
    ids = writers[number].tokenizer.encode("Once upon a time there was a dog").ids
    client = local(studio.create_app(writers))
    response = client.post("/api/attention", json={"writer": number, "ids": ids})
    assert response.status_code == 200, response.text
    rows = torch.tensor(response.json()["layers"])  # (n_layers, n_heads, T)
    assert rows.shape == (2, 2, len(ids))
    assert torch.allclose(rows.sum(-1), torch.ones(2, 2), atol=1e-5)
    seen = []
    hooks = [studio.attention_module(b).register_forward_hook(
        lambda m, i, o: seen.append((m, i[0], o))) for b in model.blocks]
    model(torch.tensor([ids]))
    for hook in hooks:
        hook.remove()
    for layer, (attn, x, out) in enumerate(seen):
        B, T, C = x.shape
        if number == 0:
            v = attn.qkv(x).split(C, dim=2)[2].view(B, T, 2, C // 2).transpose(1, 2)
            project = attn.proj
        else:  # one key/value head serves both query heads
            v = attn.wv(x).view(B, T, 1, C // 2).transpose(1, 2).expand(B, 2, T, C // 2)
            project = attn.wo
        y = (rows[layer][None, :, None, :] @ v)[:, :, 0]  # (1, heads, hs) at the last position
        assert torch.allclose(project(y.reshape(1, C)), out[:, -1], atol=1e-5)
    if number == 0:  # and step 11's pictures agree for the GPT
        maps = attention_maps(model, torch.tensor([ids]))
        assert torch.allclose(maps[:, :, -1], rows, atol=1e-5)


def test_request_form_renders_through_the_requests_step(writers):
    client = local(studio.create_app(writers))
    info = client.get("/api/info").json()
    assert [w["requests"] for w in info["writers"]] == [False, True]
    assert info["features"] == list(FEATURES)
    request = {"words": ["dog", "moon"], "features": [FEATURES[0]], "sentence": "It was late."}
    lines = stream(client, writer=1, request=request, max_new_tokens=2, seed=3)
    expected = render_request(["dog", "moon"], [FEATURES[0]], "It was late.")
    assert [t["id"] for t in lines[0]["prompt"]] == writers[1].tokenizer.encode(expected).ids
    zero_shot = stream(client, writer=0, request=request, max_new_tokens=2, seed=3)  # the base
    assert [t["id"] for t in zero_shot[0]["prompt"]] == [t["id"] for t in lines[0]["prompt"]]
    bad = client.post("/api/generate", json={"writer": 1, "request": {"features": ["Rhyme"]}})
    assert bad.status_code == 400 and "unknown features ['Rhyme']" in bad.text


@pytest.mark.parametrize("body, status, message", [
    ({"prompt": "x" * 2001}, 413, "2,001 characters; the studio takes at most 2,000"),
    ({"max_new_tokens": 1001}, 400, "from 1 to 1,000, got 1001"),
    ({"max_new_tokens": 0}, 400, "from 1 to 1,000, got 0"),
    ({"temperature": -1}, 400, "temperature must be a number >= 0"),
    ({"top_p": 1.5}, 400, "top_p must be in (0, 1]"),
    ({"seed": "x"}, 400,
     "seed must be an int from 0 to 2**64 - 1 (what a generator holds), got 'x'"),
    ({"writer": 2}, 400, "no checkpoint number 2: this studio has 2"),
    ({"writer": "../../etc/passwd"}, 400, "no checkpoint number '../../etc/passwd'"),
    ({"checkpoint": "runs/other/ckpt.pt"}, 200, ""),  # a file name is not even read
])
def test_caps_and_refusals_say_what_is_wrong(writers, body, status, message):
    client = local(studio.create_app(writers))
    response = client.post("/api/generate", json={"max_new_tokens": 2, **body})
    assert response.status_code == status and message in response.text
    if status != 200:
        assert response.json()["error"]


def test_concurrent_stories_are_capped_and_freed(writers):
    app = studio.create_app(writers, limits={"running": 1})
    client = local(app)
    release = app.state.slots.take()  # a story being written elsewhere
    assert client.get("/api/info").json()["running"] == 1
    busy = client.post("/api/generate", json={"max_new_tokens": 2})
    assert busy.status_code == 429
    assert "already writes 1 stories, its limit: wait for one to end or press stop" in busy.text
    release()
    stream(client, max_new_tokens=2)  # the slot is free again, and a finished story frees it
    assert client.get("/api/info").json()["running"] == 0


def test_the_page_loads_nothing_from_the_internet(writers):
    page = local(studio.create_app(writers)).get("/")
    assert page.status_code == 200 and "<script>" in page.text
    assert "http://" not in page.text and "https://" not in page.text
    assert "<link" not in page.text and "src=" not in page.text


def test_a_bad_checkpoint_is_refused_before_the_server_starts(tmp_path, sample_data_dir,
                                                            monkeypatch, capsys):
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("the server started"))
    bad = tmp_path / "notes.pt"
    bad.write_text("not a checkpoint")
    with pytest.raises(SystemExit, match="could not be read as a checkpoint"):
        studio.main(["--checkpoint", str(bad), "--data-dir", str(sample_data_dir)])
    other = tiny_checkpoint(tmp_path / "ckpt.pt", sample_data_dir)
    state = torch.load(other, weights_only=True)
    save_checkpoint(other, {**state, "tokenizer_sha256": "f" * 64})
    good = tiny_checkpoint(tmp_path / "good" / "ckpt.pt", sample_data_dir)
    with pytest.raises(SystemExit, match="different tokenizer"):
        studio.main(["--checkpoint", str(good), "--checkpoint2", str(other),
                     "--data-dir", str(sample_data_dir)])


def test_localhost_and_a_free_port_unless_asked(tmp_path, sample_data_dir, monkeypatch, capsys):
    ckpt = tiny_checkpoint(tmp_path / "run" / "ckpt.pt", sample_data_dir)
    started = {}

    def serve(app, sock):  # the socket is bound before the address is printed
        started.update(host=sock.getsockname()[0], port=sock.getsockname()[1], app=app)
        sock.close()
    monkeypatch.setattr(studio, "serve", serve)
    studio.main(["--checkpoint", str(ckpt), "--data-dir", str(sample_data_dir)])
    out = capsys.readouterr()
    assert started["host"] == "127.0.0.1" and 1024 <= started["port"] <= 65535
    assert f"http://127.0.0.1:{started['port']}/" in out.out and "warning" not in out.err
    port = started["port"]  # free a moment ago
    studio.main(["--checkpoint", str(ckpt), "--data-dir", str(sample_data_dir),
                 "--host", "0.0.0.0", "--port", str(port)])
    out = capsys.readouterr()
    assert (started["host"], started["port"]) == ("0.0.0.0", port)
    assert "warning: --host 0.0.0.0 lets other machines" in out.err
    other = TestClient(started["app"], base_url=f"http://192.168.1.9:{port}")  # its LAN address
    assert other.get("/api/info").status_code == 200


# ----- issue 36: nothing trusted (the studio's server) -----


@pytest.mark.parametrize("host", ["evil.example.com", "evil.example.com:8000", "127.0.0.1.nip.io",
                                  "localhost.evil.example.com:8000", ""])
def test_a_foreign_host_is_refused_before_any_endpoint(writers, host):
    client = local(studio.create_app(writers))
    for method, path, body in (("get", "/api/info", None), ("get", "/", None),
                               ("post", "/api/generate", {"max_new_tokens": 2})):
        response = client.request(method.upper(), path, json=body, headers={"host": host})
        assert response.status_code == 421, (host, path)
        assert "answers to 127.0.0.1, localhost, [::1] only" in response.json()["error"]


@pytest.mark.parametrize("host, names, allowed", [
    ("127.0.0.1:8000", studio.served_names("127.0.0.1"), True),
    ("LOCALHOST:8000", studio.served_names("127.0.0.1"), True),
    ("[::1]:8000", studio.served_names("::1"), True),
    ("192.168.1.9:8000", studio.served_names("192.168.1.9"), True),  # the --host given
    ("192.168.1.9:8000", studio.served_names("127.0.0.1"), False),
    ("10.0.0.5:8000", studio.served_names("0.0.0.0"), True),  # every address: any address
    ("[fe80::1]:8000", studio.served_names("::"), True),
    ("evil.example.com", studio.served_names("0.0.0.0"), False),  # a name never
])
def test_the_host_names_the_studio_answers_to(host, names, allowed):
    assert studio.host_allowed(host, names) is allowed


@pytest.mark.parametrize("body, status, message", [
    ({"temperature": 1e-300}, 400, "temperature 1e-300 is too small to divide by"),
    ({"temperature": 1e-45}, 400, "temperature 1e-45 is too small"),
    ({"top_p": 1e-300}, 400, "top_p 1e-300 is too small"),
    ({"seed": 2**64}, 400, "seed must be an int from 0 to 2**64 - 1"),
    ({"prompt": 5}, 400, "the prompt must be text, got int 5"),
    ({"writer": 1, "request": {"words": [1, 2]}}, 400, "each of words must be text, got int 1"),
    ({"writer": 1, "request": {"sentence": 5}}, 400, "sentence must be text, got int 5"),
    ({"writer": 1, "request": {"words": "dog, moon"}}, 400,
     "words must be a list, such as [\"dog\", \"moon\"], got str 'dog, moon'"),
    ({"writer": 1, "request": "dog"}, 400, "request must be an object"),
])
def test_values_that_broke_the_stream_are_refused_before_it(writers, body, status, message):
    client = local(studio.create_app(writers))
    response = client.post("/api/generate", json={"max_new_tokens": 2, **body})
    assert response.status_code == status and message in response.json()["error"], response.text


def test_a_surrogate_sent_as_raw_json_is_refused_not_a_broken_stream(writers):
    client = local(studio.create_app(writers))
    raw = b'{"prompt": "Once \\ud800", "max_new_tokens": 2}'  # JSON may escape half a pair
    response = client.post("/api/generate", content=raw,
                           headers={"content-type": "application/json"})
    assert response.status_code == 400 and "half of a surrogate pair" in response.text


def test_json_nested_deep_is_a_400_not_a_500(writers):
    client = local(studio.create_app(writers))
    response = client.post("/api/generate", content=b"[" * 30_000 + b"]" * 30_000,
                           headers={"content-type": "application/json"})
    assert response.status_code == 400 and "a few levels deep at most" in response.text


def test_only_json_starts_a_story(writers):
    client = local(studio.create_app(writers))
    for kind in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"content-type": kind} if kind else {}
        response = client.post("/api/generate", content=b'{"max_new_tokens": 2}', headers=headers)
        assert response.status_code == 415 and "Content-Type: application/json" in response.text
    assert client.get("/api/info").json()["running"] == 0


def test_a_huge_body_is_refused_unread(writers, monkeypatch):
    client = local(studio.create_app(writers))
    huge = b'{"prompt": "' + b"x" * 5_000_000 + b'"}'
    response = client.post("/api/generate", content=huge,
                           headers={"content-type": "application/json"})
    assert response.status_code == 413 and "at most 65,536 bytes" in response.text

    def chunks():  # no Content-Length: counted as it arrives, and cut at the cap
        yield b'{"prompt": "'
        for _ in range(100):
            yield b"x" * 100_000
    response = client.post("/api/generate", content=chunks(),
                           headers={"content-type": "application/json"})
    assert response.status_code == 413


def test_a_request_story_ends_with_its_scores_by_step_17s_rules(writers):
    client = local(studio.create_app(writers))
    request = {"words": ["dog", "the"], "features": ["Dialogue"], "sentence": None}
    lines = stream(client, writer=1, request=request, max_new_tokens=30, seed=5)
    story = writers[1].tokenizer.decode([t["id"] for t in lines[1:-1] if not t["eot"]])
    expected = score_story({**request, "summary": None}, story)
    assert lines[-1]["scores"] == expected
    assert lines[-1]["reward"] == pytest.approx((expected["words"] + expected["dialogue"]) / 2)
    assert lines[-1]["used"] == [w for w in ("dog", "the") if uses_word(story, w)]
    assert set(lines[-1]["in_sentence"]) <= set(lines[-1]["used"])  # the page marks both
    empty = client.post("/api/generate", json={"writer": 1, "request": {"words": [" ", ""]}})
    assert empty.status_code == 400 and "asks for no words" in empty.json()["error"]
    plain = stream(client, writer=1, prompt="Once", max_new_tokens=2)
    assert "scores" not in plain[-1]  # a prompt asks for nothing


def test_a_checkpoint_offers_only_the_features_it_learned(writers, tmp_path, sample_data_dir):
    derived = tiny_checkpoint(tmp_path / "derived" / "ckpt.pt", sample_data_dir, requests="derived")
    writer = studio.load_writer(derived, data_dir=sample_data_dir)
    client = local(studio.create_app([writers[0], writer]))
    info = client.get("/api/info").json()["writers"]
    assert info[0]["learned"] is None
    assert info[1]["learned"] == {"fields": ["words", "sentence"], "features": ["Dialogue"]}
    stream(client, writer=1, request={"words": ["dog"], "features": ["Dialogue"]},
           max_new_tokens=2)
    refused = client.post("/api/generate", json={"writer": 1, "request": {"features": ["Twist"]}})
    assert refused.status_code == 400
    assert "was never taught Twist: its requests held words, sentence and Dialogue" in refused.text


def test_a_port_in_use_is_said_before_any_address_is_printed(tmp_path, sample_data_dir,
                                                            monkeypatch, capsys):
    import socket

    ckpt = tiny_checkpoint(tmp_path / "run" / "ckpt.pt", sample_data_dir)
    monkeypatch.setattr(studio, "serve", lambda *a: pytest.fail("the server started"))
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(SystemExit, match=f"port {port} is in use .* choose another --port"):
            studio.main(["--checkpoint", str(ckpt), "--data-dir", str(sample_data_dir),
                         "--port", str(port)])
    assert "http://" not in capsys.readouterr().out


def test_a_run_folder_is_named_by_its_checkpoint(tmp_path, sample_data_dir):
    tiny_checkpoint(tmp_path / "run" / "ckpt.pt", sample_data_dir)
    assert studio.load_writer(tmp_path / "run", data_dir=sample_data_dir).name == (
        "run/ckpt.pt (step 5)")


# ----- OpenAI's chat API -----


def chat(client, **body):
    return client.post("/v1/chat/completions", json=body)


def test_the_openai_api_lists_the_models_and_answers_a_chat(writers):
    client = local(studio.create_app(writers))
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["gpt", "modern"]
    messages = [{"role": "system", "content": "Be kind."},
                {"role": "user", "content": "Once upon a time"}]
    answer = chat(client, model="gpt", messages=messages, max_tokens=12, seed=7,
                  temperature=0.9).json()
    choice = answer["choices"][0]
    assert answer["object"] == "chat.completion" and choice["message"]["role"] == "assistant"
    assert answer["usage"]["completion_tokens"] <= 12 and choice["finish_reason"] in (
        "stop", "length")
    tok = writers[0].tokenizer  # the last user message is the prompt of a plain model
    seeded = torch.Generator().manual_seed(7)
    out = generate(writers[0].model, torch.tensor([tok.encode("Once upon a time").ids]), 12,
                   temperature=0.9, generator=seeded, eot_id=tok.token_to_id(EOT))
    assert choice["message"]["content"] == tok.decode(out[0, 4:].tolist())
    # a requests model reads the content as the words, in step 17's request format
    asked = chat(client, model="modern", messages=[{"role": "user", "content": "dog, moon"}],
                 max_tokens=3).json()
    assert asked["usage"]["prompt_tokens"] == len(
        tok.encode(render_request(words=["dog", "moon"])).ids)


def test_a_streamed_chat_is_server_sent_events_ending_in_done(writers):
    client = local(studio.create_app(writers))
    body = {"model": "gpt", "messages": [{"role": "user", "content": "Once"}], "max_tokens": 10,
            "seed": 3}
    whole = chat(client, **body).json()["choices"][0]["message"]["content"]
    response = chat(client, **body, stream=True)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole


@pytest.mark.parametrize("body, status, message", [
    ({"model": "gpt-4", "messages": [{"role": "user", "content": "Hi"}]}, 404, "no model 'gpt-4'"),
    ({"model": "gpt", "messages": [{"role": "system", "content": "Hi"}]}, 400, "no message with"),
    ({"model": "gpt", "messages": "Hi"}, 400, "messages must be a list"),
    ({"model": "gpt", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0}, 400,
     "length must be"),
    ({"model": "modern", "messages": [{"role": "user", "content": ", ,"}]}, 400,
     "asks for no words"),
])
def test_chat_refusals_are_openai_shaped_errors(writers, body, status, message):
    response = chat(local(studio.create_app(writers)), **body)
    assert response.status_code == status and message in response.json()["error"]["message"]
    foreign = TestClient(studio.create_app(writers), base_url="http://evil.example:8000")
    assert chat(foreign, **body).status_code == 421  # the Host check covers the API too


def test_the_judge_grades_through_the_studio_and_counts_what_it_cannot_read(
        writers, tmp_path, sample_data_dir, monkeypatch, capsys):
    """A real server (uvicorn in a thread, a free port) and a real tiny model: its answers are
    not JSON, and the judge counts them unreadable, keeps them, and asks nothing twice."""
    import sys
    import threading
    import time

    import uvicorn

    from tiny_llm import evaluate

    sock = studio.listening_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(studio.create_app(writers), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    ckpt = tiny_checkpoint(tmp_path / "run" / "ckpt.pt", sample_data_dir)
    argv = ["evaluate", "--checkpoint", str(ckpt), "--data-dir", str(sample_data_dir),
            "--max-batches", "1", "--samples", "0", "--stories", "2", "--story-tokens", "8",
            "--judge", url, "--judge-model", "gpt", "--device", "cpu"]
    monkeypatch.setattr(sys, "argv", argv)
    try:
        evaluate.main()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    out = capsys.readouterr().out
    assert "2 of 2" in out and out.count("unreadable       run, story") == 2
    kept = [json.loads(line) for line in (tmp_path / "run" / "judge.jsonl").open()]
    assert len(kept) == 2 and all(k["answer"] and k["request"]["temperature"] == 0 for k in kept)
    evaluate.main()  # the server is gone: every answer comes from the record
    assert capsys.readouterr().out.splitlines()[-3:] == out.splitlines()[-3:]


def test_two_checkpoints_of_two_tokenizers_each_read_their_own(tmp_path, sample_data_dir):
    """One checkpoint of the prepared data, one whose tokenizer lies beside it (as an import's
    does, or its run's --data-dir): each writer decodes with its own; one whose tokenizer is
    nowhere is refused with the checkpoint check's advice."""
    plain = tiny_checkpoint(tmp_path / "plain" / "ckpt.pt", sample_data_dir)
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer.json").write_text((sample_data_dir / "tokenizer.json").read_text() + "\n")
    ckpt = tiny_checkpoint(other / "ckpt.pt", sample_data_dir)
    state = torch.load(ckpt, weights_only=True)
    state["tokenizer_sha256"] = tokenizer_sha256(other / "tokenizer.json")
    save_checkpoint(ckpt, state)
    first, second = (studio.load_writer(p, data_dir=sample_data_dir) for p in (plain, other))
    assert first.data_dir == sample_data_dir and second.data_dir == other
    lost = tmp_path / "lost"
    lost.mkdir()
    save_checkpoint(lost / "ckpt.pt", {**state, "train_config": {"data_dir": str(tmp_path)}})
    with pytest.raises(ValueError, match="different tokenizer"):
        studio.load_writer(lost / "ckpt.pt", data_dir=sample_data_dir)

