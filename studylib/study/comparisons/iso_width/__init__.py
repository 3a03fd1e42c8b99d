"""Notebook 07, iso-width: the pair of ``study.iso_width`` at ``study.iso_width_epochs``, the first
``study.comparison_seeds`` seeds, and the decoding benchmark's knobs (``study.decode``); its family
table ``iso_width_gap``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from studylib.study.comparisons.base import Comparison, models_at_epochs
from studylib.study.comparisons.knobs import EPOCHS, MAPPING, MODELS, Knobs, knob


@dataclass(frozen=True)
class IsoWidthKnobs(Knobs):
    """The pair (``iso_width``: dense, MoE) at ``iso_width_epochs``, and the decoding benchmark's
    knobs (``decode``)."""

    models: Optional[tuple[str, ...]] = knob("iso_width", MODELS, models=True)
    epochs: float = knob("iso_width_epochs", EPOCHS, 1.0)
    decode: dict = knob("decode", MAPPING, {})


COMPARISON = Comparison("iso_width", "07_iso_width", IsoWidthKnobs, models_at_epochs, tables=("iso_width_gap",))
