"""One law for the three models (issue #40): ``L = E + A / N_eff^alpha + B / D_eff^beta`` over every
run of the token-budget map, with E, A, alpha, B and beta shared by the three roles.

* ``N_eff``: a dense model's parameters; the MoE's effective parameters (Clark et al. 2022): form
  "lambda", ``N_active^(1 - lambda) * N_total^lambda`` with lambda in [0, 1] (0: worth its active
  match, 1: worth its total match); form "multiplier", ``m * N_active`` with m in :data:`M_BOUNDS`.
* ``D_eff`` (Muennighoff et al. 2023): ``U_s = min(D, U)`` unique tokens seen, ``R = D / U_s - 1``
  repetitions, ``D_eff = U_s + U_s R* (1 - exp(-R / R*))``; R* shared by the roles or one per role.
* The fit is :mod:`.loss_law`'s objective (Hoffmann et al. approach 3): Huber (delta 1e-3) on log L
  over every seed of every cell, minimised from the best :data:`STARTS` points of a grid of starts,
  with ``scipy``'s trust-region reflective least squares (``loss="huber"``: the same objective,
  analytic Jacobian; on the 2-core machine, shared with training jobs, L-BFGS-B reached the same
  optimum, within 3e-7, 8-20 times slower: ``optimizer="L-BFGS-B"`` still runs it); parameters
  ``theta = (log E, log A, log B, alpha, beta, lambda | log m, log R*...)``.
* Two bootstraps, each refitting from the optimum: seeds resampled within each role's cell
  (:func:`~.fits.bootstrap_values`), and whole map cells (all three roles' runs of a
  (size, tokens, unique)) resampled with replacement within each size, so every replicate keeps
  every size. A cell replicate that leaves a parameter not identified gives that parameter no
  draw (a refit from the optimum would keep the start); beyond 5% of them, no cell interval.
* A parameter the map does not pin down is "not identified" with the reason (the Jacobian test of
  :mod:`.loss_law`, a bound, one size, one budget, no repeated data), never a number. One whose only
  reason is a bound (``JointLaw.on_bound``) is the constrained fit's value: the data push it past
  the bound, so it has no interval of its own, but the law's predictions with it held there are
  the law's (:mod:`.law_checks` predicts with it and says so).

Checks of the law (form choice, held-out sizes and budgets, the paper's point) and the MoE's
position between its dense matches are :mod:`.law_checks`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, minimize
from scipy.special import huber

from studylib.study.comparisons.token_budget.fits import (Coef, bootstrap_values, cell_frame, coef_table,
                                                          no_interval, percentile_ci)
from studylib.study.comparisons.token_budget.knobs import ROLES
from studylib.study.comparisons.token_budget.loss_law import EXPONENT_BOUNDS, HUBER_DELTA, IDENTIFIED_TOL, logsumexp

FORMS = ("lambda", "multiplier")
COLUMNS = ("role", "size", "seed", "active", "total", "tokens", "unique", "value")
#: a map cell: one trio trained on one budget drawn from one number of unique tokens
MAP_KEYS = ("size", "tokens", "unique")
LAMBDA_BOUNDS, M_BOUNDS, RSTAR_BOUNDS = (0.0, 1.0), (0.1, 100.0), (0.1, 1000.0)
#: grid points optimised per fit (on synthetic maps of the grid's shape all four reached one optimum)
STARTS = 4
#: cell replicates allowed to leave a parameter not identified before it loses its cell interval
CELL_NAN_SHARE = 0.05

#: the grid of starts: log E, log A and log B at the rows' mean ln N and ln U (see :func:`_fit`),
#: alpha, beta, lambda or log m, log R*
_AXES = (np.array([-1.0, -0.5, 0.0, 0.5]), np.array([-3.0, -2.0, -1.0, 0.0]), np.array([-3.0, -2.0, -1.0, 0.0]),
         np.array([0.15, 0.4, 0.8, 1.5]), np.array([0.15, 0.4, 0.8, 1.5]), None, np.log([1.0, 5.0, 25.0]))
_MIX_STARTS = {"lambda": np.array([0.2, 0.5, 0.8]), "multiplier": np.log([0.7, 1.2, 2.0])}


def param_names(form: str, per_role_rstar: bool) -> tuple:
    """The law's parameters in ``theta``'s order: E, A, B, alpha, beta, lambda or m, R* (or R*_<role>)."""
    if form not in FORMS:
        raise ValueError(f"joint law: form must be one of {FORMS}, not {form!r}")
    return ("E", "A", "B", "alpha", "beta", "lambda" if form == "lambda" else "m",
            *((f"R*_{r}" for r in ROLES) if per_role_rstar else ("R*",)))


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


def _design(df: pd.DataFrame) -> dict:
    lna, lnt = np.log(df["active"].to_numpy(float)), np.log(df["total"].to_numpy(float))
    moe = (df["role"] == "moe").to_numpy(float)
    d = df["tokens"].to_numpy(float)
    us = np.minimum(d, df["unique"].to_numpy(float))
    return {"lna": lna, "span": moe * (lnt - lna), "moe": moe, "lnu": np.log(us), "R": np.maximum(d / us - 1, 0.0),
            "role": np.array([ROLES.index(r) for r in df["role"]], dtype=np.int64)}


def _take(X: dict, idx) -> dict:
    return {k: v[idx] for k, v in X.items()}


def _parts(theta, X, form, per_role):
    """(ln N_eff, ln D_eff, d ln N_eff / d mix, d ln D_eff / d log R*) per row (theta: (..., P))."""
    mix = theta[..., 5, None]
    dn = X["span"] if form == "lambda" else X["moe"]
    rho = theta[..., 6:][..., X["role"]] if per_role else theta[..., 6, None]
    rs = np.exp(rho)
    x = X["R"] / rs
    q = -rs * np.expm1(-x)
    return X["lna"] + mix * dn, X["lnu"] + np.log1p(q), dn, rs * (-np.expm1(-x) - x * np.exp(-x)) / (1 + q)


def _log_loss(theta, X, form, per_role) -> np.ndarray:
    """log L_hat per row, broadcast over theta's leading axes."""
    lnN, lnD, _, _ = _parts(theta, X, form, per_role)
    a, b = theta[..., 1, None] - theta[..., 3, None] * lnN, theta[..., 2, None] - theta[..., 4, None] * lnD
    return logsumexp(np.stack([a, b, np.broadcast_to(theta[..., 0, None], a.shape)], axis=-1), axis=-1)


def _model(theta, X, form, per_role):
    """(log L_hat per row, its Jacobian d log L_hat / d theta: rows x P) at one theta."""
    lnN, lnD, dn, dd = _parts(theta, X, form, per_role)
    t = np.stack([theta[1] - theta[3] * lnN, theta[2] - theta[4] * lnD, np.full_like(lnN, theta[0])], axis=1)
    lse = logsumexp(t, axis=1)
    w = np.exp(t - lse[:, None])
    r_col = -theta[4] * dd * w[:, 1]
    rcols = [r_col * (X["role"] == k) for k in range(3)] if per_role else [r_col]
    J = np.stack([w[:, 2], w[:, 0], w[:, 1], -lnN * w[:, 0], -lnD * w[:, 1], -theta[3] * dn * w[:, 0], *rcols], axis=1)
    return lse, J


def _objective(theta, X, lnL, form, per_role, delta):
    lse, J = _model(theta, X, form, per_role)
    r = lse - lnL
    return float(huber(delta, r).sum()) / delta, (np.clip(r, -delta, delta) / delta) @ J


def _bounds(form, per_role) -> list:
    mix = LAMBDA_BOUNDS if form == "lambda" else tuple(math.log(b) for b in M_BOUNDS)
    return ([(None, None)] * 3 + [EXPONENT_BOUNDS] * 2 + [mix]
            + [tuple(math.log(b) for b in RSTAR_BOUNDS)] * (3 if per_role else 1))


def _grid(form, per_role) -> np.ndarray:
    axes = list(_AXES)
    axes[5] = _MIX_STARTS[form]
    g = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 7)
    return np.concatenate([g, np.repeat(g[:, 6:], 2, axis=1)], axis=1) if per_role else g


def _centred(X) -> tuple[dict, float, float]:
    """(``X`` with ln N and ln U taken from their means, those means): ``log A`` and ``log B`` are
    then the terms' logs at the data's centre, a far better conditioned problem (same optimum)."""
    cn, cd = float(X["lna"].mean()), float(X["lnu"].mean())
    return {**X, "lna": X["lna"] - cn, "lnu": X["lnu"] - cd}, cn, cd


def _shift(theta, cn, cd, sign) -> np.ndarray:
    out = np.array(theta, dtype=float, copy=True)
    out[..., 1:3] += sign * out[..., 3:5] * [cn, cd]
    return out


def _fit(X, lnL, form, per_role, delta, screen, optimizer="trf") -> np.ndarray:
    """The best optimum from the grid's best :data:`STARTS` points (judged on ``screen`` = (design,
    mean log L) of the role cells): :func:`_refit` from each ("trf"), or L-BFGS-B (analytic
    gradient, as :mod:`.loss_law`), which reaches the same optimum 8-20 times slower here."""
    Xz, cn, cd = _centred(X)
    Xs = {**screen[0], "lna": screen[0]["lna"] - cn, "lnu": screen[0]["lnu"] - cd}
    g = _grid(form, per_role)
    starts = g[np.argsort(huber(delta, _log_loss(g, Xs, form, per_role) - screen[1]).sum(axis=-1),
                          kind="stable")[:STARTS]]
    best, best_f = None, math.inf
    for x0 in starts:
        if optimizer == "trf":
            x = _shift(_refit(X, lnL, form, per_role, delta, _shift(x0, cn, cd, +1)), cn, cd, -1)
        else:
            x = minimize(_objective, x0, args=(Xz, lnL, form, per_role, delta), jac=True, method="L-BFGS-B",
                         bounds=_bounds(form, per_role), options={"ftol": 1e-14, "gtol": 1e-9, "maxiter": 2000}).x
        f = _objective(x, Xz, lnL, form, per_role, delta)[0]
        if f < best_f:
            best, best_f = x, f
    return _shift(best, cn, cd, +1)


def _refit(X, lnL, form, per_role, delta, theta) -> np.ndarray:
    """The optimum of the Huber loss from ``theta``: ``least_squares``' trust-region reflective
    method with ``loss="huber", f_scale=delta``, whose cost is ``sum(huber(delta, r))``."""
    Xz, cn, cd = _centred(X)
    lo, hi = np.array([[-np.inf if a is None else a, np.inf if b is None else b] for a, b in _bounds(form, per_role)]).T
    x0 = np.clip(_shift(theta, cn, cd, -1), lo, hi)
    r = least_squares(lambda t: _log_loss(t, Xz, form, per_role) - lnL, x0, bounds=(lo, hi), loss="huber",
                      f_scale=delta, method="trf", x_scale="jac", ftol=1e-12, xtol=1e-12, gtol=1e-12,
                      jac=lambda t: _model(t, Xz, form, per_role)[1])
    return _shift(r.x, cn, cd, +1)


def _not_identified(theta, Xc, form, per_role, n_sizes, n_budgets) -> tuple[dict, dict]:
    """({index in theta: reason} for the parameters the role cells ``Xc`` do not pin down, {index:
    the bound's value} for those whose only reason is that the fit sits on that bound)."""
    J = _model(theta, Xc, form, per_role)[1]
    out, bound = {}, {}
    for j in range(J.shape[1]):
        others = np.delete(J, j, axis=1)
        coef, *_ = np.linalg.lstsq(others, J[:, j], rcond=None)
        if np.sqrt(np.mean((J[:, j] - others @ coef) ** 2)) < IDENTIFIED_TOL:
            out[j] = "the measured points do not pin it down: others can compensate for it"
    for k in range(3 if per_role else 1):
        rows = Xc["role"] == k if per_role else slice(None)
        if not (Xc["R"][rows] > 0).any():
            out[6 + k] = (f"no {ROLES[k]} cell " if per_role else "no cell ") + "repeats data (R = 0 everywhere)"
    if n_sizes < 2:
        ratio = math.exp(np.ptp(Xc["lna"] + Xc["span"]))
        out.update({j: f"the grid has one model size (the roles' N span a factor of {ratio:.2f}: E, A, alpha and "
                       f"the MoE's effective N trade off)" for j in (0, 1, 3, 5)})
    if n_budgets < 2:
        out.update({j: "the grid has one token budget" for j in (0, 2, 4, *range(6, J.shape[1]))})
    for j, (lo, hi) in enumerate(_bounds(form, per_role)):  # last: any other reason comes first
        if j >= 3 and j not in out and min(abs(theta[j] - lo), abs(theta[j] - hi)) < 1e-6:
            nat = (lo, hi) if j in (3, 4) or (j == 5 and form == "lambda") else (math.exp(lo), math.exp(hi))
            out[j] = f"the fit sits on the bound [{nat[0]:g}, {nat[1]:g}]"
            bound[j] = nat[0] if abs(theta[j] - lo) < abs(theta[j] - hi) else nat[1]
    return out, bound


def _natural(theta, form) -> np.ndarray:
    """(E, A, B, alpha, beta, lambda | m, R*...) from ``theta``, along the last axis."""
    out = np.array(theta, dtype=float, copy=True)
    logs = [0, 1, 2, *([5] if form == "multiplier" else []), *range(6, out.shape[-1])]
    out[..., logs] = np.exp(out[..., logs])
    return out


def _cell_means(df) -> tuple[dict, np.ndarray]:
    """(design, mean log L) of each role cell, in ``cell`` order."""
    first = df.groupby("cell", sort=True).head(1)
    return _design(first), np.log(df["value"]).groupby(df["cell"]).mean().to_numpy()


@dataclass(frozen=True)
class JointLaw:
    """A fitted :func:`fit_law`: ``coefs`` {name: Coef} with the seed-bootstrap interval,
    ``cell_ci`` {name: (low, high, note)} the cell bootstrap's, ``theta`` with its replicates
    ``draws_seed`` and ``draws_cell`` (fit parameterisation, n x P; NaN where a replicate has none),
    the measured ranges, the largest MoE's active parameters and counts; ``on_bound`` {name: value}
    for the parameters not identified only because the fit sits on a bound (that value)."""

    form: str
    per_role_rstar: bool
    names: tuple
    coefs: dict
    cell_ci: dict
    theta: np.ndarray
    draws_seed: np.ndarray
    draws_cell: np.ndarray
    active_range: tuple
    tokens_range: tuple
    passes_range: tuple
    largest_moe_active: float
    n_sizes: int
    n_cells: int
    n_obs: int
    level: float
    on_bound: dict

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

    def predict_draws(self, role, active, total, tokens, unique, draws: str = "seed") -> tuple[np.ndarray, np.ndarray]:
        """(the fitted loss at each point, its bootstrap replicates: n_boot x points; ``draws``:
        "seed" or "cell", which bootstrap; a cell replicate that left a parameter out gives NaN)."""
        cols = [np.atleast_1d(np.asarray(x, dtype=float)) for x in (active, total, tokens, unique)]
        n = max(len(c) for c in cols)
        roles = np.broadcast_to(np.atleast_1d(np.asarray(role, dtype=object)), (n,))
        X = _design(pd.DataFrame({"role": roles, **dict(zip(("active", "total", "tokens", "unique"),
                                                              (np.broadcast_to(c, (n,)) for c in cols)))}))
        return (np.exp(_log_loss(self.theta, X, self.form, self.per_role_rstar)),
                np.exp(_log_loss(self.draws_seed if draws == "seed" else self.draws_cell, X, self.form,
                                 self.per_role_rstar)).reshape(-1, n))

    def predict(self, role, active, total, tokens, unique) -> pd.DataFrame:
        """The fitted loss (bits per byte) with its seed-bootstrap interval at each point, and
        ``extrapolated`` (its N_active or D outside the measured ones)."""
        point, draws = self.predict_draws(role, active, total, tokens, unique)
        t = pd.DataFrame({k: np.broadcast_to(np.atleast_1d(np.asarray(v, dtype=object if k == "role" else float)),
                                             point.shape) for k, v in zip(COLUMNS[:1] + COLUMNS[3:7],
                                                                          (role, active, total, tokens, unique))})
        t["loss"], (t["ci_low"], t["ci_high"]) = point, percentile_ci(draws, self.level)
        (a0, a1), (d0, d1), tol = self.active_range, self.tokens_range, 1e-9
        t["extrapolated"] = ((t["active"] < a0 * (1 - tol)) | (t["active"] > a1 * (1 + tol))
                             | (t["tokens"] < d0 * (1 - tol)) | (t["tokens"] > d1 * (1 + tol)))
        return t


def _cell_draws(df, X, lnL, theta, form, per_role, delta, n_boot, rng):
    """(n_boot x P refits on map cells resampled within each size, NaN where a replicate leaves the
    parameter not identified; a note when there is no cell interval at all)."""
    P = len(theta)
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
        out[i] = _refit(_take(X, idx), lnL[idx], form, per_role, delta, theta)
        keep = np.isin(cell_of, pick)
        sub = df[df["map_cell"].isin(pick)]
        bad, _ = _not_identified(out[i], _take(Xc, keep), form, per_role, sub["size"].nunique(),
                                 len(sub.groupby(["tokens", "unique"])))
        out[i, list(bad)] = math.nan
    return out, ""


def _ci(draws: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~.fits.percentile_ci` per column, NaN (without numpy's warning) for a column of no draw."""
    lo, hi = np.full(draws.shape[1], math.nan), np.full(draws.shape[1], math.nan)
    some = ~np.isnan(draws).all(axis=0)
    if some.any():
        lo[some], hi[some] = percentile_ci(draws[:, some], level)
    return lo, hi


def fit_law(runs: pd.DataFrame, form: str = "lambda", per_role_rstar: bool = False, n_boot: int = 200,
            n_boot_cell: int | None = None, level: float = 0.95, seed: int = 0, huber_delta: float = HUBER_DELTA,
            start=None, optimizer: str = "trf") -> JointLaw:
    """:class:`JointLaw` of the map's runs (:data:`COLUMNS`, one row per run; ``value``: the final
    validation loss in bits per byte). ``n_boot`` seed replicates and ``n_boot_cell`` (default
    ``n_boot``) cell replicates, ``numpy``'s generator ``seed``. ``start``: a ``theta`` to
    optimise from instead of the grid (a refit of nearly the same data); ``optimizer`` from the
    grid's starts: "trf" or "L-BFGS-B" (see :func:`_fit`)."""
    names = param_names(form, per_role_rstar)
    df = runs_frame(runs)
    X, lnL = _design(df), np.log(df["value"].to_numpy())
    Xc, yc = _cell_means(df)
    theta = (_fit(X, lnL, form, per_role_rstar, huber_delta, (Xc, yc), optimizer) if start is None else
             _refit(X, lnL, form, per_role_rstar, huber_delta, np.asarray(start, float)))
    n_sizes, n_budgets = df["size"].nunique(), len(df.groupby(["tokens", "unique"]))
    bad, bound = _not_identified(theta, Xc, form, per_role_rstar, n_sizes, n_budgets)
    rng = np.random.default_rng(seed)
    lonely = no_interval(df, "cells (one role at one map point)") or ("" if n_boot else "no interval (n_boot=0)")
    P = len(theta)
    if lonely:
        draws = np.full((n_boot, P), math.nan)
    else:
        reps = bootstrap_values(df["value"].to_numpy(), df["cell"].to_numpy(), n_boot, rng)
        if (reps <= 0).any():
            raise ValueError("joint law: a bootstrap replicate of a loss is not positive (noise larger than the loss)")
        draws = np.array([_refit(X, np.log(r), form, per_role_rstar, huber_delta, theta) for r in reps]).reshape(-1, P)
    cells, note = _cell_draws(df, X, lnL, theta, form, per_role_rstar, huber_delta,
                              n_boot if n_boot_cell is None else n_boot_cell, rng)
    est, (lo, hi) = _natural(theta, form), _ci(_natural(draws, form), level)
    (clo, chi), share = _ci(_natural(cells, form), level), np.isnan(cells).sum(axis=0) / max(len(cells), 1)
    coefs, cell_ci = {}, {}
    for j, k in enumerate(names):
        if j in bad:
            coefs[k] = Coef(k, math.nan, math.nan, math.nan, False, bad[j])
            cell_ci[k] = (math.nan, math.nan, "")
            continue
        coefs[k] = Coef(k, float(est[j]), float(lo[j]), float(hi[j]), reason=lonely)
        why = note or ("" if share[j] <= CELL_NAN_SHARE else
                       f"no cell interval: {int(round(share[j] * len(cells)))} of {len(cells)} cell resamples "
                       f"leave it not identified")
        cell_ci[k] = (math.nan, math.nan, why) if why else (float(clo[j]), float(chi[j]), "")
    moe = df[df["role"] == "moe"]
    return JointLaw(form, per_role_rstar, names, coefs, cell_ci, theta, draws, cells,
                    (float(df["active"].min()), float(df["active"].max())),
                    (float(df["tokens"].min()), float(df["tokens"].max())),
                    (float(df["passes"].min()), float(df["passes"].max())),
                    float((moe if len(moe) else df)["active"].max()), n_sizes, int(df["map_cell"].nunique()), len(df),
                    level, {names[j]: float(v) for j, v in sorted(bound.items())})


__all__ = ["FORMS", "COLUMNS", "MAP_KEYS", "LAMBDA_BOUNDS", "M_BOUNDS", "RSTAR_BOUNDS", "param_names",
           "runs_frame", "JointLaw", "fit_law"]
