"""Paired statistics, the one function every comparison between models goes through.

Two models trained with the same seeds are compared seed by seed: the per-seed differences
``d_i = a_i - b_i`` give the mean, the sample standard deviation (ddof=1), n, a paired-t
confidence interval (``scipy.stats.t``, 95% by default) and the two-sided p value of "mean 0".
A difference is *resolved* only when its confidence interval excludes zero.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
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

    @property
    def half_width(self) -> float:
        return (self.ci_high - self.ci_low) / 2

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
    sem = std / math.sqrt(n)
    half = float(_st.t.ppf(0.5 + level / 2, n - 1)) * sem
    p = float(_st.ttest_1samp(d, 0.0).pvalue) if std > 0 else (0.0 if mean != 0 else 1.0)
    return Paired(mean, std, n, mean - half, mean + half, p, level)
