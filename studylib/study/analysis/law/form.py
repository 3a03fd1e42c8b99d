"""The law's form: ``L = E + A / N_eff^alpha + B / D_eff^beta`` (Hoffmann et al. 2022), one
parameter type per form (its fields, reported ``NAMES`` and natural-unit ``BOUNDS``); :func:`unpack`
/ :func:`pack` are the one place that reads or writes the optimiser's vector.

* "chinchilla": one model family, N its active parameters, D its tokens (the per-role check).
* "lambda": the joint law of the three roles, the MoE's ``N_eff = N_active^(1 - lambda)
  N_total^lambda`` (Clark et al. 2022); "multiplier": ``N_eff = m N_active``.
* "lambda_size" (issue #47): ``lambda(N) = lambda_0 + lambda_1 log10(N_active / N_ref)`` kept in
  [0, 1], ``N_ref`` (:data:`N_REF_MAP`) the map's middle MoE size.
* "n_lambda", "n_lambda_size": ``L = E + A / N_eff^alpha`` alone, for runs that all saw the same
  tokens (Clark et al.'s; ``N_ref`` :data:`N_REF_CLARK`).

Repeated data (Muennighoff et al. 2023): ``U_s = min(D, U)``, ``R = D / U_s - 1``, ``D_eff = U_s +
U_s R* (1 - exp(-R / R*))``, R* shared by the roles or one per role. ``log_`` fields are fitted on
the log (E, A, B, m and R* stay positive).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from studylib.study.analysis.position import ROLES

FREE = (-math.inf, math.inf)
EXPONENT_BOUNDS = (0.0, 4.0)
LAMBDA_BOUNDS, M_BOUNDS, RSTAR_BOUNDS = (0.0, 1.0), (0.1, 100.0), (0.1, 1000.0)
#: lambda_1, the change of lambda per decade of N_active
LAMBDA1_BOUNDS = (-2.0, 2.0)
#: the size forms' N_ref: the map's MoE sizes run 59k-231k active parameters (geometric middle 117k)
N_REF_MAP = 1.2e5
#: Clark et al.'s fit sizes 16.5M, 27.3M, 57.4M active (geometric middle 29.6M)
N_REF_CLARK = 3e7


#: each field's reported name
_NAME = {"log_E": "E", "log_A": "A", "log_B": "B", "alpha": "alpha", "beta": "beta", "lam": "lambda",
         "lam1": "lambda_1", "log_m": "m", "log_rstar": "R*"}


def _form(name: str, doc: str, bounds: dict, n_ref: float | None = None) -> type:
    """A form's parameter type: a NamedTuple with one field per key of ``bounds`` (in order; the
    field's bounds in natural units), ``NAMES`` (the reported names) and ``N_REF`` (a size form's)."""
    cls = NamedTuple(name, [(f, np.ndarray) for f in bounds])
    cls.__doc__, cls.BOUNDS, cls.NAMES = doc, bounds, tuple(_NAME[f] for f in bounds)
    if n_ref is not None:
        cls.N_REF = n_ref
    return cls


_N_PART = {"log_E": FREE, "log_A": FREE, "alpha": EXPONENT_BOUNDS}
_FAMILY = {"log_E": FREE, "log_A": FREE, "log_B": FREE, "alpha": EXPONENT_BOUNDS, "beta": EXPONENT_BOUNDS}
Chinchilla = _form("Chinchilla", "One family's law: E, A, B (fitted as logs), alpha, beta.", _FAMILY)
LambdaLaw = _form("LambdaLaw", "The joint law, the MoE worth ``N_active^(1 - lambda) N_total^lambda``.",
                  {**_FAMILY, "lam": LAMBDA_BOUNDS, "log_rstar": RSTAR_BOUNDS})
MultiplierLaw = _form("MultiplierLaw", "The joint law, the MoE worth ``m N_active``.",
                      {**_FAMILY, "log_m": M_BOUNDS, "log_rstar": RSTAR_BOUNDS})
LambdaSizeLaw = _form("LambdaSizeLaw", "The joint law with ``lambda(N) = lambda_0 + lambda_1 log10(N_active / "
                      "N_REF)`` kept in [0, 1].",
                      {**_FAMILY, "lam": LAMBDA_BOUNDS, "lam1": LAMBDA1_BOUNDS, "log_rstar": RSTAR_BOUNDS}, N_REF_MAP)
NLambdaLaw = _form("NLambdaLaw", "The N part alone, ``L = E + A / N_eff^alpha``, with one lambda.",
                   {**_N_PART, "lam": LAMBDA_BOUNDS})
NLambdaSizeLaw = _form("NLambdaSizeLaw", "The N part alone with lambda(N).",
                       {**_N_PART, "lam": LAMBDA_BOUNDS, "lam1": LAMBDA1_BOUNDS}, N_REF_CLARK)

FORMS = {"chinchilla": Chinchilla, "lambda": LambdaLaw, "multiplier": MultiplierLaw, "lambda_size": LambdaSizeLaw,
         "n_lambda": NLambdaLaw, "n_lambda_size": NLambdaSizeLaw}
#: the joint law's forms (the MoE's worth)
JOINT_FORMS = ("lambda", "multiplier")
#: the joint law whose MoE worth may change with size, a candidate beside :data:`JOINT_FORMS`
SIZE_FORM = "lambda_size"
#: the N-only forms (every run saw the same tokens)
N_FORMS = ("n_lambda", "n_lambda_size")


def lambda_at(theta, form: str, n_active, clip: bool = True) -> np.ndarray:
    """The MoE's lambda at ``n_active`` (``(..., n)`` over theta's leading axes): lambda_0 +
    lambda_1 log10(N / N_ref) kept in [0, 1] for a size form (unless ``clip`` is False: the line
    itself), lambda for the others."""
    p = unpack(theta, form)
    lam = p.lam
    if "lam1" in p._fields:
        lam = lam + p.lam1 * (np.log10(np.asarray(n_active, float)) - math.log10(type(p).N_REF))
        lam = np.clip(lam, 0.0, 1.0) if clip else lam
    return np.broadcast_to(lam, np.broadcast_shapes(lam.shape, np.shape(np.atleast_1d(n_active))))


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
    rs = "log_rstar" in cls._fields
    fields = [theta[..., i, None] for i in range(len(cls._fields) - rs)]
    return cls(*fields, *([theta[..., len(fields):]] if rs else []))


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
            "role": np.array([ROLES.index(r) for r in df["role"]], dtype=np.int64), "log10a": lna / math.log(10)}


def take(X: dict, idx) -> dict:
    return {k: v[idx] for k, v in X.items()}


def _parts(p, X):
    """(ln N_eff, ln D_eff or None, {field: d ln N_eff / d field} for the MoE's worth, d ln D_eff / d
    log R* or None) per row."""
    if isinstance(p, Chinchilla):
        return X["lna"], X["lnu"], {}, None
    if "log_m" in p._fields:
        lnN, dmix = X["lna"] + p.log_m * X["moe"], {"log_m": X["moe"]}
    elif "lam1" in p._fields:
        rel = X["log10a"] - math.log10(type(p).N_REF)
        raw = p.lam + p.lam1 * rel
        inside = ((raw > 0) & (raw < 1)) * X["span"]
        lnN, dmix = X["lna"] + np.clip(raw, 0.0, 1.0) * X["span"], {"lam": inside, "lam1": inside * rel}
    else:
        lnN, dmix = X["lna"] + p.lam * X["span"], {"lam": X["span"]}
    if "log_rstar" not in p._fields:
        return lnN, None, dmix, None
    rho = p.log_rstar[..., X["role"]] if p.log_rstar.shape[-1] > 1 else p.log_rstar
    rs = np.exp(rho)
    x = X["R"] / rs
    q = -rs * np.expm1(-x)
    return lnN, X["lnu"] + np.log1p(q), dmix, rs * (-np.expm1(-x) - x * np.exp(-x)) / (1 + q)


def logsumexp(t: np.ndarray, axis: int = -1) -> np.ndarray:
    """``log(sum(exp(t)))`` along ``axis``, stably (scipy's costs ~1 ms a call in the optimiser's loop)."""
    m = t.max(axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.exp(t - m).sum(axis=axis))


def _terms(p, X) -> tuple:
    """(the law's terms log A - alpha ln N_eff[, log B - beta ln D_eff], log E stacked on the last
    axis, and :func:`_parts`)."""
    lnN, lnD, _, _ = parts = _parts(p, X)
    a = p.log_A - p.alpha * lnN
    terms = [a] + ([p.log_B - p.beta * lnD] if lnD is not None else []) + [np.broadcast_to(p.log_E, a.shape)]
    return np.stack(np.broadcast_arrays(*terms), axis=-1), parts


def log_loss(theta, X: dict, form: str) -> np.ndarray:
    """log L_hat per row, broadcast over theta's leading axes."""
    return logsumexp(_terms(unpack(theta, form), X)[0], axis=-1)


def log_loss_jacobian(theta, X: dict, form: str) -> tuple[np.ndarray, np.ndarray]:
    """(log L_hat per row, its Jacobian d log L_hat / d theta: rows x P) at one theta."""
    p = unpack(theta, form)
    t, (lnN, lnD, dmix, dd) = _terms(p, X)
    lse = logsumexp(t, axis=1)
    w = np.exp(t - lse[:, None])
    wa, we = w[:, 0], w[:, -1]
    col = {"log_E": we, "log_A": wa, "alpha": -lnN * wa}
    if lnD is not None:
        wb = w[:, 1]
        col.update(log_B=wb, beta=-lnD * wb)
    col.update({f: -p.alpha[0] * d * wa for f, d in dmix.items()})
    cols = [col[f] for f in p._fields if f != "log_rstar"]
    if "log_rstar" in p._fields:
        r_col = -p.beta[0] * dd * w[:, 1]
        cols += [r_col * (X["role"] == k) for k in range(3)] if p.log_rstar.shape[-1] > 1 else [r_col]
    return lse, np.stack(cols, axis=1)


__all__ = ["Chinchilla", "LambdaLaw", "MultiplierLaw", "LambdaSizeLaw", "NLambdaLaw", "NLambdaSizeLaw", "FORMS",
           "JOINT_FORMS", "SIZE_FORM", "N_FORMS", "N_REF_MAP", "N_REF_CLARK", "LAMBDA1_BOUNDS",
           "lambda_at", "EXPONENT_BOUNDS", "LAMBDA_BOUNDS",
           "M_BOUNDS", "RSTAR_BOUNDS", "param_names", "unpack", "pack", "bounds", "natural", "design", "take",
           "log_loss", "log_loss_jacobian", "logsumexp"]
