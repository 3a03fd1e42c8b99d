"""Notebook 05, throughput: the headline trio benchmarked (``study.bench``); it trains nothing."""
from __future__ import annotations

from dataclasses import dataclass

from studylib.study.comparisons.base import Comparison
from studylib.study.comparisons.knobs import MAPPING, Knobs, knob


@dataclass(frozen=True)
class ThroughputKnobs(Knobs):
    """The benchmark's knobs (``bench``: batch, context, rounds, dtype, ...)."""

    bench: dict = knob("bench", MAPPING, {})


COMPARISON = Comparison("throughput", "05_throughput", ThroughputKnobs)
