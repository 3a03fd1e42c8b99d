"""Validation loss of a model over a set of windows, with its router statistics averaged over the
windows (no dropout); under DDP each rank evaluates its share and the sums are combined."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from studylib.nn.precision import autocast
from studylib.run.dist import Dist


def _tree_add(acc, x, w: float):
    """acc + w*x over nested lists/dicts of numbers (None stays None; non-numbers: first seen)."""
    if x is None:
        return acc
    if isinstance(x, dict):
        acc = {} if acc is None else acc
        for k, v in x.items():
            acc[k] = _tree_add(acc.get(k), v, w)
        return acc
    if isinstance(x, (list, tuple)):
        acc = [None] * len(x) if acc is None else acc
        return [_tree_add(a, v, w) for a, v in zip(acc, x)]
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return (acc or 0.0) + w * float(x)
    return x if acc is None else acc


def _tree_scale(x, s: float):
    if isinstance(x, dict):
        return {k: _tree_scale(v, s) for k, v in x.items()}
    if isinstance(x, list):
        return [_tree_scale(v, s) for v in x]
    if isinstance(x, float):
        return x * s
    return x


@torch.no_grad()
def _local_sums(model, data, idx: np.ndarray, batch_size: int, device: torch.device,
                amp_dtype: Optional[torch.dtype], dist: Dist) -> tuple:
    """(loss sum, window count, window-weighted router stats) over this rank's share of ``idx``."""
    loss_sum, n_sum, stats_acc = 0.0, 0, None
    for start in range(0, len(idx), batch_size):
        mine = idx[start:start + batch_size][dist.rank::dist.world]
        if len(mine) == 0:
            continue
        w = data.windows(mine).to(device, non_blocking=True)
        with autocast(device, amp_dtype):
            out = model(w[:, :-1], w[:, 1:], stats=True, return_logits=False)
        n = len(mine)
        loss_sum += float(out.loss) * n
        n_sum += n
        stats_acc = _tree_add(stats_acc, list(out.router_stats), n)
    return loss_sum, n_sum, stats_acc


def evaluate(model, data, idx: np.ndarray, batch_size: int, device: torch.device,
             amp_dtype: Optional[torch.dtype], dist: Optional[Dist] = None) -> dict:
    """Mean next-token CE over windows ``idx`` (no dropout), and router stats averaged over batches.

    Under DDP each rank takes ``r::world`` of every batch; sums are combined across ranks.
    """
    dist = dist or Dist()
    was_training = model.training
    model.eval()
    local = _local_sums(model, data, idx, batch_size, device, amp_dtype, dist)
    model.train(was_training)
    parts = dist.gather(local)
    loss_sum = sum(p[0] for p in parts)
    n_sum = sum(p[1] for p in parts)
    stats = None
    for p in parts:
        stats = _tree_add(stats, p[2], 1.0)
    stats = _tree_scale(stats, 1.0 / max(n_sum, 1)) if stats is not None else None
    return {"val_loss": loss_sum / max(n_sum, 1), "n_windows": n_sum, "router": stats}
