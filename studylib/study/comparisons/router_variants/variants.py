"""Notebook 12: the routers people train today against the reference MoE and the matched dense
baselines. Every comparison is paired by seed (:func:`studylib.study.analysis.tables.comparison_table`);
the router diagnostics come from the last evaluation's statistics over the evaluation subset
(:func:`studylib.study.analysis.frames.layer_stats`), the selection bias's trajectory from the eval
records (each MoE layer with ``bias_balance`` records its ``bias`` per expert)."""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np
import pandas as pd

from studylib.study.analysis.frames import aggregate, layer_stats, router_records
from studylib.study.analysis.tables import comparison_table, concat_families

DEAD_SHARE = 1e-3  # an expert with less than this share of a layer's assignments counts as dead


def describe(cfg) -> str:
    """A variant's router in a few words: ``"sigmoid, bias u=0.001, 1 shared + top-1 of 4 x 128"``."""
    f = cfg.ffn
    if f.kind != "moe":
        return f"dense {f.hidden}"
    parts = [f.score]
    if f.bias_balance:
        parts.append(f"bias u={f.bias_rate:g}")
    if f.balance_coef:
        parts.append(f"balance {f.balance_coef:g}")
    if f.seq_balance_coef:
        parts.append(f"seq-balance {f.seq_balance_coef:g}")
    if f.z_coef:
        parts.append(f"z {f.z_coef:g}")
    if f.route_scale != 1.0:
        parts.append(f"scale {f.route_scale:g}")
    if not f.renormalize:
        parts.append("not renormalised")
    shape = f"top-{f.top_k} of {f.num_experts} x {f.hidden}"
    return ", ".join(parts) + ", " + (f"{f.n_shared} shared + " if f.n_shared else "") + shape


def diagnostics(run_dirs: Mapping) -> pd.DataFrame:
    """Per variant (``{model: {seed: run_dir}}``), at the last evaluation, over layers and seeds:
    ``imbalance`` (busiest expert's share x E, the max/mean load: 1 is perfect balance; mean over
    layers and seeds), ``worst_imbalance`` (its largest layer value), ``dead_experts`` (experts
    with a share under :data:`DEAD_SHARE`, summed over layers, mean over seeds), ``entropy``
    (mean per-token router entropy over ln E: 1 is a uniform router) and ``bias_picked`` (the
    share of assignments a selection bias picked, mean over layers and seeds; NaN for routers
    without one)."""
    rows = []
    for model, by_seed in run_dirs.items():
        imb, dead, ent, picked = [], [], [], []
        for rd in by_seed.values():
            recs = router_records(rd)
            if not recs:
                continue
            layers = [st for st in recs[-1]["router"] if isinstance(st, dict)]
            read = [layer_stats(st, ("busiest", "entropy", "bias_picked")) for st in layers]  # the one reading
            E = [len(st["shares"]) for st in layers]
            imb.append([r["busiest"] * e for r, e in zip(read, E)])
            dead.append(sum(int((np.asarray(st["shares"], dtype=float) < DEAD_SHARE).sum()) for st in layers))
            ent.append(float(np.mean([r["entropy"] / np.log(e) for r, e in zip(read, E)])))
            picked += [r["bias_picked"] for r in read if "bias_picked" in r]
        if imb:
            rows.append({"model": model, "imbalance": float(np.mean(imb)), "worst_imbalance": float(np.max(imb)),
                         "dead_experts": float(np.mean(dead)), "entropy": float(np.mean(ent)),
                         "bias_picked": float(np.mean(picked)) if picked else float("nan")})
    return pd.DataFrame(rows, columns=["model", "imbalance", "worst_imbalance", "dead_experts", "entropy",
                                      "bias_picked"]).set_index("model")


#: notebook 12's three families: (key, the family's name); see :func:`variant_table`
FAMILIES = (("vs_ref", "12 router variants: each variant − the reference MoE"),
            ("vs_active", "12 router variants: the active-match dense model − each MoE"),
            ("vs_total", "12 router variants: each MoE − the total-match dense model"))


def variant_table(summaries: pd.DataFrame, variants: list, reference: str, dense_active: str,
                  dense_total: str, configs: Optional[Mapping] = None, run_dirs: Optional[Mapping] = None,
                  margin: Optional[float] = None) -> pd.DataFrame:
    """One row per MoE (the reference first): its router (``router``), n seeds, best validation
    loss (mean, std), the paired gaps (per seed, then mean and 95% CI) against the reference MoE
    (``vs_ref``: variant - reference; > 0: the reference is better), the active-match dense model
    (``vs_active``: dense_active - variant; > 0: the variant is better) and the total-match dense
    model (``vs_total``: variant - dense_total; > 0: the dense model is better), each with
    ``_mean``, ``_low``, ``_high``, ``_p``, ``_p_holm``, ``_p_tost``, ``_p_tost_holm``, ``_resolved``
    (after Holm), ``_verdict``; and the router diagnostics (:func:`diagnostics`) when ``run_dirs``
    is given.

    Three families (:data:`FAMILIES`), each Holm-corrected over its own size and tested for
    equivalence within ``±margin``: every variant against the reference MoE (the question the
    notebook asks: does another router beat the reference?), every MoE (the reference too) against
    the active-match dense model, and every MoE against the total-match dense model. The
    comparisons are in ``attrs["comparisons"]`` (:func:`comparison_table` families joined by
    :func:`~studylib.study.analysis.tables.concat_families`; its ``family`` column names each)."""
    models = [reference] + [m for m in variants if m != reference]
    pairs = {"vs_ref": {f"{m} − {reference}": (m, reference) for m in models if m != reference},
             "vs_active": {f"{dense_active} − {m}": (dense_active, m) for m in models},
             "vs_total": {f"{m} − {dense_total}": (m, dense_total) for m in models}}
    cmp = concat_families([comparison_table(summaries, pairs[key], margin=margin, family=name)
                           for key, name in FAMILIES if pairs[key]])
    agg = aggregate(summaries[summaries["model"].isin(models)], "best_val_loss").reindex(models)
    rows = []
    for m in models:
        row = {"model": m, "router": describe(configs[m]) if configs else "", "n": int(agg.loc[m, "n"]),
               "best_val_loss": agg.loc[m, "best_val_loss_mean"], "best_val_loss_std": agg.loc[m, "best_val_loss_std"]}
        for key, label in (("vs_ref", f"{m} − {reference}"), ("vs_active", f"{dense_active} − {m}"),
                           ("vs_total", f"{m} − {dense_total}")):
            c = cmp.loc[label] if label in cmp.index else None
            for k in ("mean", "low", "high", "p", "p_holm", "p_tost", "p_tost_holm", "resolved", "verdict"):
                col = {"low": "ci_low", "high": "ci_high"}.get(k, k)
                row[f"{key}_{k}"] = ({"mean": 0.0, "verdict": ""}.get(k, np.nan)) if c is None else c[col]
        rows.append(row)
    out = pd.DataFrame(rows).set_index("model")
    if run_dirs is not None:
        out = out.join(diagnostics({m: run_dirs[m] for m in models if m in run_dirs}))
    out.attrs["comparisons"] = cmp
    return out


def bias_frame(run_dirs: Mapping) -> pd.DataFrame:
    """Long frame model / seed / step / tokens / layer / expert / bias of the selection bias at
    every evaluation, for the variants that have one."""
    rows = []
    for model, by_seed in run_dirs.items():
        for seed, rd in by_seed.items():
            for r in router_records(rd):
                for layer, st in enumerate(r["router"]):
                    if isinstance(st, dict) and isinstance(st.get("bias"), list):
                        rows += [{"model": model, "seed": seed, "step": r["step"], "tokens": r.get("tokens"),
                                  "layer": layer, "expert": e, "bias": float(b)} for e, b in enumerate(st["bias"])]
    return pd.DataFrame(rows, columns=["model", "seed", "step", "tokens", "layer", "expert", "bias"])


__all__ = ["DEAD_SHARE", "FAMILIES", "describe", "diagnostics", "variant_table", "bias_frame"]
