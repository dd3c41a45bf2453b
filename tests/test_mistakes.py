"""The mistakes learners make in steps 04-10, planted: each test plants one in the finished code
and runs the step's tests on it, as `workalong` does, and asserts that what a learner reads
names that mistake, and not a neighbour's.

A plant replaces one piece of a module's source (it must occur exactly once) and puts each
function or method that this changes in place of the real one for the test; then the chosen
tests of the step's test file run in this process, and their failures are read through
workalong's own report (workalong.note), as a learner sees them.
"""

import ast
import importlib
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

import pytest

from tiny_llm.course import workalong
from tiny_llm.course.buildup import ROOT


def plant(monkeypatch, module, old, new, times=1):
    """Put a mistake in tiny_llm.<module>: `old` (found `times` times) becomes `new`, and each
    function or method whose code that changes is replaced, in place, by the changed one (the
    classes and every other object stay the ones all modules already hold)."""
    real = importlib.import_module(f"tiny_llm.{module}")
    source = Path(real.__file__).read_text()
    found = source.count(old)
    assert found == times, f"the mistake's piece is {found} times in tiny_llm/{module}.py: {old!r}"
    changed = source.replace(old, new)
    namespace = {"__name__": real.__name__, "__file__": real.__file__}
    exec(compile(changed, real.__file__, "exec"), namespace)
    before = {name: ast.dump(node) for name, node in workalong.bodies(ast.parse(source))}
    planted = 0
    for name, node in workalong.bodies(ast.parse(changed)):
        if before.get(name) == ast.dump(node):
            continue
        owner_name, _, attr = name.rpartition(".")
        owner = getattr(real, owner_name) if owner_name else real
        made = (vars(namespace[owner_name]) if owner_name else namespace)[attr]
        cells = tuple(types.CellType(owner) if var == "__class__" else cell  # super() works
                      for var, cell in zip(made.__code__.co_freevars, made.__closure__ or (),
                                           strict=True))
        fn = types.FunctionType(made.__code__, vars(real), attr, made.__defaults__,
                                cells or None)
        fn.__kwdefaults__, fn.__qualname__ = made.__kwdefaults__, made.__qualname__
        original = getattr(owner, attr)
        monkeypatch.setattr(owner, attr, fn)
        if not owner_name:  # a function: also where `from tiny_llm.x import f` put it
            for loaded in list(sys.modules.values()):
                for key, value in list(getattr(loaded, "__dict__", {}).items()):
                    if value is original and loaded is not real:
                        monkeypatch.setattr(loaded, key, fn)
        planted += 1
    assert planted, f"the change to tiny_llm/{module}.py is outside every function"


def failures(tmp_path, test_file, *select):
    """Run tests/`test_file` (narrowed by `-k` expression `select`) here: {test: what workalong
    shows for it} of the tests that fail."""
    report = tmp_path / "report.xml"
    args = [str(ROOT / "tests" / test_file), "-q", "--tb=short", "-p", "no:cacheprovider",
            "-p", "no:xdist", "-p", "no:benchmark", "-o", "addopts=", f"--junitxml={report}",
            "-o", "junit_family=xunit1",
            "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    loaded = set(sys.modules)
    try:
        pytest.main(args + (["-k", " and ".join(select)] if select else []))
    finally:  # a test module first imported here may hold a planted function: forget it
        ours = [str(ROOT / folder) for folder in ("tests", "solutions")]
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
        said = []  # what the test says: not its code, nor pytest's account of the values
        for line in low.splitlines():
            if line.startswith(("assert ", "+ ", "comparison failed")):
                break
            if not line.startswith(("at ", "> ")):
                said.append(line)
        said = "\n".join(said)
        for word in words:
            assert word.lower() in low, f"{test} does not say {word!r}:\n{text}"
        for word in never:
            assert word.lower() not in said, f"{test} blames {word!r}:\n{text}"



class Mistake(NamedTuple):
    """One planted mistake: in tiny_llm/`module`.py, `old` becomes `new` (`times` places); the
    tests of `test_file` chosen by the -k expression `select` ("": all) then fail, each naming
    every one of `words` and none of `never` (a neighbour's mistake)."""

    module: str
    old: str
    new: str
    test_file: str
    select: str
    words: tuple
    never: tuple = ()
    times: int = 1


MASK_05 = 'scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))  # exp(-inf) = 0'
NOT_THE_HEADS = ["causal mask is missing", "after the softmax", "merged", "split", "divided"]
TEMPERATURE_09 = (  # next_token_probs' body
    "    logits = logits.float() / temperature  # below 1 sharpens the distribution, above 1 "
    "flattens\n    if top_k is not None:\n        logits = top_k_filter(logits, top_k)\n"
    "    if top_p is not None:\n        logits = top_p_filter(logits, top_p)\n"
    "    return F.softmax(logits, dim=-1)\n")
LOSS_08 = "loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)"

SOFTMAX_SUM_01 = "return e / e.sum(dim=-1, keepdim=True)"
UPDATE_01 = "p -= lr * p.grad  # a small step downhill: against the gradient"

MISTAKES = {
    "autograd_super_init_forgotten": Mistake(
        "autograd",
        "        super().__init__()  # nn.Module's own set-up first: it starts the list of "
        "parameters\n",
        "",
        "test_device.py",
        "bigram_has or bigram_gives or sgd_step",
        ("call super().__init__() first",),
    ),
    "autograd_table_not_a_parameter": Mistake(
        "autograd",
        "self.table = nn.Parameter(torch.zeros(vocab_size, vocab_size))",
        "self.table = torch.zeros(vocab_size, vocab_size)",
        "test_device.py",
        "has_one_table",
        ("wrap the table in nn.Parameter",),
    ),
    "autograd_softmax_over_the_wrong_dim": Mistake(
        "autograd",
        SOFTMAX_SUM_01,
        "return e / e.sum(dim=0, keepdim=True)",
        "test_device.py",
        "softmax_rows",
        ("each column summing to 1", "dim=-1"),
    ),
    "autograd_softmax_sum_without_keepdim": Mistake(
        "autograd",
        SOFTMAX_SUM_01,
        "return e / e.sum(dim=-1)",
        "test_device.py",
        "softmax_rows",
        ("keepdim=True",),
    ),
    "autograd_softmax_without_the_max": Mistake(
        "autograd",
        "z = logits - logits.max(dim=-1, keepdim=True).values",
        "z = logits",
        "test_device.py",
        "softmax",
        ("subtract each row's max",),
    ),
    "autograd_loss_summed": Mistake(
        "autograd",
        "return -picked.log().mean()",
        "return -picked.log().sum()",
        "test_device.py",
        "cross_entropy",
        ("take the mean, not the sum",),
        never=("the sign",),
    ),
    "autograd_loss_sign": Mistake(
        "autograd",
        "return -picked.log().mean()",
        "return picked.log().mean()",
        "test_device.py",
        "cross_entropy",
        ("the sign",),
        never=("the sum",),
    ),
    "autograd_grad_without_the_mean": Mistake(
        "autograd",
        "return (softmax(logits) - one_hot) / len(targets)",
        "return softmax(logits) - one_hot",
        "test_device.py",
        "grad_by_hand",
        ("divide by N",),
        never=("one_hot minus softmax",),
    ),
    "autograd_grad_sign": Mistake(
        "autograd",
        "return (softmax(logits) - one_hot) / len(targets)",
        "return (one_hot - softmax(logits)) / len(targets)",
        "test_device.py",
        "grad_by_hand",
        ("softmax minus one_hot",),
        never=("divide by N",),
    ),
    "autograd_update_uphill": Mistake(
        "autograd",
        UPDATE_01,
        UPDATE_01.replace("-=", "+="),
        "test_device.py",
        "sgd_step",
        ("against the gradient",),
        never=("zero the gradients",),
    ),
    "autograd_gradients_not_zeroed": Mistake(
        "autograd",
        "            p.grad = None  # zero the gradients (as optimizer.zero_grad() does): "
        "backward adds\n",
        "",
        "test_device.py",
        "sgd_step",
        ("zero the gradients",),
        never=("uphill", "rose"),
    ),
    "autograd_update_outside_no_grad": Mistake(
        "autograd",
        "with torch.no_grad():  # the update itself",
        "if True:  # the update itself",
        "test_device.py",
        "sgd_step",
        ("inside `with torch.no_grad():`",),
    ),
    "embed_init_std_off": Mistake(
        "embed", "std=0.02)", "std=0.2)", "test_embed.py", "", ("std", "std=0.02")
    ),
    "embed_positions_forgotten": Mistake(
        "embed",
        "return x + self.pos_emb(pos)",
        "return x",
        "test_embed.py",
        "",
        ("pos_emb",),
        never=("std",),
    ),
    "embed_positions_looked_up_by_token_id": Mistake(
        "embed",
        "return x + self.pos_emb(pos)",
        "return x + self.pos_emb(idx)",
        "test_embed.py",
        "not bad_ids",
        ("pos_emb", "not with the token ids"),
    ),
    "embed_positions_over_the_batch": Mistake(
        "embed",
        "torch.arange(start, start + T,",
        "torch.arange(start, start + idx.shape[0],",
        "test_embed.py",
        "not bad_ids",
        ("T = idx.shape[1]",),
    ),
    # It was blamed on the token ids.
    "embed_positions_off_by_one": Mistake(
        "embed",
        "torch.arange(start, start + T,",
        "torch.arange(start + 1, start + T + 1,",
        "test_embed.py",
        "not bad_ids",
        ("off by one", "torch.arange(T)"),
        never=("not with the token ids", "the token id"),
    ),
    # It was reported as "positions take weight from later positions", with no cause.
    "attention_mask_filled_with_zero": Mistake(
        "attention",
        MASK_05,
        'scores = scores.masked_fill(~self.mask[:T, :T], 0.0)',
        "test_attention.py",
        "",
        ("set to 0, not -inf",),
        never=("is missing", "after the softmax", "divided", "multiplied"),
    ),
    "attention_mask_upper_triangle": Mistake(
        "attention",
        "mask = torch.tril(",
        "mask = torch.triu(",
        "test_attention.py",
        "",
        ("not the lower triangle",),
        never=("is missing", "after the softmax"),
    ),
    "attention_mask_missing": Mistake(
        "attention",
        MASK_05,
        "pass",
        "test_attention.py",
        "",
        ("the causal mask is missing",),
        never=("after the softmax", "divided", "multiplied"),
    ),
    "attention_mask_after_the_softmax": Mistake(
        "attention",
        MASK_05 + "\n        weights = F.softmax(scores, dim=-1)",
        "pass\n        weights = F.softmax(scores, dim=-1)\n        if causal:\n"
        "            weights = weights.masked_fill(~self.mask[:T, :T], 0.0)",
        "test_attention.py",
        "",
        ("after the softmax",),
        never=("is missing",),
    ),
    "attention_scale_missing": Mistake(
        "attention",
        "k.transpose(-2, -1) / math.sqrt(C)",
        "k.transpose(-2, -1)",
        "test_attention.py",
        "",
        ("not divided by sqrt(C)",),
        never=("mask is missing", "after the softmax"),
    ),
    "attention_scale_on_the_wrong_side": Mistake(
        "attention",
        "k.transpose(-2, -1) / math.sqrt(C)",
        "k.transpose(-2, -1) * math.sqrt(C)",
        "test_attention.py",
        "",
        ("multiplied by sqrt(C)",),
        never=("mask is missing", "after the softmax"),
    ),
    "attention_softmax_over_the_queries": Mistake(
        "attention",
        "weights = F.softmax(scores, dim=-1)",
        "weights = F.softmax(scores, dim=-2)",
        "test_attention.py",
        "",
        ("dim=-1",),
        never=("mask is missing",),
    ),
    "attention_projection_forgotten": Mistake(
        "attention",
        "out = self.proj(weights @ v)",
        "out = weights @ v",
        "test_attention.py",
        "",
        ("without proj",),
        never=("mask is missing", "after the softmax", "divided", "multiplied"),
    ),
    # It was reported as broken causality.
    "multihead_merge_without_the_transpose": Mistake(
        "multihead",
        "y = y.transpose(1, 2).contiguous().view(B, T, C)",
        "y = y.contiguous().view(B, T, C)",
        "test_multihead.py",
        "not solutions",
        ("merged without transposing back",),
        never=NOT_THE_HEADS[:2] + NOT_THE_HEADS[3:],
    ),
    "multihead_split_by_view_alone": Mistake(
        "multihead",
        ".view(B, T, self.n_heads, self.head_size).transpose(1, 2)",
        ".reshape(B, self.n_heads, T, self.head_size)",
        "test_multihead.py",
        "not solutions",
        ("split into heads by a view",),
        never=NOT_THE_HEADS[:3] + NOT_THE_HEADS[4:],
        times=3,
    ),
    "multihead_explicit_scale_by_d_model": Mistake(
        "multihead",
        "/ math.sqrt(self.head_size)",
        "/ math.sqrt(self.d_model)",
        "test_multihead.py",
        "not solutions",
        ("the explicit path: the scores are divided by sqrt(d_model)",),
        never=NOT_THE_HEADS[:4],
    ),
    "multihead_explicit_mask_missing": Mistake(
        "multihead",
        'scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))  # no looking ahead',
        "pass",
        "test_multihead.py",
        "not solutions",
        ("the explicit path: the causal mask is missing",),
        never=NOT_THE_HEADS[1:],
    ),
    "multihead_split_by_view_without_transpose": Mistake(
        "multihead",
        ".view(B, T, self.n_heads, self.head_size).transpose(1, 2)",
        ".view(B, self.n_heads, T, self.head_size)",
        "test_multihead.py",
        "not solutions",
        ("split into heads by a view",),
        never=NOT_THE_HEADS[:3] + NOT_THE_HEADS[4:],
        times=3,
    ),
    "multihead_merge_without_contiguous": Mistake(
        "multihead",
        "y = y.transpose(1, 2).contiguous().view(B, T, C)",
        "y = y.transpose(1, 2).view(B, T, C)",
        "test_multihead.py",
        "not solutions",
        ("add .contiguous() before .view(B, T, C)",),
        never=("split into heads",),
    ),
    "multihead_explicit_scale_missing": Mistake(
        "multihead",
        "k.transpose(-2, -1) / math.sqrt(self.head_size)",
        "k.transpose(-2, -1)",
        "test_multihead.py",
        "not solutions",
        ("the explicit path: the scores are not divided by sqrt(head_size)",),
        never=NOT_THE_HEADS[:4],
    ),
    "multihead_explicit_mask_filled_with_zero": Mistake(
        "multihead",
        'scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))  # no looking ahead',
        "scores = scores.masked_fill(~self.mask[:T, :T], 0.0)  # no looking ahead",
        "test_multihead.py",
        "not solutions",
        ("the explicit path: the future scores are set to 0, not -inf",),
        never=NOT_THE_HEADS,
    ),
    # It was reported as a bare `assert torch.equal(attn(x), attn(x))`.
    "multihead_dropout_left_on_in_eval": Mistake(
        "multihead",
        "self.dropout if self.training else 0.0",
        "self.dropout",
        "test_multihead.py",
        "dropout",
        ("the fast (attend) path", "dropout acts in evaluation"),
        never=NOT_THE_HEADS,
    ),
    "multihead_fast_path_not_causal": Mistake(
        "multihead",
        "is_causal=bool(Tq == Tk)",
        "is_causal=False",
        "test_multihead.py",
        "not solutions",
        ("the fast (attend) path: the causal mask is missing",),
        never=NOT_THE_HEADS[1:],
    ),
    "block_residual_dropped": Mistake(
        "block",
        "x = x + self.attn(self.ln_1(x), cache, layer)",
        "x = self.attn(self.ln_1(x), cache, layer)",
        "test_block.py",
        "not solutions and not residual_stream and not post_norm_needs_warmup",
        ("the residual is dropped around attention",),
        never=("post-norm", "skipped", "std"),
    ),
    "block_post_norm": Mistake(
        "block",
        "x = x + self.attn(self.ln_1(x), cache, layer)\n        x = x + self.mlp(self.ln_2(x))",
        "x = self.ln_1(x + self.attn(x, cache, layer))\n        x = self.ln_2(x + self.mlp(x))",
        "test_block.py",
        "not solutions and not residual_stream and not post_norm_needs_warmup",
        ("post-norm",),
        never=("dropped", "skipped", "std"),
    ),
    # It was reported as `assert False ... all(<generator>)`.
    "block_residual_added_to_the_normalised_x": Mistake(
        "block",
        "x = x + self.attn(self.ln_1(x), cache, layer)\n        x = x + self.mlp(self.ln_2(x))",
        "h = self.ln_1(x)\n        x = h + self.attn(h, cache, layer)\n"
        "        h = self.ln_2(x)\n        x = h + self.mlp(h)",
        "test_block.py",
        "not solutions and not residual_stream and not post_norm_needs_warmup",
        ("the residual is added to the normalised x",),
        never=("post-norm", "dropped", "skipped"),
    ),
    "layernorm_over_the_wrong_axis": Mistake(
        "block",
        "return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)",
        "mean = x.mean(dim=-2, keepdim=True)\n"
        "        var = x.var(dim=-2, keepdim=True, unbiased=False)\n"
        "        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias",
        "test_block.py",
        "layernorm or fused",
        ("over dim -2",),
        never=("unbiased", "eps is added", "not applied"),
    ),
    "layernorm_unbiased_variance": Mistake(
        "block",
        "var = x.var(dim=-1, keepdim=True, unbiased=False)",
        "var = x.var(dim=-1, keepdim=True)",
        "test_block.py",
        "layernorm or fused",
        ("unbiased=False",),
        never=("over dim", "eps is added"),
    ),
    # It was reported as "attn.proj is not marked residual_output: apply step 07's diff".
    "init_std_off_is_not_blamed_on_the_diff": Mistake(
        "block",
        "std=0.02 / math.sqrt(2 * n_layers)",
        "std=0.02 / math.sqrt(n_layers)",
        "test_block.py",
        "smaller_std",
        ("is marked residual_output, but starts with std", "the 2 of 2·n_layers is missing"),
        never=("is not marked", "apply step 07's diff"),
    ),
    "the_forgotten_diff_to_multihead_is_named": Mistake(
        "multihead",
        "        self.proj.residual_output = True  # added onto the "
        "residual stream: step 07's init_weights\n",
        "",
        "test_block.py",
        "smaller_std",
        ("attn.proj is not marked residual_output: apply step 07's diff",),
    ),
    "gpt_targets_shifted_again": Mistake(
        "gpt",
        LOSS_08,
        "loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), "
        "targets[:, 1:].flatten(), ignore_index=-1)",
        "test_gpt.py",
        "loss or minus_one",
        ("shifted again",),
        never=("summed", "ignore_index=-1 to"),
    ),
    "gpt_ignore_index_missing": Mistake(
        "gpt",
        LOSS_08,
        LOSS_08.replace(", ignore_index=-1", ""),
        "test_gpt.py",
        "minus_one or loss",
        ("ignore_index=-1",),
        never=("shifted", "summed"),
    ),
    "gpt_final_norm_skipped": Mistake(
        "gpt",
        "return self.lm_head(self.ln_f(x))",
        "return self.lm_head(x)",
        "test_gpt.py",
        "not memorises",
        ("ln_f is skipped",),
    ),
    "gpt_weights_not_tied": Mistake(
        "gpt",
        "self.lm_head.weight = self.embed.tok_emb.weight",
        "pass",
        "test_gpt.py",
        "tied or tying or head_weight",
        ("tie them",),
        never=("ln_f", "shifted"),
    ),
    "gpt_one_block_repeated": Mistake(
        "gpt",
        "[self.make_block(c) for _ in range(c.n_layers)]",
        "[self.make_block(c)] * c.n_layers",
        "test_gpt.py",
        "parameter_counts",
        ("one Block repeated",),
    ),
    "gpt_check_targets_forgotten": Mistake(
        "gpt",
        "        check_targets(idx, targets, self.config.vocab_size, "
        'values=idx.device.type == "cpu")\n',
        "",
        "test_gpt.py",
        "checks_its_targets",
        ("targets shape",),
    ),
    "gpt_loss_over_the_wrong_dim": Mistake(
        "gpt",
        LOSS_08,
        "loss = F.cross_entropy(logits, targets, ignore_index=-1)",
        "test_gpt.py",
        "loss_is_the_mean",
        ("flatten the logits to (B·T, V)",),
        never=("shifted", "summed"),
    ),
    "gpt_blocks_outputs_thrown_away": Mistake(
        "gpt",
        "x = block(x, cache, layer)",
        "block(x, cache, layer)",
        "test_gpt.py",
        "logits_are_the_head",
        ("thrown away",),
        never=("ln_f is skipped",),
    ),
    "top_k_by_comparison_keeps_ties": Mistake(
        "generate",
        "    values, indices = torch.topk(logits, top_k, dim=-1)\n"
        '    return torch.full_like(logits, float("-inf")).scatter(-1, indices, values)',
        "    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]\n"
        '    return logits.masked_fill(logits < kth, float("-inf"))',
        "test_generate.py",
        "top_k",
        ("keeps every tie",),
    ),
    "top_k_not_clamped": Mistake(
        "generate",
        "    top_k = min(top_k, logits.shape[-1])",
        "    pass",
        "test_generate.py",
        "top_k_keeps",
        ("clamp top_k",),
    ),
    "top_p_counts_the_token_itself": Mistake(
        "generate",
        "mass_before = probs.cumsum(dim=-1) - probs",
        "mass_before = probs.cumsum(dim=-1)",
        "test_generate.py",
        "top_p_keeps",
        ("ranked above it",),
        never=("too many",),
    ),
    "top_p_off_by_one_at_the_edge": Mistake(
        "generate",
        "masked_fill(mass_before >= top_p,",
        "masked_fill(mass_before > top_p,",
        "test_generate.py",
        "top_p_keeps",
        ("one token too many",),
        never=("ranked above it",),
    ),
    "top_p_left_sorted": Mistake(
        "generate",
        '    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)',
        "    return sorted_logits",
        "test_generate.py",
        "unsorted",
        ("in sorted order",),
    ),
    "temperature_multiplied": Mistake(
        "generate",
        "logits = logits.float() / temperature",
        "logits = logits.float() * temperature",
        "test_generate.py",
        "temperature",
        ("do not multiply",),
    ),
    "context_not_cropped": Mistake(
        "generate",
        "logits, _ = model(idx[:, -M:])  # the whole context",
        "logits, _ = model(idx)  # the whole context",
        "test_generate.py",
        "cropped",
        ("idx[:, -max_seq_len:]",),
    ),
    "top_k_keeps_k_plus_one": Mistake(
        "generate",
        "values, indices = torch.topk(logits, top_k, dim=-1)",
        "values, indices = torch.topk(logits, min(top_k + 1, logits.shape[-1]), dim=-1)",
        "test_generate.py",
        "top_k_keeps",
        ("one token too many",),
        never=("keeps every tie",),
    ),
    "top_k_keeps_the_smallest": Mistake(
        "generate",
        "values, indices = torch.topk(logits, top_k, dim=-1)",
        "values, indices = torch.topk(logits, top_k, dim=-1, largest=False)",
        "test_generate.py",
        "never_samples",
        ("keeps the 5 smallest",),
    ),
    "temperature_after_the_softmax": Mistake(
        "generate",
        TEMPERATURE_09,
        TEMPERATURE_09.replace(" / temperature  #", "  #").replace(
            "return F.softmax(logits, dim=-1)", "return F.softmax(logits, dim=-1) / temperature"),
        "test_generate.py",
        "sharpens",
        ("not the probabilities after",),
    ),
    "next_token_from_the_first_position": Mistake(
        "generate",
        "logits = logits[:, -1, :]  # (B, V)",
        "logits = logits[:, 0, :]  # (B, V)",
        "test_generate.py",
        "last_position",
        ("logits[:, -1, :]",),
    ),
    "accumulation_without_the_division": Mistake(
        "train",
        "scaler.scale(loss / cfg.grad_accum).backward()",
        "scaler.scale(loss).backward()",
        "test_train.py",
        "accumulation",
        ("divide each micro-batch's loss",),
    ),
    "warmup_from_zero": Mistake(
        "train",
        "return max_lr * (step + 1) / warmup_steps",
        "return max_lr * step / warmup_steps",
        "test_train.py",
        "lr_",
        ("lr_at(0) is 0",),
    ),
    "cosine_to_zero": Mistake(
        "train",
        "return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)",
        "return 0.5 * (1 + math.cos(math.pi * progress)) * max_lr",
        "test_train.py",
        "cosine",
        ("runs down to 0",),
        never=("warm up",),
    ),
    "weight_decay_on_everything": Mistake(
        "train",
        '[p for p in params if p.dim() >= 2], "weight_decay"',
        '[p for p in params if p.dim() >= 1], "weight_decay"',
        "test_train.py",
        "weight_decay",
        ("decay only the matrices",),
    ),
    "gradients_zeroed_inside_the_accumulation_loop": Mistake(
        "train",
        "            scaler.scale(loss / cfg.grad_accum).backward()",
        "            model.zero_grad()\n            scaler.scale(loss / cfg.grad_accum).backward()",
        "test_train.py",
        "accumulation",
        ("zeroed inside the loop",),
        never=("divide each micro-batch's loss",),
    ),
    "warmup_reaches_the_peak_a_step_late": Mistake(
        "train",
        "return max_lr * (step + 1) / warmup_steps",
        "return max_lr * (step + 1) / (warmup_steps + 1)",
        "test_train.py",
        "lr_",
        ("(step + 1) / warmup_steps",),
        never=("lr_at(0) is 0",),
    ),
}


@pytest.mark.parametrize("name", MISTAKES)
def test_the_failing_tests_name_the_planted_mistake(name, monkeypatch, tmp_path, request):
    m = MISTAKES[name]
    if m.module == "train":  # its tests read the sample data: this session's, not a new one
        folder = request.getfixturevalue("sample_data_dir")
        monkeypatch.setenv("TINY_LLM_TEST_DATA_DIR", str(folder))
    plant(monkeypatch, m.module, m.old, m.new, m.times)
    says(failures(tmp_path, m.test_file, *filter(None, [m.select])), *m.words, never=m.never)
