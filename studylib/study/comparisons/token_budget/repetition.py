"""What repeating the data does, and the power, on the map (:mod:`.gaps`): what each point takes to
resolve (:func:`power_frame`), validation minus training loss after more than one pass
(:func:`memorisation_table`) and, measured, each gap and loss against the passes at one size and
budget drawn from fewer stories (:func:`repetition_table`, :func:`repetition_fit`).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from studylib.study.analysis.stats import paired
from studylib.study.analysis.tables import power_rows
from studylib.study.analysis.bootstrap import Coef, holm_p, linear_fit, no_interval
from studylib.study.comparisons.token_budget.gaps import CELL, GAPS, PAPER_POINT, size_label
from studylib.study.comparisons.token_budget.knobs import TrioConfig



def memorisation_table(trios: Sequence[TrioConfig], summaries: pd.DataFrame, metrics: Mapping) -> pd.DataFrame:
    """Per cell of one pass or more x model: the passes, the mean over seeds of the last training
    loss, of the final validation loss and ``val - train`` (memorisation once windows repeat).
    ``metrics``: ``{(size, epochs, stories): eval records}`` (:func:`~.cell_metrics`)."""
    rows = []
    by_cell = summaries.groupby(CELL, sort=False)
    for t in trios:
        for e, f in t.cells():
            d = by_cell.get_group((t.size, e, f))
            passes = float((d["tokens"] / d["train_targets"]).iloc[0]) if "train_targets" in d else math.nan
            if passes < 1 - 1e-9:
                continue
            m = metrics[(t.size, e, f)]
            last = m.sort_values("step").groupby(["model", "seed"]).tail(1)
            for model in t.models:
                r = last[last["model"] == model]
                rows.append({"size": t.size, "epochs": e, "stories": f, "data_passes": passes, "model": model,
                             "n": len(r), "train_loss": float(r["train_loss"].mean()),
                             "val_loss": float(r["val_loss"].mean()),
                             "val_minus_train": float((r["val_loss"] - r["train_loss"]).mean())})
    return pd.DataFrame(rows)


def _repeated(per_seed: pd.DataFrame) -> pd.DataFrame:
    """The rows of the cells whose (size, epochs) was trained from two or more fractions of the
    stories (a repetition group), with ``group``."""
    ps = per_seed.copy()
    n = ps.groupby(["size", "epochs"])["stories"].transform("nunique")
    ps = ps[n > 1].copy()
    ps["group"] = ps.groupby(["size", "epochs"], sort=False).ngroup()
    return ps


def repetition_table(per_seed: pd.DataFrame, active: dict) -> pd.DataFrame:
    """Each repeated budget's cells (one size, one number of tokens, the stories cut to fractions:
    passes vary, nothing else): per cell its passes and unique tokens, each role's mean best
    validation loss (nats, one tokenizer per size) with its 95% CI over seeds, and each gap
    (``dense - MoE``) with its paired 95% CI."""
    ps = _repeated(per_seed)
    rows = []
    for (size, e, f), d in ps.groupby(CELL, sort=False):
        first = d.iloc[0]
        row = {"size": size, "size_label": size_label(size, active[size]), "epochs": e, "stories": f,
               "tokens": int(first["tokens"]), "tokens_per_param": float(first["tokens_per_param"]),
               "data_passes": float(first["data_passes"]), "unique": float(first["unique"])}
        moe = d[d["gap"] == "active"].sort_values("seed")["moe"].to_numpy()
        losses = {"moe": moe}
        for gap, (role, _) in GAPS.items():
            g = d[d["gap"] == gap].sort_values("seed")
            losses[role] = g["dense"].to_numpy()
            p = paired(g["dense"].to_numpy(), g["moe"].to_numpy())
            row.update({f"{gap}_mean": p.mean, f"{gap}_ci_low": p.ci_low, f"{gap}_ci_high": p.ci_high,
                        f"{gap}_n": p.n, f"{gap}_fmt": p.fmt()})
        for role in ("dense_active", "moe", "dense_total"):
            p = paired(losses[role])
            row.update({f"{role}_mean": p.mean, f"{role}_ci_low": p.ci_low, f"{role}_ci_high": p.ci_high})
        rows.append(row)
    return pd.DataFrame(rows)


def _slope(d: pd.DataFrame, value: str, n_boot: int, seed: int) -> tuple[Coef, np.ndarray | None]:
    """(the slope of ``value`` in log10 passes with one intercept per repetition group, with its
    bootstrap interval, seeds resampled within each cell; its bootstrap draws, None without)."""
    d = d.sort_values([*CELL, "seed"]).reset_index(drop=True)
    cell = d.groupby(CELL, sort=False).ngroup().to_numpy()
    groups = d["group"].to_numpy()
    X = np.column_stack([(groups == g).astype(float) for g in np.unique(groups)] + [np.log10(d["data_passes"])])
    if np.linalg.matrix_rank(X) < X.shape[1]:
        return Coef("passes", math.nan, math.nan, math.nan, False, "no repeated budget has two different passes"), None
    lonely = no_interval(d.assign(cell=cell))
    fit = linear_fit(X, d[value].to_numpy(), cell, n_boot, seed, lonely=lonely)
    lo, hi = fit.interval()
    coef = Coef("passes", float(fit.point[-1]), float(lo[-1]), float(hi[-1]), reason=lonely)
    return coef, None if lonely else fit.draws[:, -1]


def repetition_fit(per_seed: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per gap the slope in log10 passes of ``dense - MoE`` over the repeated cells (one intercept
    per repeated budget), its bootstrap 95% CI and p, Holm over the two gaps and ``verdict``; per
    role the slope of its loss (no family). No repeated budget: an empty frame."""
    ps = _repeated(per_seed)
    if ps.empty:
        return pd.DataFrame()
    slopes = {("gap", gap): _slope(ps[ps["gap"] == gap], "value", n_boot, seed) for gap in GAPS}
    for role, (gap, col) in (("dense_active", ("active", "dense")), ("moe", ("active", "moe")),
                             ("dense_total", ("total", "dense"))):
        slopes["role", role] = _slope(ps[ps["gap"] == gap].assign(loss=lambda x, c=col: x[c]), "loss", n_boot, seed)
    t = pd.DataFrame([{"family": k[0], "what": k[1], "estimate": c.estimate, "ci_low": c.ci_low, "ci_high": c.ci_high,
                       "identified": c.identified, "reason": c.reason} for k, (c, _) in slopes.items()])
    p, adj = holm_p({k[1]: d for k, (_, d) in slopes.items() if k[0] == "gap"})
    t["p_boot"] = t["what"].map(p).where(t["family"] == "gap")
    t["p_holm"] = t["what"].map(adj).where(t["family"] == "gap")
    t["verdict"] = [_WORDS[f].get(v, v) for f, v in
                    ((k[0], c.verdict_at(adj.get(k[1], math.nan) if k[0] == "gap" else None))
                     for k, (c, _) in slopes.items())]
    t["cells"] = ps.groupby(CELL).ngroups
    return t


#: a slope's verdict (:meth:`~studylib.study.analysis.bootstrap.Coef.verdict_at`) in words: a gap's
#: (Holm over the two gaps) and a role's loss (its own interval)
_WORDS = {"gap": {"positive": "the MoE gains with repetition", "negative": "the dense model gains with repetition"},
          "role": {"positive": "rises with the passes", "negative": "falls with the passes",
                   "not resolved": "not resolved with the passes"}}


def repetition_sentences(fit: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """The repetition check in words, from its tables (each gap's slope per decade of passes and
    its Holm-adjusted verdict, the cells it rests on)."""
    if fit.empty:
        return ["Repetition is not measured: no budget of the map is trained from fewer stories."]
    passes = ", ".join(f"{r.size} {r.tokens_per_param:.3g} tokens/param from {r.stories:g} of the stories "
                       f"({r.data_passes:.2f} passes)" for r in table.itertuples())
    out = [f"Repetition, measured on {int(fit['cells'].iloc[0])} cells ({passes}):"]
    for r in fit[fit["family"] == "gap"].itertuples():
        label = GAPS[r.what][1].split(" (")[0]
        if not r.identified or r.ci_low != r.ci_low:
            out.append(f"the {label}'s slope: {r.verdict} ({r.reason}).")
            continue
        out.append(f"the {label} moves {r.estimate:+.4f} nats per decade of passes [{r.ci_low:+.4f}, {r.ci_high:+.4f}] "
                   f"(Holm-adjusted p={r.p_holm:.2g} over the two gaps): {r.verdict}.")
    return [" ".join(out)]


def power_frame(per_seed: pd.DataFrame, active: dict, target: float = 0.05) -> pd.DataFrame:
    """What every point of the map takes to resolve (:func:`studylib.study.analysis.tables.power_rows`):
    one row per cell x gap, the effect being the paper's gap at its point (SPEC section 7; the
    map's question is whether the gaps reach it)."""
    groups, keys = {}, {}
    ps = per_seed if "stories" in per_seed else per_seed.assign(stories=1.0)
    for (size, e, f, gap), d in ps.groupby([*CELL, "gap"], sort=False):
        label = f"{size_label(size, active[size])}, {e:g} epochs" + (f", {f:g} of the stories" if f < 1 else "") \
            + f", {gap}"
        groups[label] = d.sort_values("seed")["value"].to_numpy()
        keys[label] = {"size": size, "epochs": e, "stories": f, "gap": gap,
                       "tokens_per_param": float(d["tokens_per_param"].iloc[0])}
    effects = {label: abs(PAPER_POINT[k["gap"]]) for label, k in keys.items()}
    rows = power_rows(groups, effects, target)
    return pd.concat([pd.DataFrame([keys[c] for c in rows["comparison"]]), rows], axis=1)


__all__ = ["memorisation_table", "power_frame", "repetition_fit", "repetition_sentences", "repetition_table"]
