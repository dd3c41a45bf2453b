"""Appendix: hand a trained model to the Hugging Face ecosystem, and take GPT-2 back.

Our GPT and Hugging Face's GPT2LMHeadModel are the same computation under other names: `wte` is
our `tok_emb`, `h.3.attn.c_attn` is our `blocks.3.attn.qkv`, and so on. Exporting renames every
weight (transposing the linear layers, which GPT-2 stores in/out instead of out/in), writes
config.json, model.safetensors and the tokenizer, then loads the folder back with transformers
and checks that it computes what our model computes. Importing does the same the other way.

Export:  uv run python -m tiny_llm.export --checkpoint runs/small/ckpt.pt --out runs/small/hf
Import:  uv run python -m tiny_llm.export --import gpt2 --out runs/gpt2/ckpt.pt   (needs internet)
transformers and safetensors are an extra:  uv sync --extra hf
"""

import argparse
import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch

from tiny_llm.checkpoint import load_checkpoint, save_checkpoint
from tiny_llm.generate import generate
from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.paths import DATA_DIR
from tiny_llm.tokenize import EOT, load_tokenizer, tokenizer_sha256

GPT_CLASS = "tiny_llm.gpt.GPT"  # what a checkpoint without "model_class" holds
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")  # real GPT-2 uses gelu_new
LIMIT = 1e-5  # largest |logit difference| that counts as the same model, in float32


def transformers():
    """The transformers package, or a clear error saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise SystemExit("error: export and import need transformers and safetensors, an "
                         "optional extra: run `uv sync --extra hf`") from None
    transformers.utils.logging.disable_progress_bar()
    return transformers


def gpt2_names(n_layers):
    """[(our name, GPT-2's name, transposed?)] for every weight of step 08's GPT.

    ("blocks.0.attn.qkv.weight", "transformer.h.0.attn.c_attn.weight", True): GPT-2's Conv1D
    keeps (in, out) where nn.Linear keeps (out, in). The head is tied to wte, so it has no entry.
    """
    names = [("embed.tok_emb.weight", "transformer.wte.weight", False),
             ("embed.pos_emb.weight", "transformer.wpe.weight", False),
             ("ln_f.weight", "transformer.ln_f.weight", False),
             ("ln_f.bias", "transformer.ln_f.bias", False)]
    layers = (("ln_1", "ln_1"), ("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"),
              ("ln_2", "ln_2"), ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj"))
    for i in range(n_layers):
        for ours, theirs in layers:
            a, b = f"blocks.{i}.{ours}", f"transformer.h.{i}.{theirs}"
            names += [(f"{a}.weight", f"{b}.weight", not ours.startswith("ln")),
                      (f"{a}.bias", f"{b}.bias", False)]
    return names


def copy_weights(source, target, names, backwards=False):
    """Copy every (source name -> target name) weight; a clear error if a shape does not fit."""
    src, dst = dict(source.named_parameters()), dict(target.named_parameters())
    with torch.no_grad():
        for ours, theirs, transposed in names:
            a, b = (theirs, ours) if backwards else (ours, theirs)
            w = src[a].t() if transposed else src[a]
            if w.shape != dst[b].shape:
                raise ValueError(f"{a} has shape {tuple(w.shape)} but {b} needs "
                                 f"{tuple(dst[b].shape)}: the two configs do not describe "
                                 "the same model")
            dst[b].copy_(w)
    return target


def to_gpt2(model):
    """Step 08's GPT -> an equal transformers GPT2LMHeadModel (float32, eval mode)."""
    tf, c = transformers(), model.config
    config = tf.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.max_seq_len, n_embd=c.d_model,
        n_layer=c.n_layers, n_head=c.n_heads, activation_function="gelu",  # ours is the exact erf
        layer_norm_epsilon=1e-5, resid_pdrop=c.dropout, embd_pdrop=c.dropout,
        attn_pdrop=c.dropout, bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
    hf = tf.GPT2LMHeadModel(config)
    return copy_weights(model.float(), hf, gpt2_names(c.n_layers)).eval()


def check_gpt2_config(c, source):
    """Raise unless the GPT-2 config `c` describes a model our GPT can hold."""
    problems = []
    if c.model_type != "gpt2":
        problems.append(f"it is a {c.model_type!r} model, and only GPT-2 (model_type 'gpt2', "
                        "the architecture of step 08) can be imported")
    elif c.n_inner not in (None, 4 * c.n_embd):
        problems.append(f"its MLP is {c.n_inner} wide, ours is always 4 x n_embd = {4 * c.n_embd}")
    elif abs(c.layer_norm_epsilon - 1e-5) > 1e-12:
        problems.append(f"its LayerNorm eps is {c.layer_norm_epsilon}, ours is 1e-5")
    elif c.scale_attn_by_inverse_layer_idx or not c.scale_attn_weights or c.add_cross_attention:
        problems.append("it scales or wires attention differently (scale_attn_weights, "
                        "scale_attn_by_inverse_layer_idx or add_cross_attention)")
    elif c.activation_function not in ("gelu", *TANH_GELUS):
        problems.append(f"its activation is {c.activation_function!r}, ours is GELU")
    if problems:
        raise ValueError(f"{source} cannot be imported: {problems[0]}")


def from_gpt2(source):
    """A GPT2LMHeadModel (Hub name or local folder) -> (our GPT, the transformers model)."""
    tf = transformers()
    folder = Path(source)
    if folder.exists() and not (folder / "config.json").is_file():
        raise ValueError(f"{source} is not a Hugging Face model folder (no config.json in it): "
                         "pass a folder written by save_pretrained, such as one made by "
                         "`python -m tiny_llm.export --checkpoint ...`, or a Hub name like gpt2")
    try:
        config = tf.AutoConfig.from_pretrained(source)
    except OSError as err:
        raise ValueError(f"could not load {source!r} ({str(err).splitlines()[0]}): a Hub name "
                         "needs internet the first time (then it is cached), a folder needs "
                         "config.json and model.safetensors") from None
    check_gpt2_config(config, source)
    hf = tf.GPT2LMHeadModel.from_pretrained(source, dtype=torch.float32).eval()
    if hf.lm_head.weight.data_ptr() != hf.transformer.wte.weight.data_ptr() and not torch.equal(
            hf.lm_head.weight, hf.transformer.wte.weight):
        raise ValueError(f"{source} has an output head separate from its token embedding; "
                         "ours is tied to tok_emb (step 08), so it cannot hold this model")
    ours = GPT(GPTConfig(vocab_size=config.vocab_size, max_seq_len=config.n_positions,
                         d_model=config.n_embd, n_layers=config.n_layer, n_heads=config.n_head))
    return copy_weights(hf, ours, gpt2_names(config.n_layer), backwards=True).eval(), hf


@contextmanager
def atomic_folder(out):
    """Yield a temporary folder beside `out`; it becomes `out` only if the block succeeds.

    A folder already at `out` is replaced only if it holds a model (config.json) or nothing,
    so a mistyped --out never deletes someone's files.
    """
    out = Path(out)
    if out.exists() and not (out.is_dir() and (not any(out.iterdir())
                                               or (out / "config.json").is_file())):
        raise FileExistsError(f"{out} exists and is not a model folder: pick a new --out "
                              "(an earlier export there would be replaced)")
    tmp, old = (out.with_name(f".{out.name}.{kind}-{os.getpid()}") for kind in ("tmp", "old"))
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def save_tokenizer(tokenizer_file, folder, max_len):
    """Wrap our tokenizer.json for AutoTokenizer, with <|endoftext|> as bos, eos and unk."""
    tok = transformers().PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file), bos_token=EOT, eos_token=EOT, unk_token=EOT,
        model_max_length=max_len)
    tok.save_pretrained(folder)
    # save_pretrained rewrites tokenizer.json with a do-nothing post-processor added; keep the
    # original bytes instead, so an import finds the sha256 that the checkpoint recorded
    shutil.copyfile(tokenizer_file, Path(folder) / "tokenizer.json")
    # transformers 5 names the class TokenizersBackend; older versions (and tools built on
    # them) know it by its old name, which transformers 5 still reads
    config_file = Path(folder) / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "tokenizer_class": "PreTrainedTokenizerFast"},
                                      indent=2) + "\n")


def export(checkpoint, out, data_dir=DATA_DIR):
    """Write the checkpoint's model to the folder `out` as transformers loads it; return it."""
    ckpt = load_checkpoint(checkpoint, data_dir=data_dir)  # also: the same tokenizer as data_dir
    kind = ckpt.get("model_class", GPT_CLASS)
    if kind != GPT_CLASS:
        raise ValueError(f"{checkpoint} holds a {kind}; export knows {GPT_CLASS} "
                         "(-> GPT2LMHeadModel): train one with `python -m tiny_llm.train`")
    model = GPT(GPTConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    tokenizer_file = Path(data_dir) / "tokenizer.json"
    vocab = load_tokenizer(tokenizer_file).get_vocab_size()
    if vocab != model.config.vocab_size:
        raise ValueError(f"the model has vocab_size {model.config.vocab_size:,} but "
                         f"{tokenizer_file} has {vocab:,} tokens: use the data folder the "
                         "model was trained with (--data-dir)")
    with atomic_folder(out) as tmp:
        to_gpt2(model).save_pretrained(tmp)
        save_tokenizer(tokenizer_file, tmp, model.config.max_seq_len)
    return model.eval(), ckpt


def import_gpt2(source, out):
    """Save a GPT2LMHeadModel as our checkpoint at `out` (tokenizer.json beside it, if any).

    Returns (our GPT, the transformers model, the tokenizer file or None).
    """
    model, hf = from_gpt2(source)
    try:  # the original file: a Hub download, or the one in the folder
        found = transformers().utils.cached_file(source, "tokenizer.json")
    except OSError:
        found = None
    tokenizer_file = Path(out).with_name("tokenizer.json") if found else None
    if found:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(found, tokenizer_file)
    save_checkpoint(out, {
        "model": model.state_dict(), "config": asdict(model.config), "step": 0,
        "tokenizer_sha256": tokenizer_sha256(tokenizer_file) if found else "none",
        "data_source": f"imported from {source}", "model_class": GPT_CLASS})
    return model, hf, tokenizer_file


def max_logit_difference(model, hf, seq_len=64, seed=0):
    """Largest |our logit - transformers' logit| over 2 seeded random sequences."""
    seq_len = min(seq_len, model.config.max_seq_len)
    ids = torch.randint(0, model.config.vocab_size, (2, seq_len),
                        generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return (model(ids)[0] - hf(ids).logits).abs().max().item()


def greedy_both(model, hf, ids, max_new_tokens, eot_id):
    """Greedy continuations of (1, T) `ids` by our generate and transformers' generate."""
    max_new_tokens = min(max_new_tokens, model.config.max_seq_len - ids.shape[1])
    ours = generate(model, ids, max_new_tokens, temperature=0, eot_id=eot_id)
    theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, eos_token_id=eot_id, pad_token_id=eot_id)
    return ours[0].tolist(), theirs[0].tolist()


def report(model, hf, tokenizer, prompt, max_new_tokens):
    """Print the logits check, and (with a tokenizer) both greedy stories."""
    diff = max_logit_difference(model, hf)
    verdict = "equal" if diff <= LIMIT else "close, not equal"
    print(f"{'logits':<12} max |ours - transformers| {diff:.1e} (limit {LIMIT:.0e}): {verdict}")
    if tokenizer is None:
        return
    eot_id = tokenizer.token_to_id(EOT) if tokenizer.token_to_id(EOT) is not None else 0
    ids = torch.tensor([tokenizer.encode(prompt).ids or [eot_id]])
    ours, theirs = greedy_both(model, hf, ids, max_new_tokens, eot_id)
    print(f"{'greedy':<12} {len(ours) - ids.shape[1]} new tokens, tiny_llm.generate and "
          f"transformers' generate agree: {ours == theirs}")
    print(f"{'story':<12} {tokenizer.decode(ours)}")


def main():
    parser = argparse.ArgumentParser(description="Appendix: export to and import from "
                                     "Hugging Face transformers.")
    parser.add_argument("--checkpoint", help="export this ckpt.pt (from tiny_llm.train)")
    parser.add_argument("--import", dest="source", help="import this GPT-2: a Hub name (gpt2) "
                        "or a folder holding config.json and model.safetensors")
    parser.add_argument("--out", required=True, help="export: a folder; import: a ckpt.pt")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="where tokenizer.json is")
    parser.add_argument("--prompt", default="Once upon a time")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()
    if (args.checkpoint is None) == (args.source is None):
        parser.error("give either --checkpoint (export) or --import (import)")
    torch.manual_seed(0)
    tf = transformers()
    try:
        if args.checkpoint:
            model, ckpt = export(args.checkpoint, args.out, args.data_dir)
            print(f"{'checkpoint':<12} {args.checkpoint} ({ckpt.get('model_class', GPT_CLASS)}, "
                  f"step {ckpt['step']:,})")
            hf = tf.AutoModelForCausalLM.from_pretrained(args.out).eval()
            print(f"{'exported':<12} {type(hf).__name__}, {model.num_params():,} parameters "
                  f"-> {args.out}")
            print(f"{'files':<12} {' '.join(sorted(os.listdir(args.out)))}")
            tokenizer = tf.AutoTokenizer.from_pretrained(args.out).backend_tokenizer
        else:
            model, hf, tokenizer_file = import_gpt2(args.source, args.out)
            act = hf.config.activation_function
            print(f"{'source':<12} {args.source} ({type(hf).__name__}, activation {act})")
            print(f"{'config':<12} " + " ".join(f"{k}={v}" for k, v in
                                                asdict(model.config).items()))
            if act in TANH_GELUS:
                print(f"{'note':<12} {act} is the tanh approximation of GELU; our MLP computes "
                      "the exact GELU, so the logits differ a little")
            print(f"{'saved':<12} {args.out}" + (f", {tokenizer_file}" if tokenizer_file else ""))
            tokenizer = load_tokenizer_any(tokenizer_file)
    except (FileExistsError, FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    report(model, hf, tokenizer, args.prompt, args.max_new_tokens)


def load_tokenizer_any(path):
    """A `tokenizers` Tokenizer from `path` (any vocabulary, unlike load_tokenizer), or None."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path)) if path is not None else None


if __name__ == "__main__":
    main()
