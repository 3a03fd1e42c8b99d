"""``bench paths``: today's plain eager training step against the preset's faster execution
settings, per model, side by side in one process.

The plain path is each model as the preset has it with every execution-only speed setting at
its schema default (today: ``model.lm_head_chunk`` 2,048); the preset path is the model as the
preset has it (``params/cpu.yaml``: 256). Both compute the same function to fp32 rounding
(tests/run/test_fast_paths.py). Each round runs one trainer step of every variant (the
trainer's batch reading on a synthetic corpus, forward, backward, clipping, fused AdamW) in
an order rotated by round (:mod:`studylib.tools.bench.timing`); speed is tokens per CPU-second
(process CPU time, so other processes on the cores do not count: per core with one thread),
from the fastest round; ``ratio`` is the median over rounds of the paired CPU-time ratio
plain / preset (> 1: the preset's path is faster).
"""
from __future__ import annotations

import dataclasses
import os
import statistics
from typing import Any, Optional, Sequence

import torch

from studylib.config import ModelConfig
from studylib.tools.bench.opgroups import DataProbe
from studylib.tools.bench.step import build_variant, train_step
from studylib.tools.bench.timing import interleaved_rounds, progress_printer
from studylib.tools.bench.variant import Variant, resolve_models, with_context

SPEED_KEYS = ("lm_head_chunk",)  # execution-only ModelConfig fields the plain path resets


def plain(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with every speed setting of :data:`SPEED_KEYS` at its schema default."""
    base = ModelConfig()
    return dataclasses.replace(cfg, **{k: getattr(base, k) for k in SPEED_KEYS})


def _step(name: str, cfg: ModelConfig, batch: int, context: int, seed: int, clip: float, device) -> Variant:
    """One model's trainer step on ``batch`` synthetic windows, as a timed :class:`Variant`."""
    v = Variant(name, "studylib", None, cfg)
    build_variant(v, device, seed)
    probe = DataProbe(cfg.vocab_size, batch, context, seed=seed)

    def call():
        idx, tgt = probe()
        train_step(v, idx, tgt, device, None, clip)

    v.call = call
    return v


def _time(variants: list, warmup: int, rounds: int, device, progress: bool) -> dict:
    """Time ``variants`` in interleaved rounds; the attrs every table of this module carries."""
    say = progress_printer(progress)
    load0 = os.getloadavg()[0]
    for i, timed in interleaved_rounds(variants, warmup, rounds, device):
        say(f"{'round' if timed else 'warm-up round'} {i} done")
    return dict(loadavg=(load0, os.getloadavg()[0]), threads=torch.get_num_threads(), rounds=rounds, warmup=warmup)


def bench_paths(preset: Any, models: Optional[Sequence[str]] = None, batch: int = 8, context: int = 128,
                rounds: int = 10, warmup: int = 2, seed: int = 0, clip: float = 1.0, progress: bool = True):
    """A DataFrame, one row per model: tok_s_plain, tok_s_preset (tokens per CPU-second, fastest
    round), ratio (median paired CPU-time ratio plain / preset), ratio_min (of the fastest
    rounds), the settings that differ."""
    import pandas as pd

    device = torch.device("cpu")
    variants = [_step(name, c, batch, context, seed, clip, device)
                for name, cfg in resolve_models(preset, models)
                for c in (plain(with_context(cfg, context)), with_context(cfg, context))]
    attrs = _time(variants, warmup, rounds, device, progress)
    rows = []
    tokens = batch * context
    for a, b in zip(variants[::2], variants[1::2]):
        ca, cb = a.cpu_total, b.cpu_total
        rows.append({"model": a.model, "params": a.n_params,
                     "differs": ", ".join(f"{k} {getattr(a.cfg, k)} -> {getattr(b.cfg, k)}" for k in SPEED_KEYS
                                          if getattr(a.cfg, k) != getattr(b.cfg, k)) or "nothing",
                     "tok_s_plain": tokens / min(ca), "tok_s_preset": tokens / min(cb),
                     "ratio": statistics.median(x / y for x, y in zip(ca, cb)), "ratio_min": min(ca) / min(cb)})
    df = pd.DataFrame(rows)
    df.attrs.update(attrs, batch=batch, context=context)
    return df


def bench_fold(preset: Any, folds: Sequence[int], models: Optional[Sequence[str]] = None, batch: int = 8,
               context: int = 128, rounds: int = 10, warmup: int = 2, seed: int = 0, clip: float = 1.0,
               progress: bool = True):
    """What training ``k`` seeds of a cell as one stacked model could gain at most: the preset's
    step of each model at ``k`` x ``batch`` windows against ``batch`` (a stacked model does the
    same kernels on ``k`` x the rows, plus its own per-seed work), interleaved in one process. A
    DataFrame, one row per model and ``k`` (1 included): tok_s (tokens per CPU-second, fastest
    round) and gain (median over rounds of the paired per-token CPU time at 1x / at k x; > 1: the
    larger step costs less per token)."""
    import pandas as pd

    device = torch.device("cpu")
    ks = sorted({1, *(int(k) for k in folds)})
    named = [(name, with_context(cfg, context)) for name, cfg in resolve_models(preset, models)]
    variants = [_step(name, cfg, batch * k, context, seed, clip, device) for name, cfg in named for k in ks]
    attrs = _time(variants, warmup, rounds, device, progress)
    rows = []
    for g in range(0, len(variants), len(ks)):
        one = variants[g].cpu_total
        for k, v in zip(ks, variants[g:g + len(ks)]):
            rows.append({"model": v.model, "params": v.n_params, "fold": k,
                         "tok_s": batch * k * context / min(v.cpu_total),
                         "gain": statistics.median(a * k / b for a, b in zip(one, v.cpu_total))})
    df = pd.DataFrame(rows)
    df.attrs.update(attrs, batch=batch, context=context)
    return df
