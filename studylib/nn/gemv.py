"""Single-row matmuls for decoding: ``x @ W^T`` against a cached contiguous ``W^T``.

Measured on this project's CPU (batch-1 decoding of the paper models, fp32, one thread): for one
input row, ``F.linear(x, W)`` streams the weight at ~17 GB/s while ``x @ Wt`` with ``Wt = W.T``
stored contiguously runs at ~40 GB/s, and decoding is bound by reading the weights once per token.
So, at inference (grad disabled) on a single row, the layers below multiply by a transposed copy
that is made once and cached on the module; the cache key is the weight's storage, version counter
(bumped by every in-place optimizer update), dtype and device, so a changed weight is never served
stale. Training and every multi-row call keep ``F.linear``. The copy is a plain attribute: it is not
in the ``state_dict`` and costs one extra copy of the weights only while decoding.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def transposed(owner: nn.Module, w: torch.Tensor, slot: str) -> torch.Tensor:
    """``w`` with its last two dims swapped, contiguous, cached on ``owner`` under ``slot``."""
    key = (w.data_ptr(), w._version, w.dtype, w.device)
    cache = owner.__dict__.setdefault("_transposed_cache", {})
    hit = cache.get(slot)
    if hit is None or hit[0] != key:
        hit = (key, w.detach().transpose(-2, -1).contiguous())
        cache[slot] = hit
    return hit[1]


def one_row(x: torch.Tensor) -> bool:
    """True for a single input row at inference: the case the cached transpose serves."""
    return x.numel() == x.shape[-1] and not torch.is_grad_enabled()


class Linear(nn.Linear):
    """``nn.Linear`` (no bias) that decodes a single row against a cached transposed weight."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if one_row(x):
            return x @ transposed(self, self.weight, "weight")
        return F.linear(x, self.weight)
