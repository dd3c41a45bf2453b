"""Step 11's ladder: the GPT's ancestors, built from step 08's GPT, trained by step 10's loop."""

import re

import pytest
import torch
from chapters import chapters, commands, console_blocks

from tiny_llm.gpt import GPT
from tiny_llm.gpt import PRESETS as GPT_PRESETS
from tiny_llm.ladder import RUNGS, RungConfig, RungGPT


def rung(name, size="tiny"):
    torch.manual_seed(0)
    return RungGPT(RungGPT.presets[f"{size}-{name}"]).eval()


def test_the_embedding_rung_has_no_block_and_predicts_from_one_token():
    """n_layers=0: the logits at t come from token t and position t alone (a bigram model)."""
    model = rung("embedding")
    assert len(model.blocks) == 0 and model.config.n_layers == 0
    idx = torch.randint(0, model.config.vocab_size, (1, 16))
    changed = idx.clone()
    changed[0, :8] = (idx[0, :8] + 1) % model.config.vocab_size  # every earlier token differs
    with torch.no_grad():
        assert torch.equal(model(idx)[0][0, 8:], model(changed)[0][0, 8:])


def test_attention_rungs_differ_from_the_block_by_the_mlp_alone():
    d = GPT_PRESETS["tiny"].d_model
    one_head, heads, block = rung("one-head"), rung("heads"), rung("one-block")
    assert [b.attn.n_heads for b in (one_head.blocks[0], heads.blocks[0])] == [1, 2]
    assert not hasattr(one_head.blocks[0], "mlp") and not hasattr(one_head.blocks[0], "ln_2")
    assert one_head.num_params() == heads.num_params()  # the same weights, cut into heads
    assert block.num_params() - heads.num_params() == 8 * d * d + 5 * d + 2 * d  # MLP and ln_2


def test_the_gpt_rung_is_step_08s_gpt():
    ours, theirs = rung("gpt"), GPT(GPT_PRESETS["tiny"])
    assert {k: v.shape for k, v in ours.state_dict().items()} == {
        k: v.shape for k, v in theirs.state_dict().items()}
    assert ours.blocks[0].mlp.proj.weight.std().item() == pytest.approx(0.02 / 2, rel=0.1)


def test_a_rung_config_is_checked_as_step_08_checks_a_gpt():
    with pytest.raises(ValueError, match="not divisible by n_heads=3"):
        RungConfig(n_layers=0, d_model=64, n_heads=3)
    with pytest.raises(TypeError, match="attention_only must be True or False, got 'yes'"):
        RungConfig(attention_only="yes")


# The ladder climbing on the sample corpus (every rung trained for the same steps, the whole GPT
# below the bigram model, the MLP's block below attention alone, parameters rising, samples
# that start with the prompt) is chapter 11's console block, `python -m tiny_llm.ladder`, which
# tests/test_chapters.py runs at step 11's state and at the head and compares row by row.


def test_chapters_04_to_08_quote_the_ladder_that_chapter_11_shows():
    """Each of chapters 04-08 closes with what its piece buys, "from X to Y: step 11 measures
    it"; X and Y are the rung before and its own in chapter 11's ladder."""
    block = next(b for b in console_blocks() if "tiny_llm.ladder" in b.body)
    (_, lines), = commands(block)
    bpb = {int(line.split()[1]): float(line.split()[-1]) for line in lines
           if line.split()[0] in RUNGS}
    bpb[3] = float(next(line for line in lines if line.startswith("uniform")).split()[-1])
    for chapter in chapters():
        step = int(chapter.name[:2])
        if step in bpb and step > 3:
            said = re.findall(r"from\s+([\d.]+)[^:]*?\sto\s+([\d.]+)[^:]*:\s+step 11 measures it",
                              chapter.read_text(), re.S)
            assert len(said) == 1, f"{chapter.name} does not close with its rung of the ladder"
            assert [float(x) for x in said[0]] == pytest.approx([bpb[step - 1], bpb[step]],
                                                                abs=0.006), chapter.name
