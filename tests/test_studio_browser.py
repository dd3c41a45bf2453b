"""The story studio in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`) driven by Selenium loads the page from a server on a tiny checkpoint, writes,
sees the tokens arrive one by one, inspects one, stops a story, closes a tab that is writing,
and saves a screenshot."""

import json
import os
import shutil
import threading
import time
import urllib.request

import pytest
from test_studio import tiny_checkpoint

from tiny_llm import studio

INSTALL = ("no headless Chromium found: install it with `sudo apt-get install -y chromium "
           "chromium-driver` (Debian/Ubuntu), or put `chromium` and `chromedriver` on PATH")


def find_browser():
    """(the Chromium binary, its chromedriver), or None where either is missing."""
    binary = next(filter(None, map(shutil.which, ("chromium", "chromium-browser",
                                                  "google-chrome"))), None)
    driver = shutil.which("chromedriver") or "/usr/lib/chromium/chromedriver"
    if binary is None or not os.path.exists(driver):
        return None
    return binary, driver


def require_browser():
    """The browser's paths; without one, a failure under CI (`CI` set: .ci/run installs
    Chromium, so a missing one is a broken set-up) and a skip elsewhere, naming the install."""
    found = find_browser()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(INSTALL + " (required under CI)")
        pytest.skip(INSTALL)
    return found


def browser(binary, driver):
    """Selenium's Chrome on the system's Chromium, headless."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1500,900"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(driver))


def serve(app):
    """uvicorn on a free 127.0.0.1 port in a thread: (its address, a function that stops it)."""
    import uvicorn

    sock = studio.listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)

    def stop():
        server.should_exit = True
        thread.join(10)
    return f"http://127.0.0.1:{port}", stop


def wait(condition, seconds=20, what="the page"):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {seconds} s")


def test_the_studio_streams_inspects_and_stops_in_chromium(tmp_path, sample_data_dir):
    found = require_browser()
    ckpt = tiny_checkpoint(tmp_path / "run" / "ckpt.pt", sample_data_dir)
    writer = studio.load_writer(ckpt, data_dir=sample_data_dir)
    # 2 ms a forward: tokens arrive apart on any machine, and a long story lasts long enough to stop
    writer.model.register_forward_pre_hook(lambda *_: time.sleep(0.002))
    url, stop_server = serve(studio.create_app([writer]))
    driver = browser(*found)
    try:
        driver.get(url)
        js = driver.execute_script
        wait(lambda: "checkpoint 1: run/ckpt.pt" in driver.find_element("id", "who").text)
        js("document.getElementById('length').value = 40")
        driver.find_element("id", "write").click()
        status = lambda: " ".join(  # noqa: E731 ("" until the story's box is on the page)
            e.text for e in driver.find_elements("css selector", ".status"))
        wait(lambda: "ended by" in status(), what="a 40-token story")
        log = js("return studio.log")
        assert [entry["n"] for entry in log] == list(range(1, 41))
        assert len({round(entry["t"]) for entry in log}) >= 20  # one by one, not all at once
        tokens = driver.find_elements("css selector", ".tok:not(.prompt)")
        assert len(tokens) == 40 and "40 tokens" in status()
        tokens[30].click()  # past the window of 24: the inspector reads the last 24 tokens
        wait(lambda: driver.find_element("id", "ctx").text, what="the attention of a token")
        rows = driver.find_elements("css selector", "#candidates tbody tr")
        assert len(rows) == 10 and len(driver.find_elements("css selector", "tr.chosen")) <= 1
        assert js("return studio.selected.layers.length") == 2  # layers x heads x 24 tokens
        assert js("return studio.selected.layers[1][1].length") == 24
        shot = tmp_path / "studio.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        if os.environ.get("STUDIO_SCREENSHOT"):  # to refresh steps/images/studio.png by hand
            shutil.copy(shot, os.environ["STUDIO_SCREENSHOT"])
        # stop: the browser drops the stream and the server frees the slot
        js("document.getElementById('length').value = 1000")
        driver.find_element("id", "write").click()
        wait(lambda: len(js("return studio.log")) >= 5, what="the long story's first tokens")
        driver.find_element("id", "stop").click()
        wait(lambda: "stopped after" in status(), what="the stop button")
        made = len(js("return studio.log"))
        assert made < 1000

        def running():
            with urllib.request.urlopen(f"{url}/api/info") as reply:
                return json.load(reply)["running"]
        wait(lambda: running() == 0, 10, "the server's freeing of a stopped story")
        # a closed tab: its story ends on the server too
        first_tab = driver.current_window_handle
        driver.switch_to.new_window("tab")
        driver.get(url)
        wait(lambda: "checkpoint 1" in driver.find_element("id", "who").text)
        js("document.getElementById('length').value = 1000")
        driver.find_element("id", "write").click()
        wait(lambda: len(js("return studio.log")) >= 5, what="the second tab's first tokens")
        assert running() == 1
        driver.close()
        driver.switch_to.window(first_tab)
        wait(lambda: running() == 0, 10, "the end of a closed tab's story")
    finally:
        driver.quit()
        stop_server()


def test_a_missing_browser_is_skipped_with_the_install_command(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(os.path, "exists", lambda path: False)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y chromium chromium-driver"):
        require_browser()


def test_a_missing_browser_fails_under_ci(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(os.path, "exists", lambda path: False)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="required under CI"):
        require_browser()


def test_names_are_text_requests_go_side_by_side_and_nothing_goes_stale(tmp_path,
                                                                        sample_data_dir):
    """Issues 35 and 36 in the page: a run folder named like HTML stays text; a base model gets
    the fine-tuned one's request as the zero-shot row, each story says what it was given and a
    request's story shows its reward; a refused setting keeps the stories on screen; a new story
    clears the inspector; at 900 px the story column is readable."""
    evil = "<img src=x onerror=document.title='XSS-RAN'>"
    base = tiny_checkpoint(tmp_path / evil / "ckpt.pt", sample_data_dir)
    tuned = tiny_checkpoint(tmp_path / "tuned" / "ckpt.pt", sample_data_dir, requests="derived")
    writers = [studio.load_writer(p, data_dir=sample_data_dir) for p in (base, tuned)]
    url, stop_server = serve(studio.create_app(writers))
    driver = browser(*require_browser())
    try:
        driver.set_window_size(900, 900)
        driver.get(url)
        js = driver.execute_script
        wait(lambda: "checkpoint 2: tuned/ckpt.pt" in driver.find_element("id", "who").text)
        features = {e.get_attribute("value"): e.is_enabled()
                    for e in driver.find_elements("css selector", "#features input")}
        assert features["Dialogue"] and not features["Twist"]  # derived requests teach Dialogue
        js("document.getElementById('length').value = 12")
        driver.find_element("id", "write").click()
        status = lambda: js("return [...document.querySelectorAll('.status')]"  # noqa: E731
                            ".map((e) => e.textContent)")
        wait(lambda: len(status()) == 2 and all("ended by" in s for s in status()),
             what="two stories")
        heads = [e.text for e in driver.find_elements("css selector", ".story h3")]
        assert heads[0] == f"checkpoint 1: {evil}/ckpt.pt (step 5)"  # shown, never run
        assert driver.title != "XSS-RAN" and not driver.find_elements("css selector", "h3 img")
        inputs = [e.text for e in driver.find_elements("css selector", ".story .input")]
        assert "zero-shot" in inputs[0] and inputs[1].startswith("input: the request")
        prompts = js("return studio.stories.map((s) => s.tokens.filter((t) => t.isPrompt)"
                     ".map((t) => t.id))")
        assert prompts[0] == prompts[1]  # the very same request, token for token
        rewards = [e.text for e in driver.find_elements("css selector", ".reward")]
        assert all(r.startswith("reward ") and "words used" in r for r in rewards)
        marks = driver.find_elements("css selector", ".reward .word")  # dog, moon, brave twice
        assert [m.text for m in marks] == ["dog", "moon", "brave"] * 2
        assert all(m.get_attribute("class").split()[1] in ("in", "used", "missed") for m in marks)
        width = js("return document.querySelector('.text').getBoundingClientRect().width")
        assert width >= 250, width  # was 130 px at 900 px
        driver.find_elements("css selector", ".tok:not(.prompt)")[3].click()
        wait(lambda: driver.find_element("id", "ctx").text, what="the inspector")
        # 2 layers x 2 heads of 12-px rows under 56 px of column labels, one per token
        assert js("return document.getElementById('heads').height") == 56 + 4 * 12
        for width in (1280, 390):  # a desktop and a phone: nothing wider than the window
            driver.set_window_size(width, 900)
            inner = js("return window.innerWidth")
            assert js("return document.documentElement.scrollWidth") <= inner, width
            shot = tmp_path / f"studio-{width}.png"
            driver.save_screenshot(str(shot))
            if os.environ.get("STUDIO_SCREENSHOTS"):  # a folder, to look at them
                shutil.copy(shot, os.environ["STUDIO_SCREENSHOTS"])
        driver.set_window_size(900, 900)
        js("document.getElementById('temperature').value = -1")  # refused by the server
        driver.find_element("id", "write").click()
        wait(lambda: "temperature must be" in driver.find_element("id", "message").text)
        assert len(driver.find_elements("css selector", ".story")) == 2  # still on screen
        assert driver.find_element("id", "ctx").text  # and still inspected
        js("document.getElementById('temperature').value = 0.8")
        driver.find_element("id", "write").click()
        wait(lambda: len(status()) == 2 and all("ended by" in s for s in status()),
             what="two new stories")
        assert not driver.find_element("id", "inspect").is_displayed()  # no stale token
        assert driver.find_element("id", "ctx").text == ""
    finally:
        driver.quit()
        stop_server()
