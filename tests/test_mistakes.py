"""The mistakes learners make in steps 04-10, planted: each test plants one in the finished code
and runs the step's tests on it, as `workalong` does, and asserts that what a learner reads
names that mistake, and not a neighbour's.

A plant replaces one piece of a module's source (it must occur exactly once), loads the changed
module in place of the real one for the test (every module that imported a name from it sees
the planted one), then runs the chosen tests of the step's test file in this process and reads
their failures through workalong's own report (workalong.note).
"""

import importlib
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tiny_llm.course import workalong
from tiny_llm.course.buildup import ROOT


def plant(monkeypatch, module, old, new, times=1):
    """Load tiny_llm.<module> with `old` (found `times` times) replaced by `new`, in place of
    the real one."""
    real = importlib.import_module(f"tiny_llm.{module}")
    source = Path(real.__file__).read_text()
    found = source.count(old)
    assert found == times, f"the mistake's piece is {found} times in tiny_llm/{module}.py: {old!r}"
    planted = types.ModuleType(real.__name__)
    planted.__file__ = real.__file__
    exec(compile(source.replace(old, new), real.__file__, "exec"), planted.__dict__)
    monkeypatch.setitem(sys.modules, real.__name__, planted)
    monkeypatch.setattr(sys.modules["tiny_llm"], module, planted)
    ours = {id(value): name for name, value in vars(real).items()
            if getattr(value, "__module__", None) == real.__name__}
    for loaded in list(sys.modules.values()):  # those that did `from tiny_llm.x import Name`
        names = getattr(loaded, "__dict__", {})
        if loaded is planted or loaded is real:
            continue
        for name, value in list(names.items()):
            if id(value) in ours and ours[id(value)] == name:
                monkeypatch.setattr(loaded, name, getattr(planted, name))


def failures(tmp_path, test_file, *select):
    """Run tests/`test_file` (narrowed by `-k` expression `select`) here: {test: what workalong
    shows for it} of the tests that fail."""
    report = tmp_path / "report.xml"
    args = [str(ROOT / "tests" / test_file), "-q", "--tb=short", "-p", "no:cacheprovider",
            "-p", "no:xdist", "-o", "addopts=", f"--junitxml={report}", "-o", "junit_family=xunit1",
            "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    loaded = set(sys.modules)
    try:
        pytest.main(args + (["-k", " and ".join(select)] if select else []))
    finally:  # a module of ours first imported here holds the planted names: forget it
        ours = [str(ROOT / folder) for folder in ("tests", "solutions", "tiny_llm")]
        for name in set(sys.modules) - loaded:
            if str(getattr(sys.modules[name], "__file__", None)).startswith(tuple(ours)):
                del sys.modules[name]
    found = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        problem = case.find("failure")
        problem = case.find("error") if problem is None else problem
        if problem is not None:
            found[case.get("name")] = workalong.note(problem)
    return found


def says(found, *words, never=()):
    """Every failure's text names `words` (each, case-insensitive) and none of `never`."""
    assert found, "the planted mistake passed every test"
    for test, text in found.items():
        low = text.lower()
        said = "\n".join(line for line in low.splitlines()  # what the test says, not its code
                         if not line.startswith(("at ", "> ")))
        for word in words:
            assert word.lower() in low, f"{test} does not say {word!r}:\n{text}"
        for word in never:
            assert word.lower() not in said, f"{test} blames {word!r}:\n{text}"


def test_embed_init_std_off(monkeypatch, tmp_path):
    plant(monkeypatch, "embed", "std=0.02)", "std=0.2)")
    says(failures(tmp_path, "test_embed.py"), "std", "std=0.02")


def test_embed_positions_forgotten(monkeypatch, tmp_path):
    plant(monkeypatch, "embed", "return x + self.pos_emb(pos)", "return x")
    says(failures(tmp_path, "test_embed.py"), "pos_emb", never=["std"])


def test_embed_positions_looked_up_by_token_id(monkeypatch, tmp_path):
    plant(monkeypatch, "embed", "return x + self.pos_emb(pos)", "return x + self.pos_emb(idx)")
    says(failures(tmp_path, "test_embed.py", "not bad_ids"), "pos_emb", "not with the token ids")


def test_embed_positions_over_the_batch(monkeypatch, tmp_path):
    plant(monkeypatch, "embed", "torch.arange(start, start + T,",
          "torch.arange(start, start + idx.shape[0],")
    says(failures(tmp_path, "test_embed.py", "not bad_ids"), "T = idx.shape[1]")


MASK_05 = 'scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))  # exp(-inf) = 0'


def test_attention_mask_missing(monkeypatch, tmp_path):
    plant(monkeypatch, "attention", MASK_05, "pass")
    says(failures(tmp_path, "test_attention.py"), "the causal mask is missing",
         never=["after the softmax", "divided", "multiplied"])


def test_attention_mask_after_the_softmax(monkeypatch, tmp_path):
    plant(monkeypatch, "attention", MASK_05 + "\n        weights = F.softmax(scores, dim=-1)",
          "pass\n        weights = F.softmax(scores, dim=-1)\n        if causal:\n"
          "            weights = weights.masked_fill(~self.mask[:T, :T], 0.0)")
    says(failures(tmp_path, "test_attention.py"), "after the softmax", never=["is missing"])


def test_attention_scale_missing(monkeypatch, tmp_path):
    plant(monkeypatch, "attention", "k.transpose(-2, -1) / math.sqrt(C)", "k.transpose(-2, -1)")
    says(failures(tmp_path, "test_attention.py"), "not divided by sqrt(C)",
         never=["mask is missing", "after the softmax"])


def test_attention_scale_on_the_wrong_side(monkeypatch, tmp_path):
    plant(monkeypatch, "attention", "k.transpose(-2, -1) / math.sqrt(C)",
          "k.transpose(-2, -1) * math.sqrt(C)")
    says(failures(tmp_path, "test_attention.py"), "multiplied by sqrt(C)",
         never=["mask is missing", "after the softmax"])


def test_attention_softmax_over_the_queries(monkeypatch, tmp_path):
    plant(monkeypatch, "attention", "weights = F.softmax(scores, dim=-1)",
          "weights = F.softmax(scores, dim=-2)")
    says(failures(tmp_path, "test_attention.py"), "dim=-1", never=["mask is missing"])


def test_attention_projection_forgotten(monkeypatch, tmp_path):
    plant(monkeypatch, "attention", "out = self.proj(weights @ v)", "out = weights @ v")
    says(failures(tmp_path, "test_attention.py"), "without proj",
         never=["mask is missing", "after the softmax", "divided", "multiplied"])


NOT_THE_HEADS = ["causal mask is missing", "after the softmax", "merged", "split", "divided"]


def test_multihead_merge_without_the_transpose(monkeypatch, tmp_path):
    """It was reported as broken causality."""
    plant(monkeypatch, "multihead", "y = y.transpose(1, 2).contiguous().view(B, T, C)",
          "y = y.contiguous().view(B, T, C)")
    says(failures(tmp_path, "test_multihead.py", "not solutions"),
         "merged without transposing back", never=NOT_THE_HEADS[:2] + NOT_THE_HEADS[3:])


def test_multihead_split_by_view_alone(monkeypatch, tmp_path):
    plant(monkeypatch, "multihead", ".view(B, T, self.n_heads, self.head_size).transpose(1, 2)",
          ".reshape(B, self.n_heads, T, self.head_size)", times=3)  # view says: use reshape
    says(failures(tmp_path, "test_multihead.py", "not solutions"), "split into heads by a view",
         never=NOT_THE_HEADS[:3] + NOT_THE_HEADS[4:])


def test_multihead_explicit_scale_by_d_model(monkeypatch, tmp_path):
    plant(monkeypatch, "multihead", "/ math.sqrt(self.head_size)", "/ math.sqrt(self.d_model)")
    says(failures(tmp_path, "test_multihead.py", "not solutions"),
         "the explicit path: the scores are divided by sqrt(d_model)", never=NOT_THE_HEADS[:4])


def test_multihead_explicit_mask_missing(monkeypatch, tmp_path):
    plant(monkeypatch, "multihead", 'scores = scores.masked_fill(~self.mask[:T, :T], '
          'float("-inf"))  # no looking ahead', "pass")
    says(failures(tmp_path, "test_multihead.py", "not solutions"),
         "the explicit path: the causal mask is missing", never=NOT_THE_HEADS[1:])


def test_multihead_fast_path_not_causal(monkeypatch, tmp_path):
    plant(monkeypatch, "multihead", "is_causal=Tq > 1", "is_causal=False")
    says(failures(tmp_path, "test_multihead.py", "not solutions"),
         "the fast (attend) path: the causal mask is missing", never=NOT_THE_HEADS[1:])


def test_block_residual_dropped(monkeypatch, tmp_path):
    plant(monkeypatch, "block", "x = x + self.attn(self.ln_1(x), cache, layer)",
          "x = self.attn(self.ln_1(x), cache, layer)")
    says(failures(tmp_path, "test_block.py", "not solutions and not residual_stream"),
         "the residual is dropped around attention", never=["post-norm", "skipped", "std"])


def test_block_post_norm(monkeypatch, tmp_path):
    plant(monkeypatch, "block", "x = x + self.attn(self.ln_1(x), cache, layer)\n"
          "        x = x + self.mlp(self.ln_2(x))",
          "x = self.ln_1(x + self.attn(x, cache, layer))\n        x = self.ln_2(x + self.mlp(x))")
    says(failures(tmp_path, "test_block.py", "not solutions and not residual_stream"),
         "post-norm", never=["dropped", "skipped", "std"])


def test_layernorm_over_the_wrong_axis(monkeypatch, tmp_path):
    plant(monkeypatch, "block", "return F.layer_norm(x, self.weight.shape, self.weight, "
          "self.bias, self.eps)", "mean = x.mean(dim=-2, keepdim=True)\n"
          "        var = x.var(dim=-2, keepdim=True, unbiased=False)\n"
          "        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias")
    says(failures(tmp_path, "test_block.py", "layernorm or fused"), "over dim -2",
         never=["unbiased", "eps is added", "not applied"])


def test_layernorm_unbiased_variance(monkeypatch, tmp_path):
    plant(monkeypatch, "block", "var = x.var(dim=-1, keepdim=True, unbiased=False)",
          "var = x.var(dim=-1, keepdim=True)")
    says(failures(tmp_path, "test_block.py", "layernorm or fused"), "unbiased=False",
         never=["over dim", "eps is added"])


def test_init_std_off_is_not_blamed_on_the_diff(monkeypatch, tmp_path):
    """It was reported as "attn.proj is not marked residual_output: apply step 07's diff"."""
    plant(monkeypatch, "block", "std=0.02 / math.sqrt(2 * n_layers)",
          "std=0.02 / math.sqrt(n_layers)")
    says(failures(tmp_path, "test_block.py", "smaller_std"),
         "is marked residual_output, but starts with std", "the 2 of 2·n_layers is missing",
         never=["is not marked", "apply step 07's diff"])


def test_the_forgotten_diff_to_multihead_is_named(monkeypatch, tmp_path):
    plant(monkeypatch, "multihead", "        self.proj.residual_output = True  # added onto the "
          "residual stream: step 07's init_weights\n", "")
    says(failures(tmp_path, "test_block.py", "smaller_std"),
         "attn.proj is not marked residual_output: apply step 07's diff")
