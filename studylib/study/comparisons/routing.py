"""Notebook 04, routing diagnostics: one sparse MoE of the preset (``-p model NAME``; default the
reference MoE), every seed, at the budget whose runs it shares: a router variant of notebook 12
at ``study.router_variants_epochs``, any other at the preset's budget."""
from __future__ import annotations

from typing import Optional

from studylib.config import ConfigError, Preset
from studylib.study.comparisons.router_variants import grid as router_variants_grid
from studylib.study.comparisons.base import Comparison
from studylib.study.orchestration.plan import reference_moe, study_list
from studylib.study.orchestration.sweep import Grid


def grid(preset: Preset, model: Optional[str] = None) -> Grid:
    model = model or reference_moe(preset)
    kind = preset.model_config(model).ffn.kind  # an unknown name: one line naming the preset's models
    if kind != "moe":
        raise ConfigError(f"notebook 04: model {model!r} is {kind!r}, not a sparse MoE (ffn.kind: moe); "
                          f"the routed models of preset {preset.name!r}: "
                          + ", ".join(m for m in preset.models if preset.model_config(m).ffn.kind == "moe"))
    if model != reference_moe(preset) and model in study_list(preset, "router_variants"):
        return Grid([model], list(preset.seeds), router_variants_grid(preset).overrides)
    return Grid([model], list(preset.seeds))


def grids(preset: Preset, model: Optional[str] = None) -> list[Grid]:
    return [grid(preset, model)]


COMPARISON = Comparison("routing", "04_routing_diagnostics", grids, parameters=("model",))
