"""The law's form: ``L = E + A / N_eff^alpha + B / D_eff^beta`` (Hoffmann et al. 2022) with named
parameters, one type per form, and the one place (:func:`unpack` / :func:`pack`) that reads or
writes the optimiser's vector.

* "chinchilla": one model family, ``N_eff = N`` (its active parameters), ``D_eff = D`` (its
  training tokens): the per-role law, a check of the joint one.
* "lambda": the joint law of the three roles, the MoE's ``N_eff = N_active^(1 - lambda) *
  N_total^lambda`` (Clark et al. 2022; 0: worth its active match, 1: its total match).
* "multiplier": the MoE's ``N_eff = m * N_active``.

The joint forms see repeated data through Muennighoff et al. 2023: ``U_s = min(D, U)`` unique tokens
seen, ``R = D / U_s - 1`` repetitions, ``D_eff = U_s + U_s R* (1 - exp(-R / R*))``, with R* shared
by the roles or one per role (``log_rstar`` then holds three). A form's fields are its fit
parameterisation (``log_`` where the law is fitted on the log, which keeps E, A, B, m and R*
positive); ``BOUNDS`` gives each field's bounds in natural units, ``NAMES`` the reported names.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from studylib.study.comparisons.token_budget.knobs import ROLES

FREE = (-math.inf, math.inf)
EXPONENT_BOUNDS = (0.0, 4.0)
LAMBDA_BOUNDS, M_BOUNDS, RSTAR_BOUNDS = (0.0, 1.0), (0.1, 100.0), (0.1, 1000.0)


class Chinchilla(NamedTuple):
    """One family's law: E, A, B (fitted as logs), alpha, beta."""
    log_E: np.ndarray
    log_A: np.ndarray
    log_B: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    NAMES = ("E", "A", "B", "alpha", "beta")
    BOUNDS = {"log_E": FREE, "log_A": FREE, "log_B": FREE, "alpha": EXPONENT_BOUNDS, "beta": EXPONENT_BOUNDS}


class LambdaLaw(NamedTuple):
    """The joint law, the MoE worth ``N_active^(1 - lambda) N_total^lambda``."""
    log_E: np.ndarray
    log_A: np.ndarray
    log_B: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    lam: np.ndarray
    log_rstar: np.ndarray
    NAMES = ("E", "A", "B", "alpha", "beta", "lambda", "R*")
    BOUNDS = {**Chinchilla.BOUNDS, "lam": LAMBDA_BOUNDS, "log_rstar": RSTAR_BOUNDS}


class MultiplierLaw(NamedTuple):
    """The joint law, the MoE worth ``m N_active``."""
    log_E: np.ndarray
    log_A: np.ndarray
    log_B: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    log_m: np.ndarray
    log_rstar: np.ndarray
    NAMES = ("E", "A", "B", "alpha", "beta", "m", "R*")
    BOUNDS = {**Chinchilla.BOUNDS, "log_m": M_BOUNDS, "log_rstar": RSTAR_BOUNDS}


FORMS = {"chinchilla": Chinchilla, "lambda": LambdaLaw, "multiplier": MultiplierLaw}
#: the joint law's forms (the MoE's worth)
JOINT_FORMS = ("lambda", "multiplier")


def form_of(form: str):
    if form not in FORMS:
        raise ValueError(f"law: form must be one of {tuple(FORMS)}, not {form!r}")
    return FORMS[form]


def param_names(form: str, per_role_rstar: bool = False) -> tuple:
    """The reported names in the vector's order: E, A, B, alpha, beta[, lambda or m, R* or R*_<role>]."""
    names = form_of(form).NAMES
    return names[:-1] + tuple(f"R*_{r}" for r in ROLES) if per_role_rstar and "R*" in names else names


def unpack(theta, form: str):
    """The optimiser's vector (or a stack of them, or of Jacobian columns: ``(..., P)``) as the
    form's named parameters, each ``(..., 1)`` (``log_rstar``: ``(..., 1 or 3)``); the one place
    that indexes the vector (with :func:`pack`)."""
    theta = np.asarray(theta, dtype=float)
    cls = form_of(form)
    fields = [theta[..., i, None] for i in range(len(cls._fields) - (cls is not Chinchilla))]
    return cls(*fields, *([theta[..., len(fields):]] if cls is not Chinchilla else []))


def pack(p) -> np.ndarray:
    """The optimiser's vector from named parameters (:func:`unpack`'s inverse), along the last axis."""
    return np.concatenate([np.asarray(x, dtype=float) for x in p], axis=-1)


def bounds(form: str, per_role_rstar: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) of the vector, in the fit's parameterisation (logs where the field is one)."""
    cls = form_of(form)
    lo, hi = [], []
    for f in cls._fields:
        a, b = cls.BOUNDS[f]
        if f.startswith("log_") and (a, b) != FREE:
            a, b = math.log(a), math.log(b)
        k = 3 if f == "log_rstar" and per_role_rstar else 1
        lo, hi = lo + [a] * k, hi + [b] * k
    return np.array(lo), np.array(hi)


def natural(theta, form: str) -> np.ndarray:
    """The vector in natural units (exp of the ``log_`` fields), along the last axis."""
    p = unpack(theta, form)
    return pack(type(p)(*(np.exp(v) if f.startswith("log_") else v for f, v in zip(p._fields, p))))


def design(df: pd.DataFrame) -> dict:
    """What the form reads of each run (``role``, ``active``, ``total``, ``tokens``, ``unique``):
    ln N_active, the MoE's ln(N_total / N_active) (0 for a dense model), whether it is the MoE,
    ln U_s, R and the role's index."""
    lna, lnt = np.log(df["active"].to_numpy(float)), np.log(df["total"].to_numpy(float))
    moe = (df["role"] == "moe").to_numpy(float)
    d = df["tokens"].to_numpy(float)
    us = np.minimum(d, df["unique"].to_numpy(float))
    return {"lna": lna, "span": moe * (lnt - lna), "moe": moe, "lnu": np.log(us), "R": np.maximum(d / us - 1, 0.0),
            "role": np.array([ROLES.index(r) for r in df["role"]], dtype=np.int64)}


def take(X: dict, idx) -> dict:
    return {k: v[idx] for k, v in X.items()}


def _parts(p, X):
    """(ln N_eff, ln D_eff, d ln N_eff / d mix, d ln D_eff / d log R*) per row."""
    if isinstance(p, Chinchilla):
        return X["lna"], X["lnu"], None, None
    mix, dn = (p.lam, X["span"]) if isinstance(p, LambdaLaw) else (p.log_m, X["moe"])
    rho = p.log_rstar[..., X["role"]] if p.log_rstar.shape[-1] > 1 else p.log_rstar
    rs = np.exp(rho)
    x = X["R"] / rs
    q = -rs * np.expm1(-x)
    return X["lna"] + mix * dn, X["lnu"] + np.log1p(q), dn, rs * (-np.expm1(-x) - x * np.exp(-x)) / (1 + q)


def logsumexp(t: np.ndarray, axis: int = -1) -> np.ndarray:
    """``log(sum(exp(t)))`` along ``axis``, stably (scipy's costs ~1 ms a call in the optimiser's loop)."""
    m = t.max(axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.exp(t - m).sum(axis=axis))


def log_loss(theta, X: dict, form: str) -> np.ndarray:
    """log L_hat per row, broadcast over theta's leading axes."""
    p = unpack(theta, form)
    lnN, lnD, _, _ = _parts(p, X)
    a, b = p.log_A - p.alpha * lnN, p.log_B - p.beta * lnD
    return logsumexp(np.stack([a, b, np.broadcast_to(p.log_E, a.shape)], axis=-1), axis=-1)


def log_loss_jacobian(theta, X: dict, form: str) -> tuple[np.ndarray, np.ndarray]:
    """(log L_hat per row, its Jacobian d log L_hat / d theta: rows x P) at one theta."""
    p = unpack(theta, form)
    lnN, lnD, dn, dd = _parts(p, X)
    t = np.stack([p.log_A - p.alpha * lnN, p.log_B - p.beta * lnD, np.full_like(lnN, p.log_E[0])], axis=1)
    lse = logsumexp(t, axis=1)
    w = np.exp(t - lse[:, None])
    cols = [w[:, 2], w[:, 0], w[:, 1], -lnN * w[:, 0], -lnD * w[:, 1]]
    if not isinstance(p, Chinchilla):
        r_col = -p.beta[0] * dd * w[:, 1]
        per_role = p.log_rstar.shape[-1] > 1
        cols += [-p.alpha[0] * dn * w[:, 0], *([r_col * (X["role"] == k) for k in range(3)] if per_role else [r_col])]
    return lse, np.stack(cols, axis=1)


__all__ = ["Chinchilla", "LambdaLaw", "MultiplierLaw", "FORMS", "JOINT_FORMS", "EXPONENT_BOUNDS", "LAMBDA_BOUNDS",
           "M_BOUNDS", "RSTAR_BOUNDS", "param_names", "unpack", "pack", "bounds", "natural", "design", "take",
           "log_loss", "log_loss_jacobian", "logsumexp"]
