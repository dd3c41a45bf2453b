"""Step 19: the ONNX export equals PyTorch (logits at several lengths, 200 greedy tokens), the
folder holds what the page loads, bad folders and missing runtimes are refused with a sentence,
and the page's JavaScript tokenizer and sampler (run under node) equal Python's."""

import importlib.util
import json
import logging
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from test_studio import tiny_checkpoint

from solutions import ex19_web
from tiny_llm import web
from tiny_llm.checkpoint import load_checkpoint, save_checkpoint
from tiny_llm.data import load_token_array
from tiny_llm.generate import next_token_probs
from tiny_llm.modern import ModernGPT
from tiny_llm.tokenize import EOT, TRICKY, load_tokenizer

pytest.importorskip("onnxruntime", reason="the web export needs: uv sync --extra web")


def require_web_runtime():
    """Where onnxruntime-web is not installed (`npm ci --prefix web`): a failure under CI
    (`.ci/run` installs it, so a missing one is a broken set-up) and elsewhere a skip that names
    the command, as a laptop without Chromium skips the browser tests."""
    try:
        web.runtime_files()
    except FileNotFoundError as err:
        if os.environ.get("CI"):
            pytest.fail(f"{err} (required under CI)")
        pytest.skip(str(err))


@pytest.fixture
def built(web_export):
    """A tiny request-tuned checkpoint (context 24: 200 tokens slide the window) and its folder,
    exported once for these tests and the page's (tests/conftest.py: web_export)."""
    return web_export


def test_onnx_logits_equal_pytorch_at_several_lengths(built):
    _, _, report = built
    assert sorted(report["diffs"]) == [1, 12, 24]
    assert max(report["diffs"].values()) <= web.LIMIT


def test_the_same_200_greedy_tokens(built):
    _, _, report = built
    ours, theirs = report["greedy"]
    assert len(ours) == len(report["prompt"]) + 200  # past the 24-token window: it slides
    assert ours == theirs


def test_the_folder_holds_what_the_page_loads(built):
    _, site, _ = built
    names = {p.name for p in site.iterdir()}
    assert set(web.PAGE_FILES) | set(web.RUNTIME_FILES) | {
        "model.onnx", "model.json", "tokenizer.json", web.MARKER} == names
    settings = json.loads((site / "model.json").read_text())
    assert settings["max_seq_len"] == 24 and settings["eot_id"] == 0
    assert settings["requests"] == {"fields": ["words", "sentence"], "features": ["Dialogue"]}
    page = (site / "index.html").read_text()
    assert 'name="viewport"' in page and 'src="page.js"' in page


def test_the_graph_named_and_dynamic(built):
    import onnx

    _, site, _ = built
    graph = onnx.load(site / "model.onnx").graph
    (inp,), (out,) = graph.input, graph.output
    assert (inp.name, out.name) == ("input_ids", "logits")
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert all(isinstance(d, str) for d in dims), dims  # batch and sequence: both dynamic


def test_a_folder_it_did_not_write_is_refused_before_any_work(built, tmp_path, sample_data_dir):
    ckpt, _, _ = built
    (tmp_path / "notes.md").write_text("mine")
    with pytest.raises(FileExistsError, match="is not a web folder: pick a new --out"):
        web.build(ckpt, tmp_path, sample_data_dir)
    assert (tmp_path / "notes.md").read_text() == "mine"


def test_only_the_exporters_torchvision_notes_are_hidden_and_only_while_it_exports():
    assert importlib.util.find_spec(web.REGISTRY_LOG), "torch.onnx logs from another module now"
    log, seen = logging.getLogger(web.REGISTRY_LOG), []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    log.addHandler(handler)
    try:
        with web.no_torchvision_notes():
            log.warning("torchvision is not installed. Skipping %s", "torchvision::nms")
            log.warning("another warning")
        log.warning("torchvision is not installed. Skipping %s", "torchvision::nms")
    finally:
        log.removeHandler(handler)
    assert seen == ["another warning", "torchvision is not installed. Skipping torchvision::nms"]


def test_a_missing_runtime_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"npm ci --prefix web.*install Node\.js"):
        web.runtime_files(tmp_path)


def test_lora_adapters_are_refused(built, tmp_path, sample_data_dir):
    ckpt, _, _ = built
    state = load_checkpoint(ckpt)
    state["model"]["blocks.0.attn.qkv.lora_a"] = torch.zeros(2, 32)
    save_checkpoint(tmp_path / "lora.pt", state)
    with pytest.raises(ValueError, match="holds LoRA adapters beside the weights"):
        web.build(tmp_path / "lora.pt", tmp_path / "site", sample_data_dir)


def test_modern_gpt_exports_equal(tmp_path, sample_data_dir):
    ckpt = tiny_checkpoint(tmp_path / "modern.pt", sample_data_dir, ModernGPT)
    model, _ = web.load_for_web(ckpt, sample_data_dir)
    sess = web.session(web.export_onnx(model, tmp_path / "modern.onnx"))
    assert max(web.logit_differences(model, sess, [1, 7, 24]).values()) <= web.LIMIT


def node_answers(job):
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("node is missing (required under CI): install Node.js 18 or later")
        pytest.skip("node is missing: install Node.js 18 or later to test the page's JavaScript")
    found = subprocess.run([node, Path(__file__).with_name("web_page_check.mjs")],
                           input=json.dumps(job), capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    return json.loads(found.stdout)


def test_the_javascript_tokenizer_and_sampler_equal_pythons(sample_data_dir):
    tokenizer = load_tokenizer(sample_data_dir / "tokenizer.json")
    lines = [tokenizer.decode(tokenizer.encode(t).ids) for t in TRICKY]
    rng = random.Random(0)
    valid = load_token_array(sample_data_dir / "valid.bin")  # the sample corpus's own stories
    pieces = [tokenizer.decode(valid[s:s + 60].tolist(), skip_special_tokens=False)
              for s in range(0, 40_000, 400)]  # 100 stretches of stories, EOTs included
    texts = [*TRICKY, *lines, *pieces, "", " ", "  leading and trailing  ", "it's I'll we've",
             f"The end.{EOT}Once{EOT}{EOT}", "1234567 3.14 ...!!", "\u00a0nbsp\u2028sep",
             "emoji 😀 flags 🇫🇷 skin 👍🏽", "naïve Zoë façade", "\x00\x01 control"]
    ids = [[rng.randrange(tokenizer.get_vocab_size()) for _ in range(rng.randrange(1, 30))]
           for _ in range(50)] + [[0, 5, 0, 6]]
    sampling = []
    for settings in ({"temperature": 1.0, "topK": None, "topP": None},
                     {"temperature": 0.7, "topK": 5, "topP": None},
                     {"temperature": 1.3, "topK": None, "topP": 0.6},
                     {"temperature": 0.9, "topK": 40, "topP": 0.9}):
        logits = torch.randn(300, generator=torch.Generator().manual_seed(len(sampling)))
        sampling.append({"logits": logits.tolist(), "settings": settings})
    job = {"page": str(web.PAGE), "tokenizer": str(sample_data_dir / "tokenizer.json"),
           "texts": texts, "ids": ids, "sampling": sampling, "seed": 7}
    answer = node_answers(job)
    for text, encoded in zip(texts, answer["encoded"], strict=True):
        assert encoded == tokenizer.encode(text).ids, text
    for row, decoded, raw in zip(ids, answer["decoded"], answer["decodedSpecial"], strict=True):
        assert decoded == tokenizer.decode(row), row
        assert raw == tokenizer.decode(row, skip_special_tokens=False), row
    for case, probs, draws in zip(sampling, answer["probs"], answer["draws"], strict=True):
        s = case["settings"]
        expected = next_token_probs(torch.tensor([case["logits"]]), s["temperature"], s["topK"],
                                    s["topP"])[0]
        assert torch.allclose(torch.tensor(probs, dtype=torch.float32), expected, atol=1e-6)
        assert all(expected[d] > 0 for d in draws)  # only tokens the filters kept are drawn
    assert answer["draws"] == node_answers(job)["draws"]  # a seed repeats its draws


def test_the_exercises(built, tmp_path):
    _, site, report = built
    model = report["model"]
    shutil.copy(site / "model.onnx", tmp_path / "model.onnx")
    ops, stored, params = ex19_web.exercise_1_what_the_graph_holds(model, site / "model.onnx")
    assert dict(ops)["MatMul"] >= 4 * model.config.n_layers and stored <= params
    gap, agree = ex19_web.exercise_2_int8_against_float(model, tmp_path / "model.onnx", 20)
    assert 0 < gap < 0.1 and agree >= 15
    assert ex19_web.exercise_3_byte_alphabet() == (256, True, "Ġ", "Ċ")
