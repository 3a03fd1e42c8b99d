"""Notebook 06, the granularity sweep: the soft-MoE K sweep of ``study.granularity`` at
``study.granularity_epochs``, the first ``study.comparison_seeds`` seeds; its family table
``granularity_gaps``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from studylib.study.comparisons.base import Comparison, models_at_epochs
from studylib.study.comparisons.knobs import EPOCHS, MODELS, POSITIVE_INT, Knobs, knob


@dataclass(frozen=True)
class GranularityKnobs(Knobs):
    """The soft-MoE K sweep (``granularity``) at ``granularity_epochs``, and the windows of its
    probes (``probe_windows``)."""

    models: Optional[tuple[str, ...]] = knob("granularity", MODELS, models=True)
    epochs: float = knob("granularity_epochs", EPOCHS, 1.0)
    probe_windows: int = knob("probe_windows", POSITIVE_INT, 64)


COMPARISON = Comparison("granularity", "06_granularity_sweep", GranularityKnobs, models_at_epochs, tables=("granularity_gaps",))
