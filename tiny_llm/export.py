"""Appendix: hand a trained model to the Hugging Face ecosystem, and take GPT-2 back.

Our GPT and transformers' GPT2LMHeadModel are the same computation under other names: their
`transformer.h.3.attn.c_attn` is our `blocks.3.attn.qkv`. Exporting renames every weight, writes
config.json, model.safetensors and the tokenizer, then loads the folder back with transformers
and checks that it computes what our model computes. Importing renames the other way.

Export:  uv run python -m tiny_llm.export --checkpoint runs/small/ckpt.pt --out runs/small/hf
Import:  uv run python -m tiny_llm.export --import gpt2 --out runs/gpt2/ckpt.pt   (needs internet)
transformers and safetensors are an optional extra:  uv sync --extra hf
"""

import argparse
import importlib
import json
import os
import re
import shutil
from dataclasses import asdict
from pathlib import Path

import torch
from tokenizers import Tokenizer

from tiny_llm import files
from tiny_llm.checkpoint import MODELS, build_model, class_path, load_checkpoint, save_checkpoint
from tiny_llm.files import atomic_path
from tiny_llm.generate import generate
from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.paths import DATA_DIR
from tiny_llm.request_data import chat_template, learned_requests
from tiny_llm.tokenize import EOT, load_tokenizer, tokenizer_sha256

TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")  # real GPT-2 uses gelu_new
LIMIT = 1e-5  # largest |logit difference| that counts as the same model, in float32

# Our parameter names -> transformers' names, by regex substitutions applied in order:
# "blocks.0.attn.qkv.weight" -> "transformer.h.0.attn.c_attn.weight"
GPT2_NAMES = [(r"^embed\.tok_emb", "transformer.wte"), (r"^embed\.pos_emb", "transformer.wpe"),
              (r"^blocks\.", "transformer.h."), (r"^ln_f", "transformer.ln_f"),
              (r"attn\.qkv", "attn.c_attn"), (r"attn\.proj", "attn.c_proj"),
              (r"mlp\.fc", "mlp.c_fc"), (r"mlp\.proj", "mlp.c_proj")]
LLAMA_NAMES = [(r"^embed\.tok_emb", "model.embed_tokens"), (r"^ln_f", "model.norm"),
               (r"^blocks\.", "model.layers."),
               (r"attention\.w([qkvo])", r"self_attn.\1_proj"),
               (r"feed_forward\.w1", "mlp.gate_proj"), (r"feed_forward\.w3", "mlp.up_proj"),
               (r"feed_forward\.w2", "mlp.down_proj"), (r"attention_norm", "input_layernorm"),
               (r"ffn_norm", "post_attention_layernorm")]


def transformers():
    """The transformers package, or a clear error saying how to install it (an extra)."""
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise SystemExit("error: export and import need transformers: uv sync --extra hf") from None


def hf_name(name, rules):
    """Our parameter name -> transformers' name for the same weight."""
    for pattern, replacement in rules:
        name = re.sub(pattern, replacement, name)
    return name


def convert(w, theirs, c, backwards=False):
    """Our weight `w` in the layout transformers keeps under the name `theirs` (or back)."""
    if re.search(r"\.c_(attn|proj|fc)\.weight$", theirs):
        return w.t()  # GPT-2's Conv1D keeps (in, out) where nn.Linear keeps (out, in)
    heads = {"q_proj": c.n_heads, "k_proj": getattr(c, "n_kv_heads", 0)}.get(
        theirs.split(".")[-2])
    if heads:
        # RoPE: ours turns the pairs of dimensions (0, 1), (2, 3)... of each head, as Meta's
        # LLaMA does; transformers' Llama turns (0, hs/2), (1, hs/2 + 1)... Reordering the
        # rows of wq and wk alike moves each pair to where Llama turns it; q·k is unchanged.
        split = (heads, 2, -1, w.shape[1]) if backwards else (heads, -1, 2, w.shape[1])
        return w.reshape(split).transpose(1, 2).reshape(w.shape)
    return w


def copy_weights(ours, theirs, rules, backwards=False):
    """Copy every weight of our model into the transformers one (backwards: the other way)."""
    hf_params = dict(theirs.named_parameters())  # a tied head is one parameter on both sides
    with torch.no_grad():
        for name, p in ours.named_parameters():
            other = hf_name(name, rules)
            q = hf_params.get(other)
            if q is None or convert(p, other, ours.config).shape != q.shape:
                found = "missing" if q is None else f"{tuple(q.shape)}"
                raise ValueError(f"our {name} {tuple(p.shape)} does not fit transformers' "
                                 f"{other} ({found}): the configs describe different models")
            if backwards:
                p.copy_(convert(q, other, ours.config, backwards=True))
            else:
                q.copy_(convert(p, other, ours.config))
    return (ours if backwards else theirs).eval()


def to_gpt2(model):
    """Step 08's GPT -> an equal transformers GPT2LMHeadModel."""
    tf, c = transformers(), model.config
    config = tf.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.max_seq_len, n_embd=c.d_model,
        n_layer=c.n_layers, n_head=c.n_heads, activation_function="gelu",  # ours is the exact erf
        layer_norm_epsilon=1e-5, resid_pdrop=c.dropout, embd_pdrop=c.dropout,
        attn_pdrop=c.dropout, bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
    return copy_weights(model, tf.GPT2LMHeadModel(config), GPT2_NAMES)


def to_llama(model):
    """Step 15's ModernGPT -> an equal transformers LlamaForCausalLM."""
    tf, c = transformers(), model.config
    config = tf.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads, head_dim=c.d_model // c.n_heads,
        max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps, hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": float(c.rope_theta)},
        tie_word_embeddings=c.tie_embeddings, bos_token_id=0, eos_token_id=0)
    return copy_weights(model, tf.LlamaForCausalLM(config), LLAMA_NAMES)


def llama_misfit(c):
    """The parts of a ModernConfig that LlamaForCausalLM has no place for (step 15's speedrun
    parts), by name; empty for a LLaMA-style config. Warmup-stable-decay and Muon's momentum
    warmup shape only the training: what they train exports like any weights."""
    return [part for part, used in (
        ("a ReLU² feed-forward (mlp='relu2')", c.mlp != "swiglu"), ("QK-norm", c.qk_norm),
        ("value embeddings", c.value_embeds), ("x0 mixing", c.x0_mix),
        (f"logit soft-capping at {c.logit_softcap:g}", c.logit_softcap > 0)) if used]


EXPORTS = {MODELS["gpt"]: to_gpt2, MODELS["modern"]: to_llama}  # by the class a checkpoint names


def gpt2_misfit(c):
    """What in the transformers config `c` our GPT cannot hold, or None."""
    if c.model_type != "gpt2":
        return f"it is a {c.model_type!r} model; only GPT-2 ('gpt2', step 08's design) fits"
    checks = [(c.n_inner in (None, 4 * c.n_embd),
               f"its MLP is {c.n_inner} wide, ours is always 4 x n_embd = {4 * c.n_embd}"),
              (c.scale_attn_weights and not c.scale_attn_by_inverse_layer_idx,
               "it scales attention differently (see scale_attn_* in its config.json)"),
              (c.activation_function in ("gelu", *TANH_GELUS),
               f"its activation is {c.activation_function!r}, ours is GELU"),
              (c.tie_word_embeddings, "its output head is not tied to wte; ours is (step 08)")]
    return next((problem for ok, problem in checks if not ok), None)


def from_gpt2(source):
    """A GPT2LMHeadModel (Hub name or local folder) -> (our GPT, the transformers model)."""
    tf = transformers()
    if Path(source).exists() and not (Path(source) / "config.json").is_file():
        raise ValueError(f"{source} is not a Hugging Face model folder (no config.json in it): "
                         "pass one that save_pretrained wrote, or a Hub name like gpt2")
    try:
        config = tf.AutoConfig.from_pretrained(source)
    except OSError as err:
        raise ValueError(f"could not load {source!r} ({str(err).splitlines()[0]}): a Hub name "
                         "needs internet the first time (then it is cached), a folder needs "
                         "config.json and model.safetensors") from None
    if problem := gpt2_misfit(config):
        raise ValueError(f"{source} cannot be imported: {problem}")
    hf = tf.GPT2LMHeadModel.from_pretrained(source, dtype=torch.float32)
    ours = GPT(GPTConfig(vocab_size=config.vocab_size, max_seq_len=config.n_positions,
                         d_model=config.n_embd, n_layers=config.n_layer, n_heads=config.n_head))
    return copy_weights(ours, hf, GPT2_NAMES, backwards=True), hf.eval()


MARKER = ".tiny-llm-export"  # in every folder export writes: the names of the files it wrote


def check_replaceable(out):
    """Raise unless `out` is absent, empty, or holds only what an earlier export wrote there
    (its MARKER lists the names): a typo in --out deletes no one's files, not even beside a
    config.json."""
    files.check_replaceable(out, MARKER, "export", "a model folder")


def atomic_folder(out):
    """A temporary folder beside `out`, renamed to `out` only if the block succeeds (files.py)."""
    return files.atomic_folder(out, MARKER, "export", "a model folder")


def save_tokenizer(tokenizer_file, folder, max_len, learned=None):
    """Our tokenizer.json for AutoTokenizer: the file, byte for byte (checkpoints record its
    sha256), and a config naming the class and <|endoftext|>, which ends and begins stories
    and pads the short prompts of a batch, on the left: every prompt ends where writing starts.
    A model tuned on requests (`learned`: step 17's learned_requests) gets CHAT_TEMPLATE."""
    shutil.copyfile(tokenizer_file, Path(folder) / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT, "eos_token": EOT,
              "unk_token": EOT, "pad_token": EOT, "padding_side": "left",
              "model_max_length": max_len}
    if learned is not None:
        longest = max(map(len, load_tokenizer(tokenizer_file).get_vocab()))  # a token's bytes
        config["chat_template"] = chat_template(learned, max_len, longest)
    (Path(folder) / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def generation_config(max_seq_len, eot_id=0):
    """generation_config.json's settings: <|endoftext|> ends and pads, and a call that names no
    length stops at max_seq_len tokens in all, the prompt's included. transformers' GPT-2 has
    no position past its table and does not crop the context as our `generate` does."""
    return transformers().GenerationConfig(bos_token_id=eot_id, eos_token_id=eot_id,
                                           pad_token_id=eot_id, max_length=max_seq_len)


def export(checkpoint, out, data_dir=DATA_DIR):
    """Write the checkpoint's model to the folder `out`; return (our model, the checkpoint).
    A model fine-tuned on requests says what it learned in config.json ("tiny_llm_requests")
    and gets a chat template that writes them."""
    check_replaceable(out)  # before any work: a folder export did not write is refused
    ckpt = load_checkpoint(checkpoint, data_dir=data_dir)  # also: the same tokenizer as data_dir
    kind = ckpt.get("model_class", MODELS["gpt"])  # older checkpoints all hold a GPT
    if kind not in EXPORTS:
        raise ValueError(f"{checkpoint} holds a {kind}; export knows {' and '.join(EXPORTS)}: "
                         "pass a checkpoint that tiny_llm.train wrote for one of them")
    model = build_model(kind, ckpt["config"])  # step 15's module is imported only if named
    if kind == MODELS["modern"] and (parts := llama_misfit(model.config)):
        raise ValueError(f"{checkpoint} holds a ModernGPT with {', '.join(parts)}: "
                         "transformers' LlamaForCausalLM has no such parts, so it cannot be "
                         "exported as LLaMA. A ModernGPT with LLaMA's parts only exports (train "
                         "one with --model modern --preset cpu); this one runs with tiny_llm's "
                         "generate, evaluate and kvcache")
    model.load_state_dict(ckpt["model"])
    tokenizer_file = Path(data_dir) / "tokenizer.json"
    vocab = load_tokenizer(tokenizer_file).get_vocab_size()
    if vocab != model.config.vocab_size:
        raise ValueError(f"the model has vocab_size {model.config.vocab_size:,}, {tokenizer_file} "
                         f"has {vocab:,} tokens: pass the model's data folder as --data-dir")
    learned = learned_requests(ckpt)
    with atomic_folder(out) as tmp:
        hf = EXPORTS[kind](model.float())
        hf.generation_config = generation_config(model.config.max_seq_len)
        if learned is not None:  # an import reads it back: the model still takes requests
            hf.config.tiny_llm_requests = learned
        hf.save_pretrained(tmp)  # config.json, generation_config.json, model.safetensors
        save_tokenizer(tokenizer_file, tmp, model.config.max_seq_len, learned)
    return model.eval(), ckpt


def import_gpt2(source, out):
    """Save a GPT-2 as our checkpoint `out`, its tokenizer.json (if any) beside it.
    Returns (our GPT, the transformers model, the tokenizer file or None)."""
    check_import_target(out)  # before any work
    model, hf = from_gpt2(source)
    try:  # the original file: the one in the folder, or the Hub's (downloaded once, cached)
        found = transformers().utils.cached_file(source, "tokenizer.json")
    except OSError:
        found = None
    tokenizer_file = Path(out).with_name("tokenizer.json") if found else None
    if found:
        with atomic_path(tokenizer_file) as tmp:
            shutil.copyfile(found, tmp)
    learned = getattr(hf.config, "tiny_llm_requests", None)  # an export of a tuned model
    save_checkpoint(out, {
        "model": model.state_dict(), "config": asdict(model.config), "step": 0,
        "tokenizer_sha256": tokenizer_sha256(tokenizer_file) if found else "none",
        "data_source": f"imported from {source}", "model_class": class_path(model),
        **({"requests": learned} if isinstance(learned, dict) else {})})
    return model, hf, tokenizer_file


def check_import_target(out):
    """Raise unless the import's ckpt.pt and the tokenizer.json beside it are both new files:
    an import never replaces a file, least of all a trained run's checkpoint or the tokenizer
    of a prepared data folder."""
    out = Path(out)
    for path, what in ((out, "--out"), (out.with_name("tokenizer.json"),
                                        "the tokenizer.json an import writes beside --out")):
        if path.exists() or path.is_symlink():
            raise FileExistsError(f"{path} exists ({what}): an import writes only new files, so "
                                  "it replaces no run's checkpoint and no data folder's "
                                  "tokenizer. Pass an --out in a new folder, such as "
                                  "runs/gpt2/ckpt.pt")
    if out.parent.exists() and not out.parent.is_dir():
        raise FileExistsError(f"{out.parent} is a file, not a folder: pass another --out")


def max_logit_difference(model, hf, seq_len=64, seed=0):
    """Largest |our logit - transformers' logit| over 2 seeded random sequences."""
    seq_len = min(seq_len, model.config.max_seq_len)
    ids = torch.randint(0, model.config.vocab_size, (2, seq_len),
                        generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return (model(ids)[0] - hf(ids).logits).abs().max().item()


def greedy_both(model, hf, ids, max_new_tokens, eot_id):
    """Greedy continuations (token lists) of (1, T) `ids`: tiny_llm's generate, then HF's."""
    max_new_tokens = min(max_new_tokens, model.config.max_seq_len - ids.shape[1])
    ours = generate(model, ids, max_new_tokens, temperature=0, eot_id=eot_id)
    theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_length=ids.shape[1] + max_new_tokens, eos_token_id=eot_id,
                         pad_token_id=eot_id)  # a length in all, as generation_config.json's
    return ours[0].tolist(), theirs[0].tolist()


def report(model, hf, tokenizer, prompt, max_new_tokens):
    """Print the logits check, and (with a tokenizer) whether both greedy stories agree."""
    diff = max_logit_difference(model, hf)
    print(f"{'logits':<12} max |ours - transformers| {diff:.1e} (limit {LIMIT:.0e}): "
          + ("equal" if diff <= LIMIT else "close, not equal"))
    if tokenizer is not None:
        eot_id = tokenizer.token_to_id(EOT) or 0
        ids = torch.tensor([tokenizer.encode(prompt).ids or [eot_id]])
        ours, theirs = greedy_both(model, hf, ids, max_new_tokens, eot_id)
        print(f"{'greedy':<12} {len(ours) - ids.shape[1]} new tokens, the same from tiny_llm "
              f"and from transformers: {ours == theirs}")
        print(f"{'story':<12} {tokenizer.decode(ours)}")


def main():
    parser = argparse.ArgumentParser(description="Appendix: to and from transformers.")
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
    tf = transformers()
    tf.utils.logging.disable_progress_bar()
    try:
        if args.checkpoint:
            model, ckpt = export(args.checkpoint, args.out, args.data_dir)
            hf = tf.AutoModelForCausalLM.from_pretrained(args.out).eval()  # as anyone would
            tokenizer = tf.AutoTokenizer.from_pretrained(args.out).backend_tokenizer
            print(f"{'checkpoint':<12} {args.checkpoint} ({class_path(model)}, "
                  f"step {ckpt['step']:,})")
            print(f"{'exported':<12} {type(hf).__name__}, {model.num_params():,} parameters "
                  f"-> {args.out}")
            names = sorted(name for name in os.listdir(args.out) if name != MARKER)
            print(f"{'files':<12} {' '.join(names)}")
        else:
            model, hf, tokenizer_file = import_gpt2(args.source, args.out)
            tokenizer = Tokenizer.from_file(str(tokenizer_file)) if tokenizer_file else None
            act = hf.config.activation_function
            approximate = " (tanh GELU; ours is exact, so logits differ a little)"
            print(f"{'source':<12} {args.source}, {type(hf).__name__}, activation {act}"
                  + (approximate if act in TANH_GELUS else ""))
            print(f"{'config':<12} " + " ".join(f"{k}={v}" for k, v in
                                                asdict(model.config).items()))
            print(f"{'saved':<12} {args.out}, {model.num_params():,} parameters"
                  + (f"; {tokenizer_file}" if tokenizer_file else "; no tokenizer found"))
    except (FileExistsError, FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    report(model, hf, tokenizer, args.prompt, args.max_new_tokens)


if __name__ == "__main__":
    main()
