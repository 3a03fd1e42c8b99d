"""The per-role laws, a check of the joint law: each role's "chinchilla" form (:func:`role_laws`),
each map point left out (:func:`role_loo_table`), and the gap plane and those laws at the paper's
point (:func:`extrapolation_table`).
"""
from __future__ import annotations

import math
from typing import Mapping

import pandas as pd

from studylib.study.analysis.paper import PAPER_ACTIVE_PARAMS, PAPER_HEADLINE_TOKENS, PAPER_TABLE6, PAPER_TOKENS_PER_PARAM
from studylib.study.comparisons.token_budget.gaps import PAPER_POINT, paper_params
from studylib.study.comparisons.token_budget.knobs import ROLES
from studylib.study.comparisons.token_budget.law_fit import ROLE_KEYS, role_law
from studylib.study.comparisons.token_budget.plane import GapModel, leave_one_out


def role_laws(losses: pd.DataFrame, n_boot: int = 100, seed: int = 0) -> dict:
    """``{role: RoleLaw}`` (:func:`~.law_fit.role_law`) (``n_boot`` refits each: about 3 s per 100 on the 2-core AMD EPYC)."""
    losses = losses[losses["stories"] == 1.0] if "stories" in losses else losses  # no repetition term
    return {role: role_law(losses[losses["role"] == role], n_boot=n_boot, seed=seed) for role in ROLES
            if (losses["role"] == role).any()}


def role_law_table(laws: Mapping) -> pd.DataFrame:
    """One row per role and parameter (E, A, B, alpha, beta): estimate and bootstrap CI, or not
    identified with the reason; the points and ranges it was fitted on."""
    rows = []
    for role, law in laws.items():
        fit = law.law
        for name, r in fit.table().iterrows():
            rows.append({"role": role, "parameter": name, "estimate": r["estimate"], "ci_low": r["ci_low"],
                         "ci_high": r["ci_high"], "identified": bool(r["identified"]), "reason": r["reason"],
                         "cells": fit.n_cells, "params_min": fit.active_range[0], "params_max": fit.active_range[1],
                         "tokens_min": fit.tokens_range[0], "tokens_max": fit.tokens_range[1]})
    return pd.DataFrame(rows)


def role_loo_table(losses: pd.DataFrame, laws: Mapping, n_boot: int = 40, seed: int = 0) -> pd.DataFrame:
    """Per role, :func:`~.plane.leave_one_out` of its law (from the full fit's optimum) with
    ``checked`` (the refit identifies every parameter); a role whose full law leaves a parameter
    unidentified is not refitted: its points are listed unchecked with the reason."""
    out = []
    losses = losses[losses["stories"] == 1.0] if "stories" in losses else losses
    for role, law in laws.items():
        d = losses[losses["role"] == role]
        bad = list(law.law.not_identified())
        if bad:
            cells = d.groupby(list(ROLE_KEYS))["value"].agg(["size", "mean"]).reset_index()
            t = pd.DataFrame({"params": cells["params"].astype(float), "tokens": cells["tokens"].astype(float),
                              "n": cells["size"], "measured": cells["mean"], "predicted": math.nan,
                              "pi_low": math.nan, "pi_high": math.nan, "inside": False, "extrapolated": False,
                              "not_identified": ", ".join(bad),
                              "note": f"not refitted: on every point the law leaves {', '.join(bad)} not identified"})
        else:
            t = leave_one_out(d[[*ROLE_KEYS, "seed", "value"]], fit=role_law, keys=ROLE_KEYS, n_boot=n_boot, seed=seed,
                              start=law.law.theta)
        t.insert(0, "role", role)
        t["checked"] = t["predicted"].notna() & t["pi_low"].notna() & (t["not_identified"] == "")
        out.append(t)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def extrapolation_table(models: Mapping[str, GapModel], laws: Mapping) -> pd.DataFrame:
    """The fits at the paper's point beside its measurement: each gap (kind "gap", compared in
    sign) only where that point lies inside the map's grid, each role's law at its paper model's N
    and 426.3M tokens (kind "loss", compared in ordering; NaN where a parameter is not identified)."""
    rows = []
    for gap, m in models.items():
        p = m.predict([PAPER_ACTIVE_PARAMS], [PAPER_TOKENS_PER_PARAM]).iloc[0]
        missing = [t for t in ("tokens_per_param", "size") if not m.coefs[t].identified]
        beyond = bool(p["extrapolated"])
        ok = not missing and not beyond  # the plane is never carried outside its grid
        reason = (f"{' and '.join(missing)} not identified by this grid" if missing else
                  "the gap plane describes the grid only and the paper's point lies outside it" if beyond else "")
        rows.append({"kind": "gap", "what": gap, "params": PAPER_ACTIVE_PARAMS, "tokens": PAPER_HEADLINE_TOKENS,
                     "predicted": p["gap"] if ok else math.nan, "ci_low": p["ci_low"] if ok else math.nan,
                     "ci_high": p["ci_high"] if ok else math.nan, "paper": PAPER_POINT[gap], "identified": ok,
                     "extrapolated": beyond, "reason": reason})
    paper_loss = dict(zip(ROLES, PAPER_TABLE6.mean().to_numpy()))
    for role, law in laws.items():
        n = paper_params(role)[0]
        bad = law.law.not_identified()
        ok = not bad
        b = law.law.at(ROLES[0], n, n, PAPER_HEADLINE_TOKENS, PAPER_HEADLINE_TOKENS)
        (lo,), (hi,) = b.interval()
        p = {"loss": b.point[0], "ci_low": lo, "ci_high": hi,
             "extrapolated": law.law.extrapolated(n, PAPER_HEADLINE_TOKENS)[0]}
        rows.append({"kind": "loss", "what": role, "params": n, "tokens": PAPER_HEADLINE_TOKENS,
                     "predicted": p["loss"] if ok else math.nan, "ci_low": p["ci_low"] if ok else math.nan,
                     "ci_high": p["ci_high"] if ok else math.nan, "paper": paper_loss[role], "identified": ok,
                     "extrapolated": bool(p["extrapolated"]),
                     "reason": "" if ok else ", ".join(bad) + " not identified by this grid"})
    return pd.DataFrame(rows)


__all__ = ["role_laws", "role_law_table", "role_loo_table", "extrapolation_table"]
