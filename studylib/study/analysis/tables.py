"""The study's result tables, as plain functions of the frames of :mod:`studylib.study.analysis.frames`
(or of model configs / benchmark rows):

* comparisons: :func:`comparison_table` (any set of paired model comparisons, judged as one
  *family*: per-seed gaps, mean, std, n, 95% CI, p, Holm-adjusted p, TOST equivalence p and its
  Holm adjustment, the verdict; every comparison table below is built on it), :func:`concat_families`;
* headline (SPEC Tables 2 and 6): :func:`headline_table`, :func:`seed_table`, :func:`headline_gaps`
  (matched-active and matched-total gaps with the paper's next to them), :func:`gap_curves` (Figure 3),
  :func:`seed_spread` (the worst seed against the median: runs that stayed behind);
* :func:`power_table`: what each comparison's measured noise takes to resolve (seeds for a CI
  half-width, seeds for 80% power at the paper's effect);
* budgets (Table 5): :func:`accounting_frame`, :func:`param_split`;
* :func:`granularity_table` (soft-MoE K sweep, each K against K = 1) and :func:`throughput_table` (Table 8);
* formatting: :func:`pm` (mean ± std), :func:`fmt_count` (14.89M / 147.8k).

Routing tables are in :mod:`studylib.study.analysis.routing`. Standard deviations are ddof=1 over seeds; a
gap is *resolved* only when its p value, Holm-adjusted over its family, is below 0.05
(:func:`studylib.study.analysis.stats.family`; for a family of one, exactly when its paired-t 95% CI
excludes zero), and *equivalent* when the TOST against ``±margin`` is, after the same adjustment.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from studylib.config import count_params, ffn_label
from studylib.study.analysis.frames import aggregate, eval_curves, paired_gaps, seed_gaps
from studylib.study.analysis.paper import PAPER_GAPS
from studylib.study.analysis.stats import MARGIN, family as judge_family, half_width_at, paired, power_of

#: the columns of a comparison row (see :func:`comparison_table`)
COMPARISON_COLUMNS = ("a", "b", "mean", "std", "n", "ci_low", "ci_high", "p", "resolved", "gap")
#: the columns a comparison row's family adds (:func:`studylib.study.analysis.stats.family`)
FAMILY_COLUMNS = ("p_holm", "p_tost", "p_tost_holm", "equivalent", "verdict", "family_size", "margin", "family")


# --------------------------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------------------------
def pm(mean: float, std: float, digits: int = 4) -> str:
    """``"1.6545 ± 0.0012"`` (std shown as n/a when it is NaN, e.g. one seed)."""
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return f"{mean:.{digits}f} ± n/a"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def fmt_count(n: int, unit: Optional[str] = None) -> str:
    """Millions at the paper's precision (``14.89M``), or thousands (``147.8k``); ``unit`` "M" or
    "k" (default: M from one million up)."""
    unit = unit or ("M" if abs(n) >= 1e6 else "k")
    return f"{n / 1e6:.2f}M" if unit == "M" else f"{n / 1e3:.1f}k"


# --------------------------------------------------------------------------------------------
# paired comparisons
# --------------------------------------------------------------------------------------------
def comparison_table(df: pd.DataFrame, pairs: Mapping[str, tuple], value: str = "best_val_loss",
                     margin: Optional[float] = None, family: str = "") -> pd.DataFrame:
    """One row per ``label: (a, b)`` of ``pairs``, the pairs judged together as one family (a loss:
    lower is better): the paired per-seed gap ``value[a] - value[b]``
    (:func:`studylib.study.analysis.frames.paired_gaps`) as ``a``, ``b``, ``mean``, ``std`` (ddof=1), ``n``,
    ``ci_low``, ``ci_high`` (paired-t 95%, unadjusted), ``p``, ``resolved`` (``p_holm < 0.05``: the
    difference survives Holm's correction over the family) and ``gap`` (the formatted
    ``+mean [low, high] (n=..)``); then :data:`FAMILY_COLUMNS` from
    :func:`studylib.study.analysis.stats.family`: ``p_holm``, ``p_tost`` (paired TOST of "within
    ``±margin``"; ``margin`` None: :data:`~studylib.study.analysis.stats.MARGIN`, 0.03 nats),
    ``p_tost_holm``, ``equivalent``, ``verdict`` ("A better" / "B better" / "equivalent" /
    "inconclusive"), ``family_size``, ``margin`` and ``family`` (its name). A family of one
    comparison is judged on its own (Holm changes nothing). The per-seed gaps are in
    ``attrs["per_seed"]`` (long: comparison / seed / gap)."""
    margin = MARGIN if margin is None else margin
    rows, per_seed = [], []
    for label, (a, b) in pairs.items():
        g = paired_gaps(df, a, b, value)
        rows.append({"comparison": label, **{k: g[k] for k in COMPARISON_COLUMNS[:-1]},
                     "gap": g["paired"].fmt()})
        per_seed.append(pd.DataFrame({"comparison": label, "seed": g["per_seed"].index,
                                      "gap": g["per_seed"].to_numpy()}))
    out = pd.DataFrame(rows, columns=["comparison", *COMPARISON_COLUMNS]).set_index("comparison")
    if len(out):
        fam = judge_family({label: d["gap"].to_numpy(dtype=float) for label, d in zip(pairs, per_seed)}, margin)
        out["resolved"] = fam["resolved"].reindex(out.index)
        for col in FAMILY_COLUMNS[:-1]:
            out[col] = fam[col].reindex(out.index)
        out["family"] = family
    else:
        for col in FAMILY_COLUMNS:
            out[col] = pd.Series(dtype=object)
    out.attrs["per_seed"] = (pd.concat(per_seed, ignore_index=True) if per_seed
                             else pd.DataFrame(columns=["comparison", "seed", "gap"]))
    return out


def concat_families(tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Several :func:`comparison_table` families as one table (rows in order, each keeping its own
    family's adjustment), their per-seed gaps joined in ``attrs["per_seed"]``."""
    bare = []
    for t in tables:
        t = t.copy()
        t.attrs = {}  # pandas compares the attrs of what it concatenates
        bare.append(t)
    out = pd.concat(bare)
    out.attrs["per_seed"] = pd.concat([t.attrs["per_seed"] for t in tables], ignore_index=True)
    return out


def relabel(table: pd.DataFrame, labels: Mapping) -> pd.DataFrame:
    """A copy of a comparison table (:func:`comparison_table`) with its comparisons renamed by
    ``labels`` (``{old: new}``; others kept), in the index and in ``attrs["per_seed"]``."""
    out = table.rename(index=lambda k: labels.get(k, k))
    ps = table.attrs.get("per_seed")
    if ps is not None:
        ps = ps.copy()
        ps["comparison"] = ps["comparison"].map(lambda k: labels.get(k, k))
        out.attrs["per_seed"] = ps
    return out


#: the seed counts :func:`power_table` shows the CI half-width for
POWER_SEEDS = (3, 5, 10, 20)


def power_table(comparisons: pd.DataFrame, effects: Mapping[str, float], target: float = 0.03,
                seeds: Sequence[int] = POWER_SEEDS) -> pd.DataFrame:
    """What each comparison of a :func:`comparison_table` takes to resolve, from its per-seed gaps
    (``attrs["per_seed"]``): :func:`power_rows` indexed by comparison."""
    ps = comparisons.attrs.get("per_seed")
    if ps is None:
        raise KeyError("power_table: the comparison table has no attrs['per_seed'] (build it with comparison_table)")
    gaps = {label: ps.loc[ps["comparison"] == label, "gap"].to_numpy(dtype=float) for label in comparisons.index}
    return power_rows(gaps, effects, target, seeds).set_index("comparison")


def power_rows(gaps: Mapping, effects: Mapping, target: float, seeds: Sequence[int] = POWER_SEEDS) -> pd.DataFrame:
    """One row per ``label: per-seed gaps`` (:func:`studylib.study.analysis.stats.power_of`): ``n``,
    ``mean``, the per-seed ``std`` of the gap and its 95% upper bound ``std_high``, the CI
    half-width now and at each of ``seeds`` (``hw@n``), the seeds for a half-width <= ``target``
    and the seeds for 80% power to resolve a true gap of ``effects[label]`` (NaN without one),
    each also at ``std_high`` (``*_high``)."""
    rows = []
    for label, d in gaps.items():
        effect = float(effects.get(label, float("nan")))
        pw = power_of(np.asarray(d, dtype=float), target=target, effect=effect)
        row = {"comparison": label, "n": pw.n, "mean": pw.mean, "std": pw.std, "std_high": pw.std_high,
               "half_width": pw.half_width}
        row.update({f"hw@{k}": half_width_at(pw.std, k) for k in seeds})
        row.update({"target": target, "seeds_target": pw.seeds_target, "seeds_target_high": pw.seeds_target_high,
                    "effect": effect, "seeds_effect": pw.seeds_effect, "seeds_effect_high": pw.seeds_effect_high})
        rows.append(row)
    out = pd.DataFrame(rows)
    for col in ("seeds_target", "seeds_target_high", "seeds_effect", "seeds_effect_high"):
        out[col] = out[col].astype("Int64")
    return out


# --------------------------------------------------------------------------------------------
# headline: Table 2, Table 6, the gaps, gap curves
# --------------------------------------------------------------------------------------------
def headline_table(df: pd.DataFrame, models: Optional[Sequence[str]] = None,
                   value: str = "best_val_loss") -> pd.DataFrame:
    """SPEC Table 2: per model n, mean and std (ddof=1) of ``value`` and of exp(value) (ppl),
    plus the formatted ``loss`` and ``ppl`` strings and the parameter counts."""
    if df.empty:
        raise ValueError("headline_table: no finished runs")
    agg = aggregate(df, value)
    order = [m for m in (models or agg.index) if m in agg.index]
    agg = agg.loc[order]
    out = agg.copy()
    out["loss"] = [pm(m, s) for m, s in zip(agg[f"{value}_mean"], agg[f"{value}_std"])]
    out["ppl"] = [pm(m, s, 2) for m, s in zip(agg["ppl_mean"], agg["ppl_std"])]
    for col in ("params_total", "params_active"):
        if col in df:
            out[col] = df.groupby("model", sort=False)[col].first().reindex(order)
    return out


def seed_table(df: pd.DataFrame, dense_active: str, moe: str, dense_total: str,
               value: str = "best_val_loss") -> pd.DataFrame:
    """SPEC Table 6: one row per seed with the three models' ``value``, the matched-active gap
    (dense_active - moe) and the matched-total gap (moe - dense_total), computed per seed; then
    ``mean`` and ``std`` (ddof=1) rows over the seeds: of each model (:func:`aggregate`) and of
    each gap (:func:`paired_gaps`), and the gaps' ``ci_low`` / ``ci_high`` rows (NaN for the models)."""
    wide = df.pivot_table(index="seed", columns="model", values=value)
    missing = [m for m in (dense_active, moe, dense_total) if m not in wide]
    if missing:
        raise KeyError(f"seed_table: no runs of {missing}; have {list(wide.columns)}")
    t = wide[[dense_active, moe, dense_total]].dropna().copy()
    t["active_gap"] = t[dense_active] - t[moe]
    t["total_gap"] = t[moe] - t[dense_total]
    t.index = t.index.astype(object)
    both = df[df["seed"].isin(t.index)]
    agg = aggregate(both, value)
    g = {"active_gap": paired_gaps(both, dense_active, moe, value),
         "total_gap": paired_gaps(both, moe, dense_total, value)}
    stats = pd.DataFrame(index=["mean", "std", "ci_low", "ci_high"], columns=t.columns, dtype=float)
    for m in (dense_active, moe, dense_total):
        stats.loc["mean", m], stats.loc["std", m] = agg.loc[m, f"{value}_mean"], agg.loc[m, f"{value}_std"]
    for col, gap in g.items():
        for row in stats.index:
            stats.loc[row, col] = gap[row]
    return pd.concat([t, stats])


def headline_gaps(df: pd.DataFrame, dense_active: str, moe: str, dense_total: str,
                  value: str = "best_val_loss", margin: Optional[float] = None) -> pd.DataFrame:
    """The two headline gaps as :func:`comparison_table` rows ``active`` (dense_active - moe,
    positive: the MoE is better) and ``total`` (moe - dense_total, positive: the dense
    total-match is better), with the paper's gap (``paper_mean``, ``paper_std``: seed 000, 3 seeds).
    The two gaps are pre-registered: each is its own family of one (no Holm correction), with its
    TOST against ``±margin`` (``equivalent``, ``verdict``)."""
    t = concat_families([comparison_table(df, {k: pair}, value, margin, f"headline: {what} (pre-registered, uncorrected)")
                         for k, pair, what in (("active", (dense_active, moe), "matched-active"),
                                               ("total", (moe, dense_total), "matched-total"))])
    t["paper_mean"] = [PAPER_GAPS[k][0] for k in t.index]
    t["paper_std"] = [PAPER_GAPS[k][1] for k in t.index]
    return t


def seed_spread(df: pd.DataFrame, models: Sequence[str], threshold: float = 0.15,
                value: str = "best_val_loss") -> pd.DataFrame:
    """Per model: n, median, std (ddof=1), best and worst seed of ``value``, ``worst - median`` and
    the seeds more than ``threshold`` above the median (``failed``: runs that stayed behind, e.g.
    left the unigram plateau late)."""
    rows = []
    for m in models:
        g = df[df["model"] == m].set_index("seed")[value].astype(float)
        if g.empty:
            raise KeyError(f"seed_spread: no runs of {m!r}")
        med = float(g.median())
        bad = [int(s) for s, v in g.items() if v - med > threshold]
        rows.append({"model": m, "n": len(g), "median": med, "std": float(g.std(ddof=1)) if len(g) > 1 else np.nan,
                     "best": float(g.min()), "worst": float(g.max()), "worst_seed": int(g.idxmax()),
                     "worst_minus_median": float(g.max()) - med, "threshold": threshold,
                     "failed": ", ".join(map(str, bad)) or "none"})
    return pd.DataFrame(rows).set_index("model")


def gap_curves(metrics: pd.DataFrame, pairs: dict, value: str = "val_loss") -> pd.DataFrame:
    """Gap curves over training on the validation subset (:func:`studylib.study.analysis.frames.eval_curves`:
    the final full-split pass is not on the curve): for each ``name: (a, b)`` in ``pairs``, the
    per-seed gap ``value[a] - value[b]`` at every eval step both runs have, then per step the
    :func:`~studylib.study.analysis.stats.paired` summary (mean, std, n, ci_low, ci_high, resolved). Long
    frame: gap / step / tokens / mean / std / n / ci_low / ci_high / resolved (and the per-seed
    frame in ``attrs["per_seed"]``: gap / seed / step / tokens / value)."""
    ev = eval_curves(metrics)
    tokens = ev.groupby("step")["tokens"].first()
    per_seed, rows = [], []
    for name, (a, b) in pairs.items():
        gap = seed_gaps(ev, a, b, value, index=["seed", "step"]).rename("value").reset_index()
        gap["gap"] = name
        per_seed.append(gap)
        for step, grp in gap.groupby("step"):
            p = paired(grp["value"].to_numpy())
            rows.append({"gap": name, "step": step, "tokens": tokens.get(step, np.nan), "mean": p.mean,
                         "std": p.std, "n": p.n, "ci_low": p.ci_low, "ci_high": p.ci_high,
                         "resolved": p.resolved})
    out = pd.DataFrame(rows)
    ps = pd.concat(per_seed, ignore_index=True)
    ps["tokens"] = ps["step"].map(tokens)
    out.attrs["per_seed"] = ps
    return out


# --------------------------------------------------------------------------------------------
# parameter accounting (Table 5)
# --------------------------------------------------------------------------------------------
def accounting_frame(cfgs: Iterable) -> pd.DataFrame:
    """SPEC Table 5 for model configs: the integer accounting plus shape columns and a
    ``display`` column "embedding | non-FFN | FFN total | total / active" in millions."""
    rows = []
    for c in cfgs:
        n = count_params(c)
        u = "M" if n.total >= 1e6 else "k"  # one unit per model, as in the paper
        rows.append({"model": c.name, "d_model": c.d_model, "heads": f"{c.n_heads}/{c.n_kv_heads}",
                     "ffn": ffn_label(c), "embedding": n.embedding, "non_ffn": n.non_ffn, "ffn_total": n.ffn_total,
                     "ffn_active": n.ffn_active, "router": n.router, "total": n.total, "active": n.active,
                     "display": " | ".join(fmt_count(v, u) for v in (n.embedding, n.non_ffn, n.ffn_total))
                                + f" | {fmt_count(n.total, u)} / {fmt_count(n.active, u)}"})
    return pd.DataFrame(rows).set_index("model")


def param_split(cfgs: Iterable) -> pd.DataFrame:
    """Per model: embedding / non-FFN / FFN active / FFN inactive / router parameter counts
    (they sum to the total; all but FFN inactive are the active path)."""
    rows = []
    for c in cfgs:
        n = count_params(c)
        rows.append({"model": c.name, "embedding": n.embedding, "non_ffn": n.non_ffn,
                     "ffn_active": n.ffn_active, "ffn_inactive": n.ffn_total - n.ffn_active,
                     "router": n.router})
    return pd.DataFrame(rows).set_index("model")


# --------------------------------------------------------------------------------------------
# granularity and throughput
# --------------------------------------------------------------------------------------------
def granularity_table(summaries: pd.DataFrame, models: Sequence[str], K: Optional[Mapping[str, int]] = None,
                      base: Optional[str] = None, value: str = "best_val_loss",
                      paper: Optional[pd.DataFrame] = None, margin: Optional[float] = None) -> pd.DataFrame:
    """Soft-MoE K sweep: per model ``K``, n, mean and std of ``value`` over seeds, and the paired
    gap ``delta_vs_<base>`` = ``value[model] - value[base]`` (default base: the first model) with
    its 95% CI (``ci_low``, ``ci_high``), ``p``, ``resolved`` and ``gap`` (text) and the family's
    columns (:data:`FAMILY_COLUMNS`: every K against the base is one family, Holm over its size,
    TOST against ``±margin``), from :func:`comparison_table` (0 and empty for the base itself).
    ``paper`` (indexed by K, one column, e.g. :data:`studylib.study.analysis.paper.PAPER_GRANULARITY`)
    adds ``paper_delta``."""
    base = base or models[0]
    agg = aggregate(summaries[summaries["model"].isin(models)], value).reindex(list(models))
    label = f"K={K[base]}" if K is not None else base
    cmp = comparison_table(summaries, {m: (m, base) for m in models if m != base}, value, margin,
                           f"06 granularity: each K − {label}")
    out = pd.DataFrame(index=pd.Index(list(models), name="model"))
    if K is not None:
        out["K"] = [K[m] for m in models]
    out["n"] = agg["n"]
    out[f"{value}_mean"], out[f"{value}_std"] = agg[f"{value}_mean"], agg[f"{value}_std"]
    out["loss"] = [pm(m, s) for m, s in zip(out[f"{value}_mean"], out[f"{value}_std"])]
    out[f"delta_vs_{base}"] = cmp["mean"].reindex(out.index)
    out.loc[base, f"delta_vs_{base}"] = 0.0
    for col in ("ci_low", "ci_high", "p", "resolved", "gap", *FAMILY_COLUMNS):
        out[col] = cmp[col].reindex(out.index)
    if paper is not None and K is not None:
        out["paper_delta"] = [paper.iloc[:, 0].get(K[m], np.nan) for m in models]
    out.attrs["per_seed"] = cmp.attrs["per_seed"]
    out.attrs["comparisons"] = cmp
    return out


def _variant_labels(d: pd.DataFrame) -> pd.Series:
    """``model`` plus the cache mode (decode rows) or ``[dispatch]`` (training rows), and the
    implementation when not every row is studylib's."""
    if "cache" in d:  # decode rows
        label = d["model"] + np.where(d["cache"], " (KV cache)", " (no cache)")
    else:
        label = d["model"] + np.where(d["dispatch"].astype(str) != "", "[" + d["dispatch"].astype(str) + "]", "")
    if "impl" in d and (d["impl"] != "studylib").any():
        label = label + np.where(d["impl"] != "studylib", " (" + d["impl"] + ")", "")
    return label


def throughput_table(df: pd.DataFrame, ref: Optional[str] = None) -> pd.DataFrame:
    """SPEC Table 8 from :func:`studylib.tools.bench.bench_train` (or ``bench_decode``) rows: one
    row per variant with a ``label`` (model, [dispatch]), the median tokens/s, its min-max range
    over the rounds (``range`` text, ``lo`` / ``hi`` numbers) and the speed ratio to ``ref``: the
    bench's paired per-round ratio (median over rounds) when ``ref`` is the bench's reference (its
    first model), else the ratio of the medians."""
    d = df.copy()
    d["label"] = _variant_labels(d)
    d["tok_per_s"] = d["tok_s"]
    d["range"] = [f"{a:,.0f}-{b:,.0f}" for a, b in zip(d["tok_s_min"], d["tok_s_max"])]
    d["lo"], d["hi"] = d["tok_s_min"], d["tok_s_max"]
    if ref is not None:
        base = d.loc[d["model"] == ref, "tok_s"]
        if base.empty:
            raise KeyError(f"throughput_table: no rows of {ref!r}")
        if "ratio_ref" in d and d["model"].iloc[0] == ref:  # the bench's paired per-round ratios
            d["ratio_to_" + ref] = d.pop("ratio_ref")
        else:
            d["ratio_to_" + ref] = d["tok_s"] / float(base.iloc[0])
    cols = ["label", "model"] + [c for c in ("dispatch", "cache") if c in d] + ["tok_per_s", "range"] + \
        ["lo", "hi"] + \
        [c for c in d.columns if c.startswith("ratio_") and not d[c].isna().all()] + \
        [c for c in ("params", "mfu", "ms_per_token") if c in d]
    return d[cols].set_index("label")
