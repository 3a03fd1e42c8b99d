"""Downstream evaluation of many runs: the local lm-eval suite (:mod:`studylib.run.hf.suite`)
on every model x seed, one row per run, and the paired per-seed gaps between models
(:func:`studylib.study.analysis.stats.paired`). Results already written for a run's latest step are reused.

Measured on the 2-core CPU (cpu preset, 202 validation stories per run): an evaluation in a fresh
process spends ~3.5 s importing, ~3 s loading the export, ~1.5 s bootstrapping stderrs and 3.4-5.6 s
in the model; nine took 63-65 s in one process (notebook 10: 202 s before lm-eval's built-in task
index was skipped, :func:`studylib.run.hf.suite.task_manager`). Two 1-thread worker processes
took 56-60 s: not worth a process pool, so the runs are evaluated one after the other.
"""
from __future__ import annotations

import json
from typing import Optional, Sequence

import pandas as pd

from studylib.config import Preset
from studylib.run.hf import suite as lm_eval_tasks
from studylib.run.rundir import RunDir
from studylib.study.analysis.frames import seed_gaps
from studylib.study.analysis.stats import paired
from studylib.study.analysis.text import better_verdict

# (column, lm-eval task, lm-eval metric key, higher is better)
METRICS = (
    ("lastword_acc", "tinystories_lastword", "acc,none", True),
    ("lastword_ppl", "tinystories_lastword", "perplexity,none", False),
    ("word_ppl", "tinystories_ppl", "word_perplexity,none", False),
    ("bits_per_byte", "tinystories_ppl", "bits_per_byte,none", False),
)


class DownstreamError(RuntimeError):
    """The lm-eval evaluation of one run failed; the message names the run directory."""


def cached_results(rd: RunDir) -> Optional[dict]:
    """The run's local-suite results when already written for its latest step, else None."""
    path = rd.path / lm_eval_tasks.EVAL_DIR / "results.json"
    if path.is_file():
        old = json.loads(path.read_text())
        if old.get("step") == rd.latest_step() and set(lm_eval_tasks.LOCAL_TASKS) <= set(old["results"]):
            return old
    return None


def evaluate_run(rd: RunDir, max_docs: int = 500, batch_size: int = 16) -> dict:
    """The run's local-suite results (reused when written for its latest step); a failure raises
    :class:`DownstreamError` naming the run directory."""
    old = cached_results(rd)
    if old is not None:
        return old
    try:
        return lm_eval_tasks.evaluate(rd.path, lm_eval_tasks.LOCAL_TASKS, max_docs=max_docs, batch_size=batch_size)
    except Exception as e:
        raise DownstreamError(f"downstream evaluation of {rd.path} failed: {type(e).__name__}: {e}") from e


def downstream_frame(preset: Preset, models: Sequence[str], seeds: Sequence[int], **kw) -> pd.DataFrame:
    """One row per (model, seed): the local suite's metrics (columns of METRICS)."""
    rows = []
    for m in models:
        for s in seeds:
            res = evaluate_run(RunDir.of(preset, m, s), **kw)["results"]
            rows.append({"model": m, "seed": s, **{c: float(res[t][k]) for c, t, k, _ in METRICS}})
    return pd.DataFrame(rows)


def metric_gaps(df: pd.DataFrame, model: str, baselines: Sequence[str]) -> pd.DataFrame:
    """Per metric and baseline: the paired per-seed gap ``model - baseline``
    (:func:`studylib.study.analysis.frames.seed_gaps`; mean, std, n, 95% CI, p, ``resolved`` = the CI
    excludes 0) and its ``verdict`` (:func:`studylib.study.analysis.text.better_verdict`, worded from
    the CI and the metric's direction)."""
    rows = []
    for b in baselines:
        for col, _, _, higher in METRICS:
            p = paired(seed_gaps(df, model, b, col).to_numpy())
            verdict = better_verdict(p, model, b, higher)
            rows.append({"comparison": f"{model} - {b}", "metric": col, "n": p.n, "gap": p.mean, "std": p.std,
                         "ci_low": p.ci_low, "ci_high": p.ci_high, "p": p.p, "resolved": p.resolved,
                         "verdict": verdict})
    return pd.DataFrame(rows)
