"""The appendix: export to transformers and import from it, proven equal; all offline."""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the Hub

from dataclasses import asdict  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from solutions import ex17_export  # noqa: E402
from tiny_llm.checkpoint import model_from_checkpoint, save_checkpoint  # noqa: E402
from tiny_llm.export import (  # noqa: E402
    LIMIT,
    atomic_folder,
    export,
    greedy_both,
    import_gpt2,
    main,
    max_logit_difference,
)
from tiny_llm.generate import complete  # noqa: E402
from tiny_llm.gpt import GPT, GPTConfig  # noqa: E402
from tiny_llm.tokenize import load_tokenizer, tokenizer_sha256  # noqa: E402


def scrambled(model, seed=0, std=0.3):
    """Every parameter redrawn, LayerNorm gains and biases too: a model with no symmetry left
    that a wrong name mapping could hide behind (fresh LayerNorms are all ones and zeros)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * std + (p == 1).float())
    return model.eval()


def save_gpt(path, data_dir, model_class="tiny_llm.gpt.GPT"):
    """A checkpoint of a scrambled small GPT for the sample tokenizer, as training writes one."""
    vocab = load_tokenizer(data_dir / "tokenizer.json").get_vocab_size()
    model = scrambled(GPT(GPTConfig(vocab_size=vocab, max_seq_len=32, d_model=32, n_layers=2,
                                    n_heads=4)))
    state = {"model": model.state_dict(), "config": asdict(model.config), "step": 7,
             "tokenizer_sha256": tokenizer_sha256(data_dir / "tokenizer.json"),
             "data_source": "sample"}
    if model_class is not None:
        state["model_class"] = model_class
    save_checkpoint(path, state)
    return model


@pytest.fixture(scope="module")
def exported(sample_data_dir, tmp_path_factory):
    """(our GPT, the exported folder) for one scrambled checkpoint."""
    folder = tmp_path_factory.mktemp("export")
    model = save_gpt(folder / "ckpt.pt", sample_data_dir)
    export(folder / "ckpt.pt", folder / "hf", data_dir=sample_data_dir)
    return model, folder / "hf"


def random_gpt2(folder, activation="gelu", **overrides):
    """A small randomly initialised GPT2LMHeadModel saved to `folder`; returns it."""
    config = transformers.GPT2Config(vocab_size=97, n_positions=16, n_embd=24, n_layer=2,
                                     n_head=3, activation_function=activation, **overrides)
    torch.manual_seed(0)
    model = scrambled(transformers.GPT2LMHeadModel(config), std=0.2)
    model.save_pretrained(folder)
    return model


def test_the_export_loads_in_transformers_with_equal_logits(exported):
    model, folder = exported
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # still tied
    assert max_logit_difference(model, hf, seq_len=32) <= LIMIT


def test_greedy_generation_through_transformers_writes_the_same_story(exported, sample_data_dir):
    model, folder = exported
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor([tokenizer.encode("Once upon a time")])
    ours, theirs = greedy_both(model, hf, ids, 28, eot_id=tokenizer.eos_token_id)
    assert len(set(ours[4:])) > 3  # a real story to compare, not one token repeated
    assert ours == theirs
    ours_text = complete(model, load_tokenizer(sample_data_dir / "tokenizer.json"),
                         "Once upon a time", 28, temperature=0)
    assert tokenizer.decode(theirs, skip_special_tokens=True) == ours_text


def test_the_pipeline_of_transformers_tells_it_too(exported, sample_data_dir):
    model, folder = exported
    generator = transformers.pipeline("text-generation", model=str(folder), device="cpu")
    out = generator("Once upon a time", do_sample=False, max_new_tokens=10)[0]["generated_text"]
    tokenizer = load_tokenizer(sample_data_dir / "tokenizer.json")
    assert out == complete(model, tokenizer, "Once upon a time", 10, temperature=0)


def test_autotokenizer_reads_the_exported_tokenizer(exported, sample_data_dir):
    _, folder = exported
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours = load_tokenizer(sample_data_dir / "tokenizer.json")
    text = "Lily saw a big dog.<|endoftext|>"
    assert theirs.encode(text) == ours.encode(text).ids  # no BOS added in front
    assert (theirs.eos_token, theirs.eos_token_id, theirs.model_max_length) == (
        "<|endoftext|>", 0, 32)
    # byte for byte the training tokenizer, so an import recognises it
    assert tokenizer_sha256(folder / "tokenizer.json") == tokenizer_sha256(
        sample_data_dir / "tokenizer.json")


def test_export_then_import_gives_back_the_same_weights(exported, sample_data_dir, tmp_path):
    model, folder = exported
    import_gpt2(folder, tmp_path / "back" / "ckpt.pt")
    back, ckpt = model_from_checkpoint(tmp_path / "back" / "ckpt.pt", data_dir=sample_data_dir)
    assert back.config == model.config and ckpt["model_class"] == "tiny_llm.gpt.GPT"
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())


def test_import_of_a_random_gpt2_gives_equal_logits(tmp_path):
    hf = random_gpt2(tmp_path / "gpt2")
    model, _, tokenizer_file = import_gpt2(tmp_path / "gpt2", tmp_path / "ckpt.pt")
    assert tokenizer_file is None  # this folder has no tokenizer, and the import says so
    rebuilt, _ = model_from_checkpoint(tmp_path / "ckpt.pt", data_dir=None)
    assert rebuilt.config == GPTConfig(vocab_size=97, max_seq_len=16, d_model=24, n_layers=2,
                                       n_heads=3)
    assert max_logit_difference(rebuilt, hf.eval()) <= LIMIT
    ids = torch.tensor([[5, 6, 7]])
    ours, theirs = greedy_both(rebuilt, hf, ids, 13, eot_id=96)
    assert ours == theirs


def test_tanh_gelu_weights_import_close_but_not_equal(tmp_path):
    hf = random_gpt2(tmp_path / "gpt2", activation="gelu_new")
    model, _, _ = import_gpt2(tmp_path / "gpt2", tmp_path / "ckpt.pt")
    assert LIMIT < max_logit_difference(model, hf.eval()) < 1e-2  # only the GELU differs


def test_a_checkpoint_from_before_model_class_existed_exports_as_gpt2(sample_data_dir, tmp_path):
    model = save_gpt(tmp_path / "ckpt.pt", sample_data_dir, model_class=None)
    export(tmp_path / "ckpt.pt", tmp_path / "hf", data_dir=sample_data_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert type(hf).__name__ == "GPT2LMHeadModel"
    assert max_logit_difference(model, hf.eval(), seq_len=32) <= LIMIT


def test_an_unknown_model_class_is_refused(sample_data_dir, tmp_path):
    save_gpt(tmp_path / "ckpt.pt", sample_data_dir, model_class="tiny_llm.mamba.Mamba")
    with pytest.raises(ValueError, match=r"holds a tiny_llm.mamba.Mamba; export knows "
                                         r"tiny_llm.gpt.GPT"):
        export(tmp_path / "ckpt.pt", tmp_path / "hf", data_dir=sample_data_dir)
    assert not (tmp_path / "hf").exists()


def test_a_vocabulary_that_does_not_fit_the_tokenizer_is_refused(sample_data_dir, tmp_path):
    model = GPT(GPTConfig(vocab_size=50, max_seq_len=8, d_model=16, n_layers=1, n_heads=2))
    save_checkpoint(tmp_path / "ckpt.pt", {
        "model": model.state_dict(), "config": asdict(model.config), "step": 1,
        "tokenizer_sha256": tokenizer_sha256(sample_data_dir / "tokenizer.json")})
    with pytest.raises(ValueError, match=r"vocab_size 50, .*tokenizer.json has 1,\d{3} "
                                         r"tokens: pass the model's data folder"):
        export(tmp_path / "ckpt.pt", tmp_path / "hf", data_dir=sample_data_dir)


def test_a_folder_that_is_not_a_model_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ValueError, match=r"not a Hugging Face model folder \(no config.json"):
        import_gpt2(tmp_path, tmp_path / "ckpt.pt")


def test_other_architectures_and_shapes_are_refused(tmp_path):
    llama = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                     num_hidden_layers=1, num_attention_heads=2)
    transformers.LlamaForCausalLM(llama).save_pretrained(tmp_path / "llama")
    with pytest.raises(ValueError, match=r"cannot be imported: it is a 'llama' model; only GPT-2"):
        import_gpt2(tmp_path / "llama", tmp_path / "ckpt.pt")
    random_gpt2(tmp_path / "wide", n_inner=200)
    with pytest.raises(ValueError, match=r"its MLP is 200 wide, ours is always 4 x n_embd = 96"):
        import_gpt2(tmp_path / "wide", tmp_path / "ckpt.pt")
    assert not (tmp_path / "ckpt.pt").exists()


def test_a_failed_export_leaves_the_old_folder_and_no_temporary_one(tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / ".tiny-llm-export").write_text("config.json\n")  # an earlier export wrote it
    with pytest.raises(RuntimeError), atomic_folder(out) as tmp:
        (tmp / "config.json").write_text('{"half": true}')
        raise RuntimeError("interrupted")
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]
    assert (out / "config.json").read_text() == "{}"


def test_a_folder_of_other_files_is_never_replaced(tmp_path):
    (tmp_path / "thesis.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match="is not a model folder: pick a new --out"):
        with atomic_folder(tmp_path):
            pass
    assert (tmp_path / "thesis.tex").read_text() == "years of work"


def test_exercise_1_the_file_holds_every_parameter_once_and_conv1d_transposed():
    inventory = ex17_export.exercise_1_safetensors_inventory()
    assert inventory["numbers"] == inventory["num_params"] and not inventory["has_lm_head"]
    assert inventory["tensors"] == 28 and inventory["c_attn"] == (32, 96)
    assert len(inventory["transposed"]) == 8  # c_attn, c_proj (square!), c_fc, c_proj x 2 blocks


def test_exercise_2_matching_the_gelu_makes_a_tanh_gpt2_equal():
    gap, where = ex17_export.exercise_2_gelu_gap()
    assert 4.5e-4 < gap < 5e-4 and 2.6 < where < 2.8
    before, after = ex17_export.exercise_2_tanh_gelu_import()
    assert before > 1e-4 and after <= LIMIT


def test_exercise_3_reordered_rows_make_the_two_ropes_agree():
    assert ex17_export.exercise_3_rope_reorder() < 1e-12


def test_the_command_says_what_it_saw_and_what_to_do(tmp_path, monkeypatch):
    (tmp_path / "notes.txt").write_text("not a model")
    monkeypatch.setattr(sys, "argv", ["export", "--import", str(tmp_path), "--out", "c.pt"])
    with pytest.raises(SystemExit, match=r"^error: .* is not a Hugging Face model folder .*"
                                         r"pass one that save_pretrained wrote"):
        main()


def test_a_modern_gpt_exports_as_llama_with_equal_logits_and_story(sample_data_dir, tmp_path):
    from tiny_llm.modern import ModernConfig, ModernGPT

    vocab = load_tokenizer(sample_data_dir / "tokenizer.json").get_vocab_size()
    torch.manual_seed(0)
    config = ModernConfig(vocab_size=vocab, max_seq_len=32, d_model=48, n_layers=2, n_heads=4,
                          n_kv_heads=2, d_ff=96, rope_theta=500.0, tie_embeddings=False)
    model = scrambled(ModernGPT(config), std=0.1)
    save_checkpoint(tmp_path / "ckpt.pt", {
        "model": model.state_dict(), "config": asdict(config), "step": 3,
        "tokenizer_sha256": tokenizer_sha256(sample_data_dir / "tokenizer.json"),
        "model_class": "tiny_llm.modern.ModernGPT"})
    export(tmp_path / "ckpt.pt", tmp_path / "hf", data_dir=sample_data_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.config.num_key_value_heads == 2
    assert max_logit_difference(model, hf, seq_len=32) <= LIMIT
    ids = torch.tensor([transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").encode(
        "Once upon a time")])
    ours, theirs = greedy_both(model, hf, ids, 28, eot_id=0)
    assert len(set(ours[4:])) >= 3 and ours == theirs
