"""Step 19's page: tokens per second in the browser beside PyTorch and onnxruntime on the CPU.

    uv run python scripts/web_speed.py --site runs/cpu/web --checkpoint runs/cpu/ckpt.pt

--site is a folder `uv run python -m tiny_llm.web` wrote from --checkpoint. Every row writes
--tokens tokens of one story from the same prompt, reading the window again for each token as
the page does (no cache), sampling off, the end of the story ignored:
- PyTorch: the model of the checkpoint, torch's threads set to 1, then to all cores;
- onnxruntime (Python): the folder's model.onnx, 1 thread, then all cores;
- the page in headless Chromium (WebAssembly), served once plainly (one thread: threads need a
  cross-origin-isolated page) and once with the COOP/COEP headers that allow threads.
It prints one line a row and the machine, for docs/records/19-web-speed.md.
"""

import argparse
import functools
import os
import platform
import shutil
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from tiny_llm.checkpoint import model_from_checkpoint
from tiny_llm.paths import DATA_DIR
from tiny_llm.tokenize import load_tokenizer
from tiny_llm.web import onnx_logits, session

PROMPT = "Once upon a time"


def pytorch_rate(model, ids, n, threads):
    torch.set_num_threads(threads)
    M, ids = model.config.max_seq_len, list(ids)
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids[-M:]]))[0][0, -1].argmax()))
    return n / (time.perf_counter() - start)


def onnx_rate(path, ids, n, M, threads):
    sess, ids = session(path, threads), list(ids)
    start = time.perf_counter()
    for _ in range(n):
        ids.append(int(onnx_logits(sess, [ids[-M:]])[0].argmax()))
    return n / (time.perf_counter() - start)


class Handler(SimpleHTTPRequestHandler):
    extensions_map = {".mjs": "text/javascript", ".js": "text/javascript",
                      ".wasm": "application/wasm", ".json": "application/json"}
    isolated = False

    def end_headers(self):
        if self.isolated:  # what a page needs for SharedArrayBuffer, and so for threads
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, *args):
        pass


def browser_rate(site, n, isolated):
    """(tokens/s, threads) of the page in headless Chromium, served from `site`."""
    from selenium import webdriver

    handler = type("Served", (Handler,), {"isolated": isolated})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=site))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("google-chrome") or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(
        shutil.which("chromedriver") or "/usr/lib/chromium/chromedriver"))
    try:
        driver.get(f"http://127.0.0.1:{server.server_address[1]}/")
        js = driver.execute_script
        for _ in range(600):
            if js("return document.body.dataset.state") == "ready":
                break
            time.sleep(0.1)
        for field, value in (("temperature", "0"), ("max-new", str(n)), ("prompt", PROMPT)):
            js(f"document.getElementById('{field}').value = arguments[0]", value)
        driver.find_element("id", "write").click()
        for _ in range(6000):
            if js("return document.body.dataset.state") == "done":
                break
            time.sleep(0.1)
        rate = js("return window.tinyLLM.tokensPerSecond")
        if rate is None:
            raise SystemExit("the page wrote nothing: "
                             + driver.find_element("id", "status").text)
        return rate, js("return window.tinyLLM.threads")
    finally:
        driver.quit()
        server.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, required=True, help="a folder tiny_llm.web wrote")
    parser.add_argument("--checkpoint", type=Path, required=True, help="the checkpoint it holds")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args()
    model, _ = model_from_checkpoint(args.checkpoint, data_dir=args.data_dir)
    ids = load_tokenizer(args.data_dir / "tokenizer.json").encode(PROMPT).ids
    cores, M = os.cpu_count(), model.config.max_seq_len
    print(f"machine      {platform.processor() or platform.machine()}, {cores} cores, "
          f"load {os.getloadavg()[0]:.2f}, torch {torch.__version__}")
    print(f"model        {model.num_params():,} parameters, context {M}, "
          f"model.onnx {(args.site / 'model.onnx').stat().st_size / 1e6:.1f} MB")
    for threads in sorted({1, cores}):
        print(f"PyTorch      {pytorch_rate(model, ids, args.tokens, threads):7.1f} tokens/s, "
              f"{threads} thread(s)")
    for threads in sorted({1, cores}):
        rate = onnx_rate(args.site / "model.onnx", ids, args.tokens, M, threads)
        print(f"onnxruntime  {rate:7.1f} tokens/s, {threads} thread(s)")
    for isolated in (False, True):
        rate, threads = browser_rate(args.site, args.tokens, isolated)
        print(f"Chromium     {rate:7.1f} tokens/s, WebAssembly, {threads} thread(s)"
              + (" (COOP/COEP headers)" if isolated else ""))


if __name__ == "__main__":
    main()
