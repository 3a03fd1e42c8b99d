"""Notebook 06, the granularity sweep: the soft-MoE K sweep of ``study.granularity`` at
``study.granularity_epochs``, the first ``study.comparison_seeds`` seeds; its family table
``granularity_gaps``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from studylib.run.spec import budget_overrides
from studylib.study.comparisons.base import Comparison
from studylib.study.comparisons.knobs import EPOCHS, MODELS, POSITIVE_INT, Knobs, Study, knob, required
from studylib.study.orchestration.plan import Grid


@dataclass(frozen=True)
class GranularityKnobs(Knobs):
    """The soft-MoE K sweep (``granularity``) at ``granularity_epochs``, and the windows of its
    probes (``probe_windows``)."""

    models: Optional[tuple[str, ...]] = knob("granularity", MODELS, models=True)
    epochs: float = knob("granularity_epochs", EPOCHS, 1.0)
    probe_windows: int = knob("probe_windows", POSITIVE_INT, 64)


def grids(study: Study, knobs: GranularityKnobs) -> list[Grid]:
    models = required(knobs.models, "granularity", study.preset, "a non-empty list of model names of the preset")
    return [Grid(list(models), study.leading_seeds(study.general.comparison_seeds),
                 budget_overrides(study.preset, knobs.epochs))]


COMPARISON = Comparison("granularity", "06_granularity_sweep", GranularityKnobs, grids, tables=("granularity_gaps",))
