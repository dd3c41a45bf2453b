"""Shared helper (step 15): what the speedruns' way of tuning adds to a run, apart from the loop.

- Every group of MuonAdamW learns at its own multiple of the schedule's rate (TrainConfig's
  lr_muon, lr_embed, lr_gains; the loop multiplies), and Muon's step for a matrix follows one of
  two rules, MUON_SCALES.
- ModernGPT's optional parts come from the run's flags (model_parts: --qk-norm ...).
- Training rows can be aligned to the stories (StoryRows, --story-starts).
- check_tuning refuses a setting that cannot work, when the config is made.
"""

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from tiny_llm.checkpoint import model_class
from tiny_llm.data import NextTokenDataset

# Muon's step size for an (A, B) matrix, times the learning rate. rms (Moonshot, 2025): 0.2·√max,
# an update of AdamW's typical size, so one learning rate serves Muon and AdamW alike. shape
# (modded-nanogpt): √max(1, A/B), 1 for a square matrix; Muon then wants its own, larger rate.
MUON_SCALES = {"rms": lambda a, b: 0.2 * math.sqrt(max(a, b)),
               "shape": lambda a, b: math.sqrt(max(1.0, a / b))}
GROUPS = ("muon", "embed", "gains")  # MuonAdamW's groups, in muon_groups' order
PARTS = ("qk_norm", "untied", "mlp", "value_embeds", "x0_mix", "logit_softcap")  # ModernGPT's


@dataclass
class Tuning:
    """Step 15's fields of TrainConfig (which inherits them): each a flag, as every field is."""

    lr_muon: float = 1.0  # each group's learning rate, as a multiple of lr: Muon's matrices
    lr_embed: float = 1.0  # the embedding (and the output head tied to it)
    lr_gains: float = 1.0  # norms' gains, biases and other scalars
    muon_scale: str = "rms"  # Muon's step for a matrix: a rule of MUON_SCALES
    story_starts: bool = False  # rows aligned to the stories (StoryRows)
    qk_norm: bool = False  # ModernGPT's optional parts (ModernConfig), for --model modern
    untied: bool = False  # an output head of its own: tie_embeddings=False
    mlp: str = "swiglu"
    value_embeds: bool = False
    x0_mix: bool = False
    logit_softcap: float = 0.0


def model_parts(cfg):
    """The ModernConfig fields of a run's part flags; {} for step 08's GPT."""
    if cfg.model != "modern":
        return {}
    parts = dict(qk_norm=cfg.qk_norm, tie_embeddings=not cfg.untied, mlp=cfg.mlp,
                 value_embeds=cfg.value_embeds, x0_mix=cfg.x0_mix, logit_softcap=cfg.logit_softcap)
    if cfg.mlp == "relu2":  # two matrices instead of SwiGLU's three: 4·d_model wide
        parts["d_ff"] = 4 * model_class(cfg.model).presets[cfg.preset].d_model
    return parts


def check_tuning(cfg):
    """Raise a clear error for a step 15 setting of a TrainConfig that cannot work."""
    scales = {f"lr_{g}": getattr(cfg, f"lr_{g}") for g in GROUPS}
    if not all(isinstance(v, (int, float)) and 0 < v * cfg.lr < 1 for v in scales.values()):
        raise ValueError(f"each group's learning rate, --lr times its scale, must lie in (0, 1); "
                         f"got --lr {cfg.lr} and {scales}")
    if cfg.optimizer == "adamw" and any(v != 1 for v in scales.values()):
        raise ValueError("--lr-muon, --lr-embed and --lr-gains scale the groups of "
                         "--optimizer muon; with adamw, leave them at 1")
    if cfg.muon_scale not in MUON_SCALES:
        raise ValueError(f"muon_scale must be one of {', '.join(MUON_SCALES)}, got "
                         f"{cfg.muon_scale!r}")
    changed = ["--" + n.replace("_", "-") for n in PARTS if getattr(cfg, n) != getattr(Tuning, n)]
    if cfg.model != "modern" and changed:
        raise ValueError(f"{', '.join(changed)} change a part of ModernGPT (step 15): add "
                         "--model modern, or leave them out")
    replace(model_class(cfg.model).presets[cfg.preset], **model_parts(cfg))  # its own checks


class StoryRows:
    """Training windows aligned to the stories, as the speedruns align rows to documents: each
    begins at a story's first token (just after an EOT, or token 0) or a whole number of
    windows on from it, so every token of a long story is still read. A window runs on into the
    next story if its own ends first. data.get_batch hands the drawing to get_batch below."""

    def __init__(self, data, eot_id, seq_len):
        self.windows = NextTokenDataset(data, seq_len)  # step 03's: window i is data[i:i+T+1]
        firsts = np.concatenate([[0], np.flatnonzero(np.asarray(data) == eot_id) + 1])
        lengths = np.diff(np.append(firsts, len(data))) - 1  # each story's tokens, without EOT
        chunks = np.maximum(1, (lengths + seq_len - 1) // seq_len)  # windows to read them all
        offsets = np.arange(chunks.sum()) - np.repeat(np.cumsum(chunks) - chunks, chunks)
        starts = np.repeat(firsts, chunks) + offsets * seq_len
        self.data, self.seq_len = data, seq_len
        self.starts = torch.from_numpy(starts[starts < len(data) - seq_len])
        if len(self.starts) < 2:  # every row would be the same window
            raise ValueError(f"only {len(self.starts)} story starts {seq_len + 1} tokens or more "
                             f"before the end of the data ({len(data):,} tokens, EOT id "
                             f"{eot_id}): prepare stories with tiny_llm.data, or leave out "
                             "--story-starts")

    def get_batch(self, batch_size, seq_len, device=None, generator=None, part=slice(None)):
        """As data.get_batch, but each window begins where StoryRows lets one begin."""
        if seq_len != self.seq_len:
            raise ValueError(f"the rows were made for {self.seq_len} tokens, asked for {seq_len}")
        i = torch.randint(len(self.starts), (batch_size,), generator=generator)[part]
        x, y = map(torch.stack, zip(*(self.windows[s] for s in self.starts[i].tolist()),
                                    strict=True))
        return (x, y) if device is None else (x.to(device), y.to(device))


def story_rows(cfg, data, eot_id, seq_len):
    """The training rows: aligned to the stories with --story-starts, else the data as it is."""
    return StoryRows(data, eot_id, seq_len) if cfg.story_starts else data
