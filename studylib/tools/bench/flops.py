"""Achieved-FLOP accounting: the measured matmul peak (the MFU denominator); the analytic
training FLOPs per token are :func:`studylib.config.accounting.train_flops_per_token` (re-exported).
"""
from __future__ import annotations

import statistics
import time
from typing import Optional

import torch

from studylib.config.accounting import norm_params, train_flops_per_token  # noqa: F401  (re-exported)
from studylib.tools.bench.timing import sync


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


def cpu_matmul_peak(amp: Optional[torch.dtype] = None, n: int = 2048, reps: int = 5) -> float:
    """GFLOP/s of the fastest of ``reps`` n x n x n matmuls in ``amp`` or fp32, timed in process CPU
    time (this process's torch threads; other processes on the cores do not lower it)."""
    dt = amp or torch.float32
    a = torch.randn(n, n, dtype=dt)
    b = torch.randn(n, n, dtype=dt)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        a @ b
        best = min(best, time.process_time() - t0)
    return 2 * n ** 3 / best / 1e9
