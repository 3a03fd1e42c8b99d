"""Notebook 12, router variants: the MoEs of ``study.router_variants``, the reference MoE and the
headline's two dense baselines at ``study.router_variants_epochs`` (1.0: the headline budget,
whose runs notebook 03 shares), every seed of the preset; the tables and diagnostics
(:mod:`.variants`); its family table ``router_variants_gaps``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from studylib.run.spec import budget_overrides
from studylib.study.comparisons.base import Comparison
from studylib.study.comparisons.knobs import EPOCHS, MODELS, Knobs, Study, knob, required
from studylib.study.orchestration.plan import Grid


@dataclass(frozen=True)
class RouterVariantsKnobs(Knobs):
    """The MoEs with other routers (``router_variants``, the reference MoE too) at
    ``router_variants_epochs`` (1.0: the headline budget, whose runs notebook 03 shares)."""

    models: Optional[tuple[str, ...]] = knob("router_variants", MODELS, models=True)
    epochs: float = knob("router_variants_epochs", EPOCHS, 1.0)


def grid(study: Study, knobs: RouterVariantsKnobs) -> Grid:
    """The variants between the headline's dense baselines (the reference MoE among them), every seed."""
    variants = required(knobs.models, "router_variants", study.preset, "a non-empty list of model names of the preset")
    dense_active, _, dense_total = study.headline
    models = [dense_active, *variants, dense_total]
    if study.reference_moe not in models:
        models.insert(1, study.reference_moe)
    return Grid(list(dict.fromkeys(models)), None, budget_overrides(study.preset, knobs.epochs))


def grids(study: Study, knobs: RouterVariantsKnobs) -> list[Grid]:
    return [grid(study, knobs)]


COMPARISON = Comparison("router_variants", "12_router_variants", RouterVariantsKnobs, grids,
                        tables=("router_variants_gaps",))
