"""The law's fit (issues #31, #40): every form of :mod:`.form` by one Huber fitter over every
run of the map, with one identification test, one grid of starts and two bootstraps.

* The objective (Hoffmann et al. 2022, approach 3): the Huber loss (delta 1e-3) of ``log L_hat -
  log L`` over every run, minimised by scipy's trust-region least squares (``loss="huber"``) with
  the analytic Jacobian (:func:`~.form.log_loss_jacobian`; 2.9 s against 5.7 s with finite
  differences, same optimum, for the test's 40 + 40 replicates on the 2-core AMD EPYC) from the
  best :data:`STARTS` points of one grid, ln N and ln U_s centred (a better conditioned problem).
* Two bootstraps, each refitting from the optimum: seeds resampled within each role's cell, and
  whole map cells resampled within each size (a replicate that leaves a parameter not identified
  gives it no draw; beyond :data:`CELL_NAN_SHARE` of them, no cell interval).
* A parameter the map does not pin down is "not identified" with the reason, never a number
  (:func:`_not_identified`); one whose only reason is a bound (``JointLaw.on_bound``) is the
  constrained fit's value, usable for predictions (:mod:`.checks` says so).
* :func:`role_law`: the "chinchilla" form per model role, a check (:mod:`.law_roles`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.special import huber

from studylib.study.analysis.bootstrap import (Bootstrap, Coef, bootstrap_values, cell_frame, coef_table, no_interval,
                                               outside)
from studylib.study.analysis.position import ROLES
from studylib.study.analysis.law.form import (Chinchilla, bounds, design, form_of,
                                                              log_loss, log_loss_jacobian, natural, pack,
                                                              param_names, take, unpack)

COLUMNS = ("role", "size", "seed", "active", "total", "tokens", "unique", "value")
#: a map cell: one trio trained on one budget drawn from one number of unique tokens
MAP_KEYS = ("size", "tokens", "unique")
#: a per-role frame's map point: parameters (N) and training tokens (D)
ROLE_KEYS = ("params", "tokens")
HUBER_DELTA = 1e-3
#: grid points optimised per fit (on synthetic maps of the grid's shape all four reached one optimum)
STARTS = 4
#: rms change of log L at the measured points per unit of a parameter (log E, log A, log B: a
#: factor e; alpha, beta: 1), others compensating, below which the parameter is not identified
IDENTIFIED_TOL = 1e-6
#: cell replicates allowed to leave a parameter not identified before it loses its cell interval
CELL_NAN_SHARE = 0.05

#: the grid of starts, per field: log E, log A and log B at the rows' mean ln N and ln U, alpha,
#: beta, lambda or log m, log R*
_GRID = {"log_E": [-1.0, -0.5, 0.0, 0.5], "log_A": [-3.0, -2.0, -1.0, 0.0], "log_B": [-3.0, -2.0, -1.0, 0.0],
         "alpha": [0.15, 0.4, 0.8, 1.5], "beta": [0.15, 0.4, 0.8, 1.5], "lam": [0.2, 0.5, 0.8],
         "log_m": np.log([0.7, 1.2, 2.0]), "log_rstar": np.log([1.0, 5.0, 25.0]), "lam1": [-0.3, 0.0, 0.3]}


def runs_frame(runs: pd.DataFrame, who: str = "joint law") -> pd.DataFrame:
    """``runs`` checked (:data:`COLUMNS`, known roles, positive numbers, a dense model's active ==
    total), sorted, with ``cell`` (a role's seeds at one map cell, what the seed bootstrap
    resamples), ``map_cell`` (one per :data:`MAP_KEYS`) and ``passes`` (D / U)."""
    missing = [c for c in COLUMNS if c not in runs]
    if missing:
        raise ValueError(f"{who}: the runs frame has no column {missing} (columns: {list(runs.columns)})")
    df = cell_frame(runs, ("active", "total", "tokens", "unique"), "value", who)
    if not df["role"].isin(ROLES).all():
        raise ValueError(f"{who}: unknown roles {sorted(set(df['role']) - set(ROLES))} (known: {ROLES})")
    if (df["value"] <= 0).any():
        raise ValueError(f"{who}: column 'value' must be positive (a loss; the fit is on log L)")
    dense = df["role"] != "moe"
    if (not np.allclose(df.loc[dense, "active"], df.loc[dense, "total"], rtol=1e-6)
            or (df["total"] < df["active"]).any()):
        raise ValueError(f"{who}: a dense model's active and total parameters must agree, and total >= active")
    df = df.sort_values(["role", *MAP_KEYS, "seed"], kind="stable").reset_index(drop=True)
    df["cell"] = df.groupby(["role", *MAP_KEYS], sort=False).ngroup()
    df["map_cell"] = df.groupby(list(MAP_KEYS), sort=False).ngroup()
    df["passes"] = df["tokens"] / df["unique"]
    return df


def _fields(form: str, per_role: bool) -> list:
    """The vector's field names, one per entry (``log_rstar`` three times with one R* per role)."""
    return [f for f in form_of(form)._fields for _ in range(3 if f == "log_rstar" and per_role else 1)]


def _grid(form: str, per_role: bool) -> np.ndarray:
    axes = [np.asarray(_GRID[f], dtype=float) for f in form_of(form)._fields]
    g = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, len(axes))
    return per_role_start(g, form) if per_role else g


def per_role_start(theta, form: str) -> np.ndarray:
    """A shared-R* optimum as a start for one R* per role (the three R* at the shared one's)."""
    p = unpack(theta, form)
    return pack(p._replace(log_rstar=np.repeat(p.log_rstar, 3, axis=-1)))


def _centred(X) -> tuple[dict, float, float]:
    """(``X`` with ln N and ln U taken from their means, those means)."""
    cn, cd = float(X["lna"].mean()), float(X["lnu"].mean())
    return {**X, "lna": X["lna"] - cn, "lnu": X["lnu"] - cd}, cn, cd


def _shift(theta, form, cn, cd, sign) -> np.ndarray:
    """``theta`` of the centred data (sign -1) or back (sign +1): log A and log B move by alpha ln N
    and beta ln U at the centre."""
    p = unpack(theta, form)
    p = p._replace(log_A=p.log_A + sign * p.alpha * cn)
    return pack(p._replace(log_B=p.log_B + sign * p.beta * cd) if "log_B" in p._fields else p)


def _huber(theta, X, lnL, form, delta) -> float:
    return float(huber(delta, log_loss_jacobian(theta, X, form)[0] - lnL).sum()) / delta


def _refit(X, lnL, form, per_role, delta, theta) -> np.ndarray:
    """The optimum of the Huber loss from ``theta``: the one call of the optimiser."""
    Xz, cn, cd = _centred(X)
    lo, hi = bounds(form, per_role)
    x0 = np.clip(_shift(theta, form, cn, cd, -1), lo, hi)
    r = least_squares(lambda t: log_loss(t, Xz, form) - lnL, x0, bounds=(lo, hi), loss="huber", f_scale=delta,
                      method="trf", x_scale="jac", ftol=1e-12, xtol=1e-12, gtol=1e-12,
                      jac=lambda t: log_loss_jacobian(t, Xz, form)[1])
    return _shift(r.x, form, cn, cd, +1)


def _fit(X, lnL, form, per_role, delta, screen) -> np.ndarray:
    """The best optimum (:func:`_refit`) from the grid's best :data:`STARTS` points, judged on
    ``screen`` = (design, mean log L) of the role cells."""
    Xz, cn, cd = _centred(X)
    Xs = {**screen[0], "lna": screen[0]["lna"] - cn, "lnu": screen[0]["lnu"] - cd}
    g = _grid(form, per_role)
    starts = g[np.argsort(huber(delta, log_loss(g, Xs, form) - screen[1]).sum(axis=-1), kind="stable")[:STARTS]]
    best, best_f = None, math.inf
    for x0 in starts:
        x = _shift(_refit(X, lnL, form, per_role, delta, _shift(x0, form, cn, cd, +1)), form, cn, cd, -1)
        f = _huber(x, Xz, lnL, form, delta)
        if f < best_f:
            best, best_f = x, f
    return _shift(best, form, cn, cd, +1)


def _not_identified(theta, Xc, form, per_role, n_sizes, n_budgets) -> tuple[dict, dict]:
    """({name: reason} for the parameters the role cells ``Xc`` do not pin down, {name: the bound's
    value} for those whose only reason is that the fit sits on that bound)."""
    names, fields = param_names(form, per_role), _fields(form, per_role)
    J = log_loss_jacobian(theta, Xc, form)[1]
    out, bound = {}, {}
    for j, k in enumerate(names):
        others = np.delete(J, j, axis=1)
        coef, *_ = np.linalg.lstsq(others, J[:, j], rcond=None)
        if np.sqrt(np.mean((J[:, j] - others @ coef) ** 2)) < IDENTIFIED_TOL:
            out[k] = "the measured points do not pin it down: others can compensate for it"
    rstar = [k for k in names if k.startswith("R*")]
    for i, k in enumerate(rstar):
        rows = Xc["role"] == i if per_role else slice(None)
        if not (Xc["R"][rows] > 0).any():
            out[k] = (f"no {ROLES[i]} cell " if per_role else "no cell ") + "repeats data (R = 0 everywhere)"
    joint = form_of(form) is not Chinchilla
    # one family's law (chinchilla) sees its N and D at n_sizes and n_budgets values: a power law with
    # its floor needs three of each (two fix one contrast, which the scale and the exponent share);
    # the joint law's three roles put every size at three values of N
    mixes = [k for k, f in zip(names, fields) if f in ("lam", "lam1", "log_m")]
    need = 2 if joint else 3
    if n_sizes < need:
        ratio = math.exp(np.ptp(Xc["lna"] + Xc["span"]))
        why = (f"the grid has one model size (the roles' N span a factor of {ratio:.2f}: E, A, alpha and the MoE's "
               f"effective N trade off)" if joint else "the grid has one model size" if n_sizes == 1 else
               f"the grid has {n_sizes} model sizes: A and alpha trade off (a power law with its floor needs three)")
        out.update({k: why for k in ("E", "A", "alpha", *mixes)})
    if n_budgets < need and "beta" in names:
        out.update({k: "the grid has one token budget" if n_budgets == 1 else
                    f"the grid has {n_budgets} token budgets: B and beta trade off (a power law with its floor needs "
                    f"three)" for k in ("E", "B", "beta", *rstar)})
    lo, hi = bounds(form, per_role)
    to_lo, to_hi = np.abs(np.asarray(theta) - lo), np.abs(np.asarray(theta) - hi)
    for j, k in enumerate(names):  # last: any other reason comes first
        if np.isfinite(lo[j]) and k not in out and min(to_lo[j], to_hi[j]) < 1e-6:
            nat = (math.exp(lo[j]), math.exp(hi[j])) if fields[j].startswith("log_") else (lo[j], hi[j])
            out[k] = f"the fit sits on the bound [{nat[0]:g}, {nat[1]:g}]"
            bound[k] = nat[0] if to_lo[j] < to_hi[j] else nat[1]
    return out, bound


def _cell_means(df) -> tuple[dict, np.ndarray]:
    """(design, mean log L) of each role cell, in ``cell`` order."""
    first = df.groupby("cell", sort=True).head(1)
    return design(first), np.log(df["value"]).groupby(df["cell"]).mean().to_numpy()


@dataclass(frozen=True)
class JointLaw:
    """A fitted :func:`fit_law`: ``coefs`` {name: Coef} with the seed-bootstrap interval,
    ``cell_ci`` {name: (low, high, note)} the cell bootstrap's, ``seed`` the fit's vector with its
    seed replicates, the measured ranges and counts; ``on_bound`` {name: the bound} for the
    parameters not identified only because the fit sits on a bound."""

    form: str
    per_role_rstar: bool
    names: tuple
    coefs: dict
    cell_ci: dict
    seed: Bootstrap
    active_range: tuple
    tokens_range: tuple
    largest_moe_active: float
    n_sizes: int
    n_cells: int
    n_obs: int
    level: float
    on_bound: dict

    @property
    def theta(self) -> np.ndarray:
        return self.seed.point

    @property
    def mix(self) -> str:
        """The MoE's parameter: "lambda" or "m"."""
        return "m" if "log_m" in form_of(self.form)._fields else "lambda"

    def table(self) -> pd.DataFrame:
        """One row per parameter: estimate, ci_low, ci_high (seeds resampled), cell_ci_low,
        cell_ci_high (map cells resampled within each size), identified, verdict, reason, cell_note."""
        t = coef_table([self.coefs[k] for k in self.names])
        for i, col in enumerate(("cell_ci_low", "cell_ci_high", "cell_note")):
            t[col] = [self.cell_ci[k][i] for k in self.names]
        return t[["estimate", "ci_low", "ci_high", "cell_ci_low", "cell_ci_high", "identified", "verdict", "reason",
                  "cell_note"]]

    def not_identified(self) -> tuple:
        """The names of the parameters the map does not identify."""
        return tuple(k for k in self.names if not self.coefs[k].identified)

    def at(self, role, active, total, tokens, unique) -> Bootstrap:
        """The fitted loss at each point with its seed-bootstrap replicates."""
        cols = [np.atleast_1d(np.asarray(x, dtype=float)) for x in (active, total, tokens, unique)]
        n = max(len(c) for c in cols)
        roles = np.broadcast_to(np.atleast_1d(np.asarray(role, dtype=object)), (n,))
        X = design(pd.DataFrame({"role": roles, **dict(zip(("active", "total", "tokens", "unique"),
                                                            (np.broadcast_to(c, (n,)) for c in cols)))}))
        return self.seed.map(lambda t: np.exp(log_loss(t, X, self.form)))

    def predict_draws(self, params, tokens) -> tuple[np.ndarray, np.ndarray]:
        """(one family's fitted loss at N = ``params``, D = ``tokens``: "chinchilla", its replicates)."""
        b = self.at(ROLES[0], params, params, tokens, tokens)
        return b.point, b.draws

    def extrapolated(self, active, tokens) -> np.ndarray:
        """Whether each point's N_active or D lies outside the measured ones."""
        return outside(active, *self.active_range) | outside(tokens, *self.tokens_range)


def _cell_draws(df, X, lnL, theta, form, per_role, delta, n_boot, rng):
    """(n_boot x P refits on map cells resampled within each size, NaN where a replicate leaves the
    parameter not identified; a note when there is no cell interval at all)."""
    P, names = len(theta), param_names(form, per_role)
    by_size = [np.unique(g) for _, g in df.groupby("size")["map_cell"]]
    if n_boot == 0:
        return np.full((0, P), math.nan), "no cell interval (not computed)"
    if max(len(c) for c in by_size) < 2:
        return np.full((n_boot, P), math.nan), "no cell interval: every size has one map cell"
    rows_of = df.groupby("map_cell").indices
    cell_of = df.groupby("cell")["map_cell"].first().to_numpy()
    Xc, _ = _cell_means(df)
    out = np.empty((n_boot, P))
    for i in range(n_boot):
        pick = np.concatenate([rng.choice(c, len(c)) for c in by_size])
        idx = np.concatenate([rows_of[c] for c in pick])
        out[i] = _refit(take(X, idx), lnL[idx], form, per_role, delta, theta)
        keep = np.isin(cell_of, pick)
        sub = df[df["map_cell"].isin(pick)]
        bad, _ = _not_identified(out[i], take(Xc, keep), form, per_role, sub["size"].nunique(),
                                 len(sub.groupby(["tokens", "unique"])))
        out[i, [names.index(k) for k in bad]] = math.nan
    return out, ""


def fit_law(runs: pd.DataFrame, form: str = "lambda", per_role_rstar: bool = False, n_boot: int = 200,
            n_boot_cell: int | None = None, level: float = 0.95, seed: int = 0, huber_delta: float = HUBER_DELTA,
            start=None, who: str = "joint law", cells: str = "cells (one role at one map point)") -> JointLaw:
    """:class:`JointLaw` of the map's runs (:data:`COLUMNS`, one per run; ``value``: the final loss
    in bits per byte) with ``n_boot`` seed and ``n_boot_cell`` (default ``n_boot``) cell replicates.
    ``start``: a vector to optimise from instead of the grid; ``who``, ``cells``: the errors' words."""
    names = param_names(form, per_role_rstar)
    df = runs_frame(runs, who)
    X, lnL = design(df), np.log(df["value"].to_numpy())
    Xc, yc = _cell_means(df)
    theta = (_fit(X, lnL, form, per_role_rstar, huber_delta, (Xc, yc)) if start is None else
             _refit(X, lnL, form, per_role_rstar, huber_delta, np.asarray(start, float)))
    n_sizes, n_budgets = df["size"].nunique(), len(df.groupby(["tokens", "unique"]))
    bad, bound = _not_identified(theta, Xc, form, per_role_rstar, n_sizes, n_budgets)
    rng = np.random.default_rng(seed)
    lonely = no_interval(df, cells) or ("" if n_boot else "no interval (n_boot=0)")
    P = len(theta)
    reps = None if lonely else bootstrap_values(df["value"].to_numpy(), df["cell"].to_numpy(), n_boot, rng)
    if reps is not None and (reps <= 0).any():  # no log of a replicate: the fit stands, its intervals do not
        lonely, reps = (f"no interval: {int((reps <= 0).any(axis=1).sum())} of {n_boot} bootstrap replicates hold a "
                        f"loss <= 0 (a cell's seeds spread more than their mean: a run far off, see its residual)"), None
    draws = (np.full((n_boot, P), math.nan) if reps is None else
             np.array([_refit(X, np.log(r), form, per_role_rstar, huber_delta, theta) for r in reps]).reshape(-1, P))
    cells_, note = _cell_draws(df, X, lnL, theta, form, per_role_rstar, huber_delta,
                               n_boot if n_boot_cell is None else n_boot_cell, rng)
    est = natural(theta, form)
    (lo, hi), (clo, chi) = (Bootstrap(est, natural(d, form), level).interval() for d in (draws, cells_))
    share = np.isnan(cells_).sum(axis=0) / max(len(cells_), 1)
    coefs, cell_ci = {}, {}
    for j, k in enumerate(names):
        if k in bad:
            coefs[k] = Coef(k, math.nan, math.nan, math.nan, False, bad[k])
            cell_ci[k] = (math.nan, math.nan, "")
            continue
        coefs[k] = Coef(k, float(est[j]), float(lo[j]), float(hi[j]), reason=lonely)
        why = note or ("" if share[j] <= CELL_NAN_SHARE else
                       f"no cell interval: {int(round(share[j] * len(cells_)))} of {len(cells_)} cell resamples "
                       f"leave it not identified")
        cell_ci[k] = (math.nan, math.nan, why) if why else (float(clo[j]), float(chi[j]), "")
    moe = df[df["role"] == "moe"]
    return JointLaw(form, per_role_rstar, names, coefs, cell_ci, Bootstrap(theta, draws, level),
                    (float(df["active"].min()), float(df["active"].max())),
                    (float(df["tokens"].min()), float(df["tokens"].max())),
                    float((moe if len(moe) else df)["active"].max()), n_sizes, int(df["map_cell"].nunique()), len(df),
                    level, {k: float(bound[k]) for k in names if k in bound})


def role_runs(per_seed: pd.DataFrame, value: str = "value") -> pd.DataFrame:
    """One family's per-seed losses (``params``: N, ``tokens``: D, ``seed``, ``value``) as the law's
    runs (:data:`COLUMNS`), one family of the "chinchilla" form: every run a ``dense_active``."""
    df = cell_frame(per_seed, ROLE_KEYS, value, "role law")
    return pd.DataFrame({"role": ROLES[0], "size": df["params"], "seed": df["seed"] if "seed" in df else df.index,
                         "active": df["params"], "total": df["params"], "tokens": df["tokens"],
                         "unique": df["tokens"], "value": df[value]})


#: what :func:`role_law` and its checks say of their fits: a map point is a cell (one size, one budget)
ROLE_FIT = {"who": "role law", "cells": "map points"}


def role_law(per_seed: pd.DataFrame, value: str = "value", n_boot: int = 200, level: float = 0.95, seed: int = 0,
             huber_delta: float = HUBER_DELTA, start=None) -> JointLaw:
    """The "chinchilla" form's :class:`JointLaw` of one family's per-seed losses (:func:`role_runs`)."""
    return fit_law(role_runs(per_seed, value), "chinchilla", n_boot=n_boot, n_boot_cell=0, level=level, seed=seed,
                   huber_delta=huber_delta, start=start, **ROLE_FIT)

__all__ = ["COLUMNS", "MAP_KEYS", "ROLE_KEYS", "HUBER_DELTA", "STARTS", "IDENTIFIED_TOL", "CELL_NAN_SHARE",
           "runs_frame", "per_role_start", "JointLaw", "fit_law", "role_runs", "ROLE_FIT", "role_law"]
