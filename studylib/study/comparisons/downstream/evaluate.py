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

import numpy as np
import pandas as pd

from studylib.config import Preset
from studylib.run.hf import suite as lm_eval_tasks
from studylib.run.rundir import RunDir
from studylib.study.analysis.frames import seed_gaps
from studylib.study.analysis.stats import (A_BETTER, B_BETTER, EQUIVALENT, MARGIN, holm, paired, tost,
                                           verdicts)

# (column, lm-eval task, lm-eval metric key, higher is better)
METRICS = (
    ("lastword_acc", "tinystories_lastword", "acc,none", True),
    ("lastword_ppl", "tinystories_lastword", "perplexity,none", False),
    ("word_ppl", "tinystories_ppl", "word_perplexity,none", False),
    ("bits_per_byte", "tinystories_ppl", "bits_per_byte,none", False),
)
#: how each metric's equivalence margin is read: "absolute" (the paired difference within
#: ±margin: last-word accuracy, a proportion, ±0.03 = 3 points) or "log ratio" (log(a / b) per
#: seed within ±margin: a relative margin, ±3% at 0.03; for a perplexity exactly ±margin nats per
#: word, for bits per byte ±margin in log units of the ratio)
MARGIN_SCALE = {"lastword_acc": "absolute", "lastword_ppl": "log ratio", "word_ppl": "log ratio",
                "bits_per_byte": "log ratio"}
#: notebook 10's family: every metric x baseline comparison of the MoE
FAMILY = "10 downstream: the MoE − each dense baseline, every metric"


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


def metric_gaps(df: pd.DataFrame, model: str, baselines: Sequence[str], margin: Optional[float] = None,
                alpha: float = 0.05) -> pd.DataFrame:
    """Per baseline and metric: the paired per-seed gap ``model - baseline``
    (:func:`studylib.study.analysis.frames.seed_gaps`; ``gap`` = its mean, std, n, 95% CI, p), every
    row one comparison of one family (:data:`FAMILY`): ``p_holm`` (Holm over the family),
    ``p_tost`` (paired TOST within ``±margin`` on the metric's :data:`MARGIN_SCALE`; ``margin``
    None: :data:`~studylib.study.analysis.stats.MARGIN`) and ``p_tost_holm``, ``resolved``
    (``p_holm < alpha``), ``equivalent`` (``p_tost_holm < alpha``), ``verdict`` ("A better" /
    "B better" by the metric's direction, "equivalent", "inconclusive"; A is ``model``),
    ``verdict_label`` ("moe better", "equivalent within ±0.03 (log ratio)", ...),
    ``family_size``, ``margin``, ``margin_scale``, ``higher_is_better`` and ``family``."""
    margin = MARGIN if margin is None else float(margin)
    logs = df.copy()
    rows = []
    for b in baselines:
        for col, _, _, higher in METRICS:
            d = seed_gaps(df, model, b, col).to_numpy(dtype=float)
            scale = MARGIN_SCALE[col]
            if scale == "log ratio":
                logs[col] = np.log(df[col].astype(float))
                d_eq = seed_gaps(logs, model, b, col).to_numpy(dtype=float)
            else:
                d_eq = d
            p = paired(d)
            rows.append({"comparison": f"{model} - {b}", "a": model, "b": b, "metric": col, "n": p.n, "gap": p.mean,
                         "std": p.std, "ci_low": p.ci_low, "ci_high": p.ci_high, "p": p.p,
                         "p_tost": tost(d_eq, margin), "higher_is_better": higher, "margin_scale": scale})
    out = pd.DataFrame(rows)
    out["p_holm"], out["p_tost_holm"] = holm(out["p"]), holm(out["p_tost"])
    out["resolved"], out["equivalent"] = out["p_holm"] < alpha, out["p_tost_holm"] < alpha
    out["verdict"] = verdicts(out["gap"], out["p_holm"], out["p_tost_holm"], alpha,
                              out["higher_is_better"].to_numpy(dtype=bool))
    out["family_size"], out["margin"], out["family"] = int(np.isfinite(out["p"]).sum()), margin, FAMILY
    out["verdict_label"] = [verdict_label(r) for _, r in out.iterrows()]
    return out[["comparison", "metric", "n", "gap", "std", "ci_low", "ci_high", "p", "resolved", "verdict",
                "p_holm", "p_tost", "p_tost_holm", "equivalent", "verdict_label", "family_size", "margin",
                "margin_scale", "higher_is_better", "family", "a", "b"]]


def verdict_label(row) -> str:
    """A :func:`metric_gaps` row's verdict in a few words: "moe better", "dense_total better",
    "equivalent within ±0.03 (log ratio)" or "inconclusive"."""
    v = row["verdict"]
    if v in (A_BETTER, B_BETTER):
        return f"{row['a'] if v == A_BETTER else row['b']} better"
    if v == EQUIVALENT:
        return f"equivalent within ±{float(row['margin']):g} ({row['margin_scale']})"
    return "inconclusive"


def gap_sentences(gaps: pd.DataFrame) -> str:
    """Notebook 10's outcome from :func:`metric_gaps` (or its written table): the family, then one
    sentence per comparison worded from its adjusted verdict, the numbers it rests on beside it."""
    if gaps.empty:
        return "No downstream comparisons."
    m = int(gaps["family_size"].max())
    words = {A_BETTER: "MoE better", B_BETTER: "baseline better"}
    counts = ", ".join(f"{int((gaps['verdict'] == v).sum())} {words.get(v, v)}"
                       for v in (A_BETTER, B_BETTER, EQUIVALENT, "inconclusive") if (gaps["verdict"] == v).any())
    head = (f'Family "{gaps["family"].iloc[0]}" ({len(gaps)} comparisons, A = the MoE; Holm-corrected over {m}; '
            f"equivalence: TOST within ±{float(gaps['margin'].iloc[0]):g}, on the log ratio of the perplexities "
            f"and bits per byte, on the difference of the accuracies): {counts}.")
    out = [head]

    def num(x):  # perplexities of untrained models run to billions
        return f"{x:+.4f}" if abs(x) < 1e4 or x != x else f"{x:+.4g}"

    for _, r in gaps.iterrows():
        nums = (f"{num(r['gap'])} [{num(r['ci_low'])}, {num(r['ci_high'])}] (p={r['p']:.2g}, Holm-adjusted "
                f"{r['p_holm']:.2g}; TOST p={r['p_tost']:.2g}, Holm-adjusted {r['p_tost_holm']:.2g}; n={int(r['n'])})")
        out.append(f"{r['comparison']}, {r['metric']}: {verdict_label(r)}, {nums}.")
    return " ".join(out)
