from dataclasses import replace

import pytest
import torch

from solutions import ex17_instruct
from tiny_llm.checkpoint import load_checkpoint
from tiny_llm.data import load_token_array
from tiny_llm.gpt import GPT, PRESETS
from tiny_llm.instruct import (
    FEATURES,
    RequestConfig,
    RequestHooks,
    RequestRows,
    add_lora,
    instruct_records,
    merged,
    parse_record,
    render_request,
    request_row,
    request_rows,
    takes_requests,
    trainable,
)
from tiny_llm.request_data import derive_request, score_story, uses_word
from tiny_llm.tokenize import EOT, load_tokenizer
from tiny_llm.train import train

STORY = ('Tom saw a big dog in the park. "Can I play?" he asked. The dog wagged its tail.\n'
         'They ran to the pond and played until the sun went down.')


def tiny(data_dir, out, **changes):
    """A few steps of the tiny preset: 4 rows of 64 tokens."""
    cfg = RequestConfig(preset="tiny", max_steps=4, batch_size=4, warmup_steps=2,
                        eval_interval=2, eval_iters=2, data_dir=str(data_dir), out=str(out),
                        device="cpu")
    return replace(cfg, **changes)


@pytest.fixture(scope="module")
def base(sample_data_dir, tmp_path_factory):
    """A tiny pretrained checkpoint to fine-tune."""
    out = tmp_path_factory.mktemp("base")
    train(tiny(sample_data_dir, out))
    return out / "ckpt.pt"


def test_the_request_targets_carry_the_ignore_index_and_the_story_and_eot_count():
    x, y = request_row([7, 8, 9], [5, 6], eot_id=0, seq_len=7)
    assert x.tolist() == [7, 8, 9, 5, 6, 0, 0]  # padded with EOT
    assert y.tolist() == [-1, -1, 5, 6, 0, -1, -1]  # the request's targets and padding left out
    x, y = request_row([7, 8], [5, 6, 4, 3], eot_id=0, seq_len=4)  # cut: no EOT fits
    assert x.tolist() == [7, 8, 5, 6] and y.tolist() == [-1, 5, 6, 4]


def test_render_and_parse_round_trip_and_a_local_instruct_file(tmp_path, sample_data_dir):
    request = {"words": ("dog", "moon", "brave"), "features": ("Dialogue", "Twist"),
               "sentence": "The moon was big.", "summary": "A dog is brave."}
    assert parse_record(render_request(**request) + STORY) == (request, STORY)
    assert render_request(["dog"]).endswith("Story:\n")
    with pytest.raises(ValueError, match="unknown features"):
        render_request(features=["Funny"])
    # TinyStories-Instruct's own layout: fields in any order, the story after "Story:"
    record = ("Summary: A dog plays.\nWords: dog, ball, run\nFeatures: Dialogue\n"
              "Story: \n\nThe dog ran after the ball.")
    path = tmp_path / "instruct.txt"
    path.write_text("\n<|endoftext|>\n".join([record] * 3) + f"\n{EOT}\n")
    tokenizer = load_tokenizer(sample_data_dir / "tokenizer.json")
    records = instruct_records(str(path), tokenizer)
    assert (len(records["train"]), len(records["valid"])) == (2, 1)
    request, ids = records["valid"][0]
    assert request["words"] == ("dog", "ball", "run") and request["features"] == ("Dialogue",)
    assert request["summary"] == "A dog plays." and request["sentence"] is None
    assert tokenizer.decode(ids.tolist()) == "The dog ran after the ball."


def test_derived_requests_are_deterministic_and_read_off_the_story():
    first, again = derive_request(STORY, seed=3), derive_request(STORY, seed=3)
    assert first == again
    assert len(first["words"]) == 3 and all(w in STORY.lower() for w in first["words"])
    assert first["features"] == ("Dialogue",)  # it has quoted speech
    assert derive_request(STORY.replace('"', ""), seed=3)["features"] == ()
    assert {derive_request(STORY, seed=s)["words"] for s in range(6)} != {first["words"]}
    assert set(FEATURES) >= {"Dialogue", "Twist"}


def test_word_inclusion_counts_regular_inflections_only():
    assert uses_word("The dogs ran.", "dog") and uses_word("She was running.", "run")
    assert uses_word("He smiled.", "smile") and not uses_word("He ran.", "run")
    scores = score_story({"words": ("dog", "pond", "cat"), "features": ("Dialogue",),
                          "sentence": "The dog wagged its tail.", "summary": None}, STORY)
    assert scores == {"words": pytest.approx(2 / 3), "sentence": 1.0, "dialogue": 1.0}


def test_rows_start_at_a_record(sample_data_dir):
    train_data, valid_data = (load_token_array(sample_data_dir / f"{s}.bin")
                              for s in ("train", "valid"))
    cfg = tiny(sample_data_dir, "unused", requests="derived")
    rows, _ = request_rows(cfg, train_data, valid_data, 64)
    tokenizer = load_tokenizer(sample_data_dir / "tokenizer.json")
    starts = {tokenizer.encode("Features").ids[0], tokenizer.encode("Words").ids[0]}
    assert isinstance(rows, RequestRows) and rows.x.shape[1] == 64
    assert set(rows.x[:, 0].tolist()) <= starts  # every row opens with its request
    x, y = rows.get_batch(3, 64, generator=torch.Generator().manual_seed(0))
    assert (y[:, 0] == -1).all() and (y >= 0).any()


def test_story_rows_and_request_rows_do_not_mix(sample_data_dir):
    with pytest.raises(ValueError, match="rows each start at a request already: leave out"):
        RequestConfig(requests="derived", story_starts=True, data_dir=str(sample_data_dir))


def test_request_rows_give_a_rank_only_its_part_of_the_batch():
    """As data.get_batch does for DDP: every rank draws all B rows (the ranks stay in step) and
    keeps its own slice, so two ranks of half a batch see what one rank of the whole sees."""
    from tiny_llm.data import get_batch
    from tiny_llm.instruct import RequestRows

    x = torch.arange(40).view(10, 4)
    rows = RequestRows(x, x + 100)
    whole = get_batch(rows, 6, 4, generator=torch.Generator().manual_seed(3))
    halves = [get_batch(rows, 6, 4, generator=torch.Generator().manual_seed(3), part=part)
              for part in (slice(0, 3), slice(3, 6))]
    for i in range(2):
        assert torch.equal(torch.cat([h[i] for h in halves]), whole[i])
        assert halves[0][i].shape == (3, 4)


def test_lora_trains_only_adapters_and_its_merge_equals_the_adapted_forward():
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    full = trainable(model)
    add_lora(model, rank=2, alpha=4.0)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all(n.rsplit(".", 1)[-1] in ("lora_a", "lora_b") for n in names)
    assert trainable(model) < full / 10
    for name, p in model.named_parameters():
        if name.endswith("lora_b"):
            torch.nn.init.normal_(p, std=0.1)  # as if trained
    plain = GPT(model.config)
    plain.load_state_dict(merged(model.state_dict()))  # strict: exactly a plain GPT's keys
    idx = torch.randint(model.config.vocab_size, (2, 8))
    torch.testing.assert_close(plain(idx)[0], model(idx)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lora", [0, 2])
def test_fine_tuning_resumes_exactly(base, sample_data_dir, tmp_path, lora):
    settings = dict(init_from=str(base), requests="derived", lora_rank=lora, lr=1e-3,
                    optimizer="adamw" if lora else "muon")
    hooks = RequestHooks()
    whole = train(tiny(sample_data_dir, tmp_path / "whole", **settings), hooks=hooks)
    train(tiny(sample_data_dir, tmp_path / "half", max_steps=2, **settings), hooks=hooks)
    resumed = train(tiny(sample_data_dir, tmp_path / "half", resume=True, **settings),
                    hooks=hooks)
    assert resumed["train_loss"] == whole["train_loss"]
    a, b = (load_checkpoint(tmp_path / run / "ckpt.pt") for run in ("whole", "half"))
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert takes_requests(a) and not takes_requests(load_checkpoint(base))
    assert set(a["model"]) == set(load_checkpoint(base)["model"])  # ordinary: merged, plain
    if lora:  # the base weights stayed as they were; only the adapters moved
        start = load_checkpoint(base)["model"]
        frozen = [k for k in start if k.startswith("blocks.") and k.endswith("weight")]
        assert frozen and all(torch.equal(a["adapters"][k], start[k]) for k in frozen)


def test_instruct_write_takes_a_request(base, sample_data_dir, capsys):
    from tiny_llm import instruct
    instruct.main([
        "write", "--checkpoint", str(base), "--data-dir", str(sample_data_dir), "--words",
        "dog,moon,brave", "--features", "Dialogue", "--sentence", "The moon was big.",
        "--max-new-tokens", "5", "--device", "cpu"])
    out = capsys.readouterr().out
    prompt = render_request(("dog", "moon", "brave"), ("Dialogue",), "The moon was big.")
    assert repr(prompt) in out and prompt in out


def test_solutions(sample_data_dir):
    assert ex17_instruct.exercise_1_summary_rows(sample_data_dir) == (True, True)
    assert ex17_instruct.exercise_2_lora_count() == ex17_instruct.lora_count_by_formula()
    assert 0 < ex17_instruct.exercise_3_cut_share(sample_data_dir) < 0.5


def test_a_fine_tuning_run_resumes_only_through_its_own_command(base, sample_data_dir, tmp_path,
                                                                monkeypatch):
    """Step 10's command does not know step 17's settings: it names the command that does."""
    from tiny_llm import instruct
    from tiny_llm import train as train_module

    out = tmp_path / "ft"
    train(tiny(sample_data_dir, out, init_from=str(base), requests="derived", max_steps=2),
          hooks=RequestHooks())
    assert load_checkpoint(out / "ckpt.pt")["command"] == "tiny_llm.instruct train"
    monkeypatch.setattr("sys.argv", ["train", "--resume", "--out", str(out), "--max-steps", "3",
                                     "--sample-tokens", "0"])
    with pytest.raises(SystemExit, match=r"is a run of `tiny_llm.instruct train`.*continue it "
                                         r"with .*uv run python -m tiny_llm.instruct train "
                                         r"--resume"):
        train_module.main()
    instruct.main(["train", "--resume", "--out", str(out), "--max-steps", "3",
                   "--sample-tokens", "0"])
    assert load_checkpoint(out / "ckpt.pt")["step"] == 3
    with pytest.raises(SystemExit):  # step 10's parser has no step-17 flags
        monkeypatch.setattr("sys.argv", ["train", "--requests", "derived"])
        train_module.parse_args()
