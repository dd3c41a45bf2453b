"""The appendix: export to transformers and import from it, proven equal; all offline."""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the Hub

from dataclasses import asdict  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from solutions import ex20_export  # noqa: E402
from tiny_llm import generate as generate_module  # noqa: E402
from tiny_llm.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint  # noqa: E402
from tiny_llm.export import (  # noqa: E402
    LIMIT,
    atomic_folder,
    export,
    greedy_both,
    import_gpt2,
    main,
    max_logit_difference,
)
from tiny_llm.generate import complete, generate  # noqa: E402
from tiny_llm.gpt import GPT, GPTConfig  # noqa: E402
from tiny_llm.instruct import render_request  # noqa: E402
from tiny_llm.tokenize import EOT, load_tokenizer, tokenizer_sha256  # noqa: E402


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
    with pytest.raises(ValueError, match=r"unknown model class 'tiny_llm.mamba.Mamba'.*not "
                                         r"loaded"):  # refused when read, by every command
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
    inventory = ex20_export.exercise_1_safetensors_inventory()
    assert inventory["numbers"] == inventory["num_params"] and not inventory["has_lm_head"]
    assert inventory["tensors"] == 28 and inventory["c_attn"] == (32, 96)
    assert len(inventory["transposed"]) == 8  # c_attn, c_proj (square!), c_fc, c_proj x 2 blocks


def test_exercise_2_matching_the_gelu_makes_a_tanh_gpt2_equal():
    gap, where = ex20_export.exercise_2_gelu_gap()
    assert 4.5e-4 < gap < 5e-4 and 2.6 < where < 2.8
    before, after = ex20_export.exercise_2_tanh_gelu_import()
    assert before > 1e-4 and after <= LIMIT


def test_exercise_3_reordered_rows_make_the_two_ropes_agree():
    assert ex20_export.exercise_3_rope_reorder() < 1e-12


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
    # RoPE has no table to run off: transformers' Llama writes on past position 32, reading the
    # whole text where ours reads the last 32 tokens, and the two stories part soon after
    ours = generate(model, ids, 40, temperature=0, eot_id=None)[0].tolist()
    theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=40, min_new_tokens=40)[0].tolist()
    assert len(theirs) == 44 and ours[:33] == theirs[:33] and ours != theirs


def test_a_modern_gpt_with_speedrun_parts_is_refused_by_the_llama_export(sample_data_dir,
                                                                         tmp_path):
    from tiny_llm.modern import ModernConfig, ModernGPT

    vocab = load_tokenizer(sample_data_dir / "tokenizer.json").get_vocab_size()
    config = ModernConfig(vocab_size=vocab, max_seq_len=16, d_model=32, n_layers=2, n_heads=4,
                          n_kv_heads=2, d_ff=128, mlp="relu2", qk_norm=True, value_embeds=True,
                          x0_mix=True, logit_softcap=15.0)
    save_checkpoint(tmp_path / "ckpt.pt", {
        "model": ModernGPT(config).state_dict(), "config": asdict(config), "step": 1,
        "tokenizer_sha256": tokenizer_sha256(sample_data_dir / "tokenizer.json"),
        "model_class": "tiny_llm.modern.ModernGPT"})
    with pytest.raises(ValueError, match=r"a ReLU² feed-forward \(mlp='relu2'\), QK-norm, value "
                       r"embeddings, x0 mixing, logit soft-capping at 15: transformers' "
                       r"LlamaForCausalLM has no such parts"):
        export(tmp_path / "ckpt.pt", tmp_path / "hf", data_dir=sample_data_dir)
    assert not (tmp_path / "hf").exists()


def test_a_batch_of_prompts_goes_through_the_pipeline_as_each_alone(exported, sample_data_dir):
    model, folder = exported
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert (tokenizer.pad_token, tokenizer.pad_token_id, tokenizer.padding_side) == (EOT, 0, "left")
    generator = transformers.pipeline("text-generation", model=str(folder), device="cpu")
    prompts = ["Once upon a time", "Lily saw a big dog and", "Tom"]  # 3 lengths: 2 are padded
    batched = generator(prompts, batch_size=3, do_sample=False, max_new_tokens=8)
    ours = load_tokenizer(sample_data_dir / "tokenizer.json")
    assert [out[0]["generated_text"] for out in batched] == [
        complete(model, ours, prompt, 8, temperature=0) for prompt in prompts]


def test_a_long_generation_stops_at_the_models_last_position(exported, sample_data_dir):
    model, folder = exported  # max_seq_len 32; the pipeline's own default is 256 new tokens
    generator = transformers.pipeline("text-generation", model=str(folder), device="cpu")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = generator("Once upon a time", do_sample=False)[0]["generated_text"]
    ids = torch.tensor([tokenizer.encode("Once upon a time")])
    ours = generate(model, ids, 28, temperature=0, eot_id=0)  # 4 + 28 = 32 positions
    assert text == complete(model, load_tokenizer(sample_data_dir / "tokenizer.json"),
                            "Once upon a time", 28, temperature=0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert hf.generation_config.max_length == 32  # generation_config.json: the model's limit
    assert hf.generate(ids, attention_mask=torch.ones_like(ids))[0].tolist() == ours[0].tolist()
    # it can write the token after the 32nd (4 + 29 = 33 tokens, read from 32 positions) ...
    out = generator("Once upon a time", do_sample=False, max_new_tokens=29, min_new_tokens=29,
                    return_tensors=True)[0]["generated_token_ids"]
    assert len(out) == 33
    # ... but not read a 33rd position: it has no row for it and does not crop, as ours does
    with pytest.raises(IndexError, match="index out of range"):
        generator("Once upon a time", do_sample=False, max_new_tokens=30, min_new_tokens=30)
    # what it can: drop the start of a long prompt so that prompt + new tokens fit ("hole")
    long_prompt = "Once upon a time " * 10  # 40 tokens, more than the model's 32 positions
    text = generator(long_prompt, do_sample=False, max_new_tokens=8,
                     handle_long_generation="hole")[0]["generated_text"]
    kept = torch.tensor([tokenizer.encode(long_prompt)[-(32 - 8):]])  # its last 24 tokens
    new = generate(model, kept, 8, temperature=0, eot_id=0)[0, kept.shape[1]:]
    assert text == long_prompt + tokenizer.decode(new, skip_special_tokens=True)


def gpt2_tokenizer(path):
    """A byte-level tokenizer laid out like GPT-2's, offline: ids 0-255 the bytes ('!' is 0),
    50256 <|endoftext|>; GPT-2's 50,000 merges would lie in between, left unused here."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({f"<unused{i}>": i for i in range(256, 50256)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(EOT, special=True)])
    tokenizer.save(str(path))
    return tokenizer


def always_predicts(token_id, wte, ln_f):
    """Rig a GPT so that every position predicts `token_id`: the final LayerNorm outputs its
    bias, set to that token's (lengthened) embedding, the longest row of the tied head."""
    with torch.no_grad():
        wte[token_id] *= 100
        ln_f.weight.zero_()
        ln_f.bias.copy_(wte[token_id])


def test_generate_writes_with_an_imported_gpt2_whose_eot_is_50256(sample_data_dir, tmp_path,
                                                                   monkeypatch, capsys):
    (tmp_path / "gpt2").mkdir()
    gpt2_tokenizer(tmp_path / "gpt2" / "tokenizer.json")
    config = transformers.GPT2Config(vocab_size=50257, n_positions=16, n_embd=8, n_layer=1,
                                     n_head=2, activation_function="gelu")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config)
    always_predicts(0, hf.transformer.wte.weight, hf.transformer.ln_f)  # GPT-2's id 0 is "!"
    hf.save_pretrained(tmp_path / "gpt2")
    _, _, tokenizer_file = import_gpt2(tmp_path / "gpt2", tmp_path / "run" / "ckpt.pt")
    assert tokenizer_file == tmp_path / "run" / "tokenizer.json"

    def run(*flags):
        monkeypatch.setattr(sys, "argv", ["generate", "--checkpoint", str(tmp_path / "run" /
                                          "ckpt.pt"), "--temperature", "0", *flags])
        generate_module.main()
        return capsys.readouterr().out

    # data/ holds the course's tokenizer, not GPT-2's: the error names the folder that does
    with pytest.raises(SystemExit, match=r"made with the tokenizer beside it, not the one in "
                                         rf".*: pass --data-dir {tmp_path / 'run'}$"):
        run("--data-dir", str(sample_data_dir))
    out = run("--data-dir", str(tmp_path / "run"), "--max-new-tokens", "30")
    # id 0 is an ordinary token here: 30 of them, where an EOT id of 0 stopped after one
    assert "sample 1     Once upon a time" + "!" * 30 + "\n" in out

    # and a model that ends every story stops after one token, at id 50256
    model, _ = model_from_checkpoint(tmp_path / "run" / "ckpt.pt", data_dir=tmp_path / "run")
    always_predicts(50256, model.embed.tok_emb.weight, model.ln_f)
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(args[0][0].tolist()))
    tokenizer = Tokenizer.from_file(str(tmp_path / "run" / "tokenizer.json"))
    assert complete(model, tokenizer, "", 10, temperature=0) == ""
    assert seen == [[50256]]  # an empty prompt starts after GPT-2's EOT; one step, then it ends


# ----- issues 35 and 36: a model tuned on requests exports its request format -----


@pytest.fixture(scope="module")
def exported_tuned(sample_data_dir, tmp_path_factory):
    """A scrambled small GPT saved as a fine-tuning on derived requests saves it, exported."""
    folder = tmp_path_factory.mktemp("export_tuned")
    save_gpt(folder / "ckpt.pt", sample_data_dir)
    state = torch.load(folder / "ckpt.pt", weights_only=True)
    save_checkpoint(folder / "ckpt.pt", {**state, "train_config": {"requests": "derived"}})
    export(folder / "ckpt.pt", folder / "hf", data_dir=sample_data_dir)
    return folder / "hf"


REQUESTS = [
    {"words": ["dog", "moon", "brave"]},
    {"words": ["dog"], "features": ["Dialogue"]},
    {"words": ["kite", "wind"], "features": ["Dialogue"], "sentence": "The kite flew\nhigh."},
    {"words": [], "features": []},
    {"sentence": "It was late."},
]


@pytest.mark.parametrize("request_", REQUESTS)
def test_the_chat_template_renders_a_request_as_render_request_does(exported_tuned,
                                                                    sample_data_dir, request_):
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported_tuned)
    messages = [{"role": "user", **request_}]
    expected = render_request(request_.get("words", ()), request_.get("features", ()),
                              request_.get("sentence"))
    assert tokenizer.apply_chat_template(messages, tokenize=False) == expected
    ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    assert ids == load_tokenizer(sample_data_dir / "tokenizer.json").encode(expected).ids


def test_a_chat_message_gives_the_words_and_unlearned_features_are_refused(exported_tuned):
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported_tuned)
    chat = [{"role": "user", "content": "dog, moon ,brave"}]
    assert tokenizer.apply_chat_template(chat, tokenize=False) == render_request(
        ["dog", "moon", "brave"])
    with pytest.raises(Exception, match="not taught the feature Twist"):
        tokenizer.apply_chat_template([{"role": "user", "features": ["Twist"]}], tokenize=False)
    with pytest.raises(Exception, match="not taught a summary"):
        tokenizer.apply_chat_template([{"role": "user", "summary": "A dog."}], tokenize=False)


def test_the_chat_template_refuses_what_it_cannot_render_in_a_sentence(exported_tuned):
    import jinja2

    tokenizer = transformers.AutoTokenizer.from_pretrained(exported_tuned)
    render = lambda chat: tokenizer.apply_chat_template(chat, tokenize=False)  # noqa: E731
    parts = [{"role": "user", "content": [{"type": "text", "text": "dog, moon"},
                                          {"type": "text", "text": "brave"}]}]
    assert render(parts) == render_request(["dog", "moon", "brave"])  # OpenAI's list of parts
    refused = {
        "not a system message: leave the system message out": [
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "dog"}],
        "no user message: give one, with the words as its content": [
            {"role": "assistant", "content": "Once upon a time"}],
        "reads text only: a message part of type image_url": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        "the request is longer than this model reads: it reads 32 tokens": [
            {"role": "user", "content": "dog", "sentence": "A dog ran. " * 1000}],
    }
    for said, chat in refused.items():
        with pytest.raises(jinja2.exceptions.TemplateError, match=said):
            render(chat)


def test_a_chat_pipeline_writes_from_the_request(exported_tuned):
    tell = transformers.pipeline("text-generation", model=str(exported_tuned), device="cpu")
    out = tell([{"role": "user", "content": "dog, moon"}], do_sample=False, max_new_tokens=4)
    assert out[0]["generated_text"][-1]["role"] == "assistant"


def test_a_base_model_ships_no_chat_template(exported):
    _, folder = exported
    assert "chat_template" not in json.loads((folder / "tokenizer_config.json").read_text())


def test_an_import_of_a_tuned_export_still_takes_its_requests(exported_tuned, tmp_path):
    from tiny_llm.instruct import learned_requests, takes_requests

    import_gpt2(str(exported_tuned), tmp_path / "back" / "ckpt.pt")
    back = load_checkpoint(tmp_path / "back" / "ckpt.pt")
    assert takes_requests(back)
    assert learned_requests(back) == {"fields": ["words", "sentence"], "features": ["Dialogue"]}
