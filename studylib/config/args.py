"""Argument types for the command line (argparse ``type=`` callables) and the seed range.

Each type parses one string and raises :class:`argparse.ArgumentTypeError` with what was
expected, so argparse names the option: ``error: argument --top-p: expected a probability in
(0, 1], got '0'``. Torch-free.
"""
from __future__ import annotations

import argparse
import math

SEED_MAX = 2**32 - 1  # numpy's legacy RandomState (and so every library's seeding) takes [0, 2**32)


def _parser(convert, ok, what: str):
    """An argparse type: ``convert(text)`` (int or float; floats must be finite), accepted when
    ``ok(value)``, else an ArgumentTypeError saying ``expected <what>``."""
    def parse(text: str):
        try:
            v = convert(text)
        except (TypeError, ValueError):
            v = None
        if v is None or (isinstance(v, float) and not math.isfinite(v)) or not ok(v):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v

    parse.__name__ = what  # argparse shows a type's name when it fails without a message
    return parse


positive_int = _parser(int, lambda v: v >= 1, "a positive integer")
non_negative_int = _parser(int, lambda v: v >= 0, "a non-negative integer")
seed = _parser(int, lambda v: 0 <= v <= SEED_MAX, f"a seed: an integer in [0, {SEED_MAX}]")
positive_float = _parser(float, lambda v: v > 0, "a finite number > 0")
non_negative_float = _parser(float, lambda v: v >= 0, "a finite number >= 0")
probability = _parser(float, lambda v: 0 < v <= 1, "a probability in (0, 1]")
dropout = _parser(float, lambda v: 0 <= v < 1, "a dropout rate in [0, 1)")


def seed_error(value, where: str) -> str | None:
    """Why ``value`` is not a usable seed (a message naming ``where``), or None when it is."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        return f"{where}: expected an integer seed in [0, {SEED_MAX}], got {value!r}"
    return None
