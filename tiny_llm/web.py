"""Step 19: your model in a browser tab, with no Python and no server behind it.

The model goes out as one ONNX file (a graph of standard operations with the weights inside),
which onnxruntime-web runs in WebAssembly. The page around it is three small JavaScript files of
our own: step 02's tokenizer, step 09's sampler and the loop that writes. Before anything is
written, onnxruntime (Python) runs the ONNX file beside PyTorch: the logits must agree at several
lengths and the greedy story token for token.

    uv run python -m tiny_llm.web --checkpoint runs/cpu/ckpt.pt --out runs/cpu/web
    python -m http.server -d runs/cpu/web      # then open http://127.0.0.1:8000

onnx, onnxruntime and onnxscript are an optional extra (uv sync --extra web); onnxruntime-web
comes from npm, pinned by web/package-lock.json (npm ci --prefix web).
"""

import argparse
import contextlib
import importlib
import json
import logging
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from tiny_llm.checkpoint import MODELS, class_path, load_checkpoint, model_from_state
from tiny_llm.data import load_token_array
from tiny_llm.evaluate import bits_per_byte
from tiny_llm.files import atomic_folder, check_replaceable
from tiny_llm.generate import generate
from tiny_llm.paths import DATA_DIR, REPO_ROOT
from tiny_llm.request_data import learned_requests
from tiny_llm.tokenize import EOT, load_tokenizer

OPSET = 20  # the ONNX operator set the graph is written in (onnxruntime-web reads 7 to 22)
LIMIT = 1e-4  # largest |logit difference| between ONNX and PyTorch that counts as equal
MARKER = ".tiny-llm-web"  # in every folder this command writes: the names of its files
PAGE = Path(__file__).with_name("web_page")  # our page: index.html and its JavaScript
PAGE_FILES = ("index.html", "page.js", "tokenizer.js", "sampler.js")
# npm's folder in the repository: found through steps/, which a package written elsewhere (a
# test's scratch folder, workalong's mine/.build/) links back to the repository
RUNTIME = ((REPO_ROOT / "steps").resolve().parent / "web" / "node_modules" / "onnxruntime-web"
           / "dist")
RUNTIME_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
EXPORTABLE = (MODELS["gpt"], MODELS["modern"])  # by the class a checkpoint names


def onnx_modules():
    """(onnx, onnxruntime), or a clear error saying how to install them (an extra)."""
    try:
        importlib.import_module("onnxscript")  # what torch.onnx.export writes the graph with
        return importlib.import_module("onnx"), importlib.import_module("onnxruntime")
    except ImportError:
        raise SystemExit("error: the web export needs onnx, onnxruntime and onnxscript: "
                         "uv sync --extra web") from None


def runtime_files(dist=RUNTIME):
    """onnxruntime-web's files the page loads, or a sentence naming the command that installs
    them (and what to install first when node itself is missing)."""
    missing = [name for name in RUNTIME_FILES if not (Path(dist) / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"onnxruntime-web is not installed ({Path(dist) / missing[0]} is missing): run "
            "`npm ci --prefix web` in the repository. It needs node and npm: without them, "
            "install Node.js 18 or later (nodejs.org, or `sudo apt install nodejs npm`)")
    return [Path(dist) / name for name in RUNTIME_FILES]


class NextTokenLogits(nn.Module):
    """The graph the page runs: (B, T) token ids -> (B, V) logits of the last position only,
    the one that predicts the next token (the other T - 1 rows would cross into JavaScript
    unread)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        logits, _ = self.model(input_ids)
        return logits[:, -1, :]


# where torch.onnx's exporter says "torchvision is not installed. Skipping torchvision::nms", once
# for each of its image operators: a GPT has none, so the lines are noise to hide, not to fix
REGISTRY_LOG = "torch.onnx._internal.exporter._registration"


@contextlib.contextmanager
def no_torchvision_notes():
    """Inside, the exporter's logger drops its "torchvision is not installed" warnings, and only
    those; they come back afterwards."""
    def keep(record):
        return not record.getMessage().startswith("torchvision is not installed")
    log = logging.getLogger(REGISTRY_LOG)
    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


def export_onnx(model, path):
    """Write `model` (eval mode, float32) to `path` as ONNX: input "input_ids" (batch,
    sequence) int64, output "logits" (batch, vocab) float32; batch and sequence are dynamic
    axes, the sequence from 1 to max_seq_len tokens."""
    onnx_modules()
    model = model.float().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    sequence = torch.export.Dim("sequence", min=1, max=model.config.max_seq_len)
    example = torch.zeros(2, min(8, model.config.max_seq_len), dtype=torch.long)
    graph = NextTokenLogits(model).eval()
    with no_torchvision_notes():
        torch.onnx.export(graph, (example,), path, dynamo=True, opset_version=OPSET,
                          input_names=["input_ids"], output_names=["logits"],
                          dynamic_shapes={"input_ids": {0: batch, 1: sequence}},
                          external_data=False, verbose=False)  # one file, weights inside
    return Path(path)


def session(path, threads=1):
    """An onnxruntime InferenceSession of the ONNX file `path` on the CPU."""
    _, ort = onnx_modules()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # errors only
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_logits(sess, ids):
    """(B, T) ids (a tensor or a list of lists) -> (B, V) next-token logits, as a tensor."""
    ids = np.asarray(ids.tolist() if torch.is_tensor(ids) else ids, dtype=np.int64)
    return torch.from_numpy(sess.run(["logits"], {"input_ids": ids})[0])


def logit_differences(model, sess, lengths, seed=0):
    """{length: largest |PyTorch logit - ONNX logit|} on 2 seeded random sequences each."""
    found = {}
    for length in lengths:
        ids = torch.randint(0, model.config.vocab_size, (2, length),
                            generator=torch.Generator().manual_seed(seed + length))
        with torch.no_grad():
            ours = model(ids)[0][:, -1]
        found[length] = (ours - onnx_logits(sess, ids)).abs().max().item()
    return found


def onnx_greedy(sess, ids, max_new_tokens, max_seq_len, eot_id=0):
    """Greedy continuation of the prompt `ids` (a list) with the ONNX model, as the page writes:
    the last max_seq_len tokens read again for every new token, stopping after eot_id."""
    ids = list(ids)
    for _ in range(max_new_tokens):
        next_id = int(onnx_logits(sess, [ids[-max_seq_len:]])[0].argmax())
        ids.append(next_id)
        if next_id == eot_id:
            break
    return ids


def torch_greedy(model, ids, max_new_tokens, eot_id=0):
    """The same with step 09's generate at temperature 0 (greedy)."""
    return generate(model, torch.tensor([ids]), max_new_tokens, temperature=0,
                    eot_id=eot_id)[0].tolist()


def quantize_int8(src, dst):
    """Dynamic int8 quantisation: the weights of every MatMul stored as 8-bit integers with a
    scale, activations quantised on the fly. The embedding's Gather stays float32."""
    onnx_modules()
    from onnxruntime.quantization import QuantType, quantize_dynamic
    logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process concerns images
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul"])
    return Path(dst)


def onnx_bits_per_byte(sess, tokens, tokenizer, max_seq_len, positions=64):
    """Bits per byte of the ONNX model on `positions` tokens of `tokens` (a token array),
    each predicted from the full window before it (the page's view), spread evenly."""
    starts = np.linspace(0, len(tokens) - max_seq_len - 1, positions).astype(int)
    nats = n_bytes = 0.0
    for s in starts:
        window = tokens[s:s + max_seq_len + 1].astype(np.int64)
        logits = onnx_logits(sess, [window[:-1].tolist()])[0]
        nats -= torch.log_softmax(logits.double(), -1)[int(window[-1])].item()
        token = tokenizer.id_to_token(int(window[-1]))  # byte-level: one character per byte
        n_bytes += 0 if token == EOT else len(token)
    return bits_per_byte(nats / len(starts), len(starts), n_bytes)


def tokens_per_second(sess, max_seq_len, vocab_size, seconds=1.0):
    """Tokens per second at the full window, the page's slowest case: one run per token."""
    ids = np.random.default_rng(0).integers(0, vocab_size, (1, max_seq_len)).tolist()
    onnx_logits(sess, ids)  # the first run sets up buffers
    runs, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        onnx_logits(sess, ids)
        runs += 1
    return runs / elapsed


def page_settings(model, ckpt, checkpoint, int8):
    """model.json: what the page needs to know about the model it runs."""
    return {"max_seq_len": model.config.max_seq_len, "vocab_size": model.config.vocab_size,
            "eot_id": 0, "eot": EOT, "model_class": class_path(model), "step": ckpt["step"],
            "checkpoint": Path(checkpoint).name, "int8": int8,
            "requests": learned_requests(ckpt)}  # step 17's: the page shows a request form


def load_for_web(checkpoint, data_dir):
    """The checkpoint's model in eval mode, float32, and the checkpoint; refused with a
    sentence when it cannot be exported."""
    ckpt = load_checkpoint(checkpoint, data_dir=data_dir)  # also: the same tokenizer
    if any(name.rsplit(".", 1)[-1].startswith("lora_") for name in ckpt["model"]):
        raise ValueError(f"{checkpoint} holds LoRA adapters beside the weights: export the "
                         "merged checkpoint that tiny_llm.instruct train saves at its end")
    kind = ckpt.get("model_class", MODELS["gpt"])  # older checkpoints all hold a GPT
    if kind not in EXPORTABLE:
        raise ValueError(f"{checkpoint} holds a {kind}; the web export knows "
                         f"{' and '.join(EXPORTABLE)}: pass a checkpoint tiny_llm.train wrote")
    model = model_from_state(ckpt, checkpoint)
    return model.float().eval(), ckpt


def build(checkpoint, out, data_dir=DATA_DIR, int8=False, say=print):
    """Write the static folder `out` for the checkpoint; return a report dict (the checks)."""
    check_replaceable(out, MARKER, "tiny_llm.web", "a web folder")  # before any work
    runtime = runtime_files()
    model, ckpt = load_for_web(checkpoint, data_dir)
    tokenizer_file = Path(data_dir) / "tokenizer.json"
    tokenizer = load_tokenizer(tokenizer_file)
    M = model.config.max_seq_len
    report = {"model": model, "ckpt": ckpt}
    with atomic_folder(out, MARKER, "tiny_llm.web", "a web folder") as tmp:
        say(f"{'exporting':<12} {class_path(model)}, {model.num_params():,} parameters "
            "(torch.onnx.export, a minute at most)", flush=True)
        onnx_file = export_onnx(model, tmp / "model.onnx")
        float_sess = session(onnx_file)
        report["diffs"] = logit_differences(model, float_sess, sorted({1, M // 2, M}))
        prompt = tokenizer.encode("Once upon a time").ids
        say(f"{'checking':<12} 200 greedy tokens from PyTorch and from onnxruntime", flush=True)
        report["prompt"] = prompt
        report["greedy"] = (torch_greedy(model, prompt, 200, eot_id=None),
                            onnx_greedy(float_sess, prompt, 200, M, eot_id=None))
        if int8:
            float_file = onnx_file.with_name("model-float32.onnx")
            onnx_file.rename(float_file)
            quantize_int8(float_file, onnx_file)
            valid = load_token_array(Path(data_dir) / "valid.bin")
            int8_sess = session(onnx_file)
            report["int8"] = {name: {"bytes": path.stat().st_size,
                                     "bpb": onnx_bits_per_byte(s, valid, tokenizer, M),
                                     "tokens_s": tokens_per_second(s, M, model.config.vocab_size)}
                              for name, path, s in (("float32", float_file, float_sess),
                                                    ("int8", onnx_file, int8_sess))}
            float_file.unlink()  # the page loads model.onnx only
        shutil.copyfile(tokenizer_file, tmp / "tokenizer.json")
        (tmp / "model.json").write_text(json.dumps(
            page_settings(model, ckpt, checkpoint, int8), indent=2) + "\n")
        for name in PAGE_FILES:
            shutil.copyfile(PAGE / name, tmp / name)
        say(f"{'copying':<12} onnxruntime-web's WebAssembly runtime", flush=True)
        for path in runtime:
            shutil.copyfile(path, tmp / path.name)
        ours, theirs = report["greedy"]
        if max(report["diffs"].values()) > LIMIT or ours != theirs:
            raise ValueError(f"the ONNX model differs from PyTorch (logits by up to "
                             f"{max(report['diffs'].values()):.1e}, limit {LIMIT:.0e}; greedy "
                             f"tokens equal: {ours == theirs}): nothing was written")
    report["files"] = {p.name: p.stat().st_size for p in sorted(Path(out).iterdir())
                       if p.name != MARKER}
    return report


def mb(n):
    return f"{n / 1e6:.1f} MB"


def main(argv=None):
    parser = argparse.ArgumentParser(description="Step 19: a static page that runs your model.")
    parser.add_argument("--checkpoint", type=Path, required=True, help="a ckpt.pt (tiny_llm.train)")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="where tokenizer.json is")
    parser.add_argument("--int8", action="store_true",
                        help="dynamic int8 quantisation: a smaller file, measured against float32")
    args = parser.parse_args(argv)
    onnx_modules()
    try:
        r = build(args.checkpoint, args.out, args.data_dir, args.int8)
    except (FileExistsError, FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    diffs = ", ".join(f"{d:.1e} at {n}" for n, d in r["diffs"].items())
    ours, theirs = r["greedy"]
    print(f"{'logits':<12} max |PyTorch - onnxruntime| {diffs} tokens (limit {LIMIT:.0e}): equal")
    print(f"{'greedy':<12} {len(ours) - len(r['prompt'])} new tokens, the same from PyTorch "
          f"and onnxruntime: {ours == theirs}")
    for name, row in r.get("int8", {}).items():
        print(f"{name:<12} {mb(row['bytes'])}, {row['bpb']:.3f} bits per byte, "
              f"{row['tokens_s']:,.0f} tokens/s at the full window (onnxruntime, 1 thread)")
    print(f"{'files':<12} " + " ".join(r["files"]))
    print(f"{'model.onnx':<12} {mb(r['files']['model.onnx'])}; the page and its runtime "
          f"{mb(sum(r['files'].values()) - r['files']['model.onnx'])}")
    print(f"{'serve':<12} python -m http.server -d {args.out}   (then open "
          "http://127.0.0.1:8000)")


if __name__ == "__main__":
    main()
