"""``bench train``: training-step throughput per variant, timed in interleaved rounds, and
``--profile``: torch.profiler's top-ops table of one step per variant.

Variants: each model of the preset, the MoE ones once per dispatch path, and with ``peer="hf"``
the same models built as transformers' Llama / Mixtral (:mod:`studylib.tools.bench.hf`). The
step is :func:`studylib.tools.bench.step.train_step`; timing, :mod:`studylib.tools.bench.timing`;
FLOPs and MFU, :mod:`studylib.tools.bench.flops`; memory, :mod:`studylib.tools.bench.memory`.
``mfu`` is achieved FLOP/s over a matmul peak measured in the same process, same dtype (before
the rounds and once per round; median).
"""
from __future__ import annotations

import functools
import os
import statistics
import sys
from typing import Any, Optional, Sequence

import torch

from studylib.config import ConfigError
from studylib.nn.precision import parse_dtype
from studylib.tools.bench.allocators import allocator_info
from studylib.tools.bench.flops import cpu_matmul_peak, matmul_peak, train_flops_per_token
from studylib.tools.bench.flops import peak_size as flops_peak_size
from studylib.tools.bench.memory import NO_MEMORY, measure_memory
from studylib.tools.bench.step import build_variant, random_batch, train_step, train_variants
from studylib.tools.bench.timing import interleaved_rounds, progress_printer, speed_stats, speedup, sync
from studylib.tools.bench.variant import DISPATCHES, Variant, find, resolve_models, with_context


def _check_options(peer: Optional[str], dispatches: Optional[Sequence[str]]) -> None:
    if peer not in (None, "hf"):
        raise ConfigError(f"--peer: must be hf, got {peer!r}")
    bad = [d for d in dispatches or () if d not in DISPATCHES]
    if bad:
        raise ConfigError(f"--dispatch: unknown path(s) {bad}; allowed: {list(DISPATCHES)}")


def _report_peer_params(variants: Sequence[Variant]) -> None:
    for v in variants:
        if v.impl == "hf":
            ours = find(variants, model=v.model, impl="studylib")
            ok = "match" if ours.n_params == v.n_params else "MISMATCH"
            print(f"{v.model}: parameters studylib {ours.n_params:,}, transformers {v.n_params:,} ({ok})",
                  file=sys.stderr)


def _time_variants(variants: Sequence[Variant], warmup: int, rounds: int, device: torch.device,
                   amp: Optional[torch.dtype], peak_size: int, tokens: int, say) -> list[float]:
    """The interleaved rounds; returns the matmul peaks probed before them and after each round."""
    peaks = [matmul_peak(amp, n=peak_size, device=device)]  # peak_size: see flops.peak_size
    for i, timed in interleaved_rounds(variants, warmup, rounds, device):
        if not timed:
            say(f"warm-up round {i}/{warmup} done")
            continue
        peaks.append(matmul_peak(amp, n=peak_size, reps=3, device=device))
        say(f"round {i}/{rounds}: " + ", ".join(f"{v.label} {tokens / v.times[-1]:,.0f}" for v in variants)
            + " tok/s")
    return peaks


def _train_row(v: Variant, variants: Sequence[Variant], setup: dict, peak: float, mem: dict) -> dict:
    """The frame row of ``v``; ``setup``: its dtype, batch and context."""
    fpt = train_flops_per_token(v.cfg, setup["context"])
    speed = speed_stats(v.times, setup["batch"] * setup["context"])
    naive = find(variants, model=v.model, impl=v.impl, dispatch="naive", compiled=v.compiled) \
        if v.dispatch else None
    eager = find(variants, model=v.model, impl=v.impl, dispatch=v.dispatch, compiled=False) \
        if v.compiled else None
    hf = find(variants, model=v.model, impl="hf") if v.impl == "studylib" else None
    return {
        "model": v.model, "impl": v.impl, "dispatch": v.dispatch or "", **setup, "params": v.n_params,
        "flops_per_token": fpt, "step_s": statistics.median(v.times), **speed,
        "gflops": speed["tok_s"] * fpt / 1e9, "mfu": speed["tok_s"] * fpt / 1e9 / peak,
        "cpu_s": statistics.median(u + k for u, k in v.cpu),
        "sys_frac": statistics.median(k / max(u + k, 1e-9) for u, k in v.cpu),
        "minflt": statistics.median(v.faults), **mem.get(v.label, NO_MEMORY),
        "ratio_ref": speedup(find(variants, impl=v.impl), v), "ratio_naive": speedup(naive, v),
        "ratio_hf": speedup(hf, v), "allocator": allocator_info(), "dropout": v.cfg.dropout,
        "compiled": v.compiled, "ratio_compile": speedup(eager, v),
    }


def bench_train(preset: Any, models: Optional[Sequence[str]] = None,
                dispatches: Optional[Sequence[str]] = DISPATCHES, dtype: str = "bf16", batch: int = 16,
                context: int = 512, rounds: int = 5, warmup: int = 1, peer: Optional[str] = None,
                memory: str = "auto", device: str = "cpu", seed: int = 0, hf_experts: str = "eager",
                progress: bool = True, peak_size: int = 2048, dropout: Optional[float] = None,
                compile: str = "off"):
    """Time one training step per variant, interleaved; a pandas DataFrame, one row per variant.

    Columns: model, impl, dispatch, dtype, batch, context, params (stored, counted on the built
    model), flops_per_token, step_s (median), tok_s (median), tok_s_min, tok_s_max, tok_s_q1, tok_s_q3,
    gflops, mfu, cpu_s (process CPU seconds per step, all threads, user + sys), sys_frac (system
    share of it: page faults), minflt (minor page faults per step), peak_mem_mb, mem_delta_mb,
    ratio_ref (speed vs the first model of the same impl, its first variant), ratio_naive (MoE
    dispatch rows: speed vs `naive` of the same model), ratio_hf (ours / HF of the same model),
    allocator, dropout. ``df.attrs`` holds the matmul peak
    (``peak_gflops``, ``peak_gflops_all``), threads, allocator, torch version, and per-variant times.
    ``dropout`` overrides the preset's rate for every variant (``0`` compares identical
    computations with the HF peer: see :mod:`studylib.tools.bench.hf`). ``compile``: ``off``, ``on``
    (our variants wrapped in ``torch.compile``) or ``both`` (each of ours twice; column ``compiled``,
    ``ratio_compile`` = compiled over eager of the same variant). With compilation the warm-up is
    at least 2 rounds, so compiling and recompiling (the MoE's token counts change) is not timed.
    """
    import pandas as pd  # kept out of the import path: the memory probe's baseline RSS excludes it

    device = torch.device(device)
    amp = parse_dtype(dtype)
    dtype = "bf16" if amp is not None else "fp32"
    _check_options(peer, dispatches)
    pairs = [(n, with_context(c, context, dropout)) for n, c in resolve_models(preset, models)]
    say = progress_printer(progress)
    variants = train_variants(pairs, dispatches, peer, compile)
    if compile != "off":
        warmup = max(warmup, 2)
    for v in variants:
        build_variant(v, device, seed, hf_experts)
    _report_peer_params(variants)
    load0 = os.getloadavg()[0]
    say(f"bench train: {len(variants)} variants, batch {batch} x {context}, {dtype}, "
        f"{torch.get_num_threads()} threads, allocator {allocator_info()}, load average {load0:.1f}")
    idx, tgt = random_batch(min(c.vocab_size for _, c in pairs), batch, context, seed, device)
    for v in variants:
        v.call = functools.partial(train_step, v, idx, tgt, device, amp)
    peak_n = flops_peak_size(amp, peak_size, device)
    peaks = _time_variants(variants, warmup, rounds, device, amp, peak_n, batch * context, say)
    peak = statistics.median(peaks)
    load1 = os.getloadavg()[0]
    mem = measure_memory(variants, memory, device, idx, tgt, amp, dtype, seed, warmup + 1, hf_experts, say)
    setup = {"dtype": dtype, "batch": batch, "context": context}
    df = pd.DataFrame([_train_row(v, variants, setup, peak, mem) for v in variants])
    df.attrs.update(peak_gflops=peak, peak_gflops_all=peaks, peak_size=peak_n, threads=torch.get_num_threads(),
                    loadavg=(load0, load1),
                    allocator=allocator_info(), torch=torch.__version__, device=str(device),
                    times={v.label: v.times for v in variants}, rounds=rounds, warmup=warmup)
    return df


def profile_train(preset: Any, models=None, dispatches=DISPATCHES, dtype="bf16", batch=16, context=512,
                  warmup=1, peer=None, device="cpu", seed=0, rows=15, hf_experts="eager",
                  sort_by="self_cpu_time_total", dropout: Optional[float] = None) -> dict:
    """torch.profiler top-ops tables of one training step per variant: {label: table text}."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    amp = parse_dtype(dtype)
    pairs = [(n, with_context(c, context, dropout)) for n, c in resolve_models(preset, models)]
    variants = train_variants(pairs, dispatches, peer)
    idx, tgt = random_batch(min(c.vocab_size for _, c in pairs), batch, context, seed, device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    out = {}
    for v in variants:
        build_variant(v, device, seed, hf_experts)
        for _ in range(warmup):
            train_step(v, idx, tgt, device, amp)
        with profile(activities=acts) as prof:
            train_step(v, idx, tgt, device, amp)
            sync(device)
        out[v.label] = prof.key_averages().table(sort_by=sort_by, row_limit=rows)
        v.net = v.opt = None  # free before the next variant
    return out


def profile_groups(preset: Any, models=None, dispatches=("grouped",), batch=8, context=128, warmup=2,
                   steps=5, timed=10, device="cpu", seed=0, clip: float = 1.0, peak_size: int = 2048,
                   dtype: str = "fp32") -> dict:
    """One step's time by kind of work (:mod:`studylib.tools.bench.opgroups`), per variant.

    Every variant trains on the trainer's own batch reading (a synthetic corpus) with clipping,
    fused AdamW and zero_grad, as the trainer does. The profiler's per-op overhead inflates the
    profiled step, so the groups' *shares* come from ``steps`` profiled steps (each group's time
    the least over them: a shared machine only ever adds time) and the step time from the fastest
    of ``timed`` unprofiled steps (both after ``warmup``); ms per group = share x that time. Step
    times are the process's CPU time (user + system, all threads), so ``tok_s`` is tokens per
    CPU-second: per core, and not inflated by other processes taking the cores (with one torch
    thread it equals wall time on an idle machine). Returns {label: {"groups": {group: ms}, "step_ms", "tok_s", "gflops", "peak_gflops",
    "frac_peak", "flops_per_token", "profiled_ms"}}; the peak is an fp32 ``peak_size``^3 matmul on
    this process's threads, probed before each variant (median of 5).
    """
    import time

    from torch.profiler import ProfilerActivity, profile

    from studylib.tools.bench.opgroups import DataProbe, group_events, scoped_model

    device = torch.device(device)
    amp = parse_dtype(dtype)
    pairs = [(n, with_context(c, context)) for n, c in resolve_models(preset, models)]
    out = {}
    for v in train_variants(pairs, dispatches, None):
        build_variant(v, device, seed)
        probe = DataProbe(v.cfg.vocab_size, batch, context, seed=seed)

        def step():
            idx, tgt = probe()
            train_step(v, idx.to(device), tgt.to(device), device, amp, clip)

        for _ in range(warmup):
            step()
        times = []
        for _ in range(timed):
            t0 = time.process_time()
            step()
            sync(device)
            times.append(time.process_time() - t0)
        per_step = []  # each profiled step on its own: a group's time is its fastest step's
        with scoped_model(v.net):
            for _ in range(steps):
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    step()
                per_step.append(group_events(prof.events()))
        groups = {g: min(s[g] for s in per_step) for g in per_step[0]}
        total = sum(groups.values())
        step_s = min(times)
        peak = cpu_matmul_peak(amp, n=peak_size)
        fpt = train_flops_per_token(v.cfg, context)
        tok_s = batch * context / step_s
        out[v.label] = {"groups": {g: t / total * step_s * 1e3 for g, t in groups.items()},
                        "step_ms": step_s * 1e3, "tok_s": tok_s, "gflops": tok_s * fpt / 1e9, "peak_gflops": peak,
                        "frac_peak": tok_s * fpt / 1e9 / peak, "flops_per_token": fpt,
                        "profiled_ms": total / 1e3, "params": v.n_params}
        v.net = v.opt = None
    return out
