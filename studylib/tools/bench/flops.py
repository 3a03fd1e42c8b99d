"""Achieved-FLOP accounting: analytic training FLOPs per token and the measured matmul peak
(the MFU denominator).

FLOPs per trained token, forward + backward = 3 x forward: ``6 * N_mm + 6 * L * S * d_attn``
where ``N_mm`` are the parameters a token multiplies by: the active parameters
(:func:`studylib.config.count_params`) without the RMSNorm gains, with the tied embedding counted
once *as the LM-head matmul* (the lookup is free) and the router included; ``L * S * d_attn`` is
causal attention (QK^T and AV each ``2 * S/2 * d_attn`` per token and layer on average,
d_attn = heads * head_dim).
"""
from __future__ import annotations

import statistics
import time
from typing import Optional

import torch

from studylib.config import ModelConfig, count_params
from studylib.tools.bench.timing import sync


def norm_params(cfg: ModelConfig) -> int:
    """RMSNorm gains: two per layer and the final norm (stored, but no matmul)."""
    return (2 * cfg.n_layers + 1) * cfg.d_model


def train_flops_per_token(cfg: ModelConfig, seq: int) -> float:
    """Analytic training FLOPs per token (see the module docstring)."""
    n_mm = count_params(cfg).active - norm_params(cfg)
    return 6.0 * n_mm + 6.0 * cfg.n_layers * seq * cfg.n_heads * cfg.head_dim


def peak_size(amp: Optional[torch.dtype] = None, n: int = 2048, device: str | torch.device = "cpu",
              budget_s: float = 1.0, smallest: int = 256) -> int:
    """``n``, halved (not below ``smallest``) while one n x n x n product takes over ``budget_s``:
    a dtype the hardware emulates (bf16 on a CPU without AVX-512 BF16) must not stall the bench."""
    device = torch.device(device)
    dt = amp or torch.float32
    while n > smallest:
        a = torch.randn(n, n, device=device, dtype=dt)
        sync(device)
        t0 = time.perf_counter()
        a @ a
        sync(device)
        if time.perf_counter() - t0 <= budget_s:
            break
        n //= 2
    return n


def matmul_peak(amp: Optional[torch.dtype] = None, n: int = 2048, reps: int = 5,
                device: str | torch.device = "cpu") -> float:
    """Median GFLOP/s of an n x n x n matmul in ``amp`` (bf16) or fp32."""
    device = torch.device(device)
    dt = amp or torch.float32
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    a @ b
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times) / 1e9
