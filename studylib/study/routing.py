"""Routing tables: what the routers did, from the per-layer frames of
:mod:`studylib.study.frames` (:func:`~studylib.study.frames.routing_frame`,
:func:`~studylib.study.frames.shares_frame`).

* collapse: :func:`collapsed` (one expert takes >= threshold of the assignments),
  :func:`collapse_table` (per run and layer: when, and whether at the end);
* SPEC Table 1 (:func:`ablation_table`) and Table 7 (:func:`diagnostics_table`,
  :func:`routing_trend`: the first -> last log-z trend), :func:`final_routing`;
* :func:`gate_table`: soft-MoE gate diagnostics at the last evaluation.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from studylib.study.frames import (ROUTER_SCALARS, TABLE7_METRICS, router_records, routing_frame, sample_std,
                                   shares_frame)


def collapsed(shares, threshold: float = 0.9) -> bool:
    """Routing collapse: one expert receives at least ``threshold`` of the assignments."""
    s = np.asarray(shares, dtype=float)
    if s.size == 0:
        raise ValueError("collapsed: empty shares")
    return bool(s.max() >= threshold)


def _layer_collapse(per_step: pd.Series, threshold: float) -> dict:
    """Collapse summary of one layer from its shares per eval step (``step -> [f_e]``)."""
    busiest = per_step.map(max)
    hit = [s for s, v in per_step.items() if collapsed(v, threshold)]
    return {"final_busiest": float(busiest.iloc[-1]), "max_busiest": float(busiest.max()),
            "first_collapse_step": hit[0] if hit else np.nan,
            "collapsed_at_end": collapsed(per_step.iloc[-1], threshold)}


def collapse_table(runs_by_name: dict, threshold: float = 0.9) -> pd.DataFrame:
    """Per run (``name: run_dir or records``) and layer: the final and the maximum busiest-expert
    fraction, the first eval step with a collapsed layer (NaN if never) and whether the layer is
    collapsed at the end (:func:`collapsed` of the final shares)."""
    rows = []
    for name, src in runs_by_name.items():
        sh = shares_frame(src)
        for layer, g in sh.groupby("layer"):
            per_step = g.groupby("step")["share"].apply(list)
            rows.append({"model": name, "layer": layer, **_layer_collapse(per_step, threshold)})
    return pd.DataFrame(rows)


def final_routing(source, metrics: Sequence[str] = ROUTER_SCALARS) -> pd.DataFrame:
    """Router statistics of the last evaluation, one row per routed layer (wide)."""
    rf = routing_frame(source, metrics)
    if rf.empty:
        return pd.DataFrame()
    last = rf[rf["step"] == rf["step"].max()]
    out = last.pivot_table(index="layer", columns="metric", values="value")
    return out[[m for m in metrics if m in out]]


def routing_trend(frames: dict | pd.DataFrame, metric: str = "logz") -> pd.DataFrame:
    """First -> last evaluation trend of ``metric`` per layer (SPEC Table 7's log-z trend).

    ``frames``: one routing frame or ``{seed: routing_frame}`` (then mean and std over seeds of
    first, last and change)."""
    if isinstance(frames, pd.DataFrame):
        frames = {0: frames}
    rows = []
    for seed, rf in frames.items():
        d = rf[rf["metric"] == metric]
        for layer, g in d.groupby("layer"):
            v = g.sort_values("step")["value"]
            rows.append({"seed": seed, "layer": layer, "first": v.iloc[0], "last": v.iloc[-1],
                         "change": v.iloc[-1] - v.iloc[0]})
    t = pd.DataFrame(rows)
    out = t.groupby("layer").agg(first=("first", "mean"), last=("last", "mean"), change=("change", "mean"),
                                 change_std=("change", sample_std), n=("seed", "count"))
    out["trend"] = np.where(out["change"] < 0, "falls", np.where(out["change"] > 0, "rises", "flat"))
    return out


def ablation_table(summaries: pd.DataFrame, run_dirs: dict) -> pd.DataFrame:
    """SPEC Table 1 per variant: final / best val loss, the busiest-expert fraction of each layer
    at the end, the mean router log-z at the end, and whether any layer collapsed (>= 0.9)."""
    rows = []
    s = summaries.set_index("model")
    for name, rd in run_dirs.items():
        fr = final_routing(rd)
        row = {"model": name, "final_val_loss": s.loc[name, "final_val_loss"],
               "best_val_loss": s.loc[name, "best_val_loss"]}
        for layer, v in fr["busiest"].items():
            row[f"busiest_L{layer}"] = v
        row["logz_mean"] = float(fr["logz"].mean())
        row["collapsed_layers"] = int((fr["busiest"] >= 0.9).sum())
        rows.append(row)
    return pd.DataFrame(rows).set_index("model")


def diagnostics_table(rf: pd.DataFrame, metrics: Sequence[str] = TABLE7_METRICS) -> pd.DataFrame:
    """SPEC Table 7 shape: per layer, the last evaluation's value of each metric (mean over the
    seeds of a :func:`studylib.study.frames.routing_frames` frame)."""
    last = rf[rf["step"] == rf["step"].max()]
    t = last.pivot_table(index="layer", columns="metric", values="value", aggfunc="mean")
    return t[[m for m in metrics if m in t]]


def _gate_row(st: dict) -> dict:
    """One soft-MoE layer's gate diagnostics with their uniform references."""
    K = len(st["shares"])
    return {"K": K, "usage_entropy": st.get("usage_entropy"), "token_entropy": st["entropy"],
            "max_entropy": math.log(K), "mean_max_gate": st["top1"], "uniform_gate": 1.0 / K,
            "share_max_gt_0.9": st.get("max_gt_0.9"),
            "argmax_shares": " ".join(f"{v:.2f}" for v in st.get("argmax_shares", []))}


def gate_table(run_dirs: dict) -> pd.DataFrame:
    """Soft-MoE gate diagnostics at the last evaluation, per model and layer: usage entropy (of
    the mean gate), per-token gate entropy, mean max gate, share of tokens with max gate > 0.9,
    their uniform references and the argmax shares."""
    rows = []
    for name, rd in run_dirs.items():
        recs = router_records(rd)
        if not recs:
            continue
        for layer, st in enumerate(recs[-1]["router"]):
            if isinstance(st, dict):
                row = _gate_row(st)
                rows.append({"model": name, "K": row.pop("K"), "layer": layer, **row})
    return pd.DataFrame(rows)
