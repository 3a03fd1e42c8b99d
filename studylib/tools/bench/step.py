"""The benchmarked training step: which variants a train bench times, how each is built (model and
optimizer) and the one full step it runs.

One step is: forward with targets, loss + aux loss, backward, AdamW step, zero_grad, under the
autocast of :func:`studylib.nn.precision.autocast` (bf16 keeps fp32 weights, as the trainer does).
The optimizer is the trainer's own (:func:`studylib.run.optim.make_optimizer`) with the trainer's
default settings (:data:`OPTIMIZER_SETTINGS`: lr 3e-4, betas (0.9, 0.95), weight decay 0.1 on
>=2-D tensors), whatever the preset trains with: the bench times the step, not a schedule.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

import torch

from studylib.config import ConfigError, ModelConfig, TrainConfig
from studylib.nn.precision import autocast
from studylib.run.optim import make_optimizer
from studylib.tools.bench.hf import build_hf, hf_supported
from studylib.tools.bench.opgroups import scope
from studylib.tools.bench.variant import COMPILE_MODES, Variant, build_ours, built_params

OPTIMIZER_SETTINGS = TrainConfig()  # lr, betas and weight decay: the trainer's defaults


def train_variants(pairs: Sequence[tuple[str, ModelConfig]], dispatches: Optional[Sequence[str]],
                   peer: Optional[str], compile: str = "off") -> list[Variant]:
    """Each model of ``pairs``, the MoE ones once per dispatch path, eager and/or compiled per
    ``compile``; with ``peer="hf"`` the transformers peer of each model that has one."""
    if compile not in COMPILE_MODES:
        raise ConfigError(f"--compile: must be one of {list(COMPILE_MODES)}, got {compile!r}")
    flags = {"off": [False], "on": [True], "both": [False, True]}[compile]
    out = []
    for name, cfg in pairs:
        paths = list(dispatches) if (cfg.ffn.kind == "moe" and dispatches) else [None]
        for c in flags:
            for d in paths:
                out.append(Variant(name, "studylib", d, cfg, compiled=c))
        if peer == "hf":
            if hf_supported(cfg):
                print(f"note: {name}: {hf_supported(cfg)}; skipped", file=sys.stderr)
            else:
                out.append(Variant(name, "hf", None, cfg))
    return out


def build_variant(v: Variant, device, seed: int, hf_experts: str = "eager", train: bool = True,
                  copy: bool = True) -> None:
    """Build the variant's model (HF peers get our weights when ``copy``) and its optimizer."""
    if v.impl == "studylib":
        v.net = build_ours(v.cfg, v.dispatch, seed, device)
    else:
        ours = build_ours(v.cfg, v.dispatch, seed, device) if copy else None
        v.net = build_hf(v.cfg, ours, hf_experts, device)
        del ours
    v.net.train(train)
    v.n_params = built_params(v.net)
    if train:
        v.opt = make_optimizer(v.net, OPTIMIZER_SETTINGS)
    if v.compiled:  # after the optimizer: it holds the module's own parameters
        v.net = torch.compile(v.net)


def train_step(v: Variant, idx: torch.Tensor, tgt: torch.Tensor, device: torch.device,
               amp: Optional[torch.dtype], clip: float = 0.0) -> None:
    """One full training step of ``v`` on the batch ``idx`` -> ``tgt``; ``clip > 0`` clips the
    gradients' norm first, as the trainer does (in the profiler's ``optimizer`` scope)."""
    with autocast(device, amp):
        if v.impl == "hf":
            out = v.net(input_ids=idx, labels=idx, use_cache=False)  # HF shifts labels itself
            loss = out.loss  # includes router_aux_loss_coef * aux for Mixtral
        else:
            out = v.net(idx, tgt, return_logits=False)
            loss = out.loss + out.aux_loss
    loss.backward()
    if clip > 0:
        with scope("optimizer"):
            torch.nn.utils.clip_grad_norm_(v.net.parameters(), clip)
    v.opt.step()
    v.opt.zero_grad(set_to_none=True)


def random_batch(vocab: int, batch: int, context: int, seed: int,
                 device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens from ``seed``: ``context`` input tokens per row and their next tokens."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (batch, context + 1), generator=g).to(device)
    return data[:, :-1], data[:, 1:]
