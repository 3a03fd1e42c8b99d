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

ROLE_LAW_COLUMNS = ("role", "parameter", "estimate", "ci_low", "ci_high", "identified", "reason", "cells", "params_min",
                    "params_max", "tokens_min", "tokens_max")


def role_laws(losses: pd.DataFrame, n_boot: int = 100, seed: int = 0) -> dict:
    """``{role: JointLaw}`` (:func:`~.law_fit.role_law`) (``n_boot`` refits each: about 3 s per 100 on the 2-core AMD EPYC)."""
    losses = losses[losses["stories"] == 1.0] if "stories" in losses else losses  # no repetition term
    return {role: role_law(losses[losses["role"] == role], n_boot=n_boot, seed=seed) for role in ROLES
            if (losses["role"] == role).any()}


def role_law_table(laws: Mapping) -> pd.DataFrame:
    """One row per role and parameter (E, A, B, alpha, beta): estimate and bootstrap CI, or not
    identified with the reason; the points and ranges it was fitted on."""
    out = [law.table().rename_axis("parameter").reset_index().assign(
        role=role, cells=law.n_cells, params_min=law.active_range[0], params_max=law.active_range[1],
        tokens_min=law.tokens_range[0], tokens_max=law.tokens_range[1]) for role, law in laws.items()]
    return pd.concat(out, ignore_index=True)[list(ROLE_LAW_COLUMNS)] if out else pd.DataFrame()


def role_loo_table(losses: pd.DataFrame, laws: Mapping, n_boot: int = 40, seed: int = 0) -> pd.DataFrame:
    """Per role, :func:`~.plane.leave_one_out` of its law (from the full fit's optimum) with
    ``checked`` (the refit identifies every parameter); a role whose full law leaves a parameter
    unidentified is not refitted: its points are listed unchecked with the reason."""
    out = []
    losses = losses[losses["stories"] == 1.0] if "stories" in losses else losses
    for role, law in laws.items():
        d = losses[losses["role"] == role]
        bad = list(law.not_identified())
        if bad:
            cells = d.groupby(list(ROLE_KEYS))["value"].agg(["size", "mean"]).reset_index()
            t = pd.DataFrame({"params": cells["params"].astype(float), "tokens": cells["tokens"].astype(float),
                              "n": cells["size"], "measured": cells["mean"], "predicted": math.nan,
                              "pi_low": math.nan, "pi_high": math.nan, "inside": False, "extrapolated": False,
                              "not_identified": ", ".join(bad),
                              "note": f"not refitted: on every point the law leaves {', '.join(bad)} not identified"})
        else:
            t = leave_one_out(d[[*ROLE_KEYS, "seed", "value"]], fit=role_law, keys=ROLE_KEYS, n_boot=n_boot, seed=seed,
                              start=law.theta)
        t.insert(0, "role", role)
        t["checked"] = t["predicted"].notna() & t["pi_low"].notna() & (t["not_identified"] == "")
        out.append(t)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def _paper_row(kind: str, what: str, params: float, est, paper: float, extrapolated, reason: str) -> dict:
    """One row of :func:`extrapolation_table`; ``est``: (predicted, ci_low, ci_high), None where not identified."""
    p, lo, hi = est or (math.nan,) * 3
    return {"kind": kind, "what": what, "params": params, "tokens": PAPER_HEADLINE_TOKENS, "predicted": p,
            "ci_low": lo, "ci_high": hi, "paper": paper, "identified": est is not None,
            "extrapolated": bool(extrapolated), "reason": reason}


def extrapolation_table(models: Mapping[str, GapModel], laws: Mapping) -> pd.DataFrame:
    """The fits at the paper's point beside its measurement: each gap (kind "gap", compared in
    sign) only where that point lies inside the map's grid, each role's law at its paper model's N
    and 426.3M tokens (kind "loss", compared in ordering; NaN where a parameter is not identified)."""
    rows = []
    for gap, m in models.items():
        p = m.predict([PAPER_ACTIVE_PARAMS], [PAPER_TOKENS_PER_PARAM]).iloc[0]
        missing = [t for t in ("tokens_per_param", "size") if not m.coefs[t].identified]
        beyond = bool(p["extrapolated"])  # the plane is never carried outside its grid
        reason = (f"{' and '.join(missing)} not identified by this grid" if missing else
                  "the gap plane describes the grid only and the paper's point lies outside it" if beyond else "")
        rows.append(_paper_row("gap", gap, PAPER_ACTIVE_PARAMS, None if reason else (p["gap"], p["ci_low"], p["ci_high"]),
                               PAPER_POINT[gap], beyond, reason))
    paper_loss = dict(zip(ROLES, PAPER_TABLE6.mean().to_numpy()))
    for role, law in laws.items():
        n, bad = paper_params(role)[0], law.not_identified()
        b = law.at(ROLES[0], n, n, PAPER_HEADLINE_TOKENS, PAPER_HEADLINE_TOKENS)
        (lo,), (hi,) = b.interval()
        rows.append(_paper_row("loss", role, n, None if bad else (b.point[0], lo, hi), paper_loss[role],
                               law.extrapolated(n, PAPER_HEADLINE_TOKENS)[0],
                               ", ".join(bad) + " not identified by this grid" if bad else ""))
    return pd.DataFrame(rows)


__all__ = ["role_laws", "role_law_table", "role_loo_table", "extrapolation_table"]
