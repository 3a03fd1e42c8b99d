"""The gap plane (issue #31): each gap of the token-budget map as a plane in ``u = log10
tokens/param`` and ``v = log10 params``, ``gap = b0 + b1 (u - u0) + b2 (v - v0) [+ b3 (u - u0)(v - v0)]``,
a linear model (:func:`~studylib.study.analysis.bootstrap.linear_fit`) over every seed of every cell,
centred on the cells' means (``b1``: per decade of tokens/param at the centre size, ``b2``: per
decade of size at the centre tokens/param), seeds resampled within cells. A term the grid cannot
identify is left out and reported as not identified. Its crossing line (where the gap is zero),
every map point predicted with itself left out (:func:`leave_one_out`), its
tables and its words. Anything outside the measured ranges is marked ``extrapolated``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from studylib.study.analysis.bootstrap import (Bootstrap, Coef, cell_frame, coef_table, linear_fit, no_interval,
                                               holm_p, outside, percentile_ci, pooled_sd)
from studylib.study.comparisons.token_budget.gaps import GAPS

#: the map point's coordinates of a per-seed gap frame (see :func:`gap_model`)
GAP_KEYS = ("params", "tokens_per_param")
TERMS = ("intercept", "tokens_per_param", "size", "interaction")


def _design(u: np.ndarray, v: np.ndarray, terms: Sequence[str]) -> np.ndarray:
    cols = {"intercept": np.ones_like(u), "tokens_per_param": u, "size": v, "interaction": u * v}
    return np.stack([cols[t] for t in terms], axis=1)


@dataclass(frozen=True)
class GapModel:
    """A fitted :func:`gap_model`: ``coefs`` (all four :data:`TERMS`, fitted or not identified),
    the fitted ``terms`` with their estimate and replicates (``fit``), the centre ``(u0, v0)``, the
    measured ranges and sizes."""

    coefs: dict
    terms: tuple
    fit: Bootstrap
    centre: tuple
    tokens_per_param_range: tuple
    params_range: tuple
    sizes: tuple
    n_cells: int
    n_obs: int

    def table(self) -> pd.DataFrame:
        return coef_table([self.coefs[t] for t in TERMS])

    def predict_draws(self, params, tokens_per_param) -> tuple[np.ndarray, np.ndarray]:
        """(the fitted gap at each point, its replicates: n_boot x points)."""
        u = np.log10(np.asarray(tokens_per_param, dtype=float)) - self.centre[0]
        v = np.log10(np.asarray(params, dtype=float)) - self.centre[1]
        X = _design(np.atleast_1d(u), np.atleast_1d(v), self.terms)
        return X @ self.fit.point, self.fit.draws @ X.T

    def extrapolated(self, params, tokens_per_param) -> np.ndarray:
        return outside(tokens_per_param, *self.tokens_per_param_range) | outside(params, *self.params_range)

    def predict(self, params, tokens_per_param) -> pd.DataFrame:
        """The fitted gap with its bootstrap interval at each point, and ``extrapolated``."""
        mean, draws = self.predict_draws(params, tokens_per_param)
        lo, hi = percentile_ci(draws, self.fit.level)
        return pd.DataFrame({"params": np.atleast_1d(params), "tokens_per_param": np.atleast_1d(tokens_per_param),
                             "gap": mean, "ci_low": lo, "ci_high": hi,
                             "extrapolated": self.extrapolated(params, tokens_per_param)})

    def crossing(self, params: Optional[Sequence[float]] = None, decades: float = 1.0,
                 points: int = 401) -> pd.DataFrame:
        """Per size (``params``; default the measured ones): the tokens/param where the fitted gap
        is zero (NaN where it is not within ``decades`` beyond the measured range) and
        ``low``..``high``, the stretch around it where the gap's interval includes zero (on
        ``points`` log-spaced values; ``low_open`` / ``high_open``: it reaches the searched edge);
        ``extrapolated``: the zero, its band or the size lies outside the measured ranges."""
        params = self.sizes if params is None else params
        t0, t1 = self.tokens_per_param_range
        grid = np.logspace(math.log10(t0) - decades, math.log10(t1) + decades, points)
        lg, l0, l1 = np.log10(grid), math.log10(grid[0]), math.log10(grid[-1])
        rows = []
        for n in np.atleast_1d(np.asarray(params, dtype=float)):
            mean, draws = self.predict_draws(np.full_like(grid, n), grid)
            lo, hi = percentile_ci(draws, self.fit.level)
            row = {"params": n, "tokens_per_param": math.nan, "low": math.nan, "high": math.nan,
                   "low_open": False, "high_open": False}
            slope = (mean[-1] - mean[0]) / (l1 - l0)
            u_star = l0 - mean[0] / slope if self.coefs["tokens_per_param"].identified and slope != 0 else math.nan
            if l0 <= u_star <= l1:
                row["tokens_per_param"] = 10 ** u_star
                i, out = int(np.argmin(np.abs(lg - u_star))), np.flatnonzero(~((lo <= 0) & (hi >= 0)))
                if i not in out:
                    a = out[out < i].max() + 1 if (out < i).any() else 0
                    e = out[out > i].min() - 1 if (out > i).any() else len(grid) - 1
                    row.update(low=grid[a], high=grid[e], low_open=a == 0, high_open=e == len(grid) - 1)
            cross = [x for x in (row["tokens_per_param"], row["low"], row["high"]) if x == x]
            row["extrapolated"] = bool(outside(n, *self.params_range)[0] or outside(cross, t0, t1).any())
            rows.append(row)
        return pd.DataFrame(rows)


def gap_model(per_seed: pd.DataFrame, value: str = "value", interaction="auto", n_boot: int = 2000,
              level: float = 0.95, seed: int = 0) -> GapModel:
    """:class:`GapModel` of one comparison's per-seed gaps (one row per seed and map point with
    ``tokens_per_param``, ``params`` or ``tokens``, and ``value``). ``interaction``: "auto" (fitted
    where identified on at least five cells), True (where identified) or False."""
    df = cell_frame(per_seed, GAP_KEYS, value, "gap_model")
    u_all, v_all = np.log10(df["tokens_per_param"].to_numpy()), np.log10(df["params"].to_numpy())
    cells = df.groupby("cell")[list(GAP_KEYS)].first()
    cu, cv = np.log10(cells["tokens_per_param"].to_numpy()), np.log10(cells["params"].to_numpy())
    centre = (float(cu.mean()), float(cv.mean()))
    u, v, cu, cv = u_all - centre[0], v_all - centre[1], cu - centre[0], cv - centre[1]
    why = {}
    if len(np.unique(cu)) < 2:
        why["tokens_per_param"] = "the grid has one tokens/param"
    if len(np.unique(cv)) < 2:
        why["size"] = "the grid has one model size"
    terms = ["intercept"] + [t for t in ("tokens_per_param", "size") if t not in why]
    if interaction is False:
        why["interaction"] = "not fitted (interaction=False)"
    elif why:
        why["interaction"] = "the grid has one value of " + ("tokens/param" if "tokens_per_param" in why else "size")
    elif np.linalg.matrix_rank(_design(cu, cv, TERMS)) < 4:
        why["interaction"] = "the grid's cells do not identify it (rank-deficient design)"
    elif interaction == "auto" and len(cu) < 5:
        why["interaction"] = f"{len(cu)} cells: the four-term model would pass through every cell mean"
    else:
        terms.append("interaction")
    if np.linalg.matrix_rank(_design(cu, cv, terms)) < len(terms):  # e.g. sizes and tokens/param collinear
        for t in terms[1:]:
            why[t] = "the grid's cells do not identify it (tokens/param and size vary together)"
        terms = ["intercept"]
    lonely = no_interval(df)
    fit = linear_fit(_design(u, v, terms), df[value].to_numpy(), df["cell"].to_numpy(), n_boot, seed, level, lonely)
    lo, hi = fit.interval()
    coefs = {t: Coef(t, float(fit.point[terms.index(t)]), float(lo[terms.index(t)]), float(hi[terms.index(t)]),
                     reason=lonely)
             if t in terms else Coef(t, math.nan, math.nan, math.nan, False, why[t]) for t in TERMS}
    t, n = df["tokens_per_param"], df["params"]
    return GapModel(coefs, tuple(terms), fit, centre, (float(t.min()), float(t.max())),
                    (float(n.min()), float(n.max())), tuple(float(x) for x in np.unique(n)), len(cells), len(df))


def leave_one_out(per_seed: pd.DataFrame, value: str = "value", level: float = 0.95, seed: int = 0,
                  **fit_kwargs) -> pd.DataFrame:
    """One row per map point: :func:`gap_model` refitted on the others and the point predicted;
    ``inside``: its measured mean (``n`` seeds) lies inside the prediction interval (the refit's
    replicates plus the noise of a mean of ``n`` seeds at the others' pooled within-cell sd);
    ``extrapolated``; ``not_identified`` (the refit's terms the others do not pin down); ``note``
    (why not). (A law's held-out points: :func:`~studylib.study.analysis.law.checks.predict_held_out`.)"""
    keys = GAP_KEYS
    df = cell_frame(per_seed, keys, value, "leave_one_out")
    rng = np.random.default_rng(seed)
    rows = []
    for c, point in df.groupby("cell"):
        rest = df[df["cell"] != c]
        x = [float(point[k].iloc[0]) for k in keys]
        y = point[value].to_numpy()
        row = {**dict(zip(keys, x)), "n": len(y), "measured": float(y.mean()), "predicted": math.nan,
               "pi_low": math.nan, "pi_high": math.nan, "inside": False, "extrapolated": True, "not_identified": "",
               "note": ""}
        try:
            m = gap_model(rest.drop(columns="cell"), value=value, level=level, seed=seed, **fit_kwargs)
        except ValueError as e:
            rows.append({**row, "note": str(e)})
            continue
        s = np.nan_to_num(pooled_sd(rest, value))
        mean, draws = m.predict_draws(*[[v] for v in x])
        sim = draws[:, 0] + rng.normal(0.0, s / math.sqrt(len(y)), len(draws))
        lo, hi = percentile_ci(sim, level)
        lonely = next((c.reason for c in m.coefs.values() if c.identified and not c.has_interval), "")
        row.update(predicted=float(mean[0]), pi_low=float(lo), pi_high=float(hi),
                   inside=bool(lo <= y.mean() <= hi), extrapolated=bool(m.extrapolated(*[[v] for v in x])[0]),
                   not_identified=", ".join(k for k, c in m.coefs.items() if not c.identified), note=lonely)
        rows.append(row)
    return pd.DataFrame(rows)


def _gap_rows(per_seed: pd.DataFrame, gap: str) -> pd.DataFrame:
    """One gap's per-seed rows of the map's cells (all the training stories: the repeated cells are
    the repetition check's, :mod:`.repetition`)."""
    ps = per_seed[per_seed["gap"] == gap]
    return ps[ps["stories"] == 1.0] if "stories" in ps else ps


def _unit(per_seed: pd.DataFrame) -> str:
    """The per-seed gap the fits across sizes read: in bits per byte where the frame has it (one
    scale across the trios' tokenizers), else in nats."""
    return "value_bpb" if "value_bpb" in per_seed and per_seed["value_bpb"].notna().all() else "value"


def gap_models(per_seed: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> dict:
    """``{gap: GapModel}`` for the gaps with at least one map point (in :func:`_unit`)."""
    rows = {g: _gap_rows(per_seed, g) for g in GAPS}
    return {g: gap_model(d, value=_unit(per_seed), n_boot=n_boot, seed=seed) for g, d in rows.items() if len(d)}


def coefficient_table(models: Mapping[str, GapModel], alpha: float = 0.05) -> pd.DataFrame:
    """One row per gap and term (intercept, tokens_per_param, size, interaction): estimate and
    bootstrap CI per decade, ``p_boot``, ``p_holm`` (over the gap's identified slope terms: its
    family) and ``verdict`` ("positive": more of it favours the MoE, "negative", "not resolved",
    "not identified" or "no interval", with ``reason``); ``centre_*``: where the other
    coefficient is held."""
    rows = []
    for gap, m in models.items():
        t = m.table()
        p, adj = holm_p({term: m.fit.draws[:, m.terms.index(term)] for term in m.terms if term != "intercept"})
        for term, r in t.iterrows():
            ok = bool(r["identified"])
            q = adj.get(term, math.nan)
            verdict = "" if ok and term == "intercept" else m.coefs[term].verdict_at(q, alpha)
            rows.append({"gap": gap, "term": term, "estimate": r["estimate"], "ci_low": r["ci_low"],
                         "ci_high": r["ci_high"], "identified": ok, "p_boot": p.get(term, math.nan), "p_holm": q,
                         "verdict": verdict, "reason": r["reason"], "centre_tokens_per_param": 10 ** m.centre[0],
                         "centre_params": 10 ** m.centre[1], "cells": m.n_cells, "rows": m.n_obs,
                         "n_boot": len(m.fit.draws)})
    return pd.DataFrame(rows)


def what_moves(coefs: pd.DataFrame, gap: str) -> str:
    """Whether size, tokens per parameter or both move the gap (its Holm-adjusted verdicts)."""
    v = coefs[coefs["gap"] == gap].set_index("term")["verdict"]
    names = {"tokens_per_param": "tokens per parameter", "size": "model size"}
    moves = [n for t, n in names.items() if v[t] in ("positive", "negative")]
    unknown = [n for t, n in names.items() if v[t] == "not identified"]
    label = GAPS[gap][1].split(" (")[0]
    if all(v[t] in ("no interval", "not identified") for t in names) and "no interval" in set(v[list(names)]):
        return f"What moves the {label}: not judged (a point needs at least two seeds to carry an interval)."
    head = ("both tokens per parameter and model size move it" if len(moves) == 2 else
            f"{moves[0]} moves it" if moves else "neither coefficient is resolved")
    tail = f"; {' and '.join(unknown)} not identified by this grid" if unknown else ""
    return f"What moves the {label}: {head}{tail}."


def _coef_words(r, what: str, unit: str) -> str:
    if not r["identified"]:
        return f"{what}: not identified ({r['reason']})"
    if r["verdict"] == "no interval":
        return f"{what}: {r['estimate']:+.4f} {unit}, {r['reason']}"
    way = {"positive": ", more of it favours the MoE", "negative": ", more of it favours the dense model"}.get(
        r["verdict"], "")
    return (f"{what}: {r['estimate']:+.4f} {unit} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] (bootstrap 95% CI; "
            f"{_p('p', r['p_boot'], r['n_boot'])}, {_p('Holm-adjusted p', r['p_holm'], r['n_boot'])}): "
            f"{r['verdict']}{way}")


def _p(name: str, p: float, n_boot: int) -> str:
    """``name=p``; at the floor of a bootstrap p (one replicate of ``n_boot``), ``name<=1/n_boot``."""
    return f"{name}<={1 / n_boot:.2g}" if p <= 1 / n_boot + 1e-12 else f"{name}={p:.2g}"


def crossing_table(models: Mapping[str, GapModel], points: int = 9) -> pd.DataFrame:
    """Per gap, the fitted zero at ``points`` log-spaced sizes over the measured range
    (:meth:`GapModel.crossing`) and at each measured size (``measured_size``)."""
    rows = []
    for gap, m in models.items():
        lo, hi = m.params_range
        inner = np.logspace(math.log10(lo), math.log10(hi), points)[1:-1] if hi > lo else []
        sizes = sorted({*m.sizes, *(float(n) for n in inner if min(abs(n / s - 1) for s in m.sizes) > 1e-3)})
        c = m.crossing(params=sizes)
        c["measured_size"] = c["params"].isin(m.sizes)
        c.insert(0, "gap", gap)
        rows.append(c)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def loo_table(per_seed: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per gap, every map point predicted by the gap model fitted without it
    (:func:`leave_one_out`)."""
    out = []
    for gap in GAPS:
        d = _gap_rows(per_seed, gap)
        if len(d):
            t = leave_one_out(d, value=_unit(per_seed), n_boot=n_boot, seed=seed)
            t.insert(0, "gap", gap)
            out.append(t)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def plane_sentences(coefs: pd.DataFrame, crossing: pd.DataFrame, loo: pd.DataFrame) -> list[str]:
    """The gap plane in words, from its tables: per gap what moves it and its coefficients, where its
    fitted zero lies at the measured sizes, how many points the left-out fit predicts."""
    out = []
    for gap in dict.fromkeys(coefs["gap"]):
        c = coefs[coefs["gap"] == gap].set_index("term")
        label = GAPS[gap][1].split(" (")[0]
        t_c, n_c = c["centre_tokens_per_param"].iloc[0], c["centre_params"].iloc[0]
        s = (f"{what_moves(coefs, gap)} Gap model of the {label} over {int(c['cells'].iloc[0])} map points "
             f"({int(c['rows'].iloc[0])} per-seed gaps): "
             + "; ".join([_coef_words(c.loc["tokens_per_param"], f"tokens/param at fixed {n_c:.3g} params",
                                      "per decade"),
                          _coef_words(c.loc["size"], f"size at fixed {t_c:.3g} tokens/param", "per decade")]
                         + ([_coef_words(c.loc["interaction"], "interaction", "per decade squared")]
                            if c.loc["interaction", "identified"] else [])) + ".")
        cr = crossing[(crossing["gap"] == gap) & crossing["measured_size"]] if len(crossing) else crossing
        zs = []
        for r in cr.itertuples():
            if r.tokens_per_param != r.tokens_per_param:
                zs.append(f"at {r.params:.3g} params it does not reach zero within a decade of the measured range")
                continue
            band = ("" if r.low != r.low else f", band {r.low:.3g}{' or below' if r.low_open else ''} to "
                    f"{r.high:.3g}{' or above' if r.high_open else ''}")
            zs.append(f"at {r.params:.3g} params {r.tokens_per_param:.3g} tokens/param{band}"
                      + (" (extrapolated)" if r.extrapolated else ""))
        if zs:
            s += " Fitted zero (the crossing line at the measured sizes): " + "; ".join(zs) + "."
        lo = loo[loo["gap"] == gap] if len(loo) else loo
        if len(lo):
            ok = lo[lo["predicted"].notna() & lo["pi_low"].notna()]
            if len(ok):
                s += (f" Left out one at a time, {int(ok['inside'].sum())} of {len(lo)} points lie inside their "
                      f"predicted 95% interval" + (f" ({len(lo) - len(ok)} could not be predicted or carry no "
                                                   f"interval)" if len(ok) < len(lo) else "") + ".")
            else:
                s += " Left out one at a time, no point's prediction carries an interval."
        out.append(s)
    return out


__all__ = ["GAP_KEYS", "TERMS", "GapModel", "gap_model", "leave_one_out", "gap_models", "coefficient_table",
           "what_moves", "crossing_table", "loo_table", "plane_sentences"]
