"""The per-role laws, a check of the joint law: each role's "chinchilla" form (:func:`role_laws`),
each map point left out (:func:`role_loo_table`), and the gap plane and those laws at the paper's
point (:func:`extrapolation_table`).
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd

from studylib.study.analysis.paper import (PAPER_ACTIVE_PARAMS, PAPER_HEADLINE_TOKENS, PAPER_TABLE6, PAPER_TOKENS_PER_PARAM,
                                           paper_params)
from studylib.study.analysis.position import ROLES
from studylib.study.analysis.text import ci_text
from studylib.study.comparisons.token_budget.gaps import GAPS, PAPER_POINT
from studylib.study.analysis.bootstrap import percentile_ci
from studylib.study.analysis.law.checks import predict_held_out
from studylib.study.analysis.law.fit import ROLE_FIT, ROLE_KEYS, role_law, role_runs, runs_frame
from studylib.study.comparisons.token_budget.plane import GapModel

ROLE_LAW_COLUMNS = ("role", "parameter", "estimate", "ci_low", "ci_high", "identified", "reason", "cells", "params_min",
                    "params_max", "tokens_min", "tokens_max")


def role_laws(losses: pd.DataFrame, n_boot: int = 100, seed: int = 0) -> dict:
    """``{role: JointLaw}`` (:func:`~studylib.study.analysis.law.fit.role_law`) (``n_boot`` refits each: about 3 s per 100 on the 2-core AMD EPYC)."""
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


def _role_loo(d: pd.DataFrame, law, n_boot: int, seed: int) -> pd.DataFrame:
    """Each map point of one role left out of its law (from the full fit's optimum) and predicted
    (:func:`~studylib.study.analysis.law.checks.predict_held_out`)."""
    runs = runs_frame(role_runs(d), "role law")
    rng, rows = np.random.default_rng(seed), []
    for c, point in runs.groupby("map_cell"):
        x, y = (float(point["active"].iloc[0]), float(point["tokens"].iloc[0])), point["value"].to_numpy()
        row = {"params": x[0], "tokens": x[1], "n": len(y), "measured": float(y.mean()), "predicted": math.nan,
               "pi_low": math.nan, "pi_high": math.nan, "inside": False, "extrapolated": True, "not_identified": "",
               "note": ""}
        try:
            h = predict_held_out(runs, runs["map_cell"] == c, "chinchilla", n_boot=n_boot, seed=seed, start=law.theta,
                                 rng=rng, **ROLE_FIT)
        except ValueError as e:
            rows.append({**row, "note": str(e)})
            continue
        lo, hi = percentile_ci(h.draws[:, 0], h.law.level)
        coefs = h.law.coefs.values()
        row.update(predicted=float(h.point[0]), pi_low=float(lo), pi_high=float(hi), inside=bool(lo <= y.mean() <= hi),
                   extrapolated=bool(h.law.extrapolated(*x)[0]),
                   not_identified=", ".join(k.name for k in coefs if not k.identified),
                   note=next((k.reason for k in coefs if k.identified and not k.has_interval), ""))
        rows.append(row)
    return pd.DataFrame(rows)


def role_loo_table(losses: pd.DataFrame, laws: Mapping, n_boot: int = 40, seed: int = 0) -> pd.DataFrame:
    """Per role, each map point left out of its law (:func:`_role_loo`) with ``checked`` (the refit
    identifies every parameter); a role whose full law leaves a parameter unidentified is not
    refitted: its points are listed unchecked with the reason."""
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
            t = _role_loo(d[[*ROLE_KEYS, "seed", "value"]], law, n_boot, seed)
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


#: what each role's N is
N_OF_ROLE = "active parameters (the MoE's active, the dense models' all)"


def _loss_loo_words(loo: pd.DataFrame, role: str) -> str:
    t = loo[loo["role"] == role]
    ok = t[t["checked"]]
    if not len(ok):
        why = t["note"].iloc[0] if t["note"].iloc[0] else "every refit leaves a parameter not identified"
        return f" Left out one at a time: no point can be checked ({why})."
    return (f" Left out one at a time, {int(ok['inside'].sum())} of {len(ok)} checked points lie inside their "
            f"predicted 95% interval" + (f" ({len(t) - len(ok)} of {len(t)} not checked: without them a parameter "
                                         f"is not identified)" if len(ok) < len(t) else "") + ".")


def role_law_sentences(laws: pd.DataFrame, loss_loo: pd.DataFrame | None = None) -> list[str]:
    """Each role's law (:func:`role_law_table`) in words: its identified parameters and
    (``loss_loo``: :func:`role_loo_table`) its left-out points."""
    out = []
    for role in dict.fromkeys(laws["role"]) if len(laws) else ():
        r = laws[laws["role"] == role].set_index("parameter")
        parts = [f"{k} not identified ({x['reason']})" if not x["identified"] else
                 f"{k} = {ci_text(x['estimate'], x['ci_low'], x['ci_high'], '.4g')}"
                 + (f", {x['reason']}" if x["ci_low"] != x["ci_low"] else "") for k, x in r.iterrows()]
        out.append(f"Loss law of {role} (N: {N_OF_ROLE}; {int(r['cells'].iloc[0])} points): " + "; ".join(parts) + "."
                   + (_loss_loo_words(loss_loo, role) if loss_loo is not None and len(loss_loo) else ""))
    return out


def extrapolation_sentences(ex: pd.DataFrame) -> list[str]:
    """:func:`~.law_roles.extrapolation_table` in words: each gap in sign, the role laws' ordering."""
    out = []
    why = ("compared in sign and ordering only: absolute losses differ (vocabulary 30,008 vs 3,750, another "
           "corpus size and context), and nothing between the sizes here and the paper's was measured")
    for r in ex[ex["kind"] == "gap"].itertuples():
        label = GAPS[r.what][1].split(" (")[0]
        if not r.identified:
            out.append(f"The gap model's {label} is not carried to the paper's point: {r.reason}.")
            continue
        if r.ci_low != r.ci_low:
            out.append(f"Extrapolated to the paper's point, the gap model's {label} is {r.predicted:+.3f} with no "
                       f"interval (a map point needs at least two seeds): no sign is predicted.")
            continue
        same = (r.ci_low > 0 and r.paper > 0) or (r.ci_high < 0 and r.paper < 0)
        unclear = r.ci_low <= 0 <= r.ci_high
        verdict = ("its interval includes zero, so no sign is predicted" if unclear else
                   "the same sign as the paper's" if same else "the opposite sign to the paper's")
        out.append(f"Extrapolated{' far' if r.extrapolated else ''} to the paper's {r.params / 1e6:.2f}M active "
                   f"parameters at {PAPER_TOKENS_PER_PARAM:.1f} tokens/param, the gap model's {label} is "
                   f"{r.predicted:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}] ({'the MoE' if r.predicted > 0 else 'the dense model'} better); the paper "
                   f"measured {r.paper:+.4f}: {verdict} ({why}).")
    loss = ex[ex["kind"] == "loss"]
    if len(loss):
        if not loss["identified"].all():
            miss = ", ".join(loss.loc[~loss["identified"], "what"])
            out.append(f"The loss laws predict no losses at the paper's N and D: a parameter is not identified by "
                       f"this grid in the law of {miss}.")
        else:
            pred = " < ".join(loss.sort_values("predicted")["what"])
            paper = " < ".join(loss.sort_values("paper")["what"])
            out.append(f"Extrapolated to the paper's N and {PAPER_HEADLINE_TOKENS / 1e6:.1f}M tokens, the loss laws "
                       f"order the models {pred}; the paper measured {paper}: "
                       f"{'the same ordering' if pred == paper else 'another ordering'} ({why}).")
    return out


__all__ = ["role_laws", "role_law_table", "role_loo_table", "extrapolation_table", "role_law_sentences", "extrapolation_sentences"]
