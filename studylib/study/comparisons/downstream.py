"""Notebook 10, downstream evaluation: the headline trio at the preset's budget, the first
``study.downstream_seeds`` seeds (each run is exported and evaluated: ~8 s a run on the AVX2
machine)."""
from __future__ import annotations

from studylib.config import Preset
from studylib.study.comparisons.base import Comparison
from studylib.study.orchestration.plan import first_seeds, study_list
from studylib.study.orchestration.sweep import Grid


def grids(preset: Preset) -> list[Grid]:
    return [Grid(study_list(preset, "headline"), first_seeds(preset, "downstream_seeds"))]


COMPARISON = Comparison("downstream", "10_downstream", grids, section="downstream")
