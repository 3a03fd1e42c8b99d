"""Notebook 10, downstream evaluation: the headline trio at the preset's budget, the first
``study.downstream_seeds`` seeds, each run exported and evaluated on the local lm-eval suite
(:mod:`.evaluate`: ~8 s a run on the AVX2 machine); its family table ``table10_downstream_gaps``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from studylib.study.comparisons.base import Comparison
from studylib.study.comparisons.downstream.evaluate import gap_sentences
from studylib.study.comparisons.knobs import SEEDS, Knobs, Study, knob
from studylib.study.orchestration.plan import Grid


@dataclass(frozen=True)
class DownstreamKnobs(Knobs):
    """How many of the preset's seeds (``downstream_seeds``; None: all)."""

    seeds: Optional[int] = knob("downstream_seeds", SEEDS)


def grids(study: Study, knobs: DownstreamKnobs) -> list[Grid]:
    return [Grid(list(study.headline), study.leading_seeds(knobs.seeds))]


COMPARISON = Comparison("downstream", "10_downstream", DownstreamKnobs, grids, tables=("table10_downstream_gaps",),
                        words=lambda table: [gap_sentences(table)])
