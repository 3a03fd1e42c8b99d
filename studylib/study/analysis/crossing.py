"""Where a gap measured at several budgets crosses zero, and its trend, against tokens per
parameter on a log axis (the token-budget map, :mod:`studylib.study.analysis.budget_map`).

* :func:`crossings`: each sign change of the mean gap between two neighbouring budgets, placed by
  linear interpolation in log10(tokens/param), with the stretch where the 95% CI band includes 0;
* :func:`trend`: a least-squares line per seed, then :func:`studylib.study.analysis.stats.paired` over
  the per-seed slopes (the one statistics function), per decade of tokens/param.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from studylib.study.analysis.stats import Paired, paired


# --------------------------------------------------------------------------------------------
# where a gap crosses zero
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Crossing:
    """A sign change of a gap's mean between two measured budgets.

    ``x``: tokens/param where the mean, interpolated linearly in log10(tokens/param) between the
    two bracketing budgets ``between``, is zero. ``x_low``..``x_high``: the stretch around it where
    the 95% CI band (each budget's paired-t CI, interpolated the same way) includes zero; NaN with
    fewer than two seeds. ``low_open`` / ``high_open``: the band still includes zero at the edge of
    the measured range, so the crossing may lie beyond it. ``rising``: the gap grows with tokens
    (the MoE gains)."""

    x: float
    between: tuple[float, float]
    x_low: float
    x_high: float
    low_open: bool
    high_open: bool
    rising: bool


def _where(a: float, b: float, f0: float, f1: float) -> Optional[tuple[float, float]]:
    """The part of [a, b] where the linear f (f0 at a, f1 at b) is <= 0, or None."""
    if f0 <= 0 and f1 <= 0:
        return (a, b)
    if f0 > 0 and f1 > 0:
        return None
    r = a + (b - a) * f0 / (f0 - f1)
    return (a, r) if f0 <= 0 else (r, b)


def _band_zero_intervals(u, lo, hi) -> list[tuple[float, float]]:
    """Maximal intervals of u where the piecewise-linear band [lo, hi] includes 0."""
    if len(u) == 1:
        return [(u[0], u[0])] if lo[0] <= 0 <= hi[0] else []
    parts = []
    for i in range(len(u) - 1):
        a, b = u[i], u[i + 1]
        p = _where(a, b, lo[i], lo[i + 1])          # lo <= 0
        q = _where(a, b, -hi[i], -hi[i + 1])        # hi >= 0
        if p and q and max(p[0], q[0]) <= min(p[1], q[1]):
            parts.append((max(p[0], q[0]), min(p[1], q[1])))
    merged: list[list[float]] = []
    for s, t in parts:
        if merged and s <= merged[-1][1] + 1e-12:
            merged[-1][1] = max(merged[-1][1], t)
        else:
            merged.append([s, t])
    return [tuple(m) for m in merged]


def crossings(x: Sequence[float], mean: Sequence[float], ci_low: Sequence[float],
              ci_high: Sequence[float]) -> list[Crossing]:
    """Every sign change of ``mean`` over the points ``x`` (tokens/param; sorted here), see
    :class:`Crossing`. A budget whose mean is exactly zero is a crossing at that budget."""
    order = np.argsort(np.asarray(x, dtype=float), kind="stable")
    xs = np.asarray(x, dtype=float)[order]
    m, lo, hi = (np.asarray(v, dtype=float)[order] for v in (mean, ci_low, ci_high))
    if np.any(xs <= 0):
        raise ValueError("crossings: tokens per parameter must be positive")
    u = np.log10(xs)
    band = [] if np.isnan(lo).any() or np.isnan(hi).any() else _band_zero_intervals(u, lo, hi)
    out = []
    for i in range(len(u)):
        if m[i] == 0 and 0 < i < len(u) - 1 and m[i - 1] * m[i + 1] < 0:  # exactly zero at a budget
            uc, a, b, rising = u[i], i, i, bool(m[i + 1] > m[i - 1])
        elif i + 1 < len(u) and m[i] * m[i + 1] < 0:
            uc, a, b, rising = u[i] + (u[i + 1] - u[i]) * m[i] / (m[i] - m[i + 1]), i, i + 1, bool(m[i + 1] > m[i])
        else:
            continue
        iv = next(((s, t) for s, t in band if s - 1e-12 <= uc <= t + 1e-12), None)
        xl, xh = (10 ** iv[0], 10 ** iv[1]) if iv else (math.nan, math.nan)
        out.append(Crossing(x=float(10 ** uc), between=(float(xs[a]), float(xs[b])), x_low=float(xl),
                            x_high=float(xh), low_open=bool(iv and iv[0] <= u[0] + 1e-12),
                            high_open=bool(iv and iv[1] >= u[-1] - 1e-12), rising=rising))
    return out


# --------------------------------------------------------------------------------------------
# the trend
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trend:
    """Slope of a gap per decade of tokens/param: a least-squares line ``gap = a + b log10(x)``
    fitted per seed, then :func:`~studylib.study.analysis.stats.paired` over the per-seed slopes ``b``
    (mean, std, n seeds, 95% CI). ``intercept``: the mean per-seed ``a`` (the gap at 1 token/param);
    ``x_range``: the measured tokens/param."""

    slope: Paired
    intercept: float
    x_range: tuple[float, float]
    n_points: int

    def zero(self) -> float:
        """tokens/param where the mean line is zero (NaN for a zero slope)."""
        return 10 ** (-self.intercept / self.slope.mean) if self.slope.mean != 0 else math.nan


def seed_slopes(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per seed of a one-gap :func:`studylib.study.analysis.budget_map.gap_frame` slice: the least-squares slope and intercept of the
    gap against log10(tokens/param) over that seed's budgets (seeds with fewer than two distinct
    budgets are left out)."""
    rows = []
    for seed, d in per_seed.groupby("seed"):
        u = np.log10(d["tokens_per_param"].to_numpy(dtype=float))
        if len(np.unique(u)) < 2:
            continue
        b, a = np.polyfit(u, d["value"].to_numpy(dtype=float), 1)
        rows.append({"seed": seed, "slope": float(b), "intercept": float(a), "n_points": len(u)})
    return pd.DataFrame(rows, columns=["seed", "slope", "intercept", "n_points"])


def trend(per_seed: pd.DataFrame) -> Optional[Trend]:
    """:class:`Trend` of a one-gap :func:`studylib.study.analysis.budget_map.gap_frame` slice (None without a seed fitted on two budgets)."""
    s = seed_slopes(per_seed)
    if s.empty:
        return None
    x = per_seed["tokens_per_param"]
    return Trend(paired(s["slope"].to_numpy()), float(s["intercept"].mean()), (float(x.min()), float(x.max())),
                 int(per_seed["tokens_per_param"].nunique()))


__all__ = ["Crossing", "crossings", "Trend", "seed_slopes", "trend"]
