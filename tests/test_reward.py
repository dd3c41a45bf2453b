from dataclasses import asdict, replace

import pytest
import torch
import torch.nn.functional as F

from solutions import ex18_reward
from tiny_llm.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from tiny_llm.data import load_token_array
from tiny_llm.generate import generate
from tiny_llm.gpt import GPT, PRESETS, GPTConfig
from tiny_llm.instruct import (
    MixedRows,
    RequestConfig,
    request_rows,
    takes_requests,
)
from tiny_llm.kvcache import fresh_cache
from tiny_llm.request_data import content_words, derive_request, derived_records, measure_line
from tiny_llm.reward import (
    RewardConfig,
    WordBoost,
    advantages,
    grpo_loss,
    main,
    reward,
    reward_parts,
    rollout_rows,
    toy_run,
    train_reward,
)
from tiny_llm.tokenize import load_tokenizer, tokenizer_sha256

REQUEST = {"words": ("dog", "moon"), "features": (), "sentence": None, "summary": None}


def test_the_reward_is_the_mean_of_the_fields_the_request_asks_for():
    assert reward(REQUEST, "The dog slept under a tree all day.") == 0.5  # 1 of 2 words
    # quotes where Dialogue was not asked cost nothing and earn nothing
    assert reward(REQUEST, 'The dogs saw the moon in the sky. "Hi!" said one.') == 1.0
    asked = {**REQUEST, "sentence": "It was late.", "features": ("Dialogue",)}
    assert reward(asked, 'A dog ran under the moon. It was late. "Bye," he said.') == 1.0
    assert reward(asked, "A dog ran under the moon. It was late.") == 2 / 3  # no dialogue


def test_a_list_of_the_words_scores_low():
    brave = {**REQUEST, "words": ("dog", "moon", "brave")}
    assert reward(brave, "Dog moon brave.") == 0.0  # no sentence, and a pile
    assert reward_parts(brave, "Dog moon brave.")["piles"] == 1.0
    assert reward(brave, "The brave dog looked at the moon and smiled.") == 1.0
    pasted = "The dog ran to the moon. Dog, moon, brave, dog. The end of the day came."
    assert reward(brave, pasted) < 2 / 3  # brave only in the pile, and the pile costs
    robot = {**REQUEST, "words": ("robot",)}
    assert reward(robot, "The robot " * 20 + "went home.") == 0.0  # repeated, not used
    loop = "The dog saw the moon and ran. " * 4
    assert reward_parts(REQUEST, loop)["repetition"] > 0.5 and reward(REQUEST, loop) < 0.5


def test_a_request_with_no_words_is_refused(capsys):
    with pytest.raises(ValueError, match="the request asks for no words"):
        reward({**REQUEST, "words": ()}, "The dog slept.")
    with pytest.raises(SystemExit):
        main(["score", "--words", ",", "--story", "Dog."])
    assert "the request asks for no words" in capsys.readouterr().err


def test_reward_score_prints_the_reward_and_its_parts(capsys):
    main(["score", "--words", "dog,moon,brave", "--story", "Dog moon brave."])
    assert capsys.readouterr().out.splitlines()[-1] == (
        "reward       0.000 (words 0.00, repetition 0.00, piles 1.00)")


def test_advantages_are_centred_on_the_group_and_scaled_by_its_spread():
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.5], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 0.0, 1.0]])
    a = advantages(rewards)
    assert torch.allclose(a[0], torch.tensor([2**0.5, -(2**0.5), 0.0, 0.0])), (
        f"rewards [1, 0, 0.5, 0.5] gave advantages {[round(x, 3) for x in a[0].tolist()]}, "
        "want [1.414, -1.414, 0, 0]: subtract the group's mean, then divide by the group's "
        "standard deviation with correction=0 (0.5 here; correction=1 gives 1.155)")
    assert a[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # a group that agrees teaches nothing
    assert torch.allclose(a.sum(dim=1), torch.zeros(3), atol=1e-6)  # centred
    assert torch.allclose(a[[0, 2]].std(dim=1, correction=0), torch.ones(2))  # unit spread
    assert torch.allclose(advantages(rewards * 0.1)[[0, 2]], a[[0, 2]], atol=1e-5)  # scale-free


def test_the_rollout_rows_train_the_story_tokens_only():
    group = [([5, 6], True), ([5, 6, 4], False)]
    x, y = rollout_rows([7, 8], group, eot_id=0, seq_len=7)
    assert x.tolist() == [[7, 8, 5, 6, 0, 0, 0], [7, 8, 5, 6, 4, 0, 0]]
    assert y.tolist()[0] == [-1, 5, 6, 0, -1, -1, -1]  # the EOT it wrote is a target
    assert y.tolist()[1] == [-1, 5, 6, 4, -1, -1, -1]  # cut short: no EOT to learn


def test_the_sampler_writes_rows_of_one_prompt_each_on_its_own():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, max_seq_len=16, d_model=16, n_layers=1, n_heads=2))
    idx = torch.tensor([[3, 4]] * 3)
    greedy = generate(model, idx, 10, temperature=0, eot_id=None, cache=fresh_cache(model, 3))
    one = generate(model, idx[:1], 10, temperature=0, eot_id=None)  # step 09's single row
    assert greedy.shape == (3, 12) and all(torch.equal(row, one[0]) for row in greedy)
    drawn = generate(model, idx, 10, generator=torch.Generator().manual_seed(0), eot_id=None,
                     cache=fresh_cache(model, 3))
    assert len({tuple(row) for row in drawn.tolist()}) > 1  # each row draws on its own
    seen = []

    def end_row_0(text, logits):  # a steer: row 0 always ends at once, the others never
        seen.append(text.shape)
        logits = logits.clone()
        logits[0, 0], logits[1:, 0] = 100.0, -100.0
        return logits

    out = generate(model, idx, 5, generator=torch.Generator().manual_seed(1), eot_id=0,
                   cache=fresh_cache(model, 3), steer=end_row_0)
    assert out[0, 2:].tolist() == [0] * 5  # an ended row gets EOT until every row has
    assert (out[1:, 2:] != 0).all() and seen == [(3, 2 + n) for n in range(5)]

    def end_all(text, logits):
        return torch.where(torch.arange(16) == 0, 100.0, -100.0).expand_as(logits)

    assert generate(model, idx, 5, eot_id=0, steer=end_all).shape == (3, 3)  # all ended: stop


def test_the_word_boost_leans_towards_the_words_not_used_yet(sample_data_dir):
    tokenizer = load_tokenizer(sample_data_dir / "tokenizer.json")
    V = tokenizer.get_vocab_size()
    dog, long = (tokenizer.encode(" " + w).ids for w in ("dog", "xylophone"))
    assert len(long) > 1  # a word spelled in several tokens
    boost = WordBoost(tokenizer, ["dog", "xylophone"], 3.0, prompt_length=2)
    used = [1, 2] + tokenizer.encode("The dogs sat").ids  # dog used ("dogs" counts)
    begun = [1, 2] + tokenizer.encode("The cat").ids + long[:1]  # xylophone begun
    zeros = torch.zeros(1, V)
    out = boost(torch.tensor([used]), zeros)[0]
    assert out.nonzero().flatten().tolist() == [long[0]] and out[long[0]] == 3.0
    sure = torch.zeros(1, V)
    sure[0, :60] = 20.0  # a model sure of 60 other tokens: + 3 alone leaves it out of top-50
    lifted = boost(torch.tensor([used]), sure)[0]
    assert lifted[long[0]] == 17.0  # within 3 of the best: top-k 50 keeps it
    out = boost(torch.tensor([begun]), zeros)[0]
    assert out[long[1]] == 3.0 and out[long[0]] == 0.0  # begun: the token that goes on
    assert out[dog[0]] == 3.0 and out.sum() == 6.0
    both = boost(torch.tensor([used, used]), torch.zeros(2, V))  # a batch: row by row
    assert torch.equal(both[1], boost(torch.tensor([used]), zeros)[0])
    assert zeros.abs().sum() == 0  # the scores it was given are left alone


def tiny_pair(seed=0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=8, max_seq_len=8, d_model=16, n_layers=1, n_heads=2))
    reference = GPT(model.config).eval()
    reference.load_state_dict(model.state_dict())
    return model.eval(), reference


def test_the_kl_term_is_zero_at_the_start_and_exact_after_a_change():
    model, reference = tiny_pair()
    x, y = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[-1, 3, 4, -1]])
    loss, kl = grpo_loss(model, reference, x, y, torch.zeros(1), kl_coef=1.0)
    assert kl == 0.0 and loss.item() == 0.0
    with torch.no_grad():
        model.lm_head.weight.add_(0.5 * torch.randn_like(model.lm_head.weight))
    loss, kl = grpo_loss(model, reference, x, y, torch.zeros(1), kl_coef=2.0)
    p, q = (F.log_softmax(m(x)[0], -1)[0, 1:3] for m in (model, reference))  # story positions
    expected = F.kl_div(q, p, log_target=True, reduction="sum").item() / 2
    assert kl == pytest.approx(expected, rel=1e-5) and kl > 0
    assert loss.item() == pytest.approx(2.0 * expected, rel=1e-5)


def test_the_policy_gradient_moves_only_story_tokens_by_their_advantage():
    model, reference = tiny_pair()
    x, y = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]]), torch.tensor([[-1, 3, 4, -1]] * 2)
    adv = torch.tensor([1.0, -1.0])
    loss, _ = grpo_loss(model, reference, x, y, adv, kl_coef=0.0)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)  # the same story, opposite advantages
    loss, _ = grpo_loss(model, reference, x[:1], y[:1], adv[:1], kl_coef=0.0)
    taken = F.log_softmax(model(x[:1])[0], -1)[0, [1, 2], [3, 4]]
    assert loss.item() == pytest.approx(-taken.mean().item(), rel=1e-5)
    y_request = torch.tensor([[5, 3, 4, 6]])  # targets on the request and padding too
    changed, _ = grpo_loss(model, reference, x[:1], y_request, adv[:1], kl_coef=0.0)
    assert changed.item() != pytest.approx(loss.item())  # so the mask is what kept them out


def test_the_reward_rises_on_a_toy_reward_and_a_strong_kl_term_holds_it_back():
    before, after, kl = toy_run(steps=60, kl_coef=0.05)
    assert before < 0.2 and after > 0.8 and kl > 0.5
    _, held, small_kl = toy_run(steps=60, kl_coef=1.0)
    assert held < 0.3 and small_kl < 0.2


@pytest.fixture(scope="module")
def start(sample_data_dir, tmp_path_factory):
    """A tiny untrained GPT saved as a checkpoint that says it takes requests."""
    tokenizer = load_tokenizer(sample_data_dir / "tokenizer.json")
    torch.manual_seed(0)
    model = GPT(replace(PRESETS["tiny"], vocab_size=tokenizer.get_vocab_size()))
    path = tmp_path_factory.mktemp("start") / "ckpt.pt"
    save_checkpoint(path, {"model": model.state_dict(), "config": asdict(model.config),
                           "step": 30, "tokenizer_sha256": tokenizer_sha256(
                               sample_data_dir / "tokenizer.json"),
                           "data_source": "sample", "train_config": {"requests": "derived"}})
    return path


def test_a_reward_run_resumes_exactly_and_saves_an_ordinary_checkpoint(start, sample_data_dir,
                                                                        tmp_path):
    cfg = RewardConfig(init_from=str(start), max_steps=2, time_budget=0, group_size=2,
                       requests_per_step=1, max_new_tokens=6, lr=1e-3,
                       data_dir=str(sample_data_dir))
    whole = train_reward(replace(cfg, out=str(tmp_path / "whole")))
    train_reward(replace(cfg, out=str(tmp_path / "parts"), max_steps=1))
    parts = train_reward(replace(cfg, out=str(tmp_path / "parts"), resume=True))
    assert [r["reward"] for r in parts] == [r["reward"] for r in whole]
    a, b = (load_checkpoint(tmp_path / name / "ckpt.pt") for name in ("whole", "parts"))
    assert a["step"] == b["step"] == 2
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert not torch.equal(a["model"]["lm_head.weight"],
                           load_checkpoint(start)["model"]["lm_head.weight"])  # it learned
    model, ckpt = model_from_checkpoint(tmp_path / "whole" / "ckpt.pt", data_dir=sample_data_dir)
    assert takes_requests(ckpt) and isinstance(model, GPT)
    with pytest.raises(FileExistsError, match="already holds a run"):
        train_reward(replace(cfg, out=str(tmp_path / "whole")))


def test_bad_settings_are_refused_before_any_work(capsys):
    with pytest.raises(ValueError, match="group-size must be >= 2"):
        RewardConfig(group_size=1)
    with pytest.raises(SystemExit):
        main(["--time-budget", "5m"])
    assert "--init-from a checkpoint fine-tuned on requests" in capsys.readouterr().err


def test_solutions():
    assert ex18_reward.exercise_1_population_or_sample(2) == pytest.approx(2**0.5)
    (measured_4, formula_4), (measured_16, formula_16) = ex18_reward.exercise_2_groups_that_agree()
    assert measured_4 == pytest.approx(formula_4, abs=0.03) and formula_4 > 0.6
    assert measured_16 == pytest.approx(formula_16, abs=0.03) and formula_16 < 0.2
    counted, rewarded, shortest = ex18_reward.exercise_3_a_list_of_the_words()
    assert counted == 1.0 and rewarded == 0.0
    assert reward({**REQUEST, "words": ("dog", "moon", "brave")}, shortest) == 1.0


# ----- step 17's additions for this step: requests from the first token, --measure -----


def test_request_share_mixes_request_rows_and_plain_windows(sample_data_dir):
    cfg = RequestConfig(preset="tiny", requests="derived", request_share=0.5,
                       data_dir=str(sample_data_dir))
    train_data, valid_data = (load_token_array(sample_data_dir / f"{s}.bin")
                              for s in ("train", "valid"))
    rows, valid = request_rows(cfg, train_data, valid_data, 64)
    assert isinstance(rows, MixedRows) and valid is valid_data  # validation: plain stories
    x, y = rows.get_batch(8, 64, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, 64)
    assert (y[:4, 0] == -1).all()  # request rows: the request's targets are ignored
    assert (y[4:] != -1).all() and torch.equal(y[4:, :-1], x[4:, 1:])  # windows: every target
    again = rows.get_batch(8, 64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again[0], x)  # the loop's generator draws them: resume draws the same
    with pytest.raises(ValueError, match="request-share is the share of rows"):
        replace(cfg, request_share=0.0)
    with pytest.raises(ValueError, match="request-share is the share of rows"):
        RequestConfig(request_share=0.5)  # no --requests to take them from


def test_rare_request_words_and_several_requests_a_story(sample_data_dir):
    story = "Tom and the dog played with a kite and a ball in the park."
    using = {w: 1000 for w in content_words(story)} | {"kite": 1, "played": 2}
    picks = [derive_request(story, seed, using)["words"] for seed in range(100)]
    assert all("kite" in w and "played" in w for w in picks)  # 1/1 and 1/2 against 1/1000
    assert len({w for words in picks for w in words}) > 3  # the third still varies
    tokenizer = load_tokenizer(sample_data_dir / "tokenizer.json")
    valid = load_token_array(sample_data_dir / "valid.bin")
    one = derived_records(valid, tokenizer, 64, seed=0)
    three = derived_records(valid, tokenizer, 64, seed=0, words="rare", per_story=3)
    assert len(three) == 3 * len(one)
    assert all(torch.equal(torch.as_tensor(three[3 * i + k][1]), torch.as_tensor(ids))
               for i, (_, ids) in enumerate(one) for k in range(3))
    assert any(three[3 * i][0]["words"] != three[3 * i + 1][0]["words"] for i in range(len(one)))
    with pytest.raises(ValueError, match="request words must be any or rare"):
        derived_records(valid, tokenizer, 64, 0, words="common")
    cfg = RequestConfig(preset="tiny", requests="derived", data_dir=str(sample_data_dir))
    train = load_token_array(sample_data_dir / "train.bin")
    rows_1, _ = request_rows(cfg, train, valid, 64)
    rows_2, valid_rows = request_rows(replace(cfg, requests_per_story=2), train, valid, 64)
    assert len(rows_2) == 2 * len(rows_1) and len(valid_rows) == len(one)  # valid: one each
    for bad in (dict(request_words="often"), dict(requests_per_story=0)):
        with pytest.raises(ValueError, match="--request-words any or rare and"):
            replace(cfg, **bad)


def test_measure_line_says_what_the_story_did():
    asked = {"words": ("dog", "moon", "brave"), "features": ("Dialogue",),
             "sentence": "It was late.", "summary": None}
    assert measure_line(asked, "The dogs saw the moon. It was late.") == (
        "measured     words 2/3 (missed brave), sentence yes, dialogue none, asked")
    assert measure_line(REQUEST, '"Hi," said the dog to the moon.') == (
        "measured     words 2/2, dialogue written, not asked")


def test_write_measure_prints_what_the_story_did_and_its_reward(start, sample_data_dir, capsys):
    main(["write", "--checkpoint", str(start), "--words", "dog,moon", "--max-new-tokens", "8",
          "--measure", "--data-dir", str(sample_data_dir), "--device", "cpu"])
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("measured     words ") and out[-2].endswith("not asked")
    assert out[-1].startswith("reward       ") and 0 <= float(out[-1].split()[1]) <= 1
    for flags in ([], ["--words", ","]):
        with pytest.raises(SystemExit):
            main(["write", "--checkpoint", str(start), "--measure", *flags])
        assert "--measure scores a story against its request" in capsys.readouterr().err
    for flags in (["--boost", "3"], ["--words", "dog", "--boost", "-1"]):
        with pytest.raises(SystemExit):
            main(["write", "--checkpoint", str(start), *flags])
        assert "--boost leans the sampler towards --words" in capsys.readouterr().err


def test_instruct_write_boost_changes_the_story_under_top_k_50(start, sample_data_dir, capsys):
    from tiny_llm.instruct import main as instruct_main

    stories = []
    for boost in ("0", "3"):
        instruct_main(["write", "--checkpoint", str(start), "--words", "kite,beach",
                       "--max-new-tokens", "12", "--top-k", "50", "--boost", boost,
                       "--data-dir", str(sample_data_dir), "--device", "cpu"])
        stories.append(capsys.readouterr().out.splitlines()[-1])
    assert stories[0] != stories[1] and " kite" in stories[1]
    instruct_main(["write", "--checkpoint", str(start), "--words", "кот,dog", "--boost", "3",
                   "--max-new-tokens", "2", "--data-dir", str(sample_data_dir), "--device", "cpu"])
    assert "this tokenizer spells кот in byte pieces" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        instruct_main(["write", "--checkpoint", str(start), "--words", ","])
    assert "--words ',' names no word" in capsys.readouterr().err


def test_the_word_boost_steers_a_request_story_in_the_studio(start, sample_data_dir):
    import json

    from fastapi.testclient import TestClient

    from tiny_llm import studio

    app = studio.create_app([studio.load_writer(start, data_dir=sample_data_dir)])
    client = TestClient(app, base_url="http://127.0.0.1:8000")
    request = {"words": ["kite", "beach"], "features": [], "sentence": None}
    stories = []
    for boost in (0, 3):
        reply = client.post("/api/generate", json={"request": request, "max_new_tokens": 12,
                                                   "seed": 5, "top_k": 50, "boost": boost})
        stories.append([json.loads(line) for line in reply.text.splitlines()])
    assert [t["id"] for t in stories[0][1:-1]] != [t["id"] for t in stories[1][1:-1]]
    assert "kite" in stories[1][-1]["used"]
    for body in ({"prompt": "Once", "boost": 3}, {"request": request, "boost": 50}):
        refused = client.post("/api/generate", json=body)
        assert refused.status_code == 400 and "boost leans the sampler" in refused.text
