"""Paired statistics, the one function every comparison between models goes through.

Two models trained with the same seeds are compared seed by seed: the per-seed differences
``d_i = a_i - b_i`` give the mean, the sample standard deviation (ddof=1), n, a paired-t
confidence interval (``scipy.stats.t``, 95% by default) and the two-sided p value of "mean 0".
A difference is *resolved* only when its confidence interval excludes zero.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np
from scipy import integrate as _integrate
from scipy import stats as _st


@dataclass(frozen=True)
class Paired:
    """Summary of paired differences (``a - b``)."""

    mean: float
    std: float  # sample std of the differences (ddof=1); nan for n < 2
    n: int
    ci_low: float  # paired-t confidence interval of the mean (nan for n < 2)
    ci_high: float
    p: float  # two-sided p value of the paired t test (nan for n < 2)
    level: float = 0.95

    @property
    def resolved(self) -> bool:
        """The confidence interval excludes zero."""
        return self.n >= 2 and (self.ci_low > 0 or self.ci_high < 0)

    def as_dict(self) -> dict:
        return {**asdict(self), "resolved": self.resolved}

    def fmt(self, digits: int = 4) -> str:
        """``+0.0758 [+0.0707, +0.0808] (n=3)``."""
        if self.n < 2:
            return f"{self.mean:+.{digits}f} (n={self.n}, no interval)"
        return (f"{self.mean:+.{digits}f} [{self.ci_low:+.{digits}f}, {self.ci_high:+.{digits}f}] "
                f"(n={self.n})")


def paired(a: Sequence[float], b: Sequence[float] | None = None, level: float = 0.95) -> Paired:
    """Paired summary of ``a - b`` (``b=None``: ``a`` already holds the per-seed differences)."""
    a = np.asarray(a, dtype=float)
    d = a if b is None else a - np.asarray(b, dtype=float)
    if d.ndim != 1 or len(d) == 0:
        raise ValueError(f"paired: need a non-empty 1-D sequence of differences, got shape {d.shape}")
    if b is not None and len(a) != len(b):
        raise ValueError(f"paired: a and b differ in length ({len(a)} vs {len(b)})")
    if not 0 < level < 1:
        raise ValueError(f"paired: level must be in (0, 1), got {level}")
    n, mean = len(d), float(d.mean())
    if n < 2:
        nan = float("nan")
        return Paired(mean, nan, n, nan, nan, nan, level)
    std = float(d.std(ddof=1))
    half = half_width_at(std, n, level)
    p = float(_st.ttest_1samp(d, 0.0).pvalue) if std > 0 else (0.0 if mean != 0 else 1.0)
    return Paired(mean, std, n, mean - half, mean + half, p, level)


# --------------------------------------------------------------------------------------------
# power: what a measured per-seed noise takes to resolve a gap
# --------------------------------------------------------------------------------------------
def half_width_at(std: float, n: int, level: float = 0.95) -> float:
    """The paired-t CI half-width ``t(level, n-1) * std / sqrt(n)`` that ``n`` seeds give when the
    per-seed gaps have sample std ``std`` (nan for n < 2)."""
    if n < 2 or not math.isfinite(std):
        return float("nan")
    return float(_st.t.ppf(0.5 + level / 2, n - 1)) * std / math.sqrt(n)


def power_at(std: float, effect: float, n: int, level: float = 0.95) -> float:
    """Probability that ``n`` seeds resolve a true gap ``effect`` (its paired-t CI excludes zero)
    when the per-seed gaps are normal with std ``std``: the two-sided paired t test's power,
    ``P(|T| > t_crit)`` for a noncentral t ``T`` (``scipy.stats.nct``; where that returns nan, as
    it does for some large noncentralities, the same probability integrated over the chi-square of
    the sample variance with ``scipy.integrate.quad``)."""
    if n < 2 or not (math.isfinite(std) and math.isfinite(effect)):
        return float("nan")
    if std == 0:
        return 1.0 if effect != 0 else 0.0
    df, nc = n - 1, abs(effect) / (std / math.sqrt(n))
    crit = float(_st.t.ppf(0.5 + level / 2, df))

    def reject(v):  # P(|Z + nc| > crit * sqrt(v / df)) for a chi-square draw v
        c = crit * math.sqrt(v / df)
        return float(_st.norm.sf(c - nc) + _st.norm.cdf(-c - nc)) * float(_st.chi2.pdf(v, df))

    p = float(_st.nct.sf(crit, df, nc) + _st.nct.cdf(-crit, df, nc))
    if math.isfinite(p):
        return p
    lo, hi = _st.chi2.ppf([1e-12, 1 - 1e-12], df)
    return min(1.0, float(_integrate.quad(reject, lo, hi, points=[df], limit=200)[0]))


def seeds_needed(ok, n_max: int = 1000):
    """The smallest n in 2..n_max with ``ok(n)`` true, for ``ok`` monotone in n (bisection), or
    None when even ``n_max`` is not enough."""
    if not ok(n_max):
        return None
    lo, hi = 2, n_max  # ok(hi) holds
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return lo


@dataclass(frozen=True)
class Power:
    """What ``n`` measured seeds of a paired gap say about more seeds.

    ``std`` is the per-seed std of the gap (ddof=1) and ``std_high`` its one-sided 95% upper bound
    (chi-square; with 3 seeds the std itself is known only within a factor ~4.4). ``seeds_target``:
    seeds for a CI half-width <= ``target``; ``seeds_effect``: seeds for ``power`` (default 80%)
    to resolve a true gap of ``effect``; each at the measured std and (``*_high``) at its bound;
    None when more than 1000 would be needed or nothing could be estimated."""

    n: int
    mean: float
    std: float
    std_high: float
    half_width: float
    target: float
    seeds_target: Optional[int]
    seeds_target_high: Optional[int]
    effect: float
    power: float
    seeds_effect: Optional[int]
    seeds_effect_high: Optional[int]


def power_of(d: Sequence[float], target: float, effect: float, power: float = 0.8,
             level: float = 0.95) -> Power:
    """:class:`Power` of the per-seed paired gaps ``d`` (as :func:`paired` takes them)."""
    p = paired(d, level=level)
    std = p.std
    std_high = std_interval(d, level=1 - 2 * (1 - level))[2]  # the two-sided 90% bound = one-sided 95%

    def for_target(s):
        return None if not math.isfinite(s) else seeds_needed(lambda n: half_width_at(s, n, level) <= target)

    def for_effect(s):
        return None if not math.isfinite(s) else seeds_needed(lambda n: power_at(s, effect, n, level) >= power)

    return Power(p.n, p.mean, std, std_high, half_width_at(std, p.n, level), target, for_target(std),
                 for_target(std_high), effect, power, for_effect(std), for_effect(std_high))


# --------------------------------------------------------------------------------------------
# spreads: how large a standard deviation is, and whether two differ
# --------------------------------------------------------------------------------------------
def std_interval(x: Sequence[float], level: float = 0.95) -> tuple[float, float, float, int]:
    """``(std, low, high, n)``: the sample std (ddof=1) of ``x`` and its chi-square confidence
    interval (normal data assumed; nan for n < 2)."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    if n < 2:
        return float("nan"), float("nan"), float("nan"), n
    s, df = float(x.std(ddof=1)), n - 1
    a = (1 - level) / 2
    return s, s * math.sqrt(df / float(_st.chi2.ppf(1 - a, df))), s * math.sqrt(df / float(_st.chi2.ppf(a, df))), n


@dataclass(frozen=True)
class VarianceRatio:
    """``var(a) / var(b)`` with its F confidence interval; *resolved* when it excludes 1."""

    ratio: float
    ci_low: float
    ci_high: float
    n_a: int
    n_b: int
    level: float = 0.95

    @property
    def resolved(self) -> bool:
        return self.ci_low > 1 or self.ci_high < 1


def variance_ratio(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> VarianceRatio:
    """:class:`VarianceRatio` of two independent samples (F distribution, normal data assumed)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or len(b) < 2:
        nan = float("nan")
        return VarianceRatio(nan, nan, nan, len(a), len(b), level)
    va, vb = float(a.var(ddof=1)), float(b.var(ddof=1))
    r = va / vb if vb > 0 else float("inf")
    d1, d2, q = len(a) - 1, len(b) - 1, (1 - level) / 2
    return VarianceRatio(r, r / float(_st.f.ppf(1 - q, d1, d2)), r / float(_st.f.ppf(q, d1, d2)),
                         len(a), len(b), level)
