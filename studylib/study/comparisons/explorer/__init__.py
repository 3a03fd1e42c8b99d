"""Notebook 08, the routing explorer: one run (``-p run PATH``), by default the reference MoE's
first seed, trained with a snapshot at every evaluation when it does not exist yet (a finished
run is reused as it is). A ``run`` given is read as it is: nothing to train."""
from __future__ import annotations

from typing import Optional

from studylib.study.comparisons.base import Comparison
from studylib.study.comparisons.knobs import Knobs, Study
from studylib.study.orchestration.plan import Grid


def grids(study: Study, knobs: Knobs, run: Optional[str] = None) -> list[Grid]:
    if run is not None:
        return []
    return [Grid([study.reference_moe], [study.preset.seeds[0]], {"train.keep_checkpoints": True})]


COMPARISON = Comparison("explorer", "08_routing_explorer", grids=grids, parameters=("run",), jobs=1)  # one run, here
