"""Step 19's page in a real browser: headless Chromium opens the written folder from a plain
static server (http.server, nothing of ours behind it) and writes a story; with sampling off its
tokens equal Python's greedy tokens. A missing model file and a prompt longer than the context
give a sentence on the page. Screenshots at 1280 and 390 px wide."""

import functools
import os
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_studio_browser import browser, require_browser, wait

from tiny_llm import web
from tiny_llm.tokenize import load_tokenizer

pytest.importorskip("onnxruntime", reason="the web export needs: uv sync --extra web")


class Quiet(SimpleHTTPRequestHandler):
    extensions_map = {".mjs": "text/javascript", ".js": "text/javascript",
                      ".wasm": "application/wasm", ".json": "application/json"}

    def log_message(self, *args):  # no line per request in the test's output
        pass


def static_server(folder):
    """http.server on a free 127.0.0.1 port serving `folder`: (its address, a stop function)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=folder))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        server.server_close()
    return f"http://127.0.0.1:{server.server_address[1]}/", stop


def test_the_page_writes_pythons_greedy_story_in_chromium(web_export, tmp_path, sample_data_dir):
    found = require_browser()
    _, site, report = web_export  # step 19's export of a tiny tuned model (tests/conftest.py)
    shutil.copytree(site, tmp_path / "site")  # served from here, beside a copy that is broken
    broken = tmp_path / "broken"
    shutil.copytree(site, broken)
    (broken / "model.onnx").unlink()
    tokenizer = load_tokenizer(sample_data_dir / "tokenizer.json")
    prompt = "Once upon a time"
    expected = web.torch_greedy(report["model"], tokenizer.encode(prompt).ids, 40)
    expected = expected[len(tokenizer.encode(prompt).ids):]
    url, stop_server = static_server(tmp_path)
    driver = browser(*found)
    js = driver.execute_script
    state = lambda: js("return document.body.dataset.state")  # noqa: E731
    status = lambda: driver.find_element("id", "status").text  # noqa: E731
    try:
        driver.get(url + "site/")
        wait(lambda: state() in ("ready", "failed"), seconds=30, what="the model loading")
        assert state() == "ready", status()
        assert not driver.find_element("id", "request").get_attribute("hidden")  # tuned on them
        for field, value in (("temperature", "0"), ("max-new", "40"), ("prompt", prompt)):
            js(f"document.getElementById('{field}').value = arguments[0]", value)
        driver.find_element("id", "write").click()
        wait(lambda: state() == "done", seconds=30, what="a 40-token greedy story")
        assert js("return window.tinyLLM.ids") == expected
        assert "tokens/s" in driver.find_element("id", "speed").text
        assert driver.find_element("id", "story").text.startswith(prompt)
        shots = {}
        for width in (1280, 390):
            driver.set_window_size(width, 900)
            shots[width] = tmp_path / f"web-{width}.png"
            driver.save_screenshot(str(shots[width]))
            assert js("return document.documentElement.scrollWidth") <= width  # no sideways
        if os.environ.get("WEB_SCREENSHOTS"):  # a folder, to look at them by hand
            for shot in shots.values():
                shutil.copy(shot, os.environ["WEB_SCREENSHOTS"])
        js("document.getElementById('prompt').value = arguments[0]", "and then " * 40)
        driver.find_element("id", "write").click()
        wait(lambda: "reads at most 24" in status(), what="the sentence for a long prompt")
        driver.get(url + "broken/")
        wait(lambda: state() == "failed", seconds=30, what="the missing model's sentence")
        assert "model.onnx is missing from this folder" in status()
    finally:
        driver.quit()
        stop_server()
