"""Notebook 13, controls: is the tiny MoE learning to route, and does its machinery cost anything?
Per cell of ``study.controls`` (:mod:`.knobs`): the reference trio and the controls (a hash router,
a frozen router, a one-expert MoE and its dense twin) at one budget, the first
``study.controls_seeds`` seeds; the tables and words (:mod:`.analysis`), what the routers learn
(:mod:`.routers`); its family tables ``controls_gaps`` (each control − the reference MoE, Holm over
the cell's controls) and ``controls_twin`` (the one-expert MoE − its dense twin, TOST within
``study.margin``).

A cell at ``epochs: 1.0`` reads the preset's own runs (the headline's, shared); one at
``tokens_per_param: x`` trains ``round(x * A / tokens_per_step)`` optimizer steps (``A``: the trio
MoE's active parameters; the token-budget map's unit, so the map's runs of that cell are the same
runs) on the trio MoE's vocabulary."""
from __future__ import annotations

from studylib.config import Preset
from studylib.run.spec import budget_overrides
from studylib.study.comparisons.base import Comparison
from studylib.study.comparisons.controls.knobs import CONTROLS_SHAPE, ControlCell, ControlsKnobs
from studylib.study.comparisons.knobs import Study, required
from studylib.study.orchestration.plan import Grid


def tokens_per_step(preset: Preset) -> int:
    """Target tokens of one optimizer step (windows per step x ``data.context - 1``): the unit the
    token-budget map turns tokens per parameter into steps with."""
    return preset.train.batch_size * preset.train.grad_accum * (preset.data.context - 1)


def cell_overrides(preset: Preset, cell: ControlCell) -> dict:
    """The overrides of a cell's runs: its budget in steps (``{}`` for the preset's own run) and
    the trio MoE's vocabulary when it has its own (``data.vocab_size``), as the map sets them."""
    if cell.epochs is not None:
        ov = dict(budget_overrides(preset, cell.epochs))
    else:
        active = int(preset.model_config(cell.moe).num_params.active)
        ov = {"train.max_steps": max(1, round(cell.tokens_per_param * active / tokens_per_step(preset)))}
    vocab = preset.model_config(cell.moe).vocab_size
    if vocab != preset.data.vocab_size:
        ov["data.vocab_size"] = vocab
        if "train.max_steps" not in ov:
            from studylib.run.spec import epoch_steps

            ov["train.max_steps"] = epoch_steps(preset)
    return ov


def grids(study: Study, knobs: ControlsKnobs) -> list[Grid]:
    """One grid per cell: its trio and controls, the first ``controls_seeds`` seeds."""
    cells = required(knobs.cells, "controls", study.preset, "a list of cells " + CONTROLS_SHAPE)
    seeds = study.leading_seeds(knobs.seeds)
    return [Grid(c.models, seeds, cell_overrides(study.preset, c) or None) for c in cells]


COMPARISON = Comparison("controls", "13_controls", ControlsKnobs, grids, tables=("controls_gaps", "controls_twin"))
