"""Step 10's optimizer: Muon for the matrices in the blocks and AdamW for the rest, in one object.

AdamW scales every weight's step by that weight's own gradient history. Muon (Keller Jordan,
2024; torch.optim.Muon since PyTorch 2.9) treats a weight matrix as a whole: it takes the
momentum of the gradient, G, and steps along the nearest orthogonal matrix to it, U·Vᵀ where
G = U·S·Vᵀ. Every direction the gradient points in gets the same step size, so the few
directions that dominate G no longer drown out the rest. Five Newton-Schulz iterations
approximate U·Vᵀ with matrix products only, which is why it is cheap enough to run every step.

Muon is for the 2-D weights inside the blocks. The embedding tables (lookups, not products)
and the 1-D gains and biases stay with AdamW, as in every Muon recipe; one optimizer object
holds both kinds of group, so step 10's loop, schedule and checkpoints work unchanged.

torch.optim.Muon runs its iterations in bfloat16, which a GPU does at full speed and a CPU
without native bfloat16 emulates at a fiftieth of float32 (step 13): on such a CPU it made a
training step 4.6 times slower. This version iterates in bfloat16 on a GPU with bfloat16
hardware and in float32 elsewhere, and stacks the matrices of one shape into one batched
product; its result matches torch.optim.Muon's within bfloat16 rounding.
"""

from collections import defaultdict

import torch
import torch.nn as nn

from tiny_llm.device import has_bf16_hardware
from tiny_llm.tuning import GROUPS, MUON_SCALES

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the quintic of Muon's reference implementation


def newton_schulz_dtype(device):
    """bfloat16 on a GPU with bfloat16 hardware (compute capability 8.0 on), whose tensor cores
    run it fastest (torch.optim.Muon's choice); float32 elsewhere: a CPU or a T4 would emulate
    bfloat16, slowly, and older MPS has none. float16 would be fast on a T4 and its range would
    do (the iteration keeps every singular value near 1), but no run of the course has checked
    that it trains as well, so float32 it is until one does."""
    return torch.bfloat16 if has_bf16_hardware(device) else torch.float32


def orthogonalize(g, steps=5, eps=1e-7):
    """≈ U·Vᵀ for a matrix (or a stack of matrices) g = U·S·Vᵀ, by Newton-Schulz, in
    newton_schulz_dtype(g.device): bfloat16 on a GPU built for it, float32 on a CPU.

    Scaling g by its norm puts every singular value in (0, 1]; each iteration
    x <- a·x + b·(x·xᵀ)·x + c·(x·xᵀ)²·x pushes them towards 1 and leaves U and V alone.
    """
    a, b, c = NS_COEFFICIENTS
    x = g.to(newton_schulz_dtype(g.device))
    tall = x.shape[-2] > x.shape[-1]
    if tall:  # iterate on the wide side: x·xᵀ is then the smaller product
        x = x.mT
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) + eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


def muon_groups(model, weight_decay):
    """Three parameter groups: Muon's hidden matrices, AdamW's tables, AdamW's gains (no decay).

    The tables are every nn.Embedding and the output head (the Linear that is a direct child of
    the model, not inside a block): their rows are looked up or scored one token at a time.
    """
    heads = [m for m in model.children() if isinstance(m, nn.Linear)]
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    tables = {id(p) for m in heads + embeddings for p in m.parameters()}
    groups = {"muon": [], "tables": [], "gains": []}
    for p in model.parameters():  # a tied head is the embedding: parameters() lists it once
        kind = "tables" if id(p) in tables else "muon" if p.dim() == 2 else "gains"
        groups[kind].append(p)
    return [{"params": groups["muon"], "muon": True, "weight_decay": weight_decay},
            {"params": groups["tables"], "muon": False, "weight_decay": weight_decay},
            {"params": groups["gains"], "muon": False, "weight_decay": 0.0}]


def muon_momentum(step, warmup_steps, start=0.85, end=0.95):
    """Muon's momentum at update `step`: a line from `start` to `end` over warmup_steps.
    warmup_steps 200: step 0 -> 0.85, 100 -> 0.90, 200 and on -> 0.95."""
    return start + (end - start) * min(1.0, step / warmup_steps)


def muon_adamw(model, cfg):
    """Step 10's default optimizer (`--optimizer muon`), built from its TrainConfig."""
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        raise ValueError("--optimizer muon needs whole matrices, and FSDP2 (step 16) shards "
                         "them: train with DDP (no --shard) or with --optimizer adamw")
    groups = muon_groups(model, cfg.weight_decay)
    for group, name in zip(groups, GROUPS, strict=True):  # step 15: muon, embed, gains
        group.update(name=name, muon_scale=cfg.muon_scale)  # lr_<name> and Muon's step rule
    return MuonAdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))


class MuonAdamW(torch.optim.Optimizer):
    """Muon on the groups marked "muon": True, AdamW on the others; one state, one step.

    Muon's step for a matrix of shape (A, B): momentum m <- 0.95·m + 0.05·g, update
    orthogonalize(g + 0.95·(m - g)) (Nesterov), scaled by 0.2·√max(A, B) so its size matches a
    typical AdamW step (torch.optim.Muon's adjust_lr_fn="match_rms_adamw"): one learning rate
    and one schedule serve both kinds of group. Weight decay is decoupled in both, as in AdamW.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                 momentum=0.95, ns_steps=5):
        if not 0 < lr < 1 or not 0 <= momentum < 1:
            raise ValueError(f"need 0 < lr < 1 and 0 <= momentum < 1, got lr={lr}, "
                             f"momentum={momentum}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        momentum=momentum, ns_steps=ns_steps, muon=False)
        super().__init__(params, defaults)
        for group in self.param_groups:
            if group["muon"] and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon groups take 2-D weight matrices only; put embeddings "
                                 "and 1-D gains in AdamW groups (see muon_groups)")

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            (self._muon if group["muon"] else self._adamw)(group, params)

    def _muon(self, group, params):
        lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
        by_shape = defaultdict(list)  # matrices of one shape are orthogonalized together
        for p in params:
            state = self.state[p]
            if not state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - mu)
            by_shape[p.shape].append((p, p.grad.lerp(buf, mu)))
        for shape, pairs in by_shape.items():
            updates = orthogonalize(torch.stack([u for _, u in pairs]), group["ns_steps"])
            scale = lr * MUON_SCALES[group.get("muon_scale", "rms")](*shape)
            for (p, _), update in zip(pairs, updates, strict=True):
                p.mul_(1 - lr * wd)
                p.add_(update.to(p.dtype), alpha=-scale)

    def _adamw(self, group, params):
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = 0  # a Python int: no device sync to read it
                state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
            state["step"] += 1
            t = state["step"]
            state["exp_avg"].lerp_(p.grad, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            denom = (state["exp_avg_sq"] / (1 - beta2**t)).sqrt_().add_(eps)
            p.mul_(1 - lr * wd)
            p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1**t))


def one_step_against_torch(seed=0):
    """One step of MuonAdamW beside torch's own optimizers on the same weights and gradients.

    Returns the largest weight difference against torch.optim.Muon (bfloat16 iterations) for a
    matrix and against torch.optim.AdamW for a gain vector."""
    g = torch.Generator().manual_seed(seed)
    w, v = torch.randn(344, 128, generator=g) * 0.02, torch.ones(128)
    grads = torch.randn(344, 128, generator=g), torch.randn(128, generator=g)
    ours = [w.clone().requires_grad_(), v.clone().requires_grad_()]
    ref = [w.clone().requires_grad_(), v.clone().requires_grad_()]
    for p, grad in zip(ours + ref, grads + grads, strict=True):
        p.grad = grad.clone()
    MuonAdamW([{"params": [ours[0]], "muon": True}, {"params": [ours[1]]}], lr=0.01).step()
    torch.optim.Muon([ref[0]], lr=0.01, adjust_lr_fn="match_rms_adamw").step()
    torch.optim.AdamW([ref[1]], lr=0.01, betas=(0.9, 0.95), weight_decay=0.1).step()
    return [(a - b).abs().max().item() for a, b in zip(ours, ref, strict=True)]


def main():
    torch.manual_seed(0)
    g = torch.randn(344, 128) * torch.logspace(0, -3, 128)  # columns from 1 down to 1/1000
    for name, m in (("gradient", g), ("orthogonalize(gradient)", orthogonalize(g))):
        s = torch.linalg.svdvals(m)
        print(f"{name:<24} singular values {s.max():8.4f} ... {s.min():.4f}")
    muon_diff, adamw_diff = one_step_against_torch()
    print(f"one step vs torch.optim.Muon (bfloat16 inside): max |difference| {muon_diff:.1e}")
    print(f"one step vs torch.optim.AdamW:                  max |difference| {adamw_diff:.1e}")
    from tiny_llm.gpt import GPT, PRESETS  # step 08's model, at the main job's size

    model = GPT(PRESETS["cpu"])
    for group, name in zip(muon_groups(model, 0.1), ("Muon", "AdamW tables", "AdamW gains"),
                           strict=True):
        n = sum(p.numel() for p in group["params"])
        print(f"{name:<13} {len(group['params']):>3} tensors {n:>10,} parameters")


if __name__ == "__main__":
    main()
