"""A law whose MoE worth may change with size (issue #47, item 3): the one-lambda form beside
``lambda(N)`` (:class:`~.form.LambdaSizeLaw`), both at the paper's point (:func:`paper_points`:
where lambda there has an interval covering [0, 1], what rests on it is "not identified"; where it
is clipped at 0 or 1, on the bound), and
:func:`sizes_needed`: the span of sizes that would pin lambda there to +-``target`` (a slope's
interval narrows as 1 / the spread of log10 N, the same sizes' count and noise).
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd

from studylib.study.analysis.paper import PAPER_ACTIVE_PARAMS
from studylib.study.analysis.position import p_text
from studylib.study.analysis.law.bound import ON_BOUND, paper_clip, paper_lambda
from studylib.study.analysis.law.checks import paper_point
from studylib.study.analysis.law.fit import COLUMNS, JointLaw, fit_law
from studylib.study.analysis.law.form import SIZE_FORM

#: the forms compared at the paper's point: one lambda, and lambda(N)
FORMS = ("lambda", SIZE_FORM)
#: the half-width of lambda's interval at the paper's point that :func:`sizes_needed` aims for
TARGET_HALF_WIDTH = 0.25
#: the least span of the measured sizes, in decades (2.3% in N), that :func:`sizes_needed` scales from
MIN_SPAN = 0.01


def fit_forms(runs: pd.DataFrame, per_role_rstar: bool = False, n_boot: int = 200, seed: int = 0,
              forms=FORMS, fitted: Mapping[str, JointLaw] | None = None) -> dict:
    """``{form: JointLaw}`` of the map's runs (:data:`~.fit.COLUMNS`) for each of ``forms``; a form
    in ``fitted`` (with the same R* and replicates) is taken as it is, not fitted again."""
    fitted = fitted or {}
    return {f: fitted[f] if f in fitted else fit_law(runs[list(COLUMNS)], f, per_role_rstar, n_boot=n_boot, seed=seed)
            for f in forms}


def lambda_at_paper(law: JointLaw) -> tuple[float, float, float]:
    """(lambda at the paper's MoE N_active, its seed-bootstrap interval low, high): lambda_0 +
    lambda_1 log10(14.77M / N_ref) kept in [0, 1] for the size form; lambda for the one-lambda form."""
    b = paper_lambda(law)
    (lo,), (hi,) = b.interval()
    return float(b.point[0]), float(lo), float(hi)


def sizes_needed(law: JointLaw, sizes_active, target: float = TARGET_HALF_WIDTH) -> dict:
    """What would pin the size form's lambda at the paper's point to +-``target``: ``sizes`` (k,
    the map's MoE N_active per size), ``spread`` (the population sd of their log10 N), ``slope_hw``
    (half the width of lambda_1's interval), ``decades`` (the span that would do, evenly spaced, up
    from the smallest size; NaN if none short of the paper's own size does), ``largest`` (the
    largest size of that span), ``span_now`` (the measured sizes' span in decades) and ``reason``
    where it cannot be computed: a size not a positive finite number, sizes spanning less than
    :data:`MIN_SPAN` decades (nothing to scale from), sizes that reach the paper's (nothing to carry)."""
    given = np.asarray(sizes_active, float).ravel()
    base = {"sizes": len(np.unique(given)), "spread": math.nan, "span_now": math.nan, "slope_hw": math.nan,
            "decades": math.nan, "largest": math.nan, "reason": ""}
    bad = given[~(np.isfinite(given) & (given > 0))]
    if len(bad):
        return {**base, "reason": f"a size must be a positive finite number, not {bad[0]:g}"}
    x = np.log10(np.unique(given))
    k, xp = len(x), math.log10(PAPER_ACTIVE_PARAMS)
    if k:
        base.update(spread=float(np.std(x)), span_now=float(np.ptp(x)))
    c = law.coefs.get("lambda_1")
    if c is None:
        return {**base, "reason": f"the {law.form} form has no lambda_1"}
    if not c.identified or not np.isfinite(c.ci_low):
        return {**base, "reason": "lambda_1 has no interval" + (f" ({c.reason})" if c.reason else "")}
    hw = (c.ci_high - c.ci_low) / 2
    base["slope_hw"] = hw
    if k < 2:
        return {**base, "reason": "one size: no spread to scale"}
    if base["span_now"] < MIN_SPAN:
        return {**base, "reason": f"the sizes span less than {MIN_SPAN:g} decades ({base['span_now']:.2g}): no "
                                  f"spread to scale"}
    if x.max() >= xp:
        return {**base, "reason": f"the measured sizes reach the paper's size ({PAPER_ACTIVE_PARAMS:.4g} active "
                                  f"parameters): nothing is carried to it"}
    unit = math.sqrt((k * k - 1) / 12) / (k - 1)  # the sd of k evenly spaced points over one decade
    span = np.linspace(1e-3, xp - x.min(), 4000)  # up to the paper's own size
    half = hw * base["spread"] / (unit * span) * np.abs(xp - (x.min() + span / 2))
    ok = np.nonzero(half <= target)[0]
    if not len(ok):
        return {**base, "reason": f"no span short of the paper's size holds it within +-{target:g}"}
    r = float(span[ok[0]])
    return {**base, "decades": r, "largest": float(10 ** (x.min() + r))}


def _need_words(need: Mapping) -> str:
    """:func:`sizes_needed` in words (its span found)."""
    held = f"lambda at the paper's N to +-{TARGET_HALF_WIDTH:g}"
    if need["decades"] <= need["span_now"]:
        return (f"the measured {need['sizes']} sizes over {need['span_now']:.2f} decades already hold {held} (by the "
                f"interval's scaling, {need['decades']:.2f} decades would)")
    return (f"{need['sizes']} sizes spread evenly over {need['decades']:.1f} decades (up to {need['largest']:.3g} "
            f"active parameters; now {need['span_now']:.2f}) would hold {held}, with the same noise per size")


def paper_points(laws: Mapping[str, JointLaw], chosen: str, sizes_active=None) -> pd.DataFrame:
    """Each form's :func:`~.checks.paper_point` rows with ``form`` and ``chosen``; the size
    form's with ``lambda_at_paper`` and, given ``sizes_active``, ``span_needed`` (:func:`sizes_needed`);
    where lambda there has an interval covering [0, 1], it and what rests on it are not identified;
    where it is clipped at 0 or 1, on the bound (:func:`~.bound.paper_clip`)."""
    out = []
    for form, law in laws.items():
        t = paper_point(law)
        if "lambda_1" in law.names:
            lam, lo, hi = lambda_at_paper(law)
            c1 = law.coefs["lambda_1"]
            ident = c1.identified and np.isfinite(lo)
            row = {"quantity": "lambda_at_paper", "estimate": lam if ident else math.nan,
                   "ci_low": lo if ident else math.nan, "ci_high": hi if ident else math.nan, "identified": ident,
                   "reason": "" if ident else c1.reason if not c1.identified else "no interval", "note": f"lambda_0 + lambda_1 log10({PAPER_ACTIVE_PARAMS:.4g} / N_ref), kept in [0, 1]"}
            cover, clip = paper_clip(law)
            if ident and cover:
                row.update(identified=False, reason=cover)
            elif ident and clip:
                row.update(ci_low=math.nan, ci_high=math.nan, reason=clip + ON_BOUND)
            rows = [row]
            if sizes_active is not None:
                need = sizes_needed(law, sizes_active)
                ok = np.isfinite(need["decades"])
                rows.append({"quantity": "span_needed", "estimate": need["decades"], "identified": bool(ok),
                             "reason": need["reason"],
                             "note": _need_words(need) if ok else ""})
            i = int(np.nonzero(t["quantity"].to_numpy() == law.mix)[0][0]) + 1
            t = pd.concat([t.iloc[:i], pd.DataFrame(rows), t.iloc[i:]], ignore_index=True)
        t.insert(0, "form", form)
        t["chosen"] = form == chosen
        out.append(t)
    return pd.concat(out, ignore_index=True).fillna({"reason": "", "note": "", "paper_note": ""})


def clipped(rows: pd.DataFrame) -> bool:
    """Whether one form's :func:`paper_points` rows (indexed by quantity) hold lambda(N) clipped at
    the paper's N: what rests on it is on the bound."""
    return "lambda_at_paper" in rows.index and str(rows.loc["lambda_at_paper", "reason"]).endswith(ON_BOUND)


def size_form_sentences(points: pd.DataFrame, forms: pd.DataFrame) -> list:
    """The two forms at the paper's point in words, from :func:`paper_points`' table and the forms'
    parameter tables (``words.law_table`` rows with ``form``): each form's position there (or
    why it is not identified; where lambda(N) is clipped there, that it is on the bound), the size
    form's lambda_1 and what span of sizes would pin lambda there."""
    out = []
    for form, t in points.groupby("form", sort=False):
        t = t.set_index("quantity")
        p = t.loc["position"]
        chosen = " (chosen by leaving cells out)" if bool(t["chosen"].iloc[0]) else ""
        said = (f"p = {p_text(p['estimate'], p['ci_low'], p['ci_high'])}" if p["identified"] and
                np.isfinite(p["ci_low"]) else f"p = {p_text(p['estimate'])} ({p['reason']})" if clipped(t)
                else f"p = {p_text(p['estimate'])} (no interval)" if p["identified"] else
                f"p is not identified ({p['reason']})")
        s = f"The {form} form{chosen} gives at the paper's point {said}"
        c = forms[(forms["form"] == form) & (forms["parameter"] == "lambda_1")]
        if len(c):
            c = c.iloc[0]
            s += (f"; lambda_1 = {c['estimate']:.3f} [{c['ci_low']:.3f}, {c['ci_high']:.3f}] per decade of N_active"
                  if c["identified"] else f"; lambda_1 is not identified ({c['reason']})")
        if "span_needed" in t.index:
            n = t.loc["span_needed"]
            s += f"; {n['note']}" if n["identified"] else f"; what span of sizes would pin it: {n['reason']}"
        out.append(s + ".")
    return out


__all__ = ["FORMS", "TARGET_HALF_WIDTH", "MIN_SPAN", "fit_forms", "lambda_at_paper", "sizes_needed", "paper_points",
           "clipped", "size_form_sentences"]
