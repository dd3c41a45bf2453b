import importlib.util
import json
import math
import os
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from solutions import ex15_modern
from tiny_llm.block import MLP
from tiny_llm.checks import check_ids
from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.kvcache import KVCache
from tiny_llm.modern import (
    PRESETS,
    Attention,
    ModernConfig,
    ModernGPT,
    ReLU2,
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    halves_to_pairs,
    kv_bytes_per_token,
    pairs_to_halves,
    swiglu_size,
)
from tiny_llm.posenc import RotaryEmbedding as Step14Rotary

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the reference models are built, never downloaded

TINY = ModernConfig(vocab_size=64, max_seq_len=16, d_model=32, n_layers=2, n_heads=4,
                    n_kv_heads=2, d_ff=88)


# --- the parts ---------------------------------------------------------------------------------


def test_rmsnorm_divides_by_the_root_mean_square():
    out = RMSNorm(2, eps=0.0)(torch.tensor([3.0, 4.0]))
    torch.testing.assert_close(out, torch.tensor([3.0, 4.0]) / math.sqrt(12.5))


def test_rmsnorm_equals_torch_rms_norm_and_ignores_the_scale_of_its_input():
    torch.manual_seed(0)
    norm, x = RMSNorm(16), torch.randn(2, 5, 16) * 3 + 1
    with torch.no_grad():
        norm.weight.normal_()
    torch.testing.assert_close(norm(x), F.rms_norm(x, (16,), norm.weight, eps=1e-5))
    torch.testing.assert_close(norm(10 * x), norm(x), atol=1e-5, rtol=1e-5)
    assert [n for n, _ in norm.named_parameters()] == ["weight"]  # no bias


def test_swiglu_is_w2_of_silu_w1_times_w3_without_biases():
    torch.manual_seed(0)
    ff, x = SwiGLU(8, 24), torch.randn(3, 8)
    expected = ff.w2(F.silu(ff.w1(x)) * ff.w3(x))
    torch.testing.assert_close(ff(x), expected)
    assert all(m.bias is None for m in (ff.w1, ff.w2, ff.w3))


@pytest.mark.parametrize("d_model", [64, 128, 384, 512])
def test_swiglu_at_eight_thirds_width_has_the_weights_of_a_4d_gelu_mlp(d_model):
    swiglu = sum(p.numel() for p in SwiGLU(d_model, swiglu_size(d_model)).parameters())
    gelu = sum(p.numel() for p in MLP(d_model).parameters())  # 8·d² weights + 5·d biases
    assert swiglu_size(d_model) % 8 == 0
    assert abs(swiglu - gelu) / gelu < 0.025  # d_ff rounded up to a multiple of 8


def test_rope_at_theta_10000_is_step_14s_and_theta_changes_the_angles():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 10, 8)
    torch.testing.assert_close(RotaryEmbedding(8, 10)(x), Step14Rotary(8, 10)(x))
    assert not torch.allclose(RotaryEmbedding(8, 10, theta=100.0)(x), Step14Rotary(8, 10)(x))
    slow = RotaryEmbedding(8, 10, theta=500000.0)  # LLaMA 3's base: the last pair barely turns
    assert slow.cos[9, -1].item() > RotaryEmbedding(8, 10).cos[9, -1].item()


def test_rope_start_rotates_new_positions_as_if_the_prefix_were_there():
    torch.manual_seed(0)
    rope, x = RotaryEmbedding(8, 10), torch.randn(1, 2, 10, 8)
    torch.testing.assert_close(rope(x[:, :, 6:9], start=6), rope(x)[:, :, 6:9])
    with pytest.raises(ValueError, match="exceeds max_len=10"):
        rope(x[:, :, :3], start=8)


def test_pairs_and_halves_reorder_rows_and_undo_each_other():
    w = torch.arange(12.0).view(12, 1)  # 2 heads of size 6, one column
    assert pairs_to_halves(w, 2).flatten().tolist() == [0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11]
    torch.testing.assert_close(halves_to_pairs(pairs_to_halves(w, 2), 2), w)


def test_config_rejects_shapes_that_cannot_work():
    with pytest.raises(ValueError, match="n_kv_heads=3"):
        replace(TINY, n_kv_heads=3)
    with pytest.raises(ValueError, match="even size"):
        replace(TINY, d_model=36, n_heads=12, n_kv_heads=12)  # heads of 3: no pairs to turn
    with pytest.raises(ValueError, match="ModernConfig.d_ff"):
        replace(TINY, d_ff=0)


# --- the model ---------------------------------------------------------------------------------


def test_parameter_names_are_step_08s_outside_the_blocks_and_llamas_inside():
    names = {n for n, _ in ModernGPT(replace(TINY, tie_embeddings=False)).named_parameters()}
    layer = {"attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1",
             "feed_forward.w2", "feed_forward.w3", "attention_norm", "ffn_norm"}
    expected = {"embed.tok_emb.weight", "ln_f.weight", "lm_head.weight"}
    expected |= {f"blocks.{i}.{n}.weight" for i in range(2) for n in layer}
    assert names == expected  # and no bias anywhere


def test_grouped_query_attention_shares_each_kv_head_with_a_group_of_query_heads():
    attn = Attention(TINY)  # 4 query heads, 2 k/v heads of size 8
    assert attn.wq.weight.shape == (32, 32) and attn.wk.weight.shape == (16, 32)
    torch.manual_seed(0)
    x = torch.randn(2, 6, 32)
    q = attn.rope(attn.wq(x).view(2, 6, 4, 8).transpose(1, 2))
    k = attn.rope(attn.wk(x).view(2, 6, 2, 8).transpose(1, 2))
    v = attn.wv(x).view(2, 6, 2, 8).transpose(1, 2)
    k, v = k[:, [0, 0, 1, 1]], v[:, [0, 0, 1, 1]]  # query heads 0, 1 read k/v head 0; 2, 3 head 1
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attn(x), attn.wo(y.transpose(1, 2).reshape(2, 6, 32)))


def test_forward_returns_logits_and_loss_like_gpt_and_is_causal():
    torch.manual_seed(0)
    model = ModernGPT(TINY).eval()
    idx = torch.randint(0, 64, (2, 16))
    logits, loss = model(idx, idx)
    assert logits.shape == (2, 16, 64) and loss.shape == ()
    assert model(idx)[1] is None
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 64
    torch.testing.assert_close(model(changed)[0][:, :10], logits[:, :10])


def test_each_layer_maps_b_t_d_to_b_t_d():
    x = torch.randn(2, 5, 32)
    assert all(layer(x).shape == (2, 5, 32) for layer in ModernGPT(TINY).blocks)


def test_initial_loss_is_near_ln_vocab_and_residual_outputs_start_smaller():
    torch.manual_seed(0)
    model = ModernGPT(PRESETS["tiny"])
    idx, targets = torch.randint(0, 4096, (2, 4, 64))
    assert model(idx, targets)[1].item() == pytest.approx(math.log(4096), abs=0.1)
    layer = model.blocks[0]
    assert layer.attention.wq.weight.std().item() == pytest.approx(0.02, rel=0.1)
    for w in (layer.attention.wo.weight, layer.feed_forward.w2.weight):
        assert w.std().item() == pytest.approx(0.02 / math.sqrt(4), rel=0.1)


def test_tie_embeddings_shares_the_output_head_and_untied_adds_a_matrix():
    tied, untied = ModernGPT(TINY), ModernGPT(replace(TINY, tie_embeddings=False))
    assert tied.lm_head.weight is tied.embed.tok_emb.weight
    assert untied.lm_head.weight is not untied.embed.tok_emb.weight
    assert untied.num_params() - tied.num_params() == 64 * 32
    assert tied.num_params(non_embedding=True) == untied.num_params(non_embedding=True)


def test_presets_are_about_the_size_of_step_08s():
    from tiny_llm.gpt import PRESETS as GPT_PRESETS

    assert set(ModernGPT.presets) >= {"tiny", "small", "gpu"}
    for name in ("tiny", "small"):
        modern, gpt = ModernGPT(PRESETS[name]).num_params(), GPT(GPT_PRESETS[name]).num_params()
        assert 0.85 < modern / gpt < 1.0  # no position table, fewer k/v weights


def test_bad_input_is_refused_with_a_message():
    model = ModernGPT(TINY)
    with pytest.raises(TypeError, match="token ids must be integers"):
        check_ids(torch.zeros(1, 4), TINY.vocab_size, TINY.max_seq_len)  # where ids enter
    with pytest.raises(ValueError, match="exceeds max_seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(TypeError, match="ModernConfig"):
        ModernGPT(GPTConfig())
    with pytest.raises(ValueError, match="a KV cache needs model.eval"):  # step 08's guard
        model.train()(torch.zeros(1, 4, dtype=torch.long), cache=KVCache(TINY))


def test_kv_bytes_per_token_counts_only_the_kv_heads():
    assert kv_bytes_per_token(PRESETS["small"]) == 2 * 4 * 2 * 32 * 4
    assert kv_bytes_per_token(GPTConfig()) == 2 * 4 * 4 * 32 * 4


class ConcatCache:
    """The KV cache interface (append, length) in its simplest form, for the tests."""

    def __init__(self):
        self.k, self.v, self.length = {}, {}, 0

    def append(self, layer, k, v):
        self.k[layer] = torch.cat([self.k[layer], k], dim=2) if layer in self.k else k
        self.v[layer] = torch.cat([self.v[layer], v], dim=2) if layer in self.v else v
        return self.k[layer], self.v[layer]


def test_a_cache_gives_the_logits_of_a_full_forward_one_token_at_a_time():
    torch.manual_seed(0)
    model = ModernGPT(TINY).eval()
    idx = torch.randint(0, 64, (2, 12))
    full, _ = model(idx)
    cache = ConcatCache()
    steps = [model(idx[:, :5], cache=cache)[0]]  # prefill 5, then one token at a time
    steps += [model(idx[:, t : t + 1], cache=cache)[0] for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 12 and cache.k[0].shape == (2, 2, 12, 8)  # n_kv_heads = 2


# --- reference implementations: Hugging Face's LLaMA and GPT-2 -------------------------------

# Hugging Face's names for the weights of layer i, ours -> theirs
LLAMA_NAMES = {"attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
               "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
               "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj",
               "feed_forward.w2": "mlp.down_proj", "attention_norm": "input_layernorm",
               "ffn_norm": "post_attention_layernorm"}


def from_llama_state_dict(state, config):
    """A LlamaForCausalLM state dict -> a ModernGPT one: new names, and the wq/wk rows turned
    from Hugging Face's RoPE on halves to our RoPE on adjacent pairs."""
    emb = state["model.embed_tokens.weight"]
    ours = {"embed.tok_emb.weight": emb, "ln_f.weight": state["model.norm.weight"],
            "lm_head.weight": state.get("lm_head.weight", emb)}
    heads = {"attention.wq": config.n_heads, "attention.wk": config.n_kv_heads}
    for i in range(config.n_layers):
        for mine, theirs in LLAMA_NAMES.items():
            w = state[f"model.layers.{i}.{theirs}.weight"]
            ours[f"blocks.{i}.{mine}.weight"] = halves_to_pairs(w, heads[mine]) if (
                mine in heads) else w
    return ours


def llama(config):
    """A LlamaForCausalLM of the same shape as `config`, float32, random weights, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = config
    hf_config = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads, max_position_embeddings=c.max_seq_len,
        rope_theta=c.rope_theta, rms_norm_eps=c.norm_eps, hidden_act="silu",
        tie_word_embeddings=c.tie_embeddings, attention_bias=False, mlp_bias=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(hf_config).float().eval()
    with torch.no_grad():  # its init leaves the norms at 1: make them count too
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.1 if "norm" in name else 0.05)
    return model


@pytest.mark.parametrize("tie", [False, True])
def test_modern_gpt_gives_llamas_logits(tie):
    config = ModernConfig(vocab_size=128, max_seq_len=32, d_model=64, n_layers=2, n_heads=4,
                          n_kv_heads=2, d_ff=96, rope_theta=500.0, norm_eps=1e-6,
                          tie_embeddings=tie)
    reference = llama(config)
    ours = ModernGPT(config).eval()
    ours.load_state_dict(from_llama_state_dict(reference.state_dict(), config))
    idx = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, actual = reference(idx).logits, ours(idx)[0]
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


def test_without_the_row_reordering_the_logits_differ():
    config = ModernConfig(vocab_size=128, max_seq_len=32, d_model=64, n_layers=2, n_heads=4,
                          n_kv_heads=2, d_ff=96)
    reference = llama(config)
    state = from_llama_state_dict(reference.state_dict(), config)
    for i in range(2):  # undo the reordering: load q_proj and k_proj as they are
        for mine, heads in (("wq", 4), ("wk", 2)):
            key = f"blocks.{i}.attention.{mine}.weight"
            state[key] = pairs_to_halves(state[key], heads)
    ours = ModernGPT(config).eval()
    ours.load_state_dict(state)
    idx = torch.randint(0, 128, (1, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gap = (ours(idx)[0] - reference(idx).logits).abs().max().item()
    assert gap > 1e-3


def from_gpt2_state_dict(state, n_layers):
    """A GPT2LMHeadModel state dict -> step 08's GPT: its Conv1D weights are (in, out), the
    transpose of nn.Linear's (out, in)."""
    ours = {"embed.tok_emb.weight": state["transformer.wte.weight"],
            "embed.pos_emb.weight": state["transformer.wpe.weight"],
            "ln_f.weight": state["transformer.ln_f.weight"],
            "ln_f.bias": state["transformer.ln_f.bias"],
            "lm_head.weight": state["transformer.wte.weight"]}
    names = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.qkv": "attn.c_attn",
             "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
    for i in range(n_layers):
        for mine, theirs in names.items():
            w = state[f"transformer.h.{i}.{theirs}.weight"]
            ours[f"blocks.{i}.{mine}.weight"] = w if mine.startswith("ln") else w.t()
            ours[f"blocks.{i}.{mine}.bias"] = state[f"transformer.h.{i}.{theirs}.bias"]
    return ours


def test_step_08_gpt_gives_gpt2s_logits():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPTConfig(vocab_size=128, max_seq_len=32, d_model=64, n_layers=2, n_heads=4)
    torch.manual_seed(0)
    reference = GPT2LMHeadModel(GPT2Config(
        vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=4,
        activation_function="gelu", layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, tie_word_embeddings=True)).float().eval()
    with torch.no_grad():
        for name, p in reference.named_parameters():  # random biases and gains as well
            p.normal_(1.0 if ".ln_" in name and name.endswith("weight") else 0.0, 0.05)
    ours = GPT(config).eval()
    ours.load_state_dict(from_gpt2_state_dict(reference.state_dict(), 2))
    idx = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, actual = reference(idx).logits, ours(idx)[0]
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


# --- the ablation script -----------------------------------------------------------------------


def load_ablation():
    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "ablate_modern.py")
    spec = importlib.util.spec_from_file_location("ablate_modern", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ablation_rows_add_one_change_each():
    ablation = load_ablation()
    models = {row: ablation.build(row, 4096) for row in ablation.ROWS}
    params = {row: m.num_params() for row, m in models.items()}
    gqa = replace(PRESETS["cpu"], max_seq_len=64, n_kv_heads=2)  # step 08's context, 2 kv heads
    assert params["+gqa"] == ModernGPT(gqa).num_params()
    assert params["+muon"] == params["+no-bias"]  # the same model, another optimizer
    assert params["+untied"] - params["+gqa"] == 4096 * 128
    assert params["+rope"] == params["+rmsnorm"] - 64 * 128  # the position table is gone
    assert abs(params["+swiglu"] - params["+rope"]) < 0.01 * params["+rope"]
    assert params["+swiglu"] - params["+no-bias"] == 4 * (4 * 128 + 2 * 344 + 128)
    assert isinstance(models["+rmsnorm"].ln_f, RMSNorm)
    assert isinstance(models["+rope"].blocks[0].feed_forward, MLP)


# --- the exercises -----------------------------------------------------------------------------


def test_exercise_1_layernorm_is_rmsnorm_of_the_centred_vector_plus_a_bias():
    assert ex15_modern.exercise_1_layernorm_is_rmsnorm_of_the_centred_vector() < 1e-5


def test_exercise_2_llamas_rule_gives_llama_7bs_width():
    assert ex15_modern.exercise_2_llama_d_ff(4096) == 11008
    assert ex15_modern.exercise_2_llama_d_ff(128, multiple_of=8) == 344  # our small preset


def test_exercise_3_gqa_cuts_a_70b_kv_cache_eightfold():
    kv = ex15_modern.exercise_3_kv_cache_70b()
    assert kv["gqa_per_token"] == 2 * 80 * 8 * 128 * 2 == 327_680
    assert kv["mha_per_token"] == 8 * kv["gqa_per_token"]
    assert kv["gqa_per_sequence_GB"] == pytest.approx(1.342, abs=1e-3)


def test_exercise_4_rotating_halves_of_reordered_dims_is_rotating_pairs():
    assert ex15_modern.exercise_4_the_two_rope_layouts_agree() < 1e-6


def test_exercise_5_fewer_kv_heads_fewer_parameters_and_cache():
    sizes = ex15_modern.exercise_5_multi_query()
    assert sorted(sizes) == [1, 2, 4]
    assert sizes[4][0] - sizes[1][0] == 4 * 2 * 128 * 96  # wk and wv lose 3 of 4 heads
    assert [sizes[kv][1] for kv in (4, 2, 1)] == [4096, 2048, 1024]


def test_exercise_6_the_gate_shuts_or_passes():
    shut, passed = ex15_modern.exercise_6_swiglu_gate()
    assert abs(shut) < 0.02 and passed == pytest.approx(6, abs=0.02)


# --- everything downstream takes it: cache, generation, checkpoints, training -----------------


def test_the_kv_cache_holds_n_kv_heads_and_generation_matches_without_it():
    from tiny_llm.generate import generate
    from tiny_llm.kvcache import KVCache, generate_cached

    torch.manual_seed(0)
    model = ModernGPT(TINY).eval()
    cache = KVCache(model.config)
    assert cache.nbytes() == kv_bytes_per_token(TINY) * TINY.max_seq_len
    idx = torch.randint(0, 64, (1, 3))
    greedy = {"temperature": 0, "eot_id": None}
    torch.testing.assert_close(generate_cached(model, idx, 20, **greedy),
                               generate(model, idx, 20, **greedy), rtol=0, atol=0)


def test_kvcache_checks_a_grouped_query_checkpoint_with_its_own_class(sample_data_dir, tmp_path,
                                                                      monkeypatch, capsys):
    import sys
    from dataclasses import asdict

    from tiny_llm import kvcache
    from tiny_llm.checkpoint import save_checkpoint
    from tiny_llm.tokenize import load_tokenizer, tokenizer_sha256

    vocab = load_tokenizer(sample_data_dir / "tokenizer.json").get_vocab_size()
    config = ModernConfig(vocab_size=vocab, max_seq_len=32, d_model=32, n_layers=2, n_heads=4,
                          n_kv_heads=2, d_ff=64)
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "ckpt.pt", {
        "model": ModernGPT(config).state_dict(), "config": asdict(config), "step": 1,
        "tokenizer_sha256": tokenizer_sha256(sample_data_dir / "tokenizer.json"),
        "model_class": "tiny_llm.modern.ModernGPT"})
    monkeypatch.setattr(kvcache, "DATA_DIR", sample_data_dir)
    monkeypatch.setattr(sys, "argv", ["kvcache", "--checkpoint", str(tmp_path / "ckpt.pt"),
                                      "--max-new-tokens", "5", "--device", "cpu"])
    kvcache.main()
    out = capsys.readouterr().out
    line = out.split("cache memory")[1].split("\n")[0].strip()
    assert line == "2 x 2 layers x 32 positions x 2 kv heads x 8 x 4 bytes = 8,192 bytes"
    assert "past the window  tiny ModernGPT, max_seq_len 64, 151 tokens: same tokens True" in out


def test_main_job_trains_it_and_the_checkpoint_rebuilds_it(sample_data_dir, tmp_path):
    from tiny_llm.checkpoint import model_from_checkpoint
    from tiny_llm.train import TrainConfig, train

    cfg = TrainConfig(model="modern", preset="tiny", max_steps=4, eval_interval=4, eval_iters=1,
                      batch_size=2, out=str(tmp_path), data_dir=str(sample_data_dir))
    result = train(cfg)
    model, ckpt = model_from_checkpoint(result["checkpoint"], data_dir=sample_data_dir)
    assert isinstance(model, ModernGPT) and model.config.n_kv_heads == 1
    assert ckpt["model_class"] == "tiny_llm.modern.ModernGPT"


def test_metas_names_reach_the_parts_outside_the_blocks():
    model = ModernGPT(PRESETS["tiny"])
    assert model.layers[0].attention.wq is model.blocks[0].attention.wq
    assert model.tok_emb is model.embed.tok_emb and model.norm is model.ln_f
    assert model.output is model.lm_head and model.output.weight is model.tok_emb.weight  # tied
    assert isinstance(model.layers[1].attention_norm, RMSNorm)


def test_grouped_query_heads_attend_like_repeated_heads():
    from tiny_llm.multihead import attend

    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    repeated = attend(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1))
    torch.testing.assert_close(attend(q, k, v), repeated)
    with pytest.raises(ValueError, match="3 queries after 2 cached keys"):
        attend(q[:, :, :3], k, v)


# --- the speedrunners' parts (step 15's last section) ------------------------------------------

SPEEDRUN = replace(TINY, mlp="relu2", d_ff=128, qk_norm=True, value_embeds=True, x0_mix=True,
                   logit_softcap=15.0)


def test_relu2_is_w2_of_squared_relu_w1_with_swiglus_weights_at_4d():
    torch.manual_seed(0)
    mlp, x = ReLU2(32, 128), torch.randn(2, 5, 32)
    expected = F.relu(x @ mlp.w1.weight.T).square() @ mlp.w2.weight.T
    torch.testing.assert_close(mlp(x), expected)
    assert sum(p.numel() for p in mlp.parameters()) == 2 * 4 * 32 * 32  # 8·d², as SwiGLU's
    assert isinstance(ModernGPT(SPEEDRUN).blocks[0].feed_forward, ReLU2)


def test_qk_norm_makes_the_scores_blind_to_the_scale_of_wq_and_wk():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 32)
    for qk_norm, same in ((True, True), (False, False)):
        attn = Attention(replace(TINY, qk_norm=qk_norm))
        before = attn(x)
        with torch.no_grad():
            attn.wq.weight.mul_(30)
            attn.wk.weight.mul_(30)
        assert torch.allclose(attn(x), before, atol=1e-5) == same


def test_the_speedrun_parts_start_as_the_model_without_them():
    """Value embeddings start at zero and x0 mixing reads x alone, so with the same weights the
    logits are the LLaMA model's; a soft cap of 15 barely moves logits this small."""
    torch.manual_seed(0)
    plain = ModernGPT(TINY).eval()
    parts = ModernGPT(replace(TINY, value_embeds=True, x0_mix=True)).eval()
    parts.load_state_dict(plain.state_dict(), strict=False)
    idx = torch.randint(0, 64, (2, 16))
    torch.testing.assert_close(parts(idx)[0], plain(idx)[0])
    with torch.no_grad():
        parts.value_embeds[1].weight.normal_()
        parts.x0_scale.fill_(0.5)
    assert (parts(idx)[0] - plain(idx)[0]).abs().max() > 1e-2


def test_a_soft_cap_bounds_every_logit():
    torch.manual_seed(0)
    model = ModernGPT(replace(TINY, logit_softcap=15.0)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(1000)  # tied: the embedding grows too
        logits = model(torch.randint(0, 64, (2, 16)))[0]
    assert logits.abs().max() <= 15.0 and logits.abs().max() > 14.0


def test_every_speedrun_part_trains_decodes_with_the_cache_and_is_checked():
    torch.manual_seed(0)
    model = ModernGPT(SPEEDRUN)
    with torch.no_grad():
        for table in model.value_embeds:
            table.weight.normal_(std=0.5)
        model.x0_scale.fill_(0.3)
    idx = torch.randint(0, 64, (2, 16))
    model(idx, idx)[1].backward()
    assert model.value_embeds[0].weight.grad.abs().sum() > 0 and model.x0_scale.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        full = model(idx[:1])[0]
        cache = KVCache(model.config)
        steps = torch.cat([model(idx[:1, t:t + 1], cache=cache)[0] for t in range(16)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-4)
    for change, match in (({"mlp": "gelu"}, "mlp must be swiglu or relu2"),
                          ({"logit_softcap": -1.0}, "logit_softcap must be 0")):
        with pytest.raises(ValueError, match=match):
            replace(TINY, **change)


def test_the_recipe_wsd_schedule_and_muon_momentum_warmup_are_the_defaults(sample_data_dir,
                                                                           tmp_path):
    from tiny_llm.muon import muon_momentum
    from tiny_llm.train import TrainConfig, lr_at, train

    # warmup-stable-decay: the peak until the last 40% of 1,000 steps, then straight to the floor
    assert [lr_at(s, 1e-3, 1e-4, 100, 1000, cooldown=0.4) for s in (99, 599, 799, 999)] == \
        pytest.approx([1e-3, 1e-3, 5.5e-4, 1e-4])
    assert [muon_momentum(s, 300) for s in (0, 150, 300, 900)] == pytest.approx(
        [0.85, 0.90, 0.95, 0.95])
    assert (TrainConfig().cooldown, TrainConfig().momentum_warmup) == (0.4, 200)
    with pytest.raises(ValueError, match="cooldown is the fraction"):
        TrainConfig(cooldown=1.5)
    cfg = TrainConfig(model="modern", preset="tiny", max_steps=6, eval_interval=6, eval_iters=1,
                      batch_size=2, out=str(tmp_path), data_dir=str(sample_data_dir),
                      cooldown=0.5, momentum_warmup=4, warmup_steps=2)
    train(cfg)
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["lr"] / cfg.lr for r in log if r["step"] > 0] == pytest.approx(
        [1 / 2, 1, 1, 2 / 3, 1 / 3, 0])  # warmup 2, the peak, the last half straight down
    muon_group = next(g for g in ckpt["optimizer"]["param_groups"] if g["muon"])
    assert muon_group["momentum"] == pytest.approx(0.95)  # step 5 of a 4-step warmup


def test_speedrun_rows_change_what_their_names_say():
    ablation = load_ablation()
    model, recipe = ablation.build_speedrun("modern+relu2+wsd+zero-init", 4096)
    assert isinstance(model.blocks[0].feed_forward, ReLU2) and model.config.d_ff == 512
    assert recipe == {"lr": 3e-3, "cooldown": 0.4, "momentum_warmup": 0, "zero_init": True}
    model = ablation.zero_residual_outputs(model)
    assert all(b.attention.wo.weight.abs().sum() == 0 and b.feed_forward.w2.weight.abs().sum()
               == 0 for b in model.blocks) and model.blocks[0].attention.wq.weight.abs().sum() > 0
    main, recipe = ablation.build_speedrun("main+momentum-warmup", 4096)
    assert isinstance(main, GPT) and recipe["momentum_warmup"] == 200 and recipe["cooldown"] == 0
    for bad in ("main+relu2", "modern+fast", "llama", "modern+lr_fast=3"):
        with pytest.raises(SystemExit, match="a row is modern or main"):
            ablation.parse_row(bad)
    base, model, recipe = ablation.parse_row("modern+qk-norm+untied+lr=6e-3+lr_embed=3")
    assert model == {"qk_norm": True, "tie_embeddings": False}
    assert (recipe["lr"], recipe["lr_embed"]) == (6e-3, 3.0)  # typed as TrainConfig's fields


def test_model_modern_trains_step_15s_recipe_and_flags_still_win(monkeypatch):
    from tiny_llm.flags import RECIPES
    from tiny_llm.train import TrainConfig, parse_args

    monkeypatch.setattr("sys.argv", ["train", "--model", "modern"])
    assert parse_args()[0].lr == RECIPES[("modern", "cpu")]["lr"] == 3e-3  # its screened peak
    monkeypatch.setattr("sys.argv", ["train", "--model", "modern", "--lr", "1e-3", "--qk-norm"])
    assert parse_args()[0].lr == 1e-3 and parse_args()[0].qk_norm  # a flag given wins
    monkeypatch.setattr("sys.argv", ["train", "--model", "modern", "--no-qk-norm"])
    assert not parse_args()[0].qk_norm  # every switch can be given either way
    monkeypatch.setattr("sys.argv", ["train", "--model", "modern", "--preset", "small"])
    assert parse_args()[0].lr == 5e-3  # the recipe is the cpu preset's alone
    monkeypatch.setattr("sys.argv", ["train"])
    assert parse_args()[0] == TrainConfig()  # the main job: step 10's defaults


# --- step 15's recipe, tuned: per-group learning rates, the parts as flags, story rows --------


def run_config(data_dir, out, **changes):
    """A ModernGPT run of the tiny preset small enough for a test: 6 steps of 4 windows."""
    from tiny_llm.train import TrainConfig

    return TrainConfig(**{**dict(model="modern", preset="tiny", max_steps=6, batch_size=4,
                                 warmup_steps=2, eval_interval=3, eval_iters=2,
                                 data_dir=str(data_dir), out=str(out), device="cpu"), **changes})


@pytest.mark.parametrize("change, match", [
    ({"lr_embed": 0.0}, "each group's learning rate, --lr times its scale, must lie in"),
    ({"lr_muon": 300.0}, r"must lie in \(0, 1\); got --lr 0.005"),
    ({"optimizer": "adamw", "lr_gains": 2.0}, "scale the groups of --optimizer muon"),
    ({"muon_scale": "spectral"}, "muon_scale must be one of rms, shape, got 'spectral'"),
    ({"model": "gpt", "qk_norm": True, "untied": True},
     r"--qk-norm, --untied change a part of ModernGPT \(step 15\): add --model modern"),
    ({"mlp": "gelu"}, "ModernConfig.mlp must be swiglu or relu2, got 'gelu'"),
])
def test_bad_tuning_settings_are_refused_before_any_work(change, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        run_config(tmp_path, tmp_path, **change)


def test_each_group_takes_its_scale_of_the_schedules_learning_rate(sample_data_dir):
    from tiny_llm.data import load_token_array
    from tiny_llm.muon import muon_adamw
    from tiny_llm.train import update_weights

    model = ModernGPT(replace(PRESETS["tiny"], vocab_size=1300, tie_embeddings=False))
    cfg = replace(run_config(sample_data_dir, "unused"), batch_size=2, lr=1e-3, lr_muon=4.0,
                  lr_embed=30.0, lr_gains=2.0, muon_scale="shape")
    optimizer = muon_adamw(model, cfg)
    data = load_token_array(sample_data_dir / "train.bin")
    update_weights(model, optimizer, data, cfg, torch.device("cpu"), torch.Generator(), 2e-4, 0)
    lrs = {g["name"]: g["lr"] for g in optimizer.param_groups}
    assert lrs == pytest.approx({"muon": 8e-4, "embed": 6e-3, "gains": 4e-4})
    embed = next(g["params"] for g in optimizer.param_groups if g["name"] == "embed")
    assert any(p is model.lm_head.weight for p in embed)  # an untied head learns with it
    assert optimizer.param_groups[0]["muon_scale"] == "shape"


def test_the_parts_and_story_rows_train_from_flags_and_resume_keeps_them(sample_data_dir,
                                                                         tmp_path):
    from tiny_llm.checkpoint import load_checkpoint
    from tiny_llm.train import train

    cfg = run_config(sample_data_dir, tmp_path, qk_norm=True, untied=True, mlp="relu2",
                     story_starts=True, muon_scale="shape", lr_embed=10.0)
    result = train(cfg)
    ckpt = load_checkpoint(result["checkpoint"])
    c = ckpt["config"]
    assert (c["qk_norm"], c["tie_embeddings"], c["mlp"], c["d_ff"]) == (True, False, "relu2", 256)
    assert ckpt["train_config"]["story_starts"] and math.isfinite(result["val_loss"])
    with pytest.raises(ValueError, match=r"--qk-norm False \(the run has True\)"):
        train(replace(cfg, resume=True, qk_norm=False, max_steps=8))


def test_story_rows_start_each_window_at_a_story_and_keep_get_batchs_shift():
    import numpy as np

    from tiny_llm.data import get_batch
    from tiny_llm.tuning import StoryRows

    tokens = np.array([5, 6, 7, 0, 8, 9, 0, 10, 11, 12, 13, 0, 14], dtype=np.uint16)
    rows = StoryRows(tokens, eot_id=0, seq_len=3)  # stories start at 0, 4, 7 (12: too late)
    assert rows.starts.tolist() == [0, 4, 7]  # 10, three on from 7, would end past the data
    long = np.array([1, 2, 3, 4, 5, 6, 7, 0, 8, 9, 0, 1], dtype=np.uint16)
    assert StoryRows(long, eot_id=0, seq_len=3).starts.tolist() == [0, 3, 6, 8]  # all 7 read
    x, y = get_batch(rows, 200, 3, generator=torch.Generator().manual_seed(0))
    assert {tuple(r) for r in x.tolist()} == {(5, 6, 7), (8, 9, 0), (10, 11, 12)}
    assert torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="made for 3 tokens, asked for 4"):
        get_batch(rows, 2, 4)
    with pytest.raises(ValueError, match="only 1 story starts 3 tokens or more before the end"):
        StoryRows(np.array([5, 6, 7], dtype=np.uint16), eot_id=0, seq_len=2)
