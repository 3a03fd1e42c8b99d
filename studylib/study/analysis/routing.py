"""Routing tables: what the routers did, from the per-layer frames of
:mod:`studylib.study.analysis.frames` (:func:`~studylib.study.analysis.frames.routing_frame`,
:func:`~studylib.study.analysis.frames.shares_frame`).

* collapse: :func:`collapsed` (one expert takes >= threshold of the assignments),
  :func:`collapse_table` (per run and layer: when, and whether at the end);
* SPEC Table 1 (:func:`ablation_table`: every variant over every seed, paired by seed against the
  reference MoE, next to the paper's Table 1 via :func:`paper_recipe`) and Table 7
  (:func:`diagnostics_table`, :func:`routing_trend`: the first -> last log-z trend), :func:`final_routing`;
* :func:`gate_table`: soft-MoE gate diagnostics at the last evaluation.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from studylib.study.analysis.frames import (ROUTER_SCALARS, TABLE7_METRICS, aggregate, router_records, routing_frame,
                                   sample_std, shares_frame)
from studylib.study.analysis.paper import PAPER_TABLE1
from studylib.study.analysis.tables import FAMILY_COLUMNS, comparison_table


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


def paper_recipe(cfg) -> Optional[pd.Series]:
    """The paper's Table 1 row (:data:`studylib.study.analysis.paper.PAPER_TABLE1`) for a model config with
    the same routing recipe (top-k, balance loss on/off, z-loss on/off, renormalised gate), or None
    (a dense model, or a recipe the paper did not run, e.g. the Switch gate)."""
    ffn = cfg.ffn
    if ffn.kind != "moe" or not getattr(ffn, "renormalize", True):
        return None
    hit = PAPER_TABLE1[(PAPER_TABLE1["top_k"] == ffn.top_k) & (PAPER_TABLE1["balance"] == (ffn.balance_coef > 0))
                       & (PAPER_TABLE1["z_loss"] == (ffn.z_coef > 0))]
    return hit.iloc[0] if len(hit) else None


def ablation_table(summaries: pd.DataFrame, run_dirs: dict, reference: str, configs: Optional[dict] = None,
                   threshold: float = 0.9, margin: Optional[float] = None) -> pd.DataFrame:
    """SPEC Table 1 over every seed. ``run_dirs``: ``{model: {seed: run_dir}}``; ``summaries``: the
    runs' summaries (:func:`studylib.study.analysis.frames.collect_runs`). Per variant: n seeds, best and
    final validation loss (mean; best also ± std), the paired gap to ``reference`` (variant −
    reference, per seed: mean, 95% CI, p, ``gap`` text and the family's columns: every variant
    against the reference is one family, Holm over its size, TOST against ``±margin``, ``resolved``
    after Holm, :data:`~studylib.study.analysis.tables.FAMILY_COLUMNS`; empty for the reference), the
    busiest-expert fraction of each layer and the router log-z at the last evaluation (means over
    seeds), and ``collapsed_runs`` ("k/n": runs with a layer whose busiest share >= ``threshold``
    at the end). ``configs`` (``{model: ModelConfig}``) adds the paper's Table 1 row of the same
    recipe (``paper_budget``, ``paper_final_val_loss``, ``paper_result``, and ``paper_delta``: its
    final loss minus the reference recipe's, one run each at 40.5M tokens)."""
    models = list(run_dirs)
    agg = aggregate(summaries[summaries["model"].isin(models)], "best_val_loss").reindex(models)
    final = summaries.groupby("model")["final_val_loss"].mean()
    cmp = comparison_table(summaries, {m: (m, reference) for m in models if m != reference}, margin=margin,
                           family=f"02 routing ablation: each variant − {reference}")
    rows = []
    for name in models:
        row = {"model": name, "n": int(agg.loc[name, "n"]),
               "best_val_loss": agg.loc[name, "best_val_loss_mean"],
               "best_val_loss_std": agg.loc[name, "best_val_loss_std"],
               "final_val_loss": float(final[name])}
        c = cmp.loc[name] if name in cmp.index else None
        row[f"delta_vs_{reference}"] = 0.0 if c is None else c["mean"]
        for k in ("ci_low", "ci_high", "p", "resolved", "gap", *FAMILY_COLUMNS):
            row[k] = np.nan if c is None else c[k]
        fins = [final_routing(rd) for rd in run_dirs[name].values()]
        fins = [f for f in fins if not f.empty]
        if fins:
            busiest = pd.concat([f["busiest"] for f in fins], axis=1)
            for layer, v in busiest.mean(axis=1).items():
                row[f"busiest_L{layer}"] = v
            row["logz_mean"] = float(np.mean([f["logz"].mean() for f in fins]))
            row["collapsed_runs"] = f"{sum(bool((f['busiest'] >= threshold).any()) for f in fins)}/{len(fins)}"
        if configs is not None:
            ref = paper_recipe(configs[name])
            row["paper_budget"] = None if ref is None else ref["budget"]
            row["paper_final_val_loss"] = np.nan if ref is None else ref["final_val_loss"]
            row["paper_result"] = "not in the paper" if ref is None else ref["result"]
        rows.append(row)
    out = pd.DataFrame(rows).set_index("model")
    if configs is not None:  # the paper's single-run difference to the same reference, where it has both
        out["paper_delta"] = out["paper_final_val_loss"] - out.loc[reference, "paper_final_val_loss"]
    out.attrs["per_seed"] = cmp.attrs["per_seed"]
    out.attrs["comparisons"] = cmp
    return out


def diagnostics_table(rf: pd.DataFrame, metrics: Sequence[str] = TABLE7_METRICS) -> pd.DataFrame:
    """SPEC Table 7 shape: per layer, the last evaluation's value of each metric (mean over the
    seeds of a :func:`studylib.study.analysis.frames.routing_frames` frame)."""
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
