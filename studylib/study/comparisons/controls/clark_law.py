"""The joint law's fitter on data no one here produced (issue #47, item 4): Clark et al. 2022's
plain dense and S-Base runs (:func:`studylib.study.analysis.clark.law_frame`), one fit per number
of experts E, with the N-only forms of :mod:`~studylib.study.comparisons.token_budget.law_form` ("n_lambda": ``L = E + A / N_eff^alpha``
with one lambda; "n_lambda_size": lambda(N)); every run saw the same tokens, so there is no D term.
The same fitter (:func:`~studylib.study.comparisons.token_budget.law_fit.fit_law`) runs here as on the map: its runs frame takes each
Clark run as one seed of one role (dense: ``dense_active``; S-Base: ``moe``) at one size, and
tokens = unique = 1 for every run (a placeholder the N-only forms never read).

* :func:`fit_clark`: the law fitted on the 15-55M runs ("fit" split) for one E and form.
* :func:`clark_law_table`: every fit's parameters (estimate and interval, or why none: each size
  has one run per model, so no seed bootstrap, and one map cell per size, so no cell bootstrap).
* :func:`clark_positions_table`: p per size from the fitted law beside the p computed directly
  from the runs (:func:`~studylib.study.analysis.clark.positions`), the 130M read from the 15-55M fit.
* :func:`clark_held_out_table`: the 130M runs (dense: the mean of its 3 seeds; S-Base: one run)
  predicted from the 15-55M fit beside the measured loss: the held-out-size check the study
  applies to itself, here without an interval (one run per model and size in the fit).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from studylib.study.analysis import clark
from studylib.study.analysis.position import position
from studylib.study.comparisons.token_budget.law_fit import JointLaw, fit_law
from studylib.study.comparisons.token_budget.law_form import N_FORMS, N_REF_CLARK

#: the tables and the figure notebook 13 writes from Clark et al.'s curves
CLARK_POSITIONS, POSITION_AGAINST_SIZE, CLARK_TREND = "clark_positions", "position_against_size", "clark_trend"
CLARK_LAW_FIT, CLARK_LAW_POSITIONS, CLARK_LAW_HELD_OUT = "clark_law_fit", "clark_law_positions", "clark_law_held_out"
#: a placeholder token count: every Clark run saw the same tokens, and the N-only forms read none
_SAME_TOKENS = 1.0
_CELLS = "runs (one model at one size)"


def clark_runs(frame: pd.DataFrame, experts: int) -> pd.DataFrame:
    """:func:`~studylib.study.analysis.clark.law_frame`'s dense rows and the S-Base rows with
    ``experts`` experts, in :data:`~studylib.study.comparisons.token_budget.law_fit.COLUMNS`' form with ``split``."""
    f = frame[(frame["role"] == "dense") | (frame["experts"] == experts)]
    if not (f["role"] == "moe").any():
        raise ValueError(f"clark law: no S-Base run with E = {experts} in the frame (E: "
                         f"{sorted(frame.loc[frame['role'] == 'moe', 'experts'].unique())})")
    return pd.DataFrame({"role": np.where(f["role"] == "dense", "dense_active", "moe"), "size": f["size_label"],
                         "seed": f["seed"].astype(int), "active": f["n_active"].astype(float),
                         "total": f["n_total"].astype(float), "tokens": _SAME_TOKENS, "unique": _SAME_TOKENS,
                         "value": f["loss"].astype(float), "split": f["split"]}).reset_index(drop=True)


def fit_clark(frame: pd.DataFrame, experts: int, form: str = "n_lambda", n_boot: int = 200, seed: int = 0) -> JointLaw:
    """The N-only law (``form`` in :data:`~studylib.study.comparisons.token_budget.law_form.N_FORMS`) on the "fit" split's runs for ``experts``."""
    if form not in N_FORMS:
        raise ValueError(f"clark law: form must be one of {N_FORMS} (no D term), not {form!r}")
    runs = clark_runs(frame, experts)
    return fit_law(runs[runs["split"] == "fit"].drop(columns="split"), form, n_boot=n_boot, who="clark law",
                   cells=_CELLS, seed=seed)


def fit_all(frame: pd.DataFrame, experts: Sequence[int] = clark.EXPERTS, forms: Sequence[str] = N_FORMS,
            n_boot: int = 200) -> dict:
    """``{(E, form): JointLaw}`` for every E and form."""
    return {(e, f): fit_clark(frame, e, f, n_boot=n_boot) for e in experts for f in forms}


def clark_law_table(fits: dict) -> pd.DataFrame:
    """One row per E, form and parameter: ``experts``, ``form``, ``parameter``, ``estimate``,
    ``ci_low``, ``ci_high``, ``identified``, ``reason``, ``runs`` (fitted), ``sizes``."""
    out = []
    for (e, form), law in fits.items():
        t = law.table().reset_index().rename(columns={"index": "parameter"})
        t = t.rename(columns={t.columns[0]: "parameter"})
        out.append(t[["parameter", "estimate", "ci_low", "ci_high", "identified", "reason"]]
                   .assign(experts=e, form=form, runs=law.n_obs, sizes=law.n_sizes))
    cols = ["experts", "form", "parameter", "estimate", "ci_low", "ci_high", "identified", "reason", "runs", "sizes"]
    return pd.concat(out, ignore_index=True)[cols]


def _law_losses(law: JointLaw, active, total) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dense at N_active, the MoE, dense at N_total) from the law at each size."""
    a, t = np.asarray(active, float), np.asarray(total, float)
    n = len(a)
    one = np.full(n, _SAME_TOKENS)
    la = law.at("dense_active", a, a, one, one).point
    lm = law.at("moe", a, t, one, one).point
    lt = law.at("dense_active", t, t, one, one).point
    return la, lm, lt


def clark_positions_table(fits: dict, frame: pd.DataFrame, last: pd.DataFrame) -> pd.DataFrame:
    """One row per E, form and size (15M-130M): ``p_fit`` (the fitted law's
    ``(L(N_active) - L_moe) / (L(N_active) - L(N_total))``), ``p_direct`` (Clark's runs,
    :func:`~studylib.study.analysis.clark.positions`: S-Base at that E), their difference,
    ``lambda`` (the law's lambda at that size) and ``split`` ("fit" or "held_out": read from the
    15-55M fit)."""
    from studylib.study.comparisons.token_budget.law_form import lambda_at

    direct = clark.positions(last, routers=("S-Base",))
    out = []
    for (e, form), law in fits.items():
        runs = clark_runs(frame, e)
        moe = runs[runs["role"] == "moe"].groupby("size", sort=False).agg(
            active=("active", "first"), total=("total", "first"), split=("split", "first")).reset_index()
        la, lm, lt = _law_losses(law, moe["active"], moe["total"])
        d = direct[direct["experts"] == e].set_index("size_label")["p"]
        out.append(pd.DataFrame({"experts": e, "form": form, "size_label": moe["size"], "n_active": moe["active"],
                                 "n_total": moe["total"], "split": moe["split"],
                                 "lambda": lambda_at(law.theta, form, moe["active"].to_numpy()),
                                 "p_fit": position(la, lm, lt), "p_direct": moe["size"].map(d).to_numpy(float)}))
    t = pd.concat(out, ignore_index=True)
    t["difference"] = t["p_fit"] - t["p_direct"]
    return t


def clark_held_out_table(fits: dict, frame: pd.DataFrame) -> pd.DataFrame:
    """One row per E, form and model of the held-out sizes (130M): ``role`` ("dense", "moe"),
    ``runs`` (averaged), ``measured`` (their mean loss), ``seed_sd`` (the sd over its runs where
    it has more than one), ``predicted`` (the 15-55M law), ``error`` (predicted - measured),
    ``ci_low``/``ci_high`` (NaN) and ``note`` (why there is no interval)."""
    out = []
    for (e, form), law in fits.items():
        runs = clark_runs(frame, e)
        held = runs[runs["split"] == "held_out"]
        for (size, role), g in held.groupby(["size", "role"], sort=False):
            a, t = float(g["active"].iloc[0]), float(g["total"].iloc[0])
            pred = float(law.at(role, a, t, _SAME_TOKENS, _SAME_TOKENS).point[0])
            meas = float(g["value"].mean())
            out.append({"experts": e, "form": form, "size_label": size, "role": "dense" if role != "moe" else "moe",
                        "n_active": a, "n_total": t, "runs": len(g), "measured": meas,
                        "seed_sd": float(g["value"].std(ddof=1)) if len(g) > 1 else math.nan,
                        "predicted": pred, "error": pred - meas, "ci_low": math.nan, "ci_high": math.nan,
                        "note": law.coefs[law.names[0]].reason or ""})
    return pd.DataFrame(out)


def clark_law_sentences(params: pd.DataFrame, pos: pd.DataFrame, held: pd.DataFrame) -> list:
    """The fitter on Clark's runs in words: per E and form, lambda (and lambda_1), p per size from
    the fit against the direct one, and the 130M check."""
    out = []
    for (e, form), t in params.groupby(["experts", "form"], sort=False):
        v = t.set_index("parameter")["estimate"]
        lam = (f"lambda_0 = {v['lambda']:.3f} at {N_REF_CLARK:.3g} active, lambda_1 = {v['lambda_1']:.3f} per decade"
               if "lambda_1" in v else f"lambda = {v['lambda']:.3f}")
        p = pos[(pos["experts"] == e) & (pos["form"] == form)]
        ps = ", ".join(f"{r.size_label} {r.p_fit:.2f} (direct {r.p_direct:.2f})" for r in p.itertuples())
        h = held[(held["experts"] == e) & (held["form"] == form)]
        hs = "; ".join(f"{r.role} {r.predicted:.3f} against {r.measured:.3f} measured (error {r.error:+.3f})"
                       for r in h.itertuples())
        out.append(f"Clark et al.'s S-Base, E = {e}, {form} form fitted on 15-55M: {lam}; p per size {ps}; "
                   f"the 130M predicted: {hs} (no interval: one run per model and size).")
    return out


def clark_tables(last: pd.DataFrame, map_table: pd.DataFrame | None = None) -> dict:
    """Everything notebook 13 shows of Clark et al.'s curves (``last``:
    :func:`~studylib.study.analysis.clark.last_evaluations`), by table name: :data:`CLARK_POSITIONS`
    (p per router, E and size), :data:`POSITION_AGAINST_SIZE` (this study's map cells, from
    ``map_table``, the map's position table ``token_budget_gaps``, or none; Clark's S-Base and Hash;
    the paper), :data:`CLARK_TREND` (each trend read at this study's MoE sizes and the paper's),
    :data:`CLARK_LAW_FIT`, :data:`CLARK_LAW_POSITIONS`, :data:`CLARK_LAW_HELD_OUT` (the fitter on
    Clark's runs); and ``"trends"`` (the :class:`~studylib.study.analysis.clark.Trend` fits, for the figure)."""
    from studylib.study.analysis.paper import PAPER_ACTIVE_PARAMS

    pos = clark.positions(last)
    fits = clark.trends(pos)
    has_map = map_table is not None and len(map_table) and "position_defined" in map_table
    cells = (clark.cells_from_gap_table(map_table) if has_map else
             pd.DataFrame({c: pd.Series(dtype=object if c == "source" else float) for c in clark.STUDY_COLUMNS}))
    sizes = {f"this study, {r.size_label}": float(r.moe_active)
             for r in (map_table.drop_duplicates("size_label").itertuples() if has_map else [])}
    sizes["the paper"] = PAPER_ACTIVE_PARAMS
    frame = clark.law_frame(last)
    laws = fit_all(frame, n_boot=0)
    law_pos = clark_positions_table(laws, frame, last)
    held = clark_held_out_table(laws, frame)
    return {CLARK_POSITIONS: pos, POSITION_AGAINST_SIZE: clark.position_against_size(cells, pos),
            CLARK_TREND: clark.trend_table(fits, sizes), CLARK_LAW_FIT: clark_law_table(laws),
            CLARK_LAW_POSITIONS: law_pos, CLARK_LAW_HELD_OUT: held, "trends": fits}


#: the tables :func:`clark_section` gives, in the order notebook 13 saves them
TABLES = (CLARK_POSITIONS, POSITION_AGAINST_SIZE, CLARK_TREND, CLARK_LAW_FIT, CLARK_LAW_POSITIONS, CLARK_LAW_HELD_OUT)


def clark_section(out_dir, path=None) -> tuple[dict | None, str]:
    """(:func:`clark_tables` of Clark et al.'s file ``path`` (default
    :func:`~studylib.study.analysis.clark.clark_file`) beside the token-budget map's position table
    of this study (``<out_dir>/tables/token_budget_gaps.csv`` where notebook 09 wrote it), a note):
    ``(None, why)`` where the file is missing or unreadable; the note says whether the map's
    cells are in."""
    from pathlib import Path

    from studylib.study.comparisons.token_budget import MAP

    try:
        last = clark.last_evaluations(clark.load_curves(path))
    except clark.ClarkDataError as e:
        return None, f"Clark et al.'s curves are not used: {e}"
    gaps = Path(out_dir) / "tables" / f"{MAP}.csv"
    table = pd.read_csv(gaps) if gaps.is_file() else None
    note = ("this study's map cells from " + str(gaps) if table is not None else
            f"no {gaps.name} in this study (notebook 09 did not run): Clark et al.'s points and the paper only")
    return clark_tables(last, table), note


__all__ = ["TABLES", "clark_section", "CLARK_POSITIONS", "POSITION_AGAINST_SIZE", "CLARK_TREND", "CLARK_LAW_FIT", "CLARK_LAW_POSITIONS",
           "CLARK_LAW_HELD_OUT", "clark_tables", "clark_runs", "fit_clark", "fit_all", "clark_law_table", "clark_positions_table", "clark_held_out_table",
           "clark_law_sentences"]
