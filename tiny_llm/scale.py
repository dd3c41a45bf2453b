"""Step 16: scale out. Step 10's loop on several processes (ranks), one per device.

torchrun starts the ranks and tells each its RANK, LOCAL_RANK and WORLD_SIZE. Every rank builds
the same model from the same seed and draws the same batch windows; each keeps its own slice of
the rows, and DistributedDataParallel averages the gradients in backward, so every rank makes the
same update. With --shard, FSDP2 (fully_shard) instead keeps 1/world of each parameter, gradient
and optimizer moment on each rank and gathers the rest only while a block runs.

Train on 2 ranks:  uv run torchrun --standalone --nproc-per-node 2 -m tiny_llm.scale --preset tiny
The step's check:  uv run python -m tiny_llm.scale   (runs its own 2 ranks; no torchrun needed)
"""

import argparse
import contextlib
import io
import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from tiny_llm.checkpoint import load_checkpoint
from tiny_llm.data import ensure_data
from tiny_llm.device import pick_device
from tiny_llm.generate import story_from_checkpoint
from tiny_llm.gpt import GPT, PRESETS
from tiny_llm.paths import DATA_DIR
from tiny_llm.processes import OneProcess
from tiny_llm.train import TrainConfig, parse_args, train

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0's CPU


class DataParallel(OneProcess):
    """Step 10's hooks for one rank of a job: DDP replicas, or FSDP2 shards with shard=True."""

    def __init__(self, device, shard=False):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device, self.shard = device, shard

    def wrap(self, model):
        if not self.shard:  # a full replica per rank; backward all-reduces the gradients
            return DistributedDataParallel(model, device_ids=[self.device.index]
                                           if self.device.type == "cuda" else None)
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        for layers in (m for m in model.children() if isinstance(m, torch.nn.ModuleList)):
            for layer in layers:  # each block gathers its weights only while it runs
                fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)  # the rest: embeddings, final norm, head

    def unwrap(self, model):
        return model if self.shard else model.module

    def no_sync(self, model, sync):
        if sync:
            return contextlib.nullcontext()
        return model.no_sync() if not self.shard else gradient_sync_off(model)

    def mean(self, value):
        total = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(total)  # a sum over the ranks; every rank gets it
        return total.item() / self.world_size

    def state_dicts(self, model, optimizer):
        if not self.shard:  # every replica holds it all: the same checkpoint as one process
            return model.module.state_dict(), optimizer.state_dict()
        return (get_model_state_dict(model, options=FULL),  # all-gathers every shard
                get_optimizer_state_dict(model, optimizer, options=FULL))

    def load_optimizer(self, model, optimizer, state):
        sharded = isinstance(state["param_groups"][0]["params"][0], str)  # FSDP2 saves names
        if sharded != self.shard:
            raise ValueError(f"this checkpoint was written {'with' if sharded else 'without'} "
                             "--shard: resume it the same way")
        if not self.shard:
            return optimizer.load_state_dict(state)
        options = StateDictOptions(full_state_dict=True)  # each rank keeps its shard of it
        set_optimizer_state_dict(model, optimizer, state, options=options)


@contextlib.contextmanager
def gradient_sync_off(model):
    """FSDP2's no_sync: keep this micro-batch's gradients unreduced, added to the next."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def start(device_kind=None):
    """Join the job torchrun started: this rank's device and the process group (nccl or gloo)."""
    kind = device_kind or ("cuda" if pick_device().type == "cuda" else "cpu")  # step 01's
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"data-parallel training runs on cpu (gloo) or cuda (nccl), not {kind!r}")
    device = torch.device("cpu")
    if kind == "cuda":
        refuse_more_ranks_than_gpus()  # LOCAL_RANK must name a GPU that is here
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if kind == "cuda" else "gloo", device_id=device
                            if kind == "cuda" else None)
    return device


def refuse_more_ranks_than_gpus():
    """Stop, before any work, a job with more ranks on this machine than GPUs.

    Each rank takes GPU number LOCAL_RANK; one past the last would fail inside CUDA ("invalid
    device ordinal"). Local rank 0 says why in one line; the others wait to be stopped, so
    that torchrun sees rank 0's failure, with its line, first.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    ranks = max(int(os.environ.get("LOCAL_WORLD_SIZE", 1)), local_rank + 1)
    gpus = torch.cuda.device_count()
    if ranks <= gpus:
        return
    if local_rank != 0:
        time.sleep(30)
        raise SystemExit(1)
    raise ValueError(f"{ranks} ranks on this machine but {gpus} GPU{'' if gpus == 1 else 's'}: "
                     f"one rank per GPU. Start {gpus} with --nproc-per-node {gpus}, or run "
                     f"the ranks on the CPU with gloo: --device cpu")


def train_ranks(cfg, device, shard=False, hooks=None):
    """This rank's part of the run; rank 0 alone prepares data, prints and writes."""
    parallel = DataParallel(device, shard)
    if parallel.rank == 0:
        ensure_data(Path(cfg.data_dir))  # once, before anyone reads it
    else:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the rest of this process)
    dist.barrier()
    print(f"{'ranks':<12} {parallel.world_size} x {device.type} ({dist.get_backend()}), "
          f"{'FSDP2 shards' if shard else 'DDP replicas'}")
    if shard and cfg.optimizer == "muon":  # Muon orthogonalises whole matrices; a rank has 1/world
        print(f"{'optimizer':<12} adamw: FSDP2 shards the matrices that Muon needs whole")
        cfg = replace(cfg, optimizer="adamw")
    return train(replace(cfg, device=str(device)), parallel, hooks)


# --- the arithmetic of an all-reduce ------------------------------------------------------

def ring_bytes(n_params, world_size, bytes_per_value=4):
    """Bytes each rank sends (and receives) to all-reduce n_params gradients around a ring.

    A ring all-reduce cuts the gradients into world_size chunks: world_size - 1 steps of
    reduce-scatter, then world_size - 1 of all-gather, each sending one chunk per rank:
    2·(n-1)/n of the whole. 1M float32 gradients on 2 ranks: 4 MB; on 8: 7 MB."""
    return 2 * (world_size - 1) / world_size * n_params * bytes_per_value


def crossover_tokens(world_size, flops_per_s, bytes_per_s):
    """Tokens per rank per step below which the all-reduce takes longer than the compute.

    Compute is about 6·N FLOPs per token, the ring moves 2·(n-1)/n · 4·N bytes: N cancels."""
    return ring_bytes(1, world_size) / bytes_per_s / (6 / flops_per_s)


MACHINES = [  # (what, ranks, FLOP/s a training step reaches, bytes/s between ranks): see ch. 16
    ("this 2-core CPU, 2 ranks", 2, 80e9, 2e9),
    ("8 GPUs on NVLink", 8, 400e12, 400e9),
    ("16 GPUs, 2 nodes, 100 Gb/s", 16, 400e12, 12.5e9),
]


def print_arithmetic(windows=16):
    """The all-reduce table of every preset, then where communication starts to dominate."""
    print(f"{'all-reduce':<14} float32 gradients of every parameter, once per step;")
    print(f"{'':<14} a ring sends 2·(n-1)/n of them from each rank (and receives as many)")
    print(f"{'preset':<8}{'parameters':>13}{'gradients':>12}{'n=2 sends':>12}{'n=8 sends':>12}"
          f"{f'compute, {windows} windows':>23}")
    for name, config in PRESETS.items():
        with torch.device("meta"):  # shapes only: no memory, no time
            n = GPT(config).num_params()
        flops = 6 * n * windows * config.max_seq_len
        print(f"{name:<8}{n:>13,}{n * 4 / 1e6:>9.2f} MB{ring_bytes(n, 2) / 1e6:>9.2f} MB"
              f"{ring_bytes(n, 8) / 1e6:>9.2f} MB{flops / 1e9:>17.1f} GFLOP")
    print(f"{'crossover':<14} tokens per rank per step below which sending beats computing:")
    for what, n, flops, bandwidth in MACHINES:
        print(f"  {what:<28} {flops / 1e12:g} TFLOP/s, {bandwidth / 1e9:g} GB/s: "
              f"{crossover_tokens(n, flops, bandwidth):,.0f}")


# --- the check: 2 ranks with B/2 windows each equal 1 rank with B -------------------------

class Watched(DataParallel):
    """DataParallel that, at every checkpoint, measures how far each rank's weights are from
    rank 0's (DDP only): [0.0, 0.0, ...] when the replicas stay identical."""

    def __init__(self, device):
        super().__init__(device)
        self.spreads = []

    def state_dicts(self, model, optimizer):
        states = super().state_dicts(model, optimizer)
        mine = torch.cat([t.detach().flatten().float() for t in states[0].values()])
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine)
        self.spreads.append(max((w - every[0]).abs().max().item() for w in every))
        return states


def _rank(rank, world_size, port, cfg, resume_at, result):
    """One spawned rank: train to resume_at, resume to the end, report the replica spreads."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    parallel = Watched(torch.device("cpu"))
    train(replace(cfg, max_steps=resume_at), parallel)
    dist.barrier()  # rank 0's checkpoint is written before anyone resumes from it
    train(replace(cfg, resume=True), parallel)
    if rank == 0:
        Path(result).write_text(json.dumps(parallel.spreads))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def compare(data_dir, work, steps=4, batch_size=8, world_size=2):
    """Train `steps` steps on 1 rank with batch_size windows, and on world_size ranks with
    batch_size // world_size each (resumed halfway). Returns both losses, the largest weight
    difference, and each step's largest difference between the ranks' weights."""
    base = TrainConfig(preset="tiny", max_steps=steps, batch_size=batch_size, warmup_steps=2,
                       eval_interval=1, eval_iters=1, data_dir=str(data_dir), device="cpu",
                       dtype="float32", lr_decay_steps=steps, time_budget=0)
    with contextlib.redirect_stdout(io.StringIO()):
        train(replace(base, out=str(work / "one")))
    ranks = replace(base, batch_size=batch_size // world_size, out=str(work / "ranks"))
    result = work / "spreads.json"
    mp.spawn(_rank, (world_size, free_port(), ranks, steps // 2, str(result)), nprocs=world_size)
    losses = [[json.loads(line)["train_loss"] for line in (work / run / "log.jsonl")
               .read_text().splitlines()][1:] for run in ("one", "ranks")]
    one, two = (load_checkpoint(work / run / "ckpt.pt")["model"] for run in ("one", "ranks"))
    weights = max((one[k] - two[k]).abs().max().item() for k in one)
    return losses, weights, json.loads(result.read_text())


def check(data_dir=DATA_DIR, tolerance=1e-5):
    """The step's check: this process's world, the 1-rank vs 2-rank equivalence, the arithmetic."""
    print(f"{'world size':<14} {os.environ.get('WORLD_SIZE', 1)} (not under torchrun: "
          f"the check starts 2 gloo ranks itself)")
    ensure_data(Path(data_dir))
    with tempfile.TemporaryDirectory() as work:
        (one, two), weights, spreads = compare(data_dir, Path(work))
    print(f"{'equivalence':<14} tiny preset, float32: 1 rank x 8 windows vs 2 ranks x 4 windows,")
    print(f"{'':<14} the 2-rank run stopped after step 2 and resumed")
    for step, (a, b) in enumerate(zip(one, two, strict=True), start=1):
        print(f"{'  step ' + str(step):<14} loss {a:.4f} vs {b:.4f}")
    loss_gap = max(abs(a - b) / abs(a) for a, b in zip(one, two, strict=True))
    print(f"{'  losses':<14} {'equal' if loss_gap <= tolerance else 'DIFFERENT'} within "
          f"{tolerance:g} (largest relative difference {loss_gap:.1e})")
    print(f"{'  weights':<14} {'equal' if weights <= tolerance else 'DIFFERENT'} within "
          f"{tolerance:g} (largest difference {weights:.1e})")
    same = all(s == 0 for s in spreads)
    print(f"{'  replicas':<14} {'identical' if same else 'DIFFERENT'} on both ranks after each "
          f"of {len(spreads)} steps (largest difference {max(spreads):g})")
    print_arithmetic()


# --- the command: one job of torchrun's ------------------------------------------------------

@contextlib.contextmanager
def one_line_per_failure(rank):
    """Print a failing rank's error as one line, `rank 1: error: ...`, before anything else.

    When a rank fails, the others lose it in their next collective (gloo says "Connection closed
    by peer") and torchrun adds its summary: the line that says what went wrong comes first,
    and the ranks that only lost a peer say so in a line of their own, without a traceback.
    """
    try:
        yield
    except (OSError, FloatingPointError, ValueError) as err:  # the mistakes step 10 explains
        print(f"rank {rank}: error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except Exception as err:
        if lost_a_rank(err):
            print(f"rank {rank}: stopped: another rank has failed (its error is above)",
                  file=sys.stderr, flush=True)
            raise SystemExit(1) from None
        print(f"rank {rank}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        raise  # a bug, not a setting: its traceback follows the line


def lost_a_rank(err):
    """True for the error a collective raises when another rank has gone away."""
    return isinstance(err, dist.DistError) or (
        isinstance(err, RuntimeError)
        and any(s in str(err) for s in ("Connection closed by peer", "Connection reset by peer")))


@record  # a failing rank's error goes into torchrun's summary
def main(config_class=TrainConfig, hooks=None):
    """The command under torchrun: step 10's flags (a later step's config and hooks, if it
    passes them: step 17's `instruct train`), on every rank."""
    if "WORLD_SIZE" not in os.environ:  # plain `python -m tiny_llm.scale`
        check()
        return
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--shard", action="store_true", help="FSDP2 instead of DDP")
    args, rest = parser.parse_known_args()
    sys.argv = [sys.argv[0], *rest]  # the rest are step 10's flags
    with one_line_per_failure(os.environ.get("RANK", "?")):  # on error: the line, then exit
        cfg, sample_tokens = parse_args(config_class)
        device = start(cfg.device.split(":")[0] if cfg.device else None)
        result = train_ranks(cfg, device, args.shard, hooks)
        print(f"{'saved':<12} {result['checkpoint']} (step {result['step']})")
        print(f"{'time':<12} {result['time_s']:.1f} s, "
              f"{result['tokens'] / max(result['time_s'], 1e-9):,.0f} tokens/s with evaluations")
        if sample_tokens > 0 and dist.get_rank() == 0:  # as step 10 ends: a story
            story = story_from_checkpoint(result["checkpoint"], sample_tokens, cfg.seed, device,
                                          cfg.data_dir)
            print(f"{'story':<12} {story}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
