"""Notebook 06, the granularity sweep: the soft-MoE K sweep of ``study.granularity`` at
``study.granularity_epochs``, the first ``study.comparison_seeds`` seeds."""
from __future__ import annotations

from studylib.config import Preset
from studylib.run.spec import budget_overrides
from studylib.study.comparisons.base import Comparison
from studylib.study.orchestration.plan import first_seeds, study_epochs, study_list
from studylib.study.orchestration.sweep import Grid


def grids(preset: Preset) -> list[Grid]:
    return [Grid(study_list(preset, "granularity"), first_seeds(preset, "comparison_seeds"),
                 budget_overrides(preset, study_epochs(preset, "granularity_epochs")))]


COMPARISON = Comparison("granularity", "06_granularity_sweep", grids, section="granularity")
