"""Notebook 02, the routing ablation (SPEC Table 1): the routed variants of ``study.ablation`` at
``study.ablation_epochs``, the first ``study.comparison_seeds`` seeds; its family table
``table1_gaps_vs_reference``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from studylib.run.spec import budget_overrides
from studylib.study.comparisons.base import Comparison
from studylib.study.comparisons.knobs import EPOCHS, MODELS, Knobs, Study, knob, required
from studylib.study.orchestration.plan import Grid


@dataclass(frozen=True)
class AblationKnobs(Knobs):
    """The routed variants (``ablation``, the reference MoE among them) at ``ablation_epochs``."""

    models: Optional[tuple[str, ...]] = knob("ablation", MODELS, models=True)
    epochs: float = knob("ablation_epochs", EPOCHS, 1.0)


def grids(study: Study, knobs: AblationKnobs) -> list[Grid]:
    models = required(knobs.models, "ablation", study.preset, "a non-empty list of model names of the preset")
    return [Grid(list(models), study.leading_seeds(study.general.comparison_seeds),
                 budget_overrides(study.preset, knobs.epochs))]


COMPARISON = Comparison("ablation", "02_routing_ablation", AblationKnobs, grids,
                        tables=("table1_gaps_vs_reference",))
