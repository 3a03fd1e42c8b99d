"""The timing harness, the one both benches use: interleaved rounds over variants.

Every variant is built once and kept. Round r runs every variant's call once, in an order
rotated by r, so slow drifts of a shared machine hit all variants alike; the first ``warmup``
rounds are not recorded. Per timed call a variant records its wall time (between device
synchronisations), its process CPU time (user, sys in clock ticks; and the total at ns
resolution) and its minor page faults. Speeds are
summarised by their median and spread; ratios between variants are medians of per-round paired
ratios (``t_ref / t_variant`` of the same round), which cancel most of the drift.
"""
from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from typing import Callable, Iterator, Optional, Sequence

import torch

from studylib.tools.bench.variant import Variant


def progress_printer(progress: bool) -> Callable[[str], None]:
    """A function that prints a progress line to stderr, or does nothing."""
    return (lambda m: print(m, file=sys.stderr, flush=True)) if progress else (lambda m: None)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); a no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_call(v: Variant, device: torch.device, record: bool) -> None:
    sync(device)
    c0, f0 = os.times(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p0, t0 = time.process_time(), time.perf_counter()
    v.output = v.call()
    sync(device)
    dt, dp = time.perf_counter() - t0, time.process_time() - p0
    c1, f1 = os.times(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    if record:
        v.times.append(dt)
        v.cpu.append((c1.user - c0.user, c1.system - c0.system))  # clock ticks (10 ms): sums only
        v.cpu_total.append(dp)
        v.faults.append(f1 - f0)


def interleaved_rounds(variants: Sequence[Variant], warmup: int, rounds: int,
                       device: torch.device) -> Iterator[tuple[int, bool]]:
    """Run ``warmup + rounds`` rounds of every variant's ``call``, rotating the order per round.

    Yields ``(i, timed)`` after each round: ``i`` counts the rounds of its phase from 1, and
    ``timed`` is False during the warm-up (whose calls are not recorded)."""
    variants = list(variants)
    n = len(variants)
    for r in range(warmup + rounds):
        timed = r >= warmup
        for v in variants[r % n:] + variants[:r % n]:
            _timed_call(v, device, timed)
        yield (r - warmup + 1 if timed else r + 1), timed


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """median over rounds of num[r] / den[r] (times: ref/variant = variant's speed-up over ref)."""
    return statistics.median(a / b for a, b in zip(num, den))


def speedup(ref: Optional[Variant], v: Variant) -> float:
    """``v``'s paired speed ratio over ``ref`` (NaN without a ``ref``)."""
    return paired_ratio(ref.times, v.times) if ref is not None else float("nan")


def speed_stats(times: Sequence[float], work: float) -> dict:
    """Speeds (``work / time``) over the timed calls: median, min, max and quartiles."""
    ts = sorted(work / t for t in times)
    q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
    return {"tok_s": statistics.median(ts), "tok_s_min": ts[0], "tok_s_max": ts[-1],
            "tok_s_q1": q[0], "tok_s_q3": q[2]}
