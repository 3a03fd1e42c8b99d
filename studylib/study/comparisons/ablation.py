"""Notebook 02, the routing ablation (SPEC Table 1): the routed variants of ``study.ablation`` at
``study.ablation_epochs``, the first ``study.comparison_seeds`` seeds."""
from __future__ import annotations

from studylib.config import Preset
from studylib.run.spec import budget_overrides
from studylib.study.comparisons.base import Comparison
from studylib.study.orchestration.plan import first_seeds, study_epochs, study_list
from studylib.study.orchestration.sweep import Grid


def grids(preset: Preset) -> list[Grid]:
    return [Grid(study_list(preset, "ablation"), first_seeds(preset, "comparison_seeds"),
                 budget_overrides(preset, study_epochs(preset, "ablation_epochs")))]


COMPARISON = Comparison("ablation", "02_routing_ablation", grids, section="ablation")
