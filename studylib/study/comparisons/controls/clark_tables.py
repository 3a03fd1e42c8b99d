"""Notebook 13's tables and figure from Clark et al. 2022's curves (read and converted by
:mod:`.clark`): the trend of p in log10 N (:class:`Trend`, :func:`trends`: per router and E, OLS by
statsmodels over the sizes where p is defined, the 95% CI of the slope; read at other sizes with the
95% CI of the line and the prediction interval of one new size, every readout outside Clark's sizes
labelled with its distance in decades), the figure "position against size", and the study's law on
their runs.
**The law on Clark's runs** (issue #47): their plain dense and S-Base runs (:func:`~.clark.law_frame`), one
fit per number of experts E, with the N-only forms of :mod:`~studylib.study.analysis.law.form`
("n_lambda": ``L = E + A / N_eff^alpha`` with one lambda; "n_lambda_size": lambda(N)): every run saw
the same tokens, so there is no D term. Each run is one seed of one role (dense: ``dense_active``;
S-Base: ``moe``) at one size; tokens = unique = 1 (a placeholder the N-only forms never read). Fitted
on 15-55M (:func:`fit_clark`), its parameters (:func:`clark_law_table`), p per size beside the
direct one (:func:`clark_positions_table`) and the 130M runs predicted
(:func:`clark_held_out_table`: the held-out-size check the study applies to itself, without an
interval: one run per model and size).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from studylib.study.analysis.law.checks import HeldOut, predict_held_out
from studylib.study.analysis.law.fit import JointLaw, runs_frame
from studylib.study.analysis.law.form import N_FORMS, N_REF_CLARK, lambda_at
from studylib.study.analysis.paper import PAPER_ACTIVE_PARAMS, PAPER_POSITION
from studylib.study.analysis.position import position
from studylib.study.comparisons.controls.clark import (EXPERTS, STUDY_COLUMNS, ClarkDataError, SAME_TOKENS,
                                                      cells_from_gap_table, clark_runs, last_evaluations, law_frame,
                                                      load_curves, position_against_size, positions)

@dataclass(frozen=True)
class Trend:
    """``p = intercept + slope log10(N_active)`` fitted by OLS over ``n`` sizes of one router and E
    (:func:`trends`), with the slope's 95% CI; ``n_min`` / ``n_max``: the sizes it rests on."""

    router: str
    experts: int
    n: int
    slope: float
    slope_lo: float
    slope_hi: float
    intercept: float
    n_min: float
    n_max: float
    result: Any = field(repr=False, compare=False)  # statsmodels' RegressionResults

    def at(self, n_active, level: float = 0.95) -> pd.DataFrame:
        """The line at ``n_active``: ``p``, its CI (``ci_lo``, ``ci_hi``), the prediction interval
        of one new size (``pi_lo``, ``pi_hi``) and ``decades_out`` (log10 distance outside
        ``[n_min, n_max]``; 0 inside): any readout with ``decades_out > 0`` is an extrapolation."""
        n = np.atleast_1d(np.asarray(n_active, float))
        x = np.log10(n)
        sf = self.result.get_prediction(np.column_stack([np.ones_like(x), x])).summary_frame(alpha=1 - level)
        out = np.maximum(np.log10(self.n_min) - x, 0) + np.maximum(x - np.log10(self.n_max), 0)
        return pd.DataFrame({"n_active": n, "p": sf["mean"].to_numpy(), "ci_lo": sf["mean_ci_lower"].to_numpy(),
                             "ci_hi": sf["mean_ci_upper"].to_numpy(), "pi_lo": sf["obs_ci_lower"].to_numpy(),
                             "pi_hi": sf["obs_ci_upper"].to_numpy(), "decades_out": out})


def trends(pos: pd.DataFrame, level: float = 0.95) -> dict:
    """``{(router, E): Trend}`` over :func:`positions`' rows where p is defined; a router and E
    with fewer than 3 such sizes (no interval) is left out. To fit over fewer sizes, pass fewer rows
    (e.g. without the 370M, which sits below the 15-130M line for every router)."""
    import statsmodels.api as sm

    fits = {}
    for (router, e), g in pos.dropna(subset=["p"]).groupby(["router", "experts"], sort=False):
        if len(g) < 3:
            continue
        x = np.log10(g["n_active"].to_numpy(float))
        res = sm.OLS(g["p"].to_numpy(float), sm.add_constant(x, has_constant="add")).fit()
        b_lo, b_hi = np.asarray(res.conf_int(alpha=1 - level))[1]
        fits[(router, int(e))] = Trend(router, int(e), len(g), float(res.params[1]), float(b_lo), float(b_hi),
                                       float(res.params[0]), float(g["n_active"].min()),
                                       float(g["n_active"].max()), res)
    return fits


def trend_table(fits: dict, sizes: dict) -> pd.DataFrame:
    """Every trend read at ``sizes`` (``{label: N_active}``, e.g. this study's MoEs and the
    paper's 14.77M): one row per router, E and size with the slope (and its CI) beside
    :meth:`Trend.at`'s columns and ``readout`` ("inside Clark's sizes" or "extrapolated, x.xx
    decades below / above Clark's sizes")."""
    rows = []
    for t in fits.values():
        at = t.at(list(sizes.values())).assign(size=list(sizes))
        at.insert(0, "router", t.router)
        at.insert(1, "experts", t.experts)
        at["slope"], at["slope_lo"], at["slope_hi"], at["fit_sizes"] = t.slope, t.slope_lo, t.slope_hi, t.n
        at["readout"] = [("inside Clark's sizes" if d == 0 else
                          f"extrapolated, {d:.2f} decades {'below' if n < t.n_min else 'above'} Clark's sizes")
                         for n, d in zip(at["n_active"], at["decades_out"])]
        rows.append(at)
    cols = ["router", "experts", "size", "n_active", "p", "ci_lo", "ci_hi", "pi_lo", "pi_hi", "decades_out",
            "readout", "slope", "slope_lo", "slope_hi", "fit_sizes"]
    return pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)


def position_against_size_figure(table: pd.DataFrame, fits: dict, outdir=None,
                                 name: str = "position_against_size"):
    """p against active N (log x) from :func:`position_against_size`'s table: this study's cells
    with their 95% CIs (black), Clark et al.'s points (colour: router; marker: E) with each trend
    of ``fits`` (:func:`trends`) whose router and E the table shows, drawn over the whole x range
    (dashed where extrapolated) with the 95% CI of the line as a band, the paper's point (star),
    and lines at 0 (the active match) and 1 (the total match)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from studylib.study.analysis.plots import save_figure

    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    clark = table[(table["kind"] == "Clark et al. 2022") & table["p"].notna()]
    routers = list(dict.fromkeys(clark["router"]))
    colours = dict(zip(routers, sns.color_palette("colorblind", len(routers))))
    markers = {4: "o", 8: "s"}
    if len(clark):
        sns.scatterplot(data=clark.assign(E=clark["experts"].astype(int)), x="n_active", y="p", hue="router",
                        hue_order=routers, palette=colours, style="E", markers=markers, s=60, ax=ax, zorder=3)
    x = table.loc[table["p"].notna(), "n_active"].astype(float)
    grid = np.logspace(np.log10(x.min()) - 0.2, np.log10(x.max()) + 0.2, 200)
    shown = set(zip(clark["router"], clark["experts"].astype(int)))
    for (router, e), t in fits.items():
        if (router, e) not in shown:
            continue
        at = t.at(grid)
        ls = "-" if e == 4 else "--"
        inside = at["decades_out"] == 0
        ax.plot(grid[inside], at["p"][inside], color=colours[router], ls=ls, lw=1.5)
        ax.plot(grid, at["p"], color=colours[router], ls=ls, lw=0.8, alpha=0.6)
        ax.fill_between(grid, at["ci_lo"], at["ci_hi"], color=colours[router], alpha=0.08 if e == 8 else 0.12, lw=0)
    study = table[(table["kind"] == "this study") & table["p"].notna()]
    if len(study):
        yerr = np.vstack([study["p"] - study["p_lo"], study["p_hi"] - study["p"]]).clip(min=0)
        ax.errorbar(study["n_active"], study["p"], yerr=np.nan_to_num(yerr), fmt="o", color="black", capsize=3,
                    label="this study (95% CI)", zorder=4)
    paper = table[table["kind"] == "the paper"]
    ax.scatter(paper["n_active"], paper["p"], marker="*", s=220, color="crimson", edgecolor="black",
               label=f"the paper ({PAPER_POSITION:.2f})", zorder=5)
    for y, words in ((0.0, "active match"), (1.0, "total match")):
        ax.axhline(y, color="grey", ls=":", lw=1)
        ax.text(grid[0], y, f" {words}", va="bottom", ha="left", fontsize=8, color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("active parameters N (log scale)")
    ax.set_ylabel("position p between the dense matches")
    ax.set_title("Position against size. Clark et al.'s trends: E = 4 solid, E = 8 dashed; band: 95% CI of the "
                 "line; thin: extrapolated", fontsize=9)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    save_figure(fig, name, outdir)
    return fig


#: the tables and the figure notebook 13 writes from Clark et al.'s curves
CLARK_POSITIONS, POSITION_AGAINST_SIZE, CLARK_TREND = "clark_positions", "position_against_size", "clark_trend"
CLARK_LAW_FIT, CLARK_LAW_POSITIONS, CLARK_LAW_HELD_OUT = "clark_law_fit", "clark_law_positions", "clark_law_held_out"
_CELLS = "runs (one model at one size)"
#: the columns of the law's tables (:func:`clark_law_table`, :func:`clark_positions_table`,
#: :func:`clark_held_out_table`), theirs also where the law is not fitted
LAW_COLUMNS = {
    CLARK_LAW_FIT: ("experts", "form", "parameter", "estimate", "ci_low", "ci_high", "identified", "reason", "runs",
                    "sizes"),
    CLARK_LAW_POSITIONS: ("experts", "form", "size_label", "n_active", "n_total", "split", "lambda", "p_fit",
                          "p_direct", "difference"),
    CLARK_LAW_HELD_OUT: ("experts", "form", "size_label", "role", "n_active", "n_total", "runs", "measured", "seed_sd",
                         "predicted", "error", "ci_low", "ci_high", "note")}


def fit_clark(frame: pd.DataFrame, experts: int, form: str = "n_lambda", n_boot: int = 200,
              seed: int = 0) -> HeldOut:
    """The N-only law (``form`` in :data:`~studylib.study.analysis.law.form.N_FORMS`) fitted on the
    "fit" split's runs for ``experts``, with the "held_out" split's runs predicted
    (:func:`~studylib.study.analysis.law.checks.predict_held_out`)."""
    if form not in N_FORMS:
        raise ValueError(f"clark law: form must be one of {N_FORMS} (no D term), not {form!r}")
    runs = runs_frame(clark_runs(frame, experts), "clark law")
    return predict_held_out(runs, runs["split"] == "held_out", form, n_boot=n_boot, seed=seed, who="clark law",
                            cells=_CELLS)


def fit_all(frame: pd.DataFrame, experts: Sequence[int] = EXPERTS, forms: Sequence[str] = N_FORMS,
            n_boot: int = 200) -> dict:
    """``{(E, form): HeldOut}`` (:func:`fit_clark`) for every E and form."""
    return {(e, f): fit_clark(frame, e, f, n_boot=n_boot) for e in experts for f in forms}


def clark_law_table(fits: dict) -> pd.DataFrame:
    """One row per E, form and parameter: ``experts``, ``form``, ``parameter``, ``estimate``,
    ``ci_low``, ``ci_high``, ``identified``, ``reason``, ``runs`` (fitted), ``sizes``."""
    out = []
    for (e, form), h in fits.items():
        law = h.law
        t = law.table().reset_index().rename(columns={"index": "parameter"})
        t = t.rename(columns={t.columns[0]: "parameter"})
        out.append(t[["parameter", "estimate", "ci_low", "ci_high", "identified", "reason"]]
                   .assign(experts=e, form=form, runs=law.n_obs, sizes=law.n_sizes))
    return pd.concat(out, ignore_index=True)[list(LAW_COLUMNS[CLARK_LAW_FIT])]


def _law_losses(law: JointLaw, active, total) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dense at N_active, the MoE, dense at N_total) from the law at each size."""
    a, t = np.asarray(active, float), np.asarray(total, float)
    n = len(a)
    one = np.full(n, SAME_TOKENS)
    la = law.at("dense_active", a, a, one, one).point
    lm = law.at("moe", a, t, one, one).point
    lt = law.at("dense_active", t, t, one, one).point
    return la, lm, lt


def clark_positions_table(fits: dict, frame: pd.DataFrame, last: pd.DataFrame) -> pd.DataFrame:
    """One row per E, form and size (15M-130M): ``p_fit`` (the fitted law's
    ``(L(N_active) - L_moe) / (L(N_active) - L(N_total))``), ``p_direct`` (Clark's runs,
    :func:`~positions`: S-Base at that E), their difference,
    ``lambda`` (the law's lambda at that size) and ``split`` ("fit" or "held_out": read from the
    15-55M fit)."""
    direct = positions(last, routers=("S-Base",))
    out = []
    for (e, form), h in fits.items():
        law, runs = h.law, clark_runs(frame, e)
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
    for (e, form), h in fits.items():
        runs = clark_runs(frame, e)
        sd = runs[runs["split"] == "held_out"].groupby(["size", "role"])["value"].std(ddof=1)
        for c, pred in zip(h.cells.itertuples(), h.point):
            out.append({"experts": e, "form": form, "size_label": c.size, "role": "dense" if c.role != "moe" else "moe",
                        "n_active": c.active, "n_total": c.total, "runs": c.n, "measured": c.measured,
                        "seed_sd": float(sd[(c.size, c.role)]) if c.n > 1 else math.nan,
                        "predicted": float(pred), "error": float(pred) - c.measured, "ci_low": math.nan,
                        "ci_high": math.nan, "note": h.law.coefs[h.law.names[0]].reason or ""})
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
    :func:`last_evaluations`), by table name: :data:`CLARK_POSITIONS`
    (p per router, E and size), :data:`POSITION_AGAINST_SIZE` (this study's map cells, from
    ``map_table``, the map's position table ``token_budget_gaps``, or none; Clark's S-Base and Hash;
    the paper), :data:`CLARK_TREND` (each trend read at this study's MoE sizes and the paper's),
    :data:`CLARK_LAW_FIT`, :data:`CLARK_LAW_POSITIONS`, :data:`CLARK_LAW_HELD_OUT` (the fitter on
    Clark's runs); ``"trends"`` (the :class:`Trend` fits, for the figure); ``"law_refused"``: why
    the law is not fitted (:func:`~.clark.law_frame`: a fit or held-out size lacks runs; its
    tables then hold no row), "" where it is."""
    pos = positions(last)
    fits = trends(pos)
    has_map = map_table is not None and len(map_table) and "position_defined" in map_table
    cells = (cells_from_gap_table(map_table) if has_map else
             pd.DataFrame({c: pd.Series(dtype=object if c == "source" else float) for c in STUDY_COLUMNS}))
    sizes = {f"this study, {r.size_label}": float(r.moe_active)
             for r in (map_table.drop_duplicates("size_label").itertuples() if has_map else [])}
    sizes["the paper"] = PAPER_ACTIVE_PARAMS
    try:
        frame = law_frame(last)
    except ClarkDataError as e:
        law, refused = {k: pd.DataFrame(columns=list(c)) for k, c in LAW_COLUMNS.items()}, str(e)
    else:
        laws = fit_all(frame, n_boot=0)
        law, refused = {CLARK_LAW_FIT: clark_law_table(laws), CLARK_LAW_POSITIONS: clark_positions_table(laws, frame, last),
                        CLARK_LAW_HELD_OUT: clark_held_out_table(laws, frame)}, ""
    return {CLARK_POSITIONS: pos, POSITION_AGAINST_SIZE: position_against_size(cells, pos),
            CLARK_TREND: trend_table(fits, sizes), **law, "trends": fits, "law_refused": refused}


#: the tables :func:`clark_section` gives, in the order notebook 13 saves them
TABLES = (CLARK_POSITIONS, POSITION_AGAINST_SIZE, CLARK_TREND, CLARK_LAW_FIT, CLARK_LAW_POSITIONS, CLARK_LAW_HELD_OUT)


def clark_section(out_dir, map_table: str, path=None) -> tuple[dict | None, str]:
    """(:func:`clark_tables` of Clark et al.'s file ``path`` (default :func:`clark_file`) beside
    the token-budget map's position table of this study (``<out_dir>/tables/<map_table>.csv``
    where notebook 09 wrote it), a note): ``(None, why)`` where the file is missing, unreadable or
    holds what the method cannot use (:func:`~.clark.load_curves`); the note says whether the map's
    cells are in, and why the law is not fitted where it is not."""
    try:
        last = last_evaluations(load_curves(path))
    except ClarkDataError as e:
        return None, f"Clark et al.'s curves are not used: {e}"
    gaps = Path(out_dir) / "tables" / f"{map_table}.csv"
    table = pd.read_csv(gaps) if gaps.is_file() else None
    note = ("this study's map cells from " + str(gaps) if table is not None else
            f"no {gaps.name} in this study (notebook 09 did not run): Clark et al.'s points and the paper only")
    tables = clark_tables(last, table)
    return tables, note + (f"; {tables['law_refused']}" if tables["law_refused"] else "")


__all__ = ["Trend", "trends", "trend_table", "position_against_size_figure", "TABLES", "LAW_COLUMNS", "clark_section",
           "CLARK_POSITIONS", "POSITION_AGAINST_SIZE", "CLARK_TREND", "CLARK_LAW_FIT", "CLARK_LAW_POSITIONS",
           "CLARK_LAW_HELD_OUT", "clark_tables", "fit_clark", "fit_all", "clark_law_table", "clark_positions_table",
           "clark_held_out_table", "clark_law_sentences"]
