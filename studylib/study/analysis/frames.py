"""pandas frames across runs (the one place that turns run directories into frames): summaries,
metric curves, per-model aggregates, per-seed paired gaps, and the long per-layer router frames
built from the eval records of ``metrics.jsonl`` (read by :meth:`RunDir.read_metrics`).

Standard deviations are sample std (ddof=1) over seeds throughout (:func:`sample_std`). Every
comparison between two models goes through :func:`paired_gaps`, i.e. :func:`studylib.study.analysis.stats.paired`.

Curves (:func:`eval_curves`) never join two samples of validation windows: during training a run
is evaluated on a fixed subset (``train.eval_windows``), at the end on the full split; the curve
is the subset, the final full-split value is a separate column.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from studylib.config import Preset
from studylib.run.layout import SUMMARY_FILE
from studylib.run.rundir import RunDir
from studylib.run.spec import RunSpec
from studylib.study.analysis.stats import paired

#: router statistics that are scalars per layer (``metrics.jsonl`` eval records, key ``router``)
ROUTER_SCALARS = ("busiest", "usage_var", "entropy", "top1", "margin", "logz", "usage_entropy",
                  "max_gt_0.9", "bias_picked")
#: the per-layer statistics of SPEC Table 7, in its column order (and, for routers with a
#: selection bias, the share of assignments the bias picked)
TABLE7_METRICS = ("busiest", "usage_var", "entropy", "top1", "margin", "logz", "bias_picked")


def sample_std(x) -> float:
    """Sample std (ddof=1) of the non-NaN values of ``x``; NaN for fewer than two."""
    x = pd.Series(x, dtype=float).dropna()
    return float(x.std(ddof=1)) if len(x) > 1 else float("nan")


# --------------------------------------------------------------------------------------------
# summaries and metric curves
# --------------------------------------------------------------------------------------------
def load_metrics(run_dir, kind: Optional[str] = None) -> pd.DataFrame:
    """``metrics.jsonl`` as a DataFrame (optionally only ``kind`` "train" or "eval" rows)."""
    return pd.DataFrame.from_records(RunDir(run_dir).read_metrics(kind))


def collect_runs(preset: Preset, models: Optional[Iterable[str]] = None,
                 seeds: Optional[Iterable[int]] = None, root=None, overrides=None, tag=None):
    """One row per finished run (summary fields; ``params`` and ``data`` flattened to
    ``params_<key>`` / ``data_<key>``) of
    ``preset`` + ``overrides`` (a variant: :meth:`~studylib.run.spec.RunSpec.resolve`).

    Missing or unfinished runs are left out; ``df.attrs["missing"]`` lists their (model, seed). A
    finished run is read only once its folder is known to hold that run (:meth:`RunDir.check`):
    one without ``config.yaml``, with another run's config, or whose summary and config disagree
    is a :class:`~studylib.run.rundir.RunDirConflict` naming the folder, never a row.
    """
    rows, missing = [], []
    for m in (models if models is not None else preset.model_names()):
        for s in (seeds if seeds is not None else preset.seeds):
            spec = RunSpec.resolve(preset, m, s, overrides, tag, root)
            summ = spec.rundir.summary()
            if not summ or not summ.get("finished"):
                missing.append((m, s))
                continue
            spec.rundir.check(spec.document())
            rows.append(summary_row(summ, m, s))
    df = pd.DataFrame.from_records(rows)
    df.attrs["missing"] = missing
    return df


def model_summaries(out_dir, model: str) -> list[dict]:
    """The ``summary.json`` of ``model``'s own runs (``runs/<model>/seed<N>``, variants left out)
    under a preset's outputs folder ``out_dir``, in folder order; none: ``[]``."""
    return [json.loads(p.read_text()) for p in sorted((Path(out_dir) / "runs" / model).glob(f"seed*/{SUMMARY_FILE}"))]


def summary_row(summ: Mapping, model: str, seed: int) -> dict:
    """One run's row of :func:`collect_runs`: its summary's scalar fields, ``params`` and ``data``
    flattened to ``params_<key>`` / ``data_<key>``, then ``model`` and ``seed``."""
    row = {k: v for k, v in summ.items() if not isinstance(v, (dict, list))}
    for section in ("params", "data"):
        for k, v in (summ.get(section) or {}).items():
            row[f"{section}_{k}"] = v
    row["model"], row["seed"] = model, seed
    return row


def runs_frame(specs: Iterable) -> pd.DataFrame:
    """:func:`collect_runs` of runs already resolved (:class:`~studylib.run.spec.RunSpec`, as
    :func:`studylib.study.orchestration.plan.plan_runs` returns them), in their order: read
    from their run directories, nothing resolved again. An unfinished run is left out and listed in
    ``df.attrs["missing"]``."""
    rows, missing = [], []
    for spec in specs:
        summ = spec.rundir.summary()
        if not summ or not summ.get("finished"):
            missing.append((spec.model, spec.seed))
            continue
        rows.append(summary_row(summ, spec.model, spec.seed))
    df = pd.DataFrame.from_records(rows)
    df.attrs["missing"] = missing
    return df


def runs_metrics(specs: Iterable, kind: Optional[str] = "eval") -> pd.DataFrame:
    """The ``metrics.jsonl`` records (``kind`` "train", "eval" or None: all) of runs already resolved
    (:class:`~studylib.run.spec.RunSpec`), in one long frame with ``model`` and ``seed``."""
    frames = [df.assign(model=spec.model, seed=spec.seed) for spec in specs
              if len(df := load_metrics(spec.run_dir, kind=kind))]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def aggregate(df, value: str = "best_val_loss"):
    """Per model: n, mean and std (ddof=1) of ``value`` and of its perplexity exp(value)."""
    d = df.assign(_ppl=df[value].map(math.exp))
    g = d.groupby("model", sort=False)
    out = pd.DataFrame({
        "n": g[value].count(),
        f"{value}_mean": g[value].mean(), f"{value}_std": g[value].std(ddof=1),
        "ppl_mean": g["_ppl"].mean(), "ppl_std": g["_ppl"].std(ddof=1),
    })
    return out


def seed_pairs(df: pd.DataFrame, a, b, value: str = "best_val_loss", column: str = "model",
               index="seed") -> pd.DataFrame:
    """The pairing every comparison uses: ``value`` of ``a`` and of ``b`` (two values of
    ``column``, by default two models) side by side, one row per ``index`` (by default the seed)
    that both have; a KeyError names what is missing."""
    wide = df.pivot_table(index=index, columns=column, values=value)
    if a not in wide or b not in wide:
        raise KeyError(f"need runs of both {a!r} and {b!r}; have {list(wide.columns)}")
    pair = wide[[a] if a == b else [a, b]].dropna()  # a == b: the zero gap
    if pair.empty:
        raise KeyError(f"{a!r} and {b!r} share no {index} with a {value!r}")
    return pair


def seed_gaps(df: pd.DataFrame, a, b, value: str = "best_val_loss", column: str = "model",
              index="seed") -> pd.Series:
    """``value[a] - value[b]`` per seed (per ``index``) over the seeds both have
    (:func:`seed_pairs`)."""
    pair = seed_pairs(df, a, b, value, column, index)
    return pair[a] - pair[b]


def paired_gaps(df, a: str, b: str, value: str = "best_val_loss") -> dict:
    """The paired comparison of ``a`` and ``b``: the per-seed gap ``value[a] - value[b]`` over the
    seeds both models have (``per_seed``, a Series indexed by seed), its
    :class:`~studylib.study.analysis.stats.Paired` summary (``paired``) and that summary's fields (``mean``,
    ``std``, ``n``, ``ci_low``, ``ci_high``, ``p``, ``level``, ``resolved``), from
    :func:`studylib.study.analysis.stats.paired`."""
    gap = seed_gaps(df, a, b, value)
    p = paired(gap.to_numpy())
    return {"a": a, "b": b, "per_seed": gap, "paired": p, **p.as_dict()}


def eval_curves(metrics: pd.DataFrame) -> pd.DataFrame:
    """The eval rows of a :func:`runs_metrics` frame, split so that a curve joins one sample of
    windows only: ``val_loss`` (and ``val_ppl``) is the loss on the fixed validation subset at
    every evaluation, ``full_val_loss`` the full split's loss at the run's last evaluation (NaN
    elsewhere).

    The trainer's last record is the full pass (``full: true``) and carries the subset's loss as
    ``subset_val_loss``; a run whose subset is the whole split (every record ``full``) has one
    sample only, so its curve is ``val_loss`` throughout. A final full record without
    ``subset_val_loss`` (written before that field existed) leaves the curve's last point NaN."""
    ev = metrics[metrics["kind"] == "eval"] if "kind" in metrics else metrics
    ev = ev.copy()
    if ev.empty:
        return ev.assign(full_val_loss=pd.Series(dtype=float))
    full = (ev["full"].astype("boolean").fillna(False).astype(bool) if "full" in ev
            else pd.Series(False, index=ev.index))
    sub = ev["subset_val_loss"].astype(float) if "subset_val_loss" in ev else pd.Series(np.nan, index=ev.index)
    keys = [ev[k] for k in ("model", "seed") if k in ev]
    if keys:
        all_full = full.groupby(keys).transform("all").astype(bool)
        last = ev["step"] == ev.groupby(keys)["step"].transform("max")
    else:
        all_full = pd.Series(bool(full.all()), index=ev.index)
        last = ev["step"] == ev["step"].max()
    loss = ev["val_loss"].astype(float)
    ev["full_val_loss"] = loss.where(full & last)
    curve = loss.where(~full, sub.where(sub.notna(), loss.where(all_full)))
    ev["val_loss"] = curve
    if "val_ppl" in ev:
        ev["val_ppl"] = np.exp(curve)
    return ev


# --------------------------------------------------------------------------------------------
# per-layer router statistics of the eval records
# --------------------------------------------------------------------------------------------
def router_records(source) -> list[dict]:
    """The eval records that carry per-layer router statistics (a ``router`` list), of a run
    directory (path or :class:`RunDir`) or of a list of ``metrics.jsonl`` records."""
    recs = RunDir(source).read_metrics() if isinstance(source, (str, os.PathLike)) else source
    return [r for r in recs if r.get("kind", "eval") == "eval" and isinstance(r.get("router"), list)]


def layer_stats(st: dict, metrics: Sequence[str] = ROUTER_SCALARS) -> dict:
    """``{metric: value}`` of one layer's router stats in an eval record; ``busiest`` and
    ``usage_var`` of the eval set's ``shares`` f_e, by the model's own definition
    (:func:`studylib.nn.router_losses.share_stats`: max_e f_e and the population variance of f_e,
    SPEC section 3) applied to the whole evaluation's shares (the recorded values average per-batch
    ones). The one reading of those statistics: the notebooks' tables and the routing explorer
    both go through it."""
    import torch

    from studylib.nn.router_losses import share_stats

    st = dict(st)
    if isinstance(st.get("shares"), list) and st["shares"]:
        st.update(share_stats(torch.tensor(st["shares"], dtype=torch.float64)))
    return {m: float(st[m]) for m in metrics if m in st and st[m] is not None}


def routing_frame(source, metrics: Sequence[str] = ROUTER_SCALARS) -> pd.DataFrame:
    """Long frame step / tokens / layer / metric / value of the per-layer router statistics in
    the eval records of ``source`` (see :func:`router_records`). Dense layers (router None) are
    left out; an empty frame if the model has no router.

    ``busiest`` and ``usage_var`` are recomputed from the record's ``shares`` (the assignment
    shares f_e over the whole evaluation subset), as SPEC section 3 defines them. (The trainer's
    own values average per-batch maxima, which read higher on small batches.)"""
    rows = []
    for r in router_records(source):
        for layer, st in enumerate(r["router"]):
            if isinstance(st, dict):
                rows += [{"step": r["step"], "tokens": r.get("tokens"), "layer": layer, "metric": m,
                          "value": v} for m, v in layer_stats(st, metrics).items()]
    return pd.DataFrame(rows, columns=["step", "tokens", "layer", "metric", "value"])


def shares_frame(source, key: str = "shares") -> pd.DataFrame:
    """Long frame step / tokens / layer / expert / share of a per-expert list (``shares``: the
    assignment shares f_e; ``argmax_shares`` for the soft MoE) over the eval records."""
    rows = []
    for r in router_records(source):
        for layer, st in enumerate(r["router"]):
            if isinstance(st, dict) and isinstance(st.get(key), list):
                rows += [{"step": r["step"], "tokens": r.get("tokens"), "layer": layer, "expert": e,
                          "share": float(v)} for e, v in enumerate(st[key])]
    return pd.DataFrame(rows, columns=["step", "tokens", "layer", "expert", "share"])


def routing_frames(run_dirs: Mapping[int, RunDir]) -> pd.DataFrame:
    """:func:`routing_frame` of one model's runs ``{seed: RunDir}``, with a ``seed`` column."""
    frames = [routing_frame(rd).assign(seed=s) for s, rd in run_dirs.items()]
    return pd.concat(frames, ignore_index=True)


def shares_frames(run_dirs: Mapping[int, RunDir], key: str = "shares") -> pd.DataFrame:
    """:func:`shares_frame` of one model's runs ``{seed: RunDir}``, with a ``seed`` column."""
    frames = [shares_frame(rd, key).assign(seed=s) for s, rd in run_dirs.items()]
    return pd.concat(frames, ignore_index=True)
