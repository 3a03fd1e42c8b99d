"""The bootstrap every fit shares: seeds resampled within cells (:func:`bootstrap_values`), the
percentile interval (:func:`percentile_ci`), and :class:`Bootstrap`, a point estimate with its
replicates that gives intervals and, through a function of the estimate, predictions with theirs
(the gap plane, the laws, the MoE's position); :func:`linear_fit`, least squares with those
replicates, and :func:`p_boot`, a bootstrap p. :class:`Coef` is one fitted parameter with its
interval or the reason it has none; :func:`cell_frame` checks a per-seed frame and numbers its cells."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

#: the seeds a cell needs for a fit over the cells to carry an interval (a bootstrap that resamples
#: one seed resamples nothing: its interval would have no width)
MIN_SEEDS = 2


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
    """The bootstrap's percentile interval along axis 0, per column: NaN draws ignored, NaN for a
    column without a draw."""
    draws = np.asarray(draws, dtype=float)
    if draws.ndim == 1:
        lo, hi = percentile_ci(draws[:, None], level)
        return lo[0], hi[0]
    q = 100 * (1 - level) / 2
    lo, hi = np.full(draws.shape[1:], math.nan), np.full(draws.shape[1:], math.nan)
    some = ~np.isnan(draws).all(axis=0) if len(draws) else np.zeros(draws.shape[1:], dtype=bool)
    if np.any(some):
        lo[some], hi[some] = (np.nanpercentile(draws[:, some], x, axis=0) for x in (q, 100 - q))
    return lo, hi


@dataclass(frozen=True)
class Bootstrap:
    """A point estimate (a vector) and its bootstrap replicates (``draws``: n_boot x the vector;
    NaN where a replicate has none) at a confidence ``level``."""

    point: np.ndarray
    draws: np.ndarray
    level: float = 0.95

    def interval(self) -> tuple[np.ndarray, np.ndarray]:
        """The percentile interval of each component (:func:`percentile_ci`)."""
        return percentile_ci(self.draws, self.level)

    def map(self, f: Callable[[np.ndarray], np.ndarray]) -> "Bootstrap":
        """``f`` (the estimate -> predictions; it must take a stack of estimates along the leading
        axis) of the point and of every replicate: the predictions with their replicates."""
        point = np.asarray(f(self.point))
        return Bootstrap(point, np.asarray(f(self.draws)).reshape((len(self.draws),) + point.shape), self.level)


def p_boot(draws: np.ndarray) -> float:
    """Two-sided bootstrap p of "the coefficient is zero": twice the smaller tail at zero, at least
    one replicate's worth (``1 / len(draws)``: no replicate beyond zero is not p = 0); NaN without
    replicates."""
    if np.isnan(draws).all():
        return math.nan
    return float(min(1.0, max(2 * min(np.mean(draws <= 0), np.mean(draws >= 0)), 1 / len(draws))))


def holm_p(draws: Mapping[str, np.ndarray | None]) -> tuple[dict, dict]:
    """(``{name: p_boot}``, ``{name: its Holm-adjusted p}``) over one family's bootstrap
    replicates, the members without a replicate (None or all NaN) left out of the family."""
    from studylib.study.analysis.stats import holm

    p = {k: p_boot(d) for k, d in draws.items() if d is not None}
    p = {k: v for k, v in p.items() if not math.isnan(v)}
    return p, (dict(zip(p, holm(list(p.values())))) if p else {})


def linear_fit(X: np.ndarray, y: np.ndarray, cell: np.ndarray, n_boot: int, seed: int, level: float = 0.95,
               lonely: str = "") -> Bootstrap:
    """Least squares of ``y`` on the design ``X`` (pseudo-inverse) with its replicates: seeds
    resampled within each ``cell`` (:func:`bootstrap_values`, ``numpy``'s generator ``seed``; the
    design is the same in every replicate, so they are one matrix product); NaN replicates where
    ``lonely`` (:func:`no_interval`) says there are none."""
    pinv = np.linalg.pinv(X)
    draws = (np.full((n_boot, X.shape[1]), math.nan) if lonely else
             bootstrap_values(y, cell, n_boot, np.random.default_rng(seed)) @ pinv.T)
    return Bootstrap(pinv @ y, draws, level)


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

    def verdict_at(self, p_holm: float | None = None, alpha: float = 0.05) -> str:
        """"positive", "negative", "not resolved", "not identified" or "no interval": resolved where
        its interval excludes 0 or, one of a family (:func:`holm_p`), where its Holm-adjusted p is
        below ``alpha``."""
        if not self.identified:
            return "not identified"
        if not self.has_interval:
            return "no interval"
        resolved = self.resolved if p_holm is None else p_holm < alpha
        return ("positive" if self.estimate > 0 else "negative") if resolved else "not resolved"

    @property
    def verdict(self) -> str:
        return self.verdict_at()


def coef_table(coefs: Sequence[Coef]) -> pd.DataFrame:
    """One row per parameter: estimate, ci_low, ci_high, identified, verdict, reason."""
    return pd.DataFrame([{"estimate": c.estimate, "ci_low": c.ci_low, "ci_high": c.ci_high,
                          "identified": c.identified, "verdict": c.verdict, "reason": c.reason}
                         for c in coefs], index=[c.name for c in coefs])


def pooled_sd(df: pd.DataFrame, value: str = "value") -> float:
    """The pooled within-cell standard deviation of ``value`` over ``df``'s cells (NaN without a
    degree of freedom)."""
    dev = df[value] - df.groupby("cell")[value].transform("mean")
    dof = len(df) - df["cell"].nunique()
    return math.sqrt(float((dev ** 2).sum()) / dof) if dof > 0 else math.nan


def outside(x, lo: float, hi: float, tol: float = 1e-9) -> np.ndarray:
    """Whether each of ``x`` lies outside [lo, hi] (relative ``tol``)."""
    x = np.atleast_1d(np.asarray(x, dtype=float))
    return (x < lo * (1 - tol)) | (x > hi * (1 + tol))


__all__ = ["MIN_SEEDS", "cell_frame", "no_interval", "resample_cells", "bootstrap_values", "percentile_ci",
           "Bootstrap", "p_boot", "holm_p", "linear_fit", "Coef", "coef_table", "pooled_sd", "outside"]
