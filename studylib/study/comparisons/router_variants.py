"""Notebook 12, router variants: the MoEs of ``study.router_variants``, the reference MoE and the
headline's two dense baselines at ``study.router_variants_epochs`` (1.0: the headline budget,
whose runs notebook 03 shares), every seed of the preset."""
from __future__ import annotations

from studylib.config import Preset
from studylib.run.spec import budget_overrides
from studylib.study.comparisons.base import Comparison
from studylib.study.orchestration.plan import reference_moe, study_epochs, study_list
from studylib.study.orchestration.sweep import Grid


def grid(preset: Preset) -> Grid:
    headline = study_list(preset, "headline")
    models = [headline[0], *study_list(preset, "router_variants"), headline[2]]
    if reference_moe(preset) not in models:
        models.insert(1, reference_moe(preset))
    return Grid(list(dict.fromkeys(models)), None,
                budget_overrides(preset, study_epochs(preset, "router_variants_epochs")))


def grids(preset: Preset) -> list[Grid]:
    return [grid(preset)]


COMPARISON = Comparison("router_variants", "12_router_variants", grids, section="router_variants")
