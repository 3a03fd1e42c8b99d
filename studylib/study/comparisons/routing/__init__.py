"""Notebook 04, routing diagnostics: one sparse MoE of the preset (``-p model NAME``; default the
reference MoE), every seed, at the budget whose runs it shares: a router variant of notebook 12
at ``study.router_variants_epochs`` (12's knobs), any other at the preset's budget."""
from __future__ import annotations

from typing import Optional

from studylib.config import ConfigError
from studylib.study.comparisons import router_variants
from studylib.study.comparisons.base import Comparison
from studylib.study.comparisons.knobs import Knobs, Study
from studylib.study.orchestration.plan import Grid


def grid(study: Study, model: Optional[str] = None) -> Grid:
    preset = study.preset
    model = model or study.reference_moe
    kind = preset.model_config(model).ffn.kind  # an unknown name: one line naming the preset's models
    if kind != "moe":
        raise ConfigError(f"notebook 04: model {model!r} is {kind!r}, not a sparse MoE (ffn.kind: moe); "
                          f"the routed models of preset {preset.name!r}: "
                          + ", ".join(m for m in preset.models if preset.model_config(m).ffn.kind == "moe"))
    variants = study[router_variants.COMPARISON]
    if model != study.reference_moe and model in (variants.models or ()):
        return Grid([model], list(preset.seeds), router_variants.grid(study, variants).overrides)
    return Grid([model], list(preset.seeds))


def grids(study: Study, knobs: Knobs, model: Optional[str] = None) -> list[Grid]:
    return [grid(study, model)]


COMPARISON = Comparison("routing", "04_routing_diagnostics", grids=grids, parameters=("model",))
