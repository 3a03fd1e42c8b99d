"""Paired statistics, the one function every comparison between models goes through.

Two models trained with the same seeds are compared seed by seed: the per-seed differences
``d_i = a_i - b_i`` give the mean, the sample standard deviation (ddof=1), n, a paired-t
confidence interval (``scipy.stats.t``, 95% by default) and the two-sided p value of "mean 0".
A difference is *resolved* only when its confidence interval excludes zero.

A notebook's *family* of comparisons (:func:`family`) is judged together: Holm's step-down
correction of the difference tests' p values (:func:`holm`), the paired two one-sided tests of
equivalence within a margin (TOST, :func:`tost`), Holm-adjusted the same way, and one verdict per comparison, "A better", "B better", "equivalent" (within the
margin) or "inconclusive" (:func:`verdict_words` says it in words). ``docs/statistics.md`` explains
the rule.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np
import pandas as pd
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


# --------------------------------------------------------------------------------------------
# a family of comparisons: Holm, equivalence (TOST) and one verdict each
# --------------------------------------------------------------------------------------------
#: the four verdicts of a comparison ``a - b`` (:func:`family`)
A_BETTER, B_BETTER, EQUIVALENT, INCONCLUSIVE = "A better", "B better", "equivalent", "inconclusive"
VERDICTS = (A_BETTER, B_BETTER, EQUIVALENT, INCONCLUSIVE)
#: the default equivalence margin in nats: the power target the study plans its seeds for
MARGIN = 0.03


def holm(p) -> np.ndarray:
    """Holm's step-down adjusted p values (Holm 1979) of a family, along the last axis (a 2-D
    array holds one family per row): the i-th smallest of m p values times ``m - i``, made
    non-decreasing in that order and capped at 1. NaN p values (a comparison with one seed has no
    test) stay NaN and do not count towards the family's size. (Tested against ``statsmodels``'
    ``multipletests(method="holm")``, which is not called here: it runs ``gc.collect()`` on every
    call.)"""
    p = np.asarray(p, dtype=float)
    ok = np.isfinite(p)
    m = ok.sum(axis=-1, keepdims=True)
    q = np.where(ok, p, 2.0)  # NaN sorts last
    order = np.argsort(q, axis=-1, kind="stable")
    k = np.arange(p.shape[-1])
    adj = np.minimum(1.0, np.maximum.accumulate((m - k) * np.take_along_axis(q, order, -1), axis=-1))
    out = np.empty_like(adj)
    np.put_along_axis(out, order, adj, axis=-1)
    return np.where(ok, out, np.nan)


def tost(d, margin: float = MARGIN):
    """p value of the paired two one-sided tests (Schuirmann 1987) of the per-seed differences
    ``d`` (along the last axis) against the equivalence margin: the larger of the one-sided t
    tests' p values of "mean <= -margin" and "mean >= +margin", small when the mean lies within
    ``(-margin, +margin)``; it is below ``alpha`` exactly when the ``1 - 2 alpha`` paired-t
    interval lies inside the margin. NaN for fewer than two seeds; with zero spread, 0 inside the
    margin and 1 on or outside it. (Tested against ``statsmodels``' ``ttost_paired``.)"""
    if not (margin > 0 and math.isfinite(margin)):
        raise ValueError(f"tost: margin must be a positive number, got {margin}")
    d = np.asarray(d, dtype=float)
    n = d.shape[-1]
    if n < 2:
        out = np.full(d.shape[:-1], np.nan)
    else:
        mean, std = d.mean(axis=-1), d.std(axis=-1, ddof=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            se = std / math.sqrt(n)
            p = np.maximum(_st.t.sf((mean + margin) / se, n - 1), _st.t.cdf((mean - margin) / se, n - 1))
        out = np.where(std > 0, p, np.where(np.abs(mean) < margin, 0.0, 1.0))
    return float(out) if out.ndim == 0 else out


def verdicts(mean, p_holm, p_tost_holm, alpha: float = 0.05, higher_is_better: bool = False) -> np.ndarray:
    """The verdict of each comparison ``a - b`` from its mean and its Holm-adjusted p values:
    "A better" / "B better" when the difference test resolves it (``p_holm < alpha``; which one
    by the sign of the mean and ``higher_is_better``), else "equivalent" when the equivalence
    test does (``p_tost_holm < alpha``), else "inconclusive"."""
    mean, p_holm, p_tost_holm = (np.asarray(v, dtype=float) for v in (mean, p_holm, p_tost_holm))
    resolved = p_holm < alpha  # NaN compares False
    a_wins = (mean > 0) == higher_is_better
    return np.select([resolved & a_wins, resolved, p_tost_holm < alpha], [A_BETTER, B_BETTER, EQUIVALENT],
                     INCONCLUSIVE)


def _differences(name, v) -> np.ndarray:
    """Per-seed differences from ``a - b`` values or an ``(a, b)`` pair of sequences."""
    if isinstance(v, tuple) and len(v) == 2:
        a, b = (np.asarray(x, dtype=float) for x in v)
        if a.shape != b.shape:
            raise ValueError(f"family: comparison {name!r}: a and b differ in length ({len(a)} vs {len(b)})")
        return a - b
    return np.asarray(v, dtype=float)


def family(gaps_by_name, margin: float = MARGIN, alpha: float = 0.05, level: float = 0.95,
           higher_is_better: bool = False) -> pd.DataFrame:
    """One row per comparison of a family, indexed by name, with a verdict each.

    ``gaps_by_name``: ``{name: per-seed differences a - b}`` (or ``{name: (a, b)}``, paired by
    position), in the metric's units. Columns: ``mean, std, n, ci_low, ci_high`` (paired t at
    ``level``, as :func:`paired`), ``p`` (difference test) and ``p_holm`` (Holm over the family),
    ``p_tost`` (equivalence within ``±margin``, :func:`tost`) and ``p_tost_holm``, ``resolved``
    (``p_holm < alpha``), ``equivalent`` (``p_tost_holm < alpha``), ``margin``, ``family_size`` and
    ``verdict``: "A better" / "B better" when the difference is resolved after Holm (which one by
    the sign and ``higher_is_better``; the default is a loss), else "equivalent" when equivalence
    holds after Holm, else "inconclusive"."""
    if not (margin > 0 and math.isfinite(margin)):
        raise ValueError(f"family: margin must be a positive number, got {margin}")
    if not 0 < alpha < 1:
        raise ValueError(f"family: alpha must be in (0, 1), got {alpha}")
    if len(gaps_by_name) == 0:
        raise ValueError("family: no comparisons given")
    rows = {}
    for name, v in gaps_by_name.items():
        d = _differences(name, v)
        s = paired(d, level=level)
        rows[name] = {"mean": s.mean, "std": s.std, "n": s.n, "ci_low": s.ci_low, "ci_high": s.ci_high,
                      "p": s.p, "p_tost": tost(d, margin)}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out["p_holm"], out["p_tost_holm"] = holm(out["p"]), holm(out["p_tost"])
    out["resolved"] = out["p_holm"] < alpha  # NaN compares False
    out["equivalent"] = out["p_tost_holm"] < alpha
    out["margin"], out["family_size"] = margin, int(np.isfinite(out["p"]).sum())
    out["verdict"] = verdicts(out["mean"], out["p_holm"], out["p_tost_holm"], alpha, higher_is_better)
    cols = ["mean", "std", "n", "ci_low", "ci_high", "p", "p_holm", "p_tost", "p_tost_holm", "resolved",
            "equivalent", "margin", "family_size", "verdict"]
    return out[cols]


def verdict_words(row, a: str, b: str, digits: int = 4, unit: str = "nats") -> str:
    """A :func:`family` row in words, the verdict first and then the numbers it rests on:

    * "B better than A by 0.0120 [0.0040, 0.0200] (95% CI; p=0.001, Holm-adjusted 0.008 over 8
      comparisons; n=5 seeds)";
    * "A and B equivalent within ±0.03 nats: A − B = +0.0010 [-0.0250, +0.0280] (TOST p=0.019,
      Holm-adjusted 0.038 over 2 comparisons; n=5 seeds)";
    * "inconclusive: A − B = +0.2760 [-0.0590, +0.6110] shows neither a difference (Holm-adjusted
      p=0.14) nor equivalence within ±0.03 nats (Holm-adjusted TOST p=1) (n=5 seeds)".

    A family of one comparison (a pre-registered gap, judged on its own) has nothing to adjust:
    its sentence gives the raw p values and no "Holm-adjusted" clause."""
    f, sf = f"{{:.{digits}f}}", f"{{:+.{digits}f}}"
    n, m = int(row["n"]), f"{row['family_size']} comparison{'s' if row['family_size'] != 1 else ''}"
    seeds = f"n={n} seed{'s' if n != 1 else ''}"
    margin = f"±{row['margin']:g}{' ' + unit if unit else ''}"
    gap = f"{a} − {b} = {sf.format(row['mean'])}"
    if n < 2:
        return f"inconclusive: {gap} from one seed, so no test"
    ci = f"[{sf.format(row['ci_low'])}, {sf.format(row['ci_high'])}]"
    v, alone = row["verdict"], int(row["family_size"]) <= 1  # alone: nothing to adjust
    if v in (A_BETTER, B_BETTER):
        winner, loser = (a, b) if v == A_BETTER else (b, a)
        lo, hi = (row["ci_low"], row["ci_high"]) if row["mean"] > 0 else (-row["ci_high"], -row["ci_low"])
        within = f"; the gap also lies within {margin}" if bool(row["equivalent"]) else ""
        adj = "" if alone else f", Holm-adjusted {row['p_holm']:.2g} over {m}"
        return (f"{winner} better than {loser} by {f.format(abs(row['mean']))} [{f.format(lo)}, {f.format(hi)}] "
                f"(95% CI; p={row['p']:.2g}{adj}; {seeds}{within})")
    if v == EQUIVALENT:
        adj = "" if alone else f", Holm-adjusted {row['p_tost_holm']:.2g} over {m}"
        return (f"{a} and {b} equivalent within {margin}: {gap} {ci} (TOST p={row['p_tost']:.2g}{adj}; {seeds})")
    if alone:
        return (f"inconclusive: {gap} {ci} shows neither a difference (p={row['p']:.2g}) nor equivalence "
                f"within {margin} (TOST p={row['p_tost']:.2g}) ({seeds})")
    if row["ci_low"] > 0 or row["ci_high"] < 0:  # resolved on its own, not over the family
        return (f"inconclusive: {gap} {ci} shows neither a difference that survives Holm's correction "
                f"(p={row['p']:.2g}, Holm-adjusted {row['p_holm']:.2g} over {m}: the unadjusted CI excludes 0) "
                f"nor equivalence within {margin} (Holm-adjusted TOST p={row['p_tost_holm']:.2g}) ({seeds})")
    return (f"inconclusive: {gap} {ci} shows neither a difference (Holm-adjusted p={row['p_holm']:.2g}) "
            f"nor equivalence within {margin} (Holm-adjusted TOST p={row['p_tost_holm']:.2g}) ({seeds})")
