"""Where the MoE sits between its two dense matches: ``p = (L_active - L_MoE) / (L_active -
L_total)``, 0 at its active match, 1 at its total match (the paper's 0.81, :data:`~.paper.PAPER_POSITION`);
per point from per-seed gaps with a bootstrap CI (:func:`position_row`, the replicates of
:class:`~.bootstrap.Bootstrap`), undefined where the two dense baselines are not resolved apart;
:func:`position_text` words it."""
from __future__ import annotations

import math

import numpy as np

from studylib.study.analysis.bootstrap import Bootstrap
from studylib.study.analysis.stats import paired

#: a trio's models by role, in its order: the active match, the MoE, the total match
ROLES = ("dense_active", "moe", "dense_total")


def position(l_active, l_moe, l_total):
    """``(L_dense_active - L_moe) / (L_dense_active - L_dense_total)`` elementwise (NaN where the
    denominator is 0): 0 where the MoE is no better than its active match, 1 where it is as good as
    its total match."""
    la, lm, lt = (np.asarray(x, dtype=float) for x in (l_active, l_moe, l_total))
    den = la - lt
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(den != 0, (la - lm) / np.where(den != 0, den, 1.0), math.nan)
    return float(p) if p.ndim == 0 else p


def position_row(g_active: np.ndarray, g_total: np.ndarray, n_boot: int = 2000, seed: int = 0,
                 level: float = 0.95) -> dict:
    """The MoE's position between its matches from per-seed gaps (paired by seed; ``dense - MoE``):
    ``position`` = mean(g_active) / mean(g_active - g_total) (:func:`position` of the roles' means)
    with a bootstrap CI over seeds (deviations scaled by sqrt(n / (n - 1)), so that a
    resample of few seeds is not narrower than their spread); ``position_defined`` False (and NaN numbers) when the paired CI
    of the denominator ``L_active - L_total`` includes 0: the two dense baselines are not resolved
    apart, so there is nothing to sit between; ``position_reason`` says why there is no number or
    no interval (one seed)."""
    ga, gt = np.asarray(g_active, float), np.asarray(g_total, float)
    d, n = ga - gt, len(ga)
    out = {"position": math.nan, "position_low": math.nan, "position_high": math.nan, "position_defined": False,
           "position_reason": ""}
    if n == 0:
        return {**out, "position_reason": "not defined: no seed has all three models"}
    if n < 2:
        return {**out, "position": position(ga[0], 0.0, ga[0] - d[0]), "position_defined": bool(d[0]),
                "position_reason": "no interval: one seed"}
    p = paired(d)
    if not p.resolved:
        return {**out, "position_reason": f"not defined: L_active - L_total = {p.mean:+.4f} [{p.ci_low:+.4f}, "
                                          f"{p.ci_high:+.4f}] includes 0 (the dense pair is not resolved apart)"}
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    k = math.sqrt(n / (n - 1))
    num = ga.mean() + k * (ga - ga.mean())[idx].mean(axis=1)
    den = d.mean() + k * (d - d.mean())[idx].mean(axis=1)
    boot = Bootstrap(np.array([ga.mean() / d.mean()]), position(num, 0.0, num - den)[:, None], level)
    (lo,), (hi,) = boot.interval()
    return {**out, "position": float(boot.point[0]), "position_low": float(lo), "position_high": float(hi),
            "position_defined": True}


def p_text(p: float, low: float = math.nan, high: float = math.nan) -> str:
    """A position with two decimals, never "-0.00": ``0.81 [0.64, 0.98]``, ``0.81`` without an
    interval, "–" without a number: every table and sentence that prints a p prints it so."""
    if p is None or p != p:
        return "–"
    two = lambda x: f"{round(float(x), 2) + 0.0:.2f}"  # noqa: E731
    return two(p) if low is None or low != low else f"{two(p)} [{two(low)}, {two(high)}]"


def position_text(r, why: bool = False) -> str:
    """One point's position (a :func:`position_row` or a table row with its columns): ``0.81 [0.64,
    0.98]`` (:func:`p_text`), ``0.81 (no interval)`` from one seed, or "not defined" (the dense
    baselines not resolved apart; ``why``: its ``position_reason`` instead)."""
    if not r.get("position_defined", False):
        return r["position_reason"] if why else "not defined"
    if r["position_low"] != r["position_low"]:
        return f"{p_text(r['position'])} (no interval)"
    return p_text(r["position"], r["position_low"], r["position_high"])


__all__ = ["ROLES", "position", "position_row", "p_text", "position_text"]
