"""The optimizer and its schedule (the one place; the trainer and the benchmarks import it):
AdamW with weight decay on >=2-D tensors only, linear warmup + cosine decay, steps per epoch; the
routers' weights in a group of their own at ``train.router_lr_scale`` times the schedule's lr
when that is not 1 (:func:`set_lr` applies a group's ``lr_scale``)."""
from __future__ import annotations

import math

import torch

from studylib.config import ConfigError, TrainConfig
from studylib.data.windows import steps_per_epoch


def warmup_steps(total_steps: int, cfg: TrainConfig) -> int:
    return int(round(cfg.warmup_frac * total_steps))


def lr_at(step: int, total_steps: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based) of ``total_steps``.

    Linear warmup over the first W = round(warmup_frac * total) steps, ``lr*(s+1)/(W+1)``,
    reaching the peak ``lr`` at step W; then cosine from ``lr`` at step W to ``min_lr`` at the
    last step (total - 1); ``min_lr`` beyond.
    """
    w = warmup_steps(total_steps, cfg)
    if step < w:
        return cfg.lr * (step + 1) / (w + 1)
    span = total_steps - 1 - w
    p = 1.0 if span <= 0 else min(1.0, (step - w) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * p))


def param_groups(model: torch.nn.Module, weight_decay: float, router_lr_scale: float = 1.0) -> list[dict]:
    """AdamW groups: decay on >=2-D tensors (matrices, embeddings, expert stacks), none on 1-D;
    with ``router_lr_scale != 1`` a third group, the routers' weights (``...router.weight``, with
    decay), whose ``lr_scale`` :func:`set_lr` applies. Frozen weights (``requires_grad`` False)
    are in no group."""
    decay, no_decay, router, names_d, names_n, names_r = [], [], [], [], [], []
    for name, p in model.named_parameters():  # shared (tied) parameters appear once
        if not p.requires_grad:
            continue
        if router_lr_scale != 1.0 and name.endswith("router.weight"):
            router.append(p), names_r.append(name)
        elif p.ndim >= 2:
            decay.append(p), names_d.append(name)
        else:
            no_decay.append(p), names_n.append(name)
    groups = [{"params": decay, "weight_decay": weight_decay, "names": names_d},
              {"params": no_decay, "weight_decay": 0.0, "names": names_n}]
    if router:
        groups.append({"params": router, "weight_decay": weight_decay, "names": names_r,
                       "lr_scale": float(router_lr_scale)})
    return groups


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's ``lr`` on every group, times the group's ``lr_scale`` (the routers' group)."""
    for g in opt.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over :func:`param_groups` (fused where available, else foreach, else plain)."""
    groups = [{k: v for k, v in g.items() if k != "names"}
              for g in param_groups(model, cfg.weight_decay, cfg.router_lr_scale)]
    for impl in ({"fused": True}, {"foreach": True}, {}):
        try:
            return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), **impl)
        except (RuntimeError, TypeError, ValueError):
            continue
    raise RuntimeError("could not build AdamW")  # pragma: no cover


def total_steps_for(cfg: TrainConfig, n_train: int) -> int:
    """``train.max_steps``, or one epoch of ``n_train`` windows (:func:`steps_per_epoch`)."""
    if cfg.max_steps is not None:
        return cfg.max_steps
    if n_train < cfg.batch_size * cfg.grad_accum:
        raise ConfigError(f"train.batch_size*grad_accum={cfg.batch_size * cfg.grad_accum} exceeds the "
                          f"{n_train} training windows: set train.max_steps or use more data")
    return steps_per_epoch(n_train, cfg.batch_size, cfg.grad_accum)
