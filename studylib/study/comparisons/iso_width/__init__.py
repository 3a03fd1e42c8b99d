"""Notebook 07, iso-width: the pair of ``study.iso_width`` at ``study.iso_width_epochs``, the first
``study.comparison_seeds`` seeds, and the decoding benchmark's knobs (``study.decode``); its family
table ``iso_width_gap``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from studylib.run.spec import budget_overrides
from studylib.study.comparisons.base import Comparison
from studylib.study.comparisons.knobs import EPOCHS, MAPPING, MODELS, Knobs, Study, knob, required
from studylib.study.orchestration.plan import Grid


@dataclass(frozen=True)
class IsoWidthKnobs(Knobs):
    """The pair (``iso_width``: dense, MoE) at ``iso_width_epochs``, and the decoding benchmark's
    knobs (``decode``)."""

    models: Optional[tuple[str, ...]] = knob("iso_width", MODELS, models=True)
    epochs: float = knob("iso_width_epochs", EPOCHS, 1.0)
    decode: dict = knob("decode", MAPPING, {})


def grids(study: Study, knobs: IsoWidthKnobs) -> list[Grid]:
    models = required(knobs.models, "iso_width", study.preset, "a non-empty list of model names of the preset")
    return [Grid(list(models), study.leading_seeds(study.general.comparison_seeds),
                 budget_overrides(study.preset, knobs.epochs))]


COMPARISON = Comparison("iso_width", "07_iso_width", IsoWidthKnobs, grids, tables=("iso_width_gap",))
