"""Notebook 07, iso-width: the pair of ``study.iso_width`` at ``study.iso_width_epochs``, the first
``study.comparison_seeds`` seeds."""
from __future__ import annotations

from studylib.config import Preset
from studylib.run.spec import budget_overrides
from studylib.study.comparisons.base import Comparison
from studylib.study.orchestration.plan import first_seeds, study_epochs, study_list
from studylib.study.orchestration.sweep import Grid


def grids(preset: Preset) -> list[Grid]:
    return [Grid(study_list(preset, "iso_width"), first_seeds(preset, "comparison_seeds"),
                 budget_overrides(preset, study_epochs(preset, "iso_width_epochs")))]


COMPARISON = Comparison("iso_width", "07_iso_width", grids, section="iso_width")
