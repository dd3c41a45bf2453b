import math
import re
import sys
from types import SimpleNamespace

import pytest
import torch

from solutions import ex12_kvcache
from tiny_llm import kvcache
from tiny_llm.generate import generate
from tiny_llm.gpt import GPT, PRESETS, GPTConfig
from tiny_llm.kvcache import KVCache, generate_cached, memory_line

SMALL = GPTConfig(vocab_size=64, max_seq_len=16, d_model=32, n_layers=2, n_heads=4)


def model_for(seed, config=SMALL):
    torch.manual_seed(seed)
    return GPT(config).eval()


def prompt(*ids):
    return torch.tensor([list(ids)])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("start", [(5,), (1, 2, 3, 4, 5, 6, 7), tuple(range(20))])
def test_greedy_output_is_the_uncached_output_token_for_token(seed, start):
    model = model_for(seed)
    idx = prompt(*start)  # the last one is longer than max_seq_len: both crop it
    slow = generate(model, idx, 40, temperature=0, eot_id=None)
    fast = generate_cached(model, idx, 40, temperature=0, eot_id=None)
    assert fast.shape == (1, len(start) + 40)
    assert torch.equal(slow, fast)  # 40 new tokens run far past max_seq_len=16


def test_sampling_with_the_same_seed_gives_the_same_tokens():
    model = model_for(7)
    runs = []
    for fn in (generate, generate_cached):
        generator = torch.Generator().manual_seed(3)
        runs.append(fn(model, prompt(1, 2), 30, temperature=1.0, top_k=10, generator=generator,
                       eot_id=None))
    assert torch.equal(*runs)


def test_it_stops_after_the_end_of_story_token_as_generate_does():
    model = model_for(1)
    free = generate(model, prompt(3), 30, temperature=0, eot_id=None)[0].tolist()
    eot = free[6]  # pretend the 6th new token is <|endoftext|>
    stopped = generate_cached(model, prompt(3), 30, temperature=0, eot_id=eot)
    assert stopped[0].tolist() == free[: free.index(eot, 1) + 1]  # the prompt is not searched
    assert torch.equal(stopped, generate(model, prompt(3), 30, temperature=0, eot_id=eot))


def test_its_output_is_an_ordinary_tensor_that_training_can_use():
    model = model_for(3)
    out = generate_cached(model, prompt(1, 2), 10, temperature=0, eot_id=None)
    assert not out.is_inference()
    _, loss = model.train()(out[:, :-1], out[:, 1:])
    loss.backward()  # would fail if `out` were an inference-mode tensor
    assert model.lm_head.weight.grad is not None


def test_one_cached_step_gives_the_logits_of_a_full_forward():
    model = model_for(2)
    ids = torch.randint(0, 64, (1, 12))
    cache = KVCache(SMALL)
    with torch.no_grad():
        model(ids[:, :11], cache=cache)  # prefill 11 positions
        step = model(ids[:, 11:], cache=cache)[0][:, -1, :]  # then one decode step
        full = model(ids)[0][:, -1, :]
    assert cache.length == 12
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)


def count_positions(model):
    """Count how many positions go through the first block's MLP (a forward hook)."""
    seen = []
    model.blocks[0].mlp.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    return seen


def test_the_cache_computes_each_position_once_until_the_window_is_full():
    config = GPTConfig(vocab_size=64, max_seq_len=64, d_model=32, n_layers=1, n_heads=2)
    model = model_for(0, config)
    seen = count_positions(model)
    generate(model, prompt(1, 2, 3, 4), 20, temperature=0, eot_id=None)
    uncached, seen[:] = sum(seen), []
    generate_cached(model, prompt(1, 2, 3, 4), 20, temperature=0, eot_id=None)
    assert uncached == sum(range(4, 24)) == 270  # the whole context again for every token
    assert seen == [4] + [1] * 19  # a prefill of the prompt, then one position per token
    assert ex12_kvcache.exercise_2_positions(4, 20, 64) == (270, 23)


def test_past_the_window_every_step_recomputes_the_last_max_seq_len_positions():
    model = model_for(0)  # max_seq_len 16
    seen = count_positions(model)
    generate_cached(model, prompt(1, 2, 3), 20, temperature=0, eot_id=None)
    assert seen == [3] + [1] * 13 + [16] * 6


def test_the_forward_refuses_what_would_corrupt_the_cache():
    model = model_for(0)
    cache = KVCache(SMALL)
    model(prompt(1, 2), cache=cache)
    with pytest.raises(ValueError, match="2 new tokens after a cache of 2: feed a prompt to an"):
        model(prompt(3, 4), cache=cache)
    cache.length = 16
    with pytest.raises(ValueError, match="positions 16..16 do not fit max_seq_len=16"):
        model(prompt(5), cache=cache)
    with pytest.raises(ValueError, match="needs model.eval"):
        model.train()(prompt(1), cache=KVCache(SMALL))


def test_generate_cached_checks_its_arguments_like_generate():
    model = model_for(0)
    with pytest.raises(ValueError, match=r"\((1|B), T\) tensor.*got \(3,\)"):  # B: step 18
        generate_cached(model, torch.zeros(3, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="temperature must be a number >= 0"):
        generate_cached(model, prompt(1), 5, temperature=-1)


def test_cache_memory_is_two_tensors_per_layer():
    cache = KVCache(PRESETS["small"])
    assert cache.k.shape == (4, 1, 4, 256, 32)
    assert cache.nbytes() == 2 * 4 * 256 * 128 * 4 == ex12_kvcache.exercise_1_cache_bytes(
        n_layers=4, max_seq_len=256, d_model=128, bytes_per_number=4)


def test_check_prints_equal_outputs_and_a_speed_up(sample_data_dir, monkeypatch, capsys):
    monkeypatch.setattr(kvcache, "DATA_DIR", sample_data_dir)
    monkeypatch.setattr(sys, "argv", ["kvcache", "--max-new-tokens", "30"])
    kvcache.main()
    out = capsys.readouterr().out
    assert out.count("same tokens      True") == 1
    assert "past the window  tiny GPT, max_seq_len 64, 151 tokens: same tokens True" in out
    assert float(out.split("speed-up")[1].split("x")[0]) > 0


def test_check_rejects_bad_flags(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["kvcache", "--device", "tpu"])
    with pytest.raises(SystemExit, match="unknown device 'tpu'"):
        kvcache.main()
    monkeypatch.setattr(sys, "argv", ["kvcache", "--max-new-tokens", "0"])
    with pytest.raises(SystemExit):
        kvcache.main()
    assert "--max-new-tokens must be at least 1, got 0" in capsys.readouterr().err


def product_of_factors(line):
    """'2 x 4 layers x ... x 4 bytes = 1,048,576 bytes' -> (2 · 4 · ... · 4, 1,048,576)."""
    factors, total = line.split(" = ")
    numbers = [int(re.match(r"\d+", f).group()) for f in factors.split(" x ")]
    return math.prod(numbers), int(total.removesuffix(" bytes").replace(",", ""))


# the sizes of step 15's tiny preset, whose 2 query heads share 1 key/value head
GROUPED = SimpleNamespace(vocab_size=64, max_seq_len=64, d_model=64, n_layers=2, n_heads=2,
                          n_kv_heads=1)


@pytest.mark.parametrize(("config", "expected"), [
    (PRESETS["small"], "2 x 4 layers x 256 positions x 128 x 4 bytes = 1,048,576 bytes"),
    (GROUPED, "2 x 2 layers x 64 positions x 1 kv heads x 32 x 4 bytes = 32,768 bytes")])
def test_the_memory_line_shows_factors_that_multiply_to_its_total(config, expected):
    line = memory_line(config)
    assert line == expected  # GPT's n_heads x head_size is d_model: 128, as chapter 12 prints
    product, total = product_of_factors(line)
    assert product == total == KVCache(config).nbytes()


def test_solutions():
    assert ex12_kvcache.exercise_1_cache_bytes(12, 1024, 768, 2) == 37_748_736  # GPT-2 small
    assert ex12_kvcache.exercise_2_positions(4, 200, 256) == (sum(range(4, 204)), 203)
    assert ex12_kvcache.exercise_3_keys_move_with_the_window() > 1e-3


def test_the_embedding_refuses_positions_past_its_table_after_a_cache():
    from tiny_llm.embed import Embed

    with pytest.raises(ValueError, match="T=65 exceeds max_seq_len=64"):
        Embed(4096, 128, 64)(torch.zeros(1, 1, dtype=torch.long), start=64)  # after 64 cached


def test_stream_sample_handed_a_cache_reads_each_token_once():
    """stream_sample (what the commands print) handed step 12's cache, as the studio and
    `instruct write` hand it, reads the prompt once, then one token a step, and writes what step
    09's uncached generate writes with the same seed."""
    from tiny_llm.generate import stream_sample
    from tiny_llm.kvcache import fresh_cache

    class Chars:  # a tokenizer of single characters: id = byte value
        def encode(self, text):
            return SimpleNamespace(ids=[ord(c) % 64 for c in text])

        def decode(self, ids):
            return "".join(chr(65 + i % 26) for i in ids)

        def token_to_id(self, token):
            return 0

    model, widths = model_for(3), []
    hook = model.embed.register_forward_hook(lambda m, i, o: widths.append(i[0].shape[1]))
    ids = stream_sample(model, Chars(), "abc", 10, lambda _: None, torch.Generator().manual_seed(5),
                        cache=fresh_cache(model), temperature=1.0, top_k=20)
    hook.remove()
    new = len(ids) - 3
    assert new >= 1 and widths == [3] + [1] * (new - 1)  # the prompt, then one token a step
    slow = generate(model, prompt(*ids[:3]), 10, temperature=1.0, top_k=20,
                    generator=torch.Generator().manual_seed(5))
    assert slow[0].tolist() == ids
