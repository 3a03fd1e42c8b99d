"""Fits over the token-budget map (issue #31): the gap model, the crossing it implies, and each map
point predicted with itself left out. The loss law is :mod:`studylib.study.comparisons.token_budget.loss_law`.

* :func:`gap_model`: a comparison's per-seed gaps as a plane in ``u = log10 tokens/param`` and
  ``v = log10 params``, ``gap = b0 + b1 (u - u0) + b2 (v - v0) [+ b3 (u - u0)(v - v0)]``, least
  squares over every seed of every cell, centred on the grid (``u0``, ``v0``: the means over the
  cells), so ``b1`` is the tokens/param coefficient at fixed (the centre) size and ``b2`` the size
  coefficient at fixed (the centre) tokens/param, each per decade. A term the grid cannot
  identify (one size, one tokens/param, an interaction on fewer than five cells or a rank-deficient
  design) is left out and reported as not identified.
* Intervals come from a bootstrap that resamples seeds within each cell (:func:`bootstrap_values`):
  each cell keeps its number of seeds, so the design is the same in every replicate and the
  replicates are one matrix product.
* :meth:`GapModel.crossing`: where the fitted gap is zero, a line in (size, tokens/param), with
  the band where the bootstrap's 95% interval of the gap includes zero;
* :func:`leave_one_out`: every map point (cell) refitted without itself and predicted, with
  whether its measured mean lies inside the prediction interval.

Anything outside the measured ranges is marked ``extrapolated``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd

#: the map point's coordinates of a per-seed gap frame (see :func:`gap_model`)
GAP_KEYS = ("params", "tokens_per_param")


# --------------------------------------------------------------------------------------------
# shared pieces: cells, the bootstrap, a coefficient with its verdict
# --------------------------------------------------------------------------------------------
def cell_frame(per_seed: pd.DataFrame, keys: Sequence[str], value: str, who: str) -> pd.DataFrame:
    """``per_seed`` with ``keys`` and ``value`` checked (present, finite, keys positive), ``params``
    derived as ``round(tokens / tokens_per_param)`` where it is missing, sorted by cell, with an
    integer ``cell`` column (one per distinct ``keys``)."""
    df = per_seed.copy()
    if "params" in keys and "params" not in df and {"tokens", "tokens_per_param"} <= set(df):
        df["params"] = np.round(df["tokens"].astype(float) / df["tokens_per_param"].astype(float))
    for c in (*keys, value):
        if c not in df:
            raise ValueError(f"{who}: the per-seed frame has no column {c!r} (columns: {list(df.columns)})")
        x = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)
        if not np.isfinite(x).all():
            raise ValueError(f"{who}: column {c!r} holds missing or non-numeric values")
        if c != value and (x <= 0).any():
            raise ValueError(f"{who}: column {c!r} must be positive (it is used on a log scale)")
        df[c] = x
    if df.empty:
        raise ValueError(f"{who}: the per-seed frame is empty")
    df = df.sort_values(list(keys), kind="stable").reset_index(drop=True)
    df["cell"] = df.groupby(list(keys), sort=False).ngroup()
    return df


#: the seeds a cell needs for a fit over the cells to carry an interval (a bootstrap that resamples
#: one seed resamples nothing: its interval would have no width)
MIN_SEEDS = 2


def no_interval(df: pd.DataFrame, cells: str = "map points") -> str:
    """Why a fit over the cells of ``df`` (:func:`cell_frame`) has no interval ("" when every cell
    has :data:`MIN_SEEDS` seeds or more); ``cells``: what a cell is, in the sentence."""
    n = df.groupby("cell")["seed"].nunique() if "seed" in df else df.groupby("cell").size()
    few = int((n < MIN_SEEDS).sum())
    return ("" if not few else f"no interval: {few} of {len(n)} {cells} have one seed (a point needs at least "
                               f"{MIN_SEEDS} seeds to carry an interval)")


def resample_cells(cell: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, len(cell))`` row indices: each replicate draws, within every cell, as many rows
    (seeds) as the cell has, with replacement. ``cell`` must be sorted."""
    idx = np.empty((n_boot, len(cell)), dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, cell[1:] != cell[:-1]])
    for s, e in zip(starts, np.r_[starts[1:], len(cell)]):
        idx[:, s:e] = s + rng.integers(0, e - s, size=(n_boot, e - s))
    return idx


def bootstrap_values(y: np.ndarray, cell: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, len(y))`` replicates of ``y``: seeds resampled within each cell
    (:func:`resample_cells`), their deviations from the cell mean scaled by ``sqrt(n / (n - 1))``
    for a cell of ``n`` seeds, so a replicate's cell mean varies as much as a mean of ``n`` fresh
    seeds would (plain resampling shrinks the variance by ``(n - 1) / n``: 20% with 5 seeds). A
    cell with one seed is kept as it is."""
    cm = pd.Series(y).groupby(cell).transform("mean").to_numpy()
    n = pd.Series(y).groupby(cell).transform("size").to_numpy()
    k = np.where(n > 1, np.sqrt(n / np.maximum(n - 1, 1)), 0.0)
    return cm + k * (y[resample_cells(cell, n_boot, rng)] - cm)


def percentile_ci(draws: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """The bootstrap's percentile interval along axis 0 (NaN draws ignored; no draw: NaN)."""
    q = 100 * (1 - level) / 2
    if np.isnan(draws).all():
        nan = np.full(draws.shape[1:], math.nan)
        return nan, nan.copy()
    return np.nanpercentile(draws, q, axis=0), np.nanpercentile(draws, 100 - q, axis=0)


@dataclass(frozen=True)
class Coef:
    """One fitted parameter: its estimate and bootstrap percentile interval, or, where the grid
    does not identify it, ``identified=False`` with the reason (and NaN numbers); where the seeds
    carry no interval (:func:`no_interval`), the estimate with NaN bounds and that reason."""

    name: str
    estimate: float
    ci_low: float
    ci_high: float
    identified: bool = True
    reason: str = ""

    @property
    def resolved(self) -> bool:
        """Identified, and its interval excludes zero."""
        return self.identified and (self.ci_low > 0 or self.ci_high < 0)

    @property
    def has_interval(self) -> bool:
        return not (math.isnan(self.ci_low) or math.isnan(self.ci_high))

    @property
    def verdict(self) -> str:
        """"positive", "negative", "not resolved" (the interval includes 0), "not identified" or
        "no interval"."""
        if not self.identified:
            return "not identified"
        if not self.has_interval:
            return "no interval"
        return ("positive" if self.estimate > 0 else "negative") if self.resolved else "not resolved"

    def words(self, what: str, unit: str = "", digits: int = 4) -> str:
        """"<what>: +0.0120 <unit> [+0.0040, +0.0200] (95% bootstrap CI), positive" or
        "<what>: not identified (<reason>)"."""
        if not self.identified:
            return f"{what}: not identified ({self.reason})"
        sf = f"{{:+.{digits}f}}"
        if not self.has_interval:
            return f"{what}: {sf.format(self.estimate)}{f' {unit}' if unit else ''}, {self.reason}"
        u = f" {unit}" if unit else ""
        return (f"{what}: {sf.format(self.estimate)}{u} [{sf.format(self.ci_low)}, {sf.format(self.ci_high)}] "
                f"(bootstrap CI), {self.verdict}")


def coef_table(coefs: Sequence[Coef]) -> pd.DataFrame:
    """One row per parameter: estimate, ci_low, ci_high, identified, verdict, reason."""
    return pd.DataFrame([{"estimate": c.estimate, "ci_low": c.ci_low, "ci_high": c.ci_high,
                          "identified": c.identified, "verdict": c.verdict, "reason": c.reason}
                         for c in coefs], index=[c.name for c in coefs])


# --------------------------------------------------------------------------------------------
# the gap model
# --------------------------------------------------------------------------------------------
TERMS = ("intercept", "tokens_per_param", "size", "interaction")


def _design(u: np.ndarray, v: np.ndarray, terms: Sequence[str]) -> np.ndarray:
    cols = {"intercept": np.ones_like(u), "tokens_per_param": u, "size": v, "interaction": u * v}
    return np.stack([cols[t] for t in terms], axis=1)


@dataclass(frozen=True)
class GapModel:
    """A fitted :func:`gap_model`: ``coefs`` (all four :data:`TERMS`, fitted or not identified;
    per decade of tokens/param and of params), the centre ``(u0, v0)`` in log10 units, the fitted
    ``terms`` with their estimate ``beta`` and bootstrap replicates ``draws`` (n_boot x terms), the
    measured ranges and sizes."""

    coefs: dict
    terms: tuple
    beta: np.ndarray
    draws: np.ndarray
    centre: tuple
    tokens_per_param_range: tuple
    params_range: tuple
    sizes: tuple
    n_cells: int
    n_obs: int
    level: float

    def table(self) -> pd.DataFrame:
        """:func:`coef_table` of the four terms."""
        return coef_table([self.coefs[t] for t in TERMS])

    def predict_draws(self, params, tokens_per_param) -> tuple[np.ndarray, np.ndarray]:
        """(the fitted gap at each point, its bootstrap replicates: n_boot x points)."""
        u = np.log10(np.asarray(tokens_per_param, dtype=float)) - self.centre[0]
        v = np.log10(np.asarray(params, dtype=float)) - self.centre[1]
        X = _design(np.atleast_1d(u), np.atleast_1d(v), self.terms)
        return X @ self.beta, self.draws @ X.T

    def extrapolated(self, params, tokens_per_param) -> np.ndarray:
        """Whether each point lies outside the measured ranges (in either coordinate)."""
        t, n = np.atleast_1d(np.asarray(tokens_per_param, float)), np.atleast_1d(np.asarray(params, float))
        (t0, t1), (n0, n1) = self.tokens_per_param_range, self.params_range
        tol = 1e-9
        return (t < t0 * (1 - tol)) | (t > t1 * (1 + tol)) | (n < n0 * (1 - tol)) | (n > n1 * (1 + tol))

    def predict(self, params, tokens_per_param) -> pd.DataFrame:
        """The fitted gap with its bootstrap interval at each point, and ``extrapolated``."""
        mean, draws = self.predict_draws(params, tokens_per_param)
        lo, hi = percentile_ci(draws, self.level)
        return pd.DataFrame({"params": np.atleast_1d(params), "tokens_per_param": np.atleast_1d(tokens_per_param),
                             "gap": mean, "ci_low": lo, "ci_high": hi,
                             "extrapolated": self.extrapolated(params, tokens_per_param)})

    def crossing(self, params: Optional[Sequence[float]] = None, decades: float = 1.0,
                 points: int = 401) -> pd.DataFrame:
        """Where the fitted gap is zero, per size (``params``; default the measured sizes): the
        tokens/param of the zero (exact, from the fitted line at that size; NaN where the line
        does not reach zero within ``decades`` beyond the measured tokens/param range or its
        slope is zero) and ``low``..``high``, the stretch around it where the bootstrap interval
        of the gap includes zero (searched on ``points`` log-spaced values over the same range;
        ``low_open`` / ``high_open``: it reaches the searched range's edge, so it may lie
        beyond). ``extrapolated``: the zero or its band lies outside the measured tokens/param, or
        the size outside the measured sizes."""
        params = self.sizes if params is None else params
        t0, t1 = self.tokens_per_param_range
        grid = np.logspace(math.log10(t0) - decades, math.log10(t1) + decades, points)
        rows = []
        for n in np.atleast_1d(np.asarray(params, dtype=float)):
            mean, draws = self.predict_draws(np.full_like(grid, n), grid)
            lo, hi = percentile_ci(draws, self.level)
            row = {"params": n, "tokens_per_param": math.nan, "low": math.nan, "high": math.nan,
                   "low_open": False, "high_open": False}
            b = self.coefs["tokens_per_param"]
            if b.identified:
                slope = (mean[-1] - mean[0]) / (math.log10(grid[-1]) - math.log10(grid[0]))
                u_star = math.log10(grid[0]) - mean[0] / slope if slope != 0 else math.nan
                if math.log10(grid[0]) <= u_star <= math.log10(grid[-1]):
                    row["tokens_per_param"] = 10 ** u_star
                    i = int(np.argmin(np.abs(np.log10(grid) - u_star)))
                    inside = (lo <= 0) & (hi >= 0)
                    if inside[i]:
                        a = i
                        while a > 0 and inside[a - 1]:
                            a -= 1
                        e = i
                        while e < len(grid) - 1 and inside[e + 1]:
                            e += 1
                        row.update(low=grid[a], high=grid[e], low_open=a == 0, high_open=e == len(grid) - 1)
            cross = [row["tokens_per_param"], row["low"], row["high"]]
            row["extrapolated"] = bool(self.extrapolated([n], [t0])[0] or any(
                x == x and not (t0 * (1 - 1e-9) <= x <= t1 * (1 + 1e-9)) for x in cross))
            rows.append(row)
        return pd.DataFrame(rows)


def gap_model(per_seed: pd.DataFrame, value: str = "value", interaction="auto", n_boot: int = 2000,
              level: float = 0.95, seed: int = 0) -> GapModel:
    """:class:`GapModel` of one comparison's per-seed gaps.

    ``per_seed``: one row per seed and map point with ``tokens_per_param``, ``params`` (the size;
    or ``tokens``, from which ``params = tokens / tokens_per_param``, as in
    :func:`studylib.study.comparisons.token_budget.gaps.gap_frame`'s rows of one gap) and ``value``.
    ``interaction``: "auto" (fitted where identified on at least five cells), True (fitted where
    identified) or False. ``n_boot`` bootstrap replicates with ``numpy``'s generator ``seed``."""
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
    X = _design(u, v, terms)
    pinv = np.linalg.pinv(X)
    y = df[value].to_numpy()
    beta = pinv @ y
    lonely = no_interval(df)
    if lonely:  # no replicates: every interval, p value and prediction band is NaN
        draws = np.full((n_boot, len(terms)), math.nan)
        lo = hi = np.full(len(terms), math.nan)
    else:
        draws = bootstrap_values(y, df["cell"].to_numpy(), n_boot, np.random.default_rng(seed)) @ pinv.T
        lo, hi = percentile_ci(draws, level)
    coefs = {t: Coef(t, float(beta[terms.index(t)]), float(lo[terms.index(t)]), float(hi[terms.index(t)]),
                     reason=lonely)
             if t in terms else Coef(t, math.nan, math.nan, math.nan, False, why[t]) for t in TERMS}
    t, n = df["tokens_per_param"], df["params"]
    return GapModel(coefs, tuple(terms), beta, draws, centre, (float(t.min()), float(t.max())),
                    (float(n.min()), float(n.max())), tuple(float(x) for x in np.unique(n)), len(cells), len(df),
                    level)


def gap_model_words(m: GapModel, label: str = "the gap") -> list[str]:
    """The two coefficients in words, each at the other's centre value, and what the crossing
    line says at the measured sizes."""
    t_c, n_c = 10 ** m.centre[0], 10 ** m.centre[1]
    out = [m.coefs["size"].words(f"Size coefficient of {label} at fixed {t_c:.3g} tokens/param",
                                 "per decade of parameters"),
           m.coefs["tokens_per_param"].words(f"Tokens/param coefficient of {label} at fixed size "
                                             f"{n_c:.3g} params", "per decade of tokens/param")]
    if m.coefs["interaction"].identified:
        out.append(m.coefs["interaction"].words("Interaction", "per decade squared"))
    for _, r in m.crossing().iterrows():
        where = f"at {r['params']:.3g} params"
        if r["tokens_per_param"] != r["tokens_per_param"]:
            out.append(f"Crossing {where}: the fitted gap does not reach zero near the measured tokens/param.")
            continue
        band = ("" if r["low"] != r["low"] else
                f", band {r['low']:.3g}{' or below' if r['low_open'] else ''} to "
                f"{r['high']:.3g}{' or above' if r['high_open'] else ''}")
        out.append(f"Crossing {where}: {r['tokens_per_param']:.3g} tokens/param{band}"
                   + (" (extrapolated beyond the measured range)" if r["extrapolated"] else "") + ".")
    return out


# --------------------------------------------------------------------------------------------
# every map point predicted with itself left out
# --------------------------------------------------------------------------------------------
def leave_one_out(per_seed: pd.DataFrame, fit: Callable = gap_model, keys: Sequence[str] = GAP_KEYS,
                  value: str = "value", level: float = 0.95, seed: int = 0, **fit_kwargs) -> pd.DataFrame:
    """One row per map point (distinct ``keys``): ``fit`` (:func:`gap_model`, or
    :func:`studylib.study.comparisons.token_budget.loss_law.loss_law` with its ``keys``) refitted on every other
    point, the point predicted, and whether its measured mean (over its ``n`` seeds) lies inside
    the prediction interval: the refit's bootstrap replicates plus the sampling noise of a mean of
    ``n`` seeds (normal, with the other points' pooled within-cell std). ``extrapolated``: the
    point lies outside the other points' ranges; ``not_identified``: the refit's parameters the
    other points do not identify (comma-separated; a loss law's prediction then rests on values the
    data do not pin down); ``note`` says why a point could not be predicted."""
    df = cell_frame(per_seed, keys, value, "leave_one_out")
    rng = np.random.default_rng(seed)
    rows = []
    for c, point in df.groupby("cell"):
        rest = df[df["cell"] != c].drop(columns="cell")
        x = [float(point[k].iloc[0]) for k in keys]
        y = point[value].to_numpy()
        row = {**dict(zip(keys, x)), "n": len(y), "measured": float(y.mean()), "predicted": math.nan,
               "pi_low": math.nan, "pi_high": math.nan, "inside": False, "extrapolated": True, "not_identified": "",
               "note": ""}
        try:
            m = fit(rest, value=value, level=level, seed=seed, **fit_kwargs)
        except ValueError as e:
            rows.append({**row, "note": str(e)})
            continue
        dev = rest[value] - rest.groupby(list(keys))[value].transform("mean")
        dof = len(rest) - rest.groupby(list(keys)).ngroups
        s = math.sqrt(float((dev ** 2).sum()) / dof) if dof > 0 else 0.0
        mean, draws = m.predict_draws(*[[v] for v in x])
        sim = draws[:, 0] + rng.normal(0.0, s / math.sqrt(len(y)), len(draws))
        lo, hi = percentile_ci(sim, level)
        lonely = next((c.reason for c in m.coefs.values() if c.identified and not c.has_interval), "")
        row.update(predicted=float(mean[0]), pi_low=float(lo), pi_high=float(hi),
                   inside=bool(lo <= y.mean() <= hi), extrapolated=bool(m.extrapolated(*[[v] for v in x])[0]),
                   not_identified=", ".join(k for k, c in m.coefs.items() if not c.identified), note=lonely)
        rows.append(row)
    return pd.DataFrame(rows)


__all__ = ["GAP_KEYS", "MIN_SEEDS", "TERMS", "Coef", "no_interval", "coef_table", "cell_frame", "resample_cells", "bootstrap_values", "percentile_ci",
           "GapModel", "gap_model", "gap_model_words", "leave_one_out"]
