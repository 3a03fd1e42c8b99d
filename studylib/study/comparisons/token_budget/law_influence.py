"""The runs that move the joint law (:mod:`.law_fit`): each run's standardised residual and the
MoE's position at the paper's point refitted without it (:func:`influence`); a run beyond
:data:`RESIDUAL_LIMIT` is named by :func:`~.law_words.influence_sentence`.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from studylib.study.analysis.paper import PAPER_HEADLINE_TOKENS
from studylib.study.comparisons.token_budget.gaps import paper_params
from studylib.study.comparisons.token_budget.knobs import ROLES
from studylib.study.comparisons.token_budget.law_checks import _quantities, _trio_draws
from studylib.study.comparisons.token_budget.law_fit import COLUMNS, JointLaw, fit_law, runs_frame

#: a run whose standardised residual lies beyond this many robust sds is named (the residuals' scale is
#: 1.4826 x their median absolute deviation: one run far off does not widen the scale it is judged by)
RESIDUAL_LIMIT = 4.0


def _paper_position(law: JointLaw) -> float:
    trio = pd.DataFrame([paper_params(r) for r in ROLES], index=list(ROLES), columns=["active", "total"])
    return float(_quantities(_trio_draws(law, trio, PAPER_HEADLINE_TOKENS, PAPER_HEADLINE_TOKENS)[0])["position"])


def influence(runs: pd.DataFrame, law: JointLaw) -> pd.DataFrame:
    """One row per run of ``law``'s fit (role, size, seed, tokens, unique, value; stories where
    ``runs`` has it): ``fitted`` (the law's loss there), ``std_residual`` ((log L - log L_hat) / the residuals' robust sd), ``beyond``
    (past :data:`RESIDUAL_LIMIT`), and the position at the paper's point refitted without that run
    (from the law's optimum): ``position_without``, ``position_change`` (from the full fit's
    ``position``); NaN where the refit fails (``note`` says why)."""
    df = runs_frame(runs, "influence")
    fitted = law.at(df["role"], df["active"], df["total"], df["tokens"], df["unique"]).point
    r = np.log(df["value"].to_numpy()) - np.log(fitted)
    scale = 1.4826 * float(np.median(np.abs(r - np.median(r))))
    p0 = _paper_position(law)
    keep = list(COLUMNS) + (["stories"] if "stories" in df else [])
    out = df[keep].assign(fitted=fitted, std_residual=r / scale if scale > 0 else math.nan, position=p0,
                          position_without=math.nan, note="")
    for i in range(len(df)):
        try:
            refit = fit_law(df.drop(index=i)[list(COLUMNS)], law.form, law.per_role_rstar, n_boot=0, n_boot_cell=0,
                            start=law.theta)
            out.loc[i, "position_without"] = _paper_position(refit)
        except ValueError as e:
            out.loc[i, "note"] = str(e)
    out["position_change"] = out["position_without"] - p0
    out["beyond"] = out["std_residual"].abs() > RESIDUAL_LIMIT
    return out


__all__ = ["RESIDUAL_LIMIT", "influence"]
