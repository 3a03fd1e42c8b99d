"""Notebook 02, the routing ablation (SPEC Table 1): the routed variants of ``study.ablation`` at
``study.ablation_epochs``, the first ``study.comparison_seeds`` seeds; its family table
``table1_gaps_vs_reference``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from studylib.study.comparisons.base import Comparison, models_at_epochs
from studylib.study.comparisons.knobs import EPOCHS, MODELS, Knobs, knob


@dataclass(frozen=True)
class AblationKnobs(Knobs):
    """The routed variants (``ablation``, the reference MoE among them) at ``ablation_epochs``."""

    models: Optional[tuple[str, ...]] = knob("ablation", MODELS, models=True)
    epochs: float = knob("ablation_epochs", EPOCHS, 1.0)


COMPARISON = Comparison("ablation", "02_routing_ablation", AblationKnobs, models_at_epochs,
                        tables=("table1_gaps_vs_reference",))
