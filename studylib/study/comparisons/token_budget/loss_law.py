"""A loss law per model family (issue #31): ``L(N, D) = E + A / N^alpha + B / D^beta`` (Hoffmann et
al. 2022, approach 3) over the token-budget map's per-seed losses, with bootstrap intervals.

The fit follows approach 3: parameters ``theta = (e, a, b, alpha, beta)`` with ``E = exp(e)``,
``A = exp(a)``, ``B = exp(b)``; ``log L_hat = logsumexp(a - alpha log N, b - beta log D, e)``; the Huber
loss (delta 1e-3) of ``log L_hat - log L`` summed over every seed of every cell, minimised with
``scipy``'s L-BFGS-B (analytic gradient, ``alpha, beta`` in [0, 4]) from Hoffmann et al.'s grid of
starting points (alpha, beta in {0, 0.5, ..., 2}, e in {-1, -0.5, ..., 1}, a, b in {0, 5, ..., 25}):
the grid is evaluated and the best :data:`STARTS` of it are optimised. The bootstrap resamples seeds
within each cell (:func:`studylib.study.comparisons.token_budget.fits.bootstrap_values`) and refits each replicate
from the full data's optimum (a replicate is a small perturbation of the data; a grid search per
replicate would cost :data:`STARTS` times as much); Besiroglu et al. 2024 show how a fit
without such intervals overstates what it knows.

A parameter the grid does not identify is reported as such (:class:`~studylib.study.comparisons.token_budget.fits.Coef`
with ``identified=False``), never as a number: at the fit, the change of the predictions at the
measured points with that parameter, once the others are free to compensate, is below
:data:`IDENTIFIED_TOL` (one model size: E, A and alpha trade off exactly), or the fit sits on the
bound of alpha or beta.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from scipy.special import huber

from studylib.study.comparisons.token_budget.fits import (Coef, bootstrap_values, cell_frame, coef_table, no_interval,
                                                          percentile_ci)

#: a per-model frame's map point: parameters (N) and training tokens (D)
LAW_KEYS = ("params", "tokens")
NAMES = ("E", "A", "B", "alpha", "beta")
HUBER_DELTA = 1e-3
EXPONENT_BOUNDS = (0.0, 4.0)
#: grid points optimised per fit (the best by objective of Hoffmann et al.'s grid)
STARTS = 8
#: rms change of log L at the measured points per unit of a parameter (e, a, b: a factor e; alpha,
#: beta: 1), others compensating, below which the parameter is not identified
IDENTIFIED_TOL = 1e-6

_GRID = np.array(list(itertools.product(np.arange(-1, 1.01, 0.5), np.arange(0, 26, 5), np.arange(0, 26, 5),
                                        np.arange(0, 2.01, 0.5), np.arange(0, 2.01, 0.5))))


def logsumexp(t: np.ndarray, axis: int = -1) -> np.ndarray:
    """``log(sum(exp(t)))`` along ``axis``, stably (scipy's costs ~1 ms a call in the optimiser's loop)."""
    m = t.max(axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.exp(t - m).sum(axis=axis))


def _terms(theta: np.ndarray, lnN: np.ndarray, lnD: np.ndarray) -> np.ndarray:
    """(..., points, 3): the log of A/N^alpha, B/D^beta and E (theta: (..., 5))."""
    e, a, b, al, be = (theta[..., i, None] for i in range(5))
    return np.stack([a - al * lnN, b - be * lnD, np.broadcast_to(e, (a - al * lnN).shape)], axis=-1)


def _objective(theta, lnN, lnD, lnL, delta):
    t = _terms(theta, lnN, lnD)
    lse = logsumexp(t, axis=-1)
    r = lse - lnL
    w = np.exp(t - lse[:, None])  # d lse / d term
    g = np.clip(r, -delta, delta) / delta  # the loss is scaled by 1/delta: gradients of order one
    grad = np.array([g @ w[:, 2], g @ w[:, 0], g @ w[:, 1], -(g * lnN) @ w[:, 0], -(g * lnD) @ w[:, 1]])
    return float(huber(delta, r).sum()) / delta, grad


def _fit(lnN, lnD, lnL, delta, starts=None) -> np.ndarray:
    """The best L-BFGS-B optimum from ``starts`` (default: the grid's best :data:`STARTS` points)."""
    if starts is None:
        screen = huber(delta, logsumexp(_terms(_GRID, lnN, lnD), axis=-1) - lnL).sum(axis=-1)
        starts = _GRID[np.argsort(screen, kind="stable")[:STARTS]]
    bounds = [(None, None)] * 3 + [EXPONENT_BOUNDS] * 2
    best = None
    for x0 in starts:
        r = minimize(_objective, x0, args=(lnN, lnD, lnL, delta), jac=True, method="L-BFGS-B", bounds=bounds,
                     options={"ftol": 1e-14, "gtol": 1e-9, "maxiter": 2000})
        if best is None or r.fun < best.fun:
            best = r
    return best.x


def _jacobian(theta, lnN, lnD) -> np.ndarray:
    """d log L_hat / d theta at each point (points x 5)."""
    t = _terms(theta, lnN, lnD)
    w = np.exp(t - logsumexp(t, axis=-1)[:, None])
    return np.stack([w[:, 2], w[:, 0], w[:, 1], -lnN * w[:, 0], -lnD * w[:, 1]], axis=1)


def _not_identified(theta, lnN, lnD) -> dict:
    """{index in theta: reason} for the parameters the measured cells do not pin down."""
    J = _jacobian(theta, lnN, lnD)
    out = {}
    for j in range(5):
        others = np.delete(J, j, axis=1)
        coef, *_ = np.linalg.lstsq(others, J[:, j], rcond=None)
        if np.sqrt(np.mean((J[:, j] - others @ coef) ** 2)) < IDENTIFIED_TOL:
            out[j] = "the measured points do not pin it down: others can compensate for it"
    for j in (3, 4):
        if j not in out and min(abs(theta[j] - b) for b in EXPONENT_BOUNDS) < 1e-6:
            out[j] = f"the fit sits on the bound {EXPONENT_BOUNDS} of the exponent"
    if len(np.unique(lnN)) < 2:
        out.update({j: "the grid has one model size" for j in (0, 1, 3) if j in out})
    if len(np.unique(lnD)) < 2:
        out.update({j: "the grid has one number of tokens" for j in (0, 2, 4) if j in out})
    return out


def _natural(theta: np.ndarray) -> np.ndarray:
    """(E, A, B, alpha, beta) from (e, a, b, alpha, beta), along the last axis."""
    return np.concatenate([np.exp(theta[..., :3]), theta[..., 3:]], axis=-1)


@dataclass(frozen=True)
class LossLaw:
    """A fitted :func:`loss_law`: ``coefs`` {E, A, B, alpha, beta} (estimates and bootstrap CIs, or
    not identified), ``theta`` and its bootstrap replicates ``draws`` (fit parameterisation), the
    measured ranges, and how many cells and rows it saw."""

    coefs: dict
    theta: np.ndarray
    draws: np.ndarray
    params_range: tuple
    tokens_range: tuple
    n_cells: int
    n_obs: int
    level: float

    def table(self) -> pd.DataFrame:
        """:func:`~studylib.study.comparisons.token_budget.fits.coef_table` of E, A, B, alpha, beta."""
        return coef_table([self.coefs[k] for k in NAMES])

    def predict_draws(self, params, tokens) -> tuple[np.ndarray, np.ndarray]:
        """(the fitted loss at each point, its bootstrap replicates: n_boot x points)."""
        lnN, lnD = (np.log(np.atleast_1d(np.asarray(x, dtype=float))) for x in (params, tokens))
        point = np.exp(logsumexp(_terms(self.theta, lnN, lnD), axis=-1))
        return point, np.exp(logsumexp(_terms(self.draws, lnN, lnD), axis=-1))

    def extrapolated(self, params, tokens) -> np.ndarray:
        """Whether each point lies outside the measured sizes or token counts."""
        n, d = (np.atleast_1d(np.asarray(x, dtype=float)) for x in (params, tokens))
        (n0, n1), (d0, d1), tol = self.params_range, self.tokens_range, 1e-9
        return (n < n0 * (1 - tol)) | (n > n1 * (1 + tol)) | (d < d0 * (1 - tol)) | (d > d1 * (1 + tol))

    def predict(self, params, tokens) -> pd.DataFrame:
        """The fitted loss with its bootstrap interval at each point, and ``extrapolated``."""
        point, draws = self.predict_draws(params, tokens)
        lo, hi = percentile_ci(draws, self.level)
        return pd.DataFrame({"params": np.atleast_1d(params), "tokens": np.atleast_1d(tokens), "loss": point,
                             "ci_low": lo, "ci_high": hi, "extrapolated": self.extrapolated(params, tokens)})

    def words(self, label: str = "the loss law") -> str:
        """Each parameter with its interval, or "not identified" with the reason."""
        parts = []
        for k in NAMES:
            c = self.coefs[k]
            parts.append(f"{k} not identified ({c.reason})" if not c.identified else
                         f"{k} = {c.estimate:.4g}, {c.reason}" if not c.has_interval else
                         f"{k} = {c.estimate:.4g} [{c.ci_low:.4g}, {c.ci_high:.4g}]")
        (n0, n1), (d0, d1) = self.params_range, self.tokens_range
        return (f"{label}, L = E + A/N^alpha + B/D^beta over {self.n_cells} points "
                f"({n0:.3g}-{n1:.3g} params, {d0:.3g}-{d1:.3g} tokens; bootstrap CIs): " + "; ".join(parts) + ".")


def loss_law(per_seed: pd.DataFrame, value: str = "value", n_boot: int = 200, level: float = 0.95,
             seed: int = 0, huber_delta: float = HUBER_DELTA, start=None) -> LossLaw:
    """:class:`LossLaw` of one model family's per-seed losses: one row per seed and map point with
    ``params`` (N), ``tokens`` (D, the training tokens) and ``value`` (the loss, > 0). ``n_boot``
    bootstrap replicates with ``numpy``'s generator ``seed``. ``start``: a ``theta`` to optimise
    from instead of the grid's best :data:`STARTS` points (a refit of nearly the same data, such as
    a point left out, from the full fit's optimum: one optimisation instead of eight)."""
    df = cell_frame(per_seed, LAW_KEYS, value, "loss_law")
    if (df[value] <= 0).any():
        raise ValueError(f"loss_law: column {value!r} must be positive (a loss; the fit is on log L)")
    lnN, lnD, y = np.log(df["params"].to_numpy()), np.log(df["tokens"].to_numpy()), df[value].to_numpy()
    theta = _fit(lnN, lnD, np.log(y), huber_delta, starts=None if start is None else (np.asarray(start, float),))
    lonely = no_interval(df)
    if lonely:  # one seed somewhere: no replicates, every interval NaN
        draws = np.full((n_boot, 5), math.nan)
    else:
        reps = bootstrap_values(y, df["cell"].to_numpy(), n_boot, np.random.default_rng(seed))
        if (reps <= 0).any():
            raise ValueError(f"loss_law: a bootstrap replicate of {value!r} is not positive (noise larger than the loss)")
        draws = np.array([_fit(lnN, lnD, np.log(r), huber_delta, starts=(theta,)) for r in reps]).reshape(-1, 5)
    cells = df.groupby("cell")[list(LAW_KEYS)].first()
    bad = _not_identified(theta, np.log(cells["params"].to_numpy()), np.log(cells["tokens"].to_numpy()))
    est, (lo, hi) = _natural(theta), percentile_ci(_natural(draws), level)
    coefs = {k: (Coef(k, math.nan, math.nan, math.nan, False, bad[j]) if j in bad else  # NAMES: theta's order
                 Coef(k, float(est[j]), float(lo[j]), float(hi[j]), reason=lonely)) for j, k in enumerate(NAMES)}
    n, d = df["params"], df["tokens"]
    return LossLaw(coefs, theta, draws, (float(n.min()), float(n.max())), (float(d.min()), float(d.max())),
                   len(cells), len(df), level)


__all__ = ["LAW_KEYS", "NAMES", "HUBER_DELTA", "STARTS", "IDENTIFIED_TOL", "LossLaw", "loss_law"]
