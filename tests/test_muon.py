"""Step 15, part 2: Muon for the hidden matrices, AdamW for the rest (tiny_llm/muon.py)."""

import io
import math
from dataclasses import replace

import pytest
import torch

from tiny_llm.gpt import GPT, GPTConfig
from tiny_llm.modern import PRESETS, ModernGPT
from tiny_llm.muon import MuonAdamW, muon_groups, one_step_against_torch, orthogonalize


def test_orthogonalize_keeps_the_singular_vectors_and_evens_out_the_values():
    torch.manual_seed(0)
    g = torch.randn(96, 40)
    u, s, vt = torch.linalg.svd(g, full_matrices=False)
    out = orthogonalize(g)
    assert out.shape == g.shape and out.dtype == torch.float32
    values = torch.linalg.svdvals(out)
    assert values.min() > 0.5 and values.max() < 1.3  # s.max()/s.min() was about 4
    exact = u @ vt  # the orthogonal matrix nearest to g
    cosine = (out * exact).sum() / (out.norm() * exact.norm())
    assert cosine > 0.97


def test_a_stack_of_matrices_is_orthogonalized_one_by_one():
    torch.manual_seed(1)
    stack = torch.randn(3, 16, 24)
    together = orthogonalize(stack)
    for i in range(3):
        assert torch.allclose(together[i], orthogonalize(stack[i]), atol=1e-5)


def test_one_step_matches_torchs_muon_and_adamw():
    muon_diff, adamw_diff = one_step_against_torch(seed=3)
    assert muon_diff < 1e-3  # torch.optim.Muon iterates in bfloat16: 3 significant digits
    assert adamw_diff < 1e-7


def test_adamw_groups_follow_torchs_adamw_for_several_steps():
    torch.manual_seed(2)
    a = torch.randn(5, 3, requires_grad=True)
    b = a.detach().clone().requires_grad_()
    ours = MuonAdamW([{"params": [a], "weight_decay": 0.1}], lr=0.01)
    ref = torch.optim.AdamW([b], lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
    for _ in range(4):
        grad = torch.randn(5, 3)
        for p, opt in ((a, ours), (b, ref)):
            p.grad = grad.clone()
            opt.step()
    assert torch.allclose(a, b, atol=1e-6)


def test_groups_send_tables_to_adamw_and_hidden_matrices_to_muon():
    gpt = GPT(GPTConfig(vocab_size=64, max_seq_len=8, d_model=16, n_layers=1, n_heads=2))
    groups = muon_groups(gpt, 0.1)
    tables = {id(p) for p in groups[1]["params"]}
    assert tables == {id(gpt.embed.tok_emb.weight), id(gpt.embed.pos_emb.weight)}
    assert all(p.dim() == 2 for p in groups[0]["params"]) and groups[0]["muon"]
    assert all(p.dim() == 1 for p in groups[2]["params"]) and groups[2]["weight_decay"] == 0
    n = sum(p.numel() for g in groups for p in g["params"])
    assert n == sum(p.numel() for p in gpt.parameters())  # every weight once
    untied = ModernGPT(replace(PRESETS["tiny"], vocab_size=64, tie_embeddings=False))
    tables = [p.shape for p in muon_groups(untied, 0.1)[1]["params"]]
    assert sorted(tables) == [(64, 64), (64, 64)]  # the embedding and the untied head, not wq


def test_muon_scales_each_matrix_by_its_rule():
    # An orthogonal update has RMS 1/√max(A, B); the group's rule (step 15's MUON_SCALES) sets
    # each matrix's step from its shape: rms 0.2·√max(A, B), shape √max(1, A/B).
    torch.manual_seed(5)
    for shape, rule, expected in (((64, 16), "rms", 0.2 * 8), ((64, 16), "shape", 2.0),
                                  ((16, 64), "shape", 1.0), ((32, 32), "shape", 1.0),
                                  ((32, 32), None, 0.2 * math.sqrt(32))):  # no rule: rms
        w = torch.zeros(shape, requires_grad=True)
        w.grad = torch.randn(shape)
        group = {"params": [w], "muon": True, "weight_decay": 0.0}
        MuonAdamW([group | ({"muon_scale": rule} if rule else {})], lr=0.01).step()
        update = orthogonalize(w.grad)  # Nesterov at step 1: a multiple of the gradient
        assert torch.allclose(w.detach(), -0.01 * expected * update, atol=1e-5), (shape, rule)


def test_state_dict_round_trip_continues_exactly():
    torch.manual_seed(4)
    model = ModernGPT(replace(PRESETS["tiny"], vocab_size=64))
    x = torch.randint(0, 64, (2, 8))
    opt = MuonAdamW(muon_groups(model, 0.1), lr=1e-2)

    def step(m, o):
        _, loss = m(x, x)
        loss.backward()
        o.step()
        o.zero_grad()

    step(model, opt)
    twin = ModernGPT(replace(PRESETS["tiny"], vocab_size=64))
    twin.load_state_dict(model.state_dict())
    twin_opt = MuonAdamW(muon_groups(twin, 0.1), lr=1e-2)
    saved = io.BytesIO()  # through bytes, as a checkpoint goes: no tensor shared with opt
    torch.save(opt.state_dict(), saved)
    saved.seek(0)
    twin_opt.load_state_dict(torch.load(saved))
    step(model, opt)
    step(twin, twin_opt)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_vector_in_a_muon_group_is_refused():
    with pytest.raises(ValueError, match="2-D weight matrices only"):
        MuonAdamW([{"params": [torch.zeros(4, requires_grad=True)], "muon": True}])


def test_the_main_job_trains_with_muon_and_resumes_exactly(sample_data_dir, tmp_path):
    import json

    from tiny_llm.train import TrainConfig, train

    def run(out, **changes):
        cfg = TrainConfig(model="modern", preset="tiny", optimizer="muon", max_steps=4,
                          time_budget=0, batch_size=4, warmup_steps=1, eval_interval=2,
                          eval_iters=1, data_dir=str(sample_data_dir), out=str(out), device="cpu")
        return train(replace(cfg, **changes))

    def losses(out):
        lines = (out / "log.jsonl").read_text().splitlines()
        return [json.loads(line)["train_loss"] for line in lines]

    run(tmp_path / "whole")
    run(tmp_path / "split", max_steps=2, lr_decay_steps=4)
    run(tmp_path / "split", resume=True, lr_decay_steps=4)
    assert losses(tmp_path / "split") == losses(tmp_path / "whole")  # identical, not close
    assert losses(tmp_path / "whole")[-1] < losses(tmp_path / "whole")[0]
    with pytest.raises(ValueError, match="optimizer must be adamw or muon, got 'sgd'"):
        run(tmp_path / "bad", optimizer="sgd")
