"""Checkers of preset values: ``(value, where, ...) -> the typed value``, or one
:class:`~studylib.config.schema.ConfigError` line naming ``where`` (``study.ablation_epochs``) and
what was expected. The general ``study`` knobs (:mod:`studylib.config.study`) and every
comparison's knobs (:mod:`studylib.study.comparisons.knobs`) use them. Torch-free."""
from __future__ import annotations

import math
from typing import Any, Mapping

from studylib.config.schema import ConfigError, _coerce


def is_number(v: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def count(v: Any, where: str, what: str = "how many of the preset's seeds to use") -> int:
    """An integer >= 2 (a paired interval needs two seeds)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 2:
        raise ConfigError(f"{where}: expected {what} (an integer >= 2), got {v!r}")
    return v


def positive_int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{where}: must be a positive integer, got {v!r}")
    return v


def positive(v: Any, where: str, what: str) -> float:
    """A finite number > 0 as a float (``what`` says what it is, e.g. "a CI half-width in nats")."""
    if not is_number(v) or not v > 0:
        raise ConfigError(f"{where}: expected {what} (a number > 0), got {v!r}")
    return float(v)


def number(v: Any, where: str) -> float:
    """A number, or a string holding one (YAML reads ``3e-3`` as a string)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ConfigError(f"{where}: must be a number, got {v!r}")
    try:
        return float(v)
    except ValueError:
        raise ConfigError(f"{where}: must be a number, got {v!r}") from None


def epochs(v: Any, where: str) -> float:
    """A budget in epochs of the preset's schedule (> 0)."""
    if not is_number(v) or not v > 0:
        raise ConfigError(f"{where}: expected a number of epochs > 0, got {v!r}")
    return float(v)


def model_names(v: Any, where: str, models: Mapping) -> tuple[str, ...]:
    """A non-empty list of names of the preset's ``models``; a typo names its index."""
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(m, str) for m in v):
        raise ConfigError(f"{where}: expected a non-empty list of model names of the preset, got {v!r}")
    for i, m in enumerate(v):
        if m not in models:
            raise ConfigError(f"{where}[{i}]: no model named {m!r} in the preset; allowed: {sorted(models)}")
    return tuple(v)


def mapping(v: Any, where: str) -> dict:
    return dict(_coerce(v, dict, where))


def strings(v: Any, where: str) -> tuple[str, ...]:
    return _coerce(v, tuple[str, ...], where)


__all__ = ["count", "epochs", "is_number", "mapping", "model_names", "number", "positive", "positive_int",
           "strings"]
