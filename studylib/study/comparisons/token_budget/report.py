"""The fits over the token-budget map (issue #31), as notebook 09 and the report show them.

* :func:`gap_models`: per gap, :func:`studylib.study.comparisons.token_budget.fits.gap_model` over every seed of
  every map point (the gap as a plane in log10 tokens/param and log10 size, its interaction only
  where the grid supports it), with intervals from a bootstrap that resamples seeds within each
  point; :func:`coefficient_table` gives each coefficient a bootstrap p value and, over each gap's
  coefficients, a Holm adjustment and a verdict, and :func:`what_moves` says in words whether size,
  tokens per parameter or both move the gap;
* :func:`crossing_table`: where each fitted gap is zero, a line in (size, tokens/param) with its
  band (the stretch where the bootstrap interval of the gap includes zero);
* :func:`loo_table`: every map point refitted without itself and predicted;
* :func:`loss_frame` and :func:`loss_law_table`: a loss law ``L = E + A/N^alpha + B/D^beta`` per
  model role (:mod:`studylib.study.comparisons.token_budget.loss_law`), or why a parameter is not identified, and
  :func:`loss_loo_table`: every point refitted without itself and predicted;
* :func:`extrapolation_table`: what the fits predict at the paper's N and D, compared with the
  paper in sign and ordering only (absolute losses differ: vocabulary 30,008 vs 3,750, another
  corpus size), labelled as extrapolation;
* :func:`fit_sentences`: the words, from those tables only (the report rebuilds them from the
  notebook's CSVs).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from studylib.config import Preset
from studylib.study.analysis.paper import (PAPER_ACTIVE_PARAMS, PAPER_HEADLINE_TOKENS, PAPER_TABLE6,
                                           PAPER_TOKENS_PER_PARAM)
from studylib.study.analysis.stats import holm
from studylib.study.comparisons.token_budget.fits import GapModel, gap_model, leave_one_out
from studylib.study.comparisons.token_budget.gaps import GAPS, PAPER_MODELS, PAPER_POINT, paper_params
from studylib.study.comparisons.token_budget.knobs import ROLES, TrioConfig
from studylib.study.comparisons.token_budget.loss_law import LAW_KEYS, NAMES, loss_law

#: what each role's N is
N_OF_ROLE = "active parameters (the MoE's active, the dense models' all)"
ALPHA = 0.05


def _gap_rows(per_seed: pd.DataFrame, gap: str) -> pd.DataFrame:
    """One gap's per-seed rows of the map's cells (all the training stories: the repeated cells are
    the repetition check's, :mod:`.checks`)."""
    ps = per_seed[per_seed["gap"] == gap]
    return ps[ps["stories"] == 1.0] if "stories" in ps else ps


def _unit(per_seed: pd.DataFrame) -> str:
    """The per-seed gap the fits across sizes read: in bits per byte where the frame has it (one
    scale across the trios' tokenizers), else in nats."""
    return "value_bpb" if "value_bpb" in per_seed and per_seed["value_bpb"].notna().all() else "value"


def gap_models(per_seed: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> dict:
    """``{gap: GapModel}`` for the gaps with at least one map point (the gap in bits per byte:
    :func:`_unit`)."""
    rows = {g: _gap_rows(per_seed, g) for g in GAPS}
    return {g: gap_model(d, value=_unit(per_seed), n_boot=n_boot, seed=seed) for g, d in rows.items() if len(d)}


def _p_boot(draws: np.ndarray) -> float:
    """Two-sided bootstrap p of "the coefficient is zero": twice the smaller tail at zero, at
    least one replicate's worth (``1 / len(draws)``: no replicate beyond zero is not p = 0); NaN
    without replicates (:func:`~studylib.study.comparisons.token_budget.fits.no_interval`)."""
    if np.isnan(draws).all():
        return math.nan
    return float(min(1.0, max(2 * min(np.mean(draws <= 0), np.mean(draws >= 0)), 1 / len(draws))))


def coefficient_table(models: Mapping[str, GapModel], alpha: float = ALPHA) -> pd.DataFrame:
    """One row per gap and term (intercept, tokens_per_param, size, interaction): estimate and
    bootstrap CI per decade, ``p_boot``, ``p_holm`` (over the gap's identified slope terms: its
    family) and ``verdict`` ("positive": more of it favours the MoE, "negative", "not resolved",
    "not identified" or "no interval", with ``reason``); ``centre_*``: where the other
    coefficient is held."""
    rows = []
    for gap, m in models.items():
        t = m.table()
        p = {term: _p_boot(m.draws[:, m.terms.index(term)]) for term in m.terms if term != "intercept"}
        p = {term: v for term, v in p.items() if not math.isnan(v)}
        adj = dict(zip(p, holm(list(p.values())))) if p else {}
        for term, r in t.iterrows():
            ok = bool(r["identified"])
            q = adj.get(term, math.nan)
            verdict = ("not identified" if not ok else "" if term == "intercept" else
                       "no interval" if term not in p else
                       ("positive" if r["estimate"] > 0 else "negative") if q < alpha else "not resolved")
            rows.append({"gap": gap, "term": term, "estimate": r["estimate"], "ci_low": r["ci_low"],
                         "ci_high": r["ci_high"], "identified": ok, "p_boot": p.get(term, math.nan), "p_holm": q,
                         "verdict": verdict, "reason": r["reason"], "centre_tokens_per_param": 10 ** m.centre[0],
                         "centre_params": 10 ** m.centre[1], "cells": m.n_cells, "rows": m.n_obs,
                         "n_boot": len(m.draws)})
    return pd.DataFrame(rows)


def what_moves(coefs: pd.DataFrame, gap: str) -> str:
    """Whether size, tokens per parameter or both move the gap (its Holm-adjusted verdicts)."""
    v = coefs[coefs["gap"] == gap].set_index("term")["verdict"]
    names = {"tokens_per_param": "tokens per parameter", "size": "model size"}
    moves = [n for t, n in names.items() if v[t] in ("positive", "negative")]
    unknown = [n for t, n in names.items() if v[t] == "not identified"]
    label = GAPS[gap][1].split(" (")[0]
    if all(v[t] in ("no interval", "not identified") for t in names) and "no interval" in set(v[list(names)]):
        return f"What moves the {label}: not judged (a point needs at least two seeds to carry an interval)."
    head = ("both tokens per parameter and model size move it" if len(moves) == 2 else
            f"{moves[0]} moves it" if moves else "neither coefficient is resolved")
    tail = f"; {' and '.join(unknown)} not identified by this grid" if unknown else ""
    return f"What moves the {label}: {head}{tail}."


def _coef_words(r, what: str, unit: str) -> str:
    if not r["identified"]:
        return f"{what}: not identified ({r['reason']})"
    if r["verdict"] == "no interval":
        return f"{what}: {r['estimate']:+.4f} {unit}, {r['reason']}"
    way = {"positive": ", more of it favours the MoE", "negative": ", more of it favours the dense model"}.get(
        r["verdict"], "")
    return (f"{what}: {r['estimate']:+.4f} {unit} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] (bootstrap 95% CI; "
            f"{_p('p', r['p_boot'], r['n_boot'])}, {_p('Holm-adjusted p', r['p_holm'], r['n_boot'])}): "
            f"{r['verdict']}{way}")


def _p(name: str, p: float, n_boot: int) -> str:
    """``name=p``; at the floor of a bootstrap p (one replicate of ``n_boot``), ``name<=1/n_boot``."""
    return f"{name}<={1 / n_boot:.2g}" if p <= 1 / n_boot + 1e-12 else f"{name}={p:.2g}"


def crossing_table(models: Mapping[str, GapModel], points: int = 9) -> pd.DataFrame:
    """Per gap, the fitted zero at ``points`` log-spaced sizes over the measured range
    (:meth:`GapModel.crossing`) and at each measured size (``measured_size``)."""
    rows = []
    for gap, m in models.items():
        lo, hi = m.params_range
        inner = np.logspace(math.log10(lo), math.log10(hi), points)[1:-1] if hi > lo else []
        sizes = sorted({*m.sizes, *(float(n) for n in inner if min(abs(n / s - 1) for s in m.sizes) > 1e-3)})
        c = m.crossing(params=sizes)
        c["measured_size"] = c["params"].isin(m.sizes)
        c.insert(0, "gap", gap)
        rows.append(c)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def loo_table(per_seed: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per gap, every map point predicted by the gap model fitted without it
    (:func:`studylib.study.comparisons.token_budget.fits.leave_one_out`)."""
    out = []
    for gap in GAPS:
        d = _gap_rows(per_seed, gap)
        if len(d):
            t = leave_one_out(d, value=_unit(per_seed), n_boot=n_boot, seed=seed)
            t.insert(0, "gap", gap)
            out.append(t)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def loss_frame(preset: Preset, trios: Sequence[TrioConfig], summaries: pd.DataFrame,
               value: str = "best_val_bpb") -> pd.DataFrame:
    """One row per run of the map: its ``role`` in its trio, ``model``, ``size``, ``seed``,
    ``params`` (N: its active parameters), ``total`` (its total parameters), ``tokens`` (D),
    ``unique`` (the distinct training tokens it saw), ``stories`` (the fraction of the training
    stories), ``passes`` and ``value`` (default: the best validation loss in bits per byte, one
    scale across the trios' tokenizers)."""
    role_of = {m: t.role(m) for t in trios for m in t.models}
    counts = {m: preset.model_config(m).num_params for m in role_of}
    return pd.DataFrame([{"role": role_of[r.model], "model": r.model, "size": r.size, "seed": int(r.seed),
                          "params": int(counts[r.model].active), "total": int(counts[r.model].total),
                          "tokens": float(r.tokens), "unique": float(r.unique), "stories": float(r.stories),
                          "passes": float(r.passes), "value": float(getattr(r, value))}
                         for r in summaries.itertuples(index=False)])


def loss_laws(losses: pd.DataFrame, n_boot: int = 100, seed: int = 0) -> dict:
    """``{role: LossLaw}`` (``n_boot`` refits each: about 3 s per 100 on the 2-core AMD EPYC)."""
    losses = losses[losses["stories"] == 1.0] if "stories" in losses else losses  # no repetition term
    return {role: loss_law(losses[losses["role"] == role], n_boot=n_boot, seed=seed) for role in ROLES
            if (losses["role"] == role).any()}


def loss_law_table(laws: Mapping) -> pd.DataFrame:
    """One row per role and parameter (E, A, B, alpha, beta): estimate and bootstrap CI, or not
    identified with the reason; the points and ranges it was fitted on."""
    rows = []
    for role, law in laws.items():
        for name, r in law.table().iterrows():
            rows.append({"role": role, "parameter": name, "estimate": r["estimate"], "ci_low": r["ci_low"],
                         "ci_high": r["ci_high"], "identified": bool(r["identified"]), "reason": r["reason"],
                         "cells": law.n_cells, "params_min": law.params_range[0], "params_max": law.params_range[1],
                         "tokens_min": law.tokens_range[0], "tokens_max": law.tokens_range[1]})
    return pd.DataFrame(rows)


def loss_loo_table(losses: pd.DataFrame, laws: Mapping, n_boot: int = 40, seed: int = 0) -> pd.DataFrame:
    """Per role, every map point predicted by the loss law refitted without it (from the full
    fit's optimum, ``n_boot`` replicates: ~1 s a point on 2 cores), as
    :func:`~studylib.study.comparisons.token_budget.fits.leave_one_out`'s rows with ``checked``: the refit
    identifies every parameter, so the prediction is a check. A role whose law on every point
    leaves a parameter unidentified is not refitted (fewer points identify no more): its points
    are listed, unchecked, with the reason in ``note``."""
    out = []
    losses = losses[losses["stories"] == 1.0] if "stories" in losses else losses
    for role, law in laws.items():
        d = losses[losses["role"] == role]
        bad = [k for k in NAMES if not law.coefs[k].identified]
        if bad:
            cells = d.groupby(list(LAW_KEYS))["value"].agg(["size", "mean"]).reset_index()
            t = pd.DataFrame({"params": cells["params"].astype(float), "tokens": cells["tokens"].astype(float),
                              "n": cells["size"], "measured": cells["mean"], "predicted": math.nan,
                              "pi_low": math.nan, "pi_high": math.nan, "inside": False, "extrapolated": False,
                              "not_identified": ", ".join(bad),
                              "note": f"not refitted: on every point the law leaves {', '.join(bad)} not identified"})
        else:
            t = leave_one_out(d[[*LAW_KEYS, "seed", "value"]], fit=loss_law, keys=LAW_KEYS, n_boot=n_boot, seed=seed,
                              start=law.theta)
        t.insert(0, "role", role)
        t["checked"] = t["predicted"].notna() & t["pi_low"].notna() & (t["not_identified"] == "")
        out.append(t)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def _loss_loo_words(loo: pd.DataFrame, role: str) -> str:
    t = loo[loo["role"] == role]
    ok = t[t["checked"]]
    if not len(ok):
        why = t["note"].iloc[0] if t["note"].iloc[0] else "every refit leaves a parameter not identified"
        return f" Left out one at a time: no point can be checked ({why})."
    return (f" Left out one at a time, {int(ok['inside'].sum())} of {len(ok)} checked points lie inside their "
            f"predicted 95% interval" + (f" ({len(t) - len(ok)} of {len(t)} not checked: without them a parameter "
                                         f"is not identified)" if len(ok) < len(t) else "") + ".")


def extrapolation_table(models: Mapping[str, GapModel], laws: Mapping) -> pd.DataFrame:
    """What the fits say at the paper's point, beside the paper's measurement: each gap at (the
    paper's MoE's 14.77M active parameters, 28.9 tokens/param) only where that point lies inside
    the map's grid (the gap plane describes the grid; outside it the joint law of :mod:`.law`
    carries the answer), and each role's loss law at its paper model's N and the paper's 426.3M
    tokens (a check of the joint law; NaN where a parameter is not identified). ``kind``: "gap"
    (compared in sign) or "loss" (compared in ordering)."""
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
        ok = all(law.coefs[k].identified for k in NAMES)
        p = law.predict([n], [PAPER_HEADLINE_TOKENS]).iloc[0]
        rows.append({"kind": "loss", "what": role, "params": n, "tokens": PAPER_HEADLINE_TOKENS,
                     "predicted": p["loss"] if ok else math.nan, "ci_low": p["ci_low"] if ok else math.nan,
                     "ci_high": p["ci_high"] if ok else math.nan, "paper": paper_loss[role], "identified": ok,
                     "extrapolated": bool(p["extrapolated"]),
                     "reason": "" if ok else ", ".join(k for k in NAMES if not law.coefs[k].identified)
                     + " not identified by this grid"})
    return pd.DataFrame(rows)


def _sign(v: float) -> str:
    return "the MoE better" if v > 0 else "the dense model better"


def _extrapolation_words(ex: pd.DataFrame) -> list[str]:
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
                   f"{r.predicted:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}] ({_sign(r.predicted)}); the paper "
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


def fit_sentences(coefs: pd.DataFrame, crossing: pd.DataFrame, loo: pd.DataFrame, laws: pd.DataFrame,
                  extrapolation: pd.DataFrame, loss_loo: pd.DataFrame | None = None) -> list[str]:
    """The fits in words, from their tables: per gap what moves it and its coefficients, where its
    fitted zero lies at the measured sizes, how many points the left-out fit predicts; each loss
    law's identified parameters and (``loss_loo``: :func:`loss_loo_table`) its left-out points; and
    the labelled extrapolation to the paper's point."""
    out = []
    for gap in dict.fromkeys(coefs["gap"]):
        c = coefs[coefs["gap"] == gap].set_index("term")
        label = GAPS[gap][1].split(" (")[0]
        t_c, n_c = c["centre_tokens_per_param"].iloc[0], c["centre_params"].iloc[0]
        s = (f"{what_moves(coefs, gap)} Gap model of the {label} over {int(c['cells'].iloc[0])} map points "
             f"({int(c['rows'].iloc[0])} per-seed gaps): "
             + "; ".join([_coef_words(c.loc["tokens_per_param"], f"tokens/param at fixed {n_c:.3g} params",
                                      "per decade"),
                          _coef_words(c.loc["size"], f"size at fixed {t_c:.3g} tokens/param", "per decade")]
                         + ([_coef_words(c.loc["interaction"], "interaction", "per decade squared")]
                            if c.loc["interaction", "identified"] else [])) + ".")
        cr = crossing[(crossing["gap"] == gap) & crossing["measured_size"]] if len(crossing) else crossing
        zs = []
        for r in cr.itertuples():
            if r.tokens_per_param != r.tokens_per_param:
                zs.append(f"at {r.params:.3g} params it does not reach zero within a decade of the measured range")
                continue
            band = ("" if r.low != r.low else f", band {r.low:.3g}{' or below' if r.low_open else ''} to "
                    f"{r.high:.3g}{' or above' if r.high_open else ''}")
            zs.append(f"at {r.params:.3g} params {r.tokens_per_param:.3g} tokens/param{band}"
                      + (" (extrapolated)" if r.extrapolated else ""))
        if zs:
            s += " Fitted zero (the crossing line at the measured sizes): " + "; ".join(zs) + "."
        lo = loo[loo["gap"] == gap] if len(loo) else loo
        if len(lo):
            ok = lo[lo["predicted"].notna() & lo["pi_low"].notna()]
            if len(ok):
                s += (f" Left out one at a time, {int(ok['inside'].sum())} of {len(lo)} points lie inside their "
                      f"predicted 95% interval" + (f" ({len(lo) - len(ok)} could not be predicted or carry no "
                                                   f"interval)" if len(ok) < len(lo) else "") + ".")
            else:
                s += " Left out one at a time, no point's prediction carries an interval."
        out.append(s)
    for role in dict.fromkeys(laws["role"]) if len(laws) else ():
        r = laws[laws["role"] == role].set_index("parameter")
        parts = [f"{k} not identified ({r.loc[k, 'reason']})" if not r.loc[k, "identified"] else
                 f"{k} = {r.loc[k, 'estimate']:.4g}, {r.loc[k, 'reason']}" if r.loc[k, "ci_low"] != r.loc[k, "ci_low"]
                 else f"{k} = {r.loc[k, 'estimate']:.4g} [{r.loc[k, 'ci_low']:.4g}, {r.loc[k, 'ci_high']:.4g}]"
                 for k in NAMES]
        out.append(f"Loss law of {role} (N: {N_OF_ROLE}; {int(r['cells'].iloc[0])} points): " + "; ".join(parts) + "."
                   + (_loss_loo_words(loss_loo, role) if loss_loo is not None and len(loss_loo) else ""))
    return out + _extrapolation_words(extrapolation)


__all__ = ["gap_models", "coefficient_table", "what_moves", "crossing_table", "loo_table", "loss_frame",
           "loss_laws", "loss_law_table", "loss_loo_table", "extrapolation_table", "fit_sentences"]
