"""Notebook 13, controls: is the tiny MoE learning to route, and does its machinery cost anything?
Per cell of ``study.controls`` (:mod:`.knobs`): the reference trio and the controls (a hash router,
a frozen router, a one-expert MoE and its dense twin) at one budget, the first
``study.controls_seeds`` seeds; the tables and words (:mod:`.analysis`; the tables' names:
:mod:`.tables`), what the routers learn (:mod:`.routers`); its family tables ``controls_gaps``
(each control − the reference MoE, Holm over the cell's controls) and ``controls_twin`` (the
one-expert MoE − its dense twin, TOST within ``study.margin``).

A cell at ``epochs: 1.0`` reads the preset's own runs (the headline's, shared); one at
``tokens_per_param: x`` trains ``round(x * A / tokens_per_step)`` optimizer steps (``A``: the trio
MoE's active parameters; the token-budget map's unit, so the map's runs of that cell are the same
runs) on the trio MoE's vocabulary. ``study.controls_recipe`` adds the MoE's recipe at one cell
(:func:`recipe_grids`: larger steps, an lr sweep per model, the router at a fraction of the lr)."""
from __future__ import annotations

from pathlib import Path

from studylib.config import ConfigError, Preset
from studylib.run.spec import cell_overrides as spec_cell_overrides, epoch_steps, tokens_per_param_epochs
from studylib.study.comparisons.base import Answer, Comparison
from studylib.study.comparisons.controls.knobs import CONTROLS_SHAPE, ControlCell, ControlsKnobs, Recipe
from studylib.study.comparisons.controls.tables import (CONTROLS, GAPS, POSITIONS, RECIPE, RECIPE_LRS,  # noqa: F401
                                                        ROUTER_RUNS, ROUTERS, TWIN)
from studylib.study.comparisons.knobs import Study, required
from studylib.study.orchestration.plan import Grid


def cell_overrides(preset: Preset, cell: ControlCell) -> dict:
    """The overrides of a cell's runs (:func:`studylib.run.spec.cell_overrides`: ``{}`` for the
    preset's own run), its budget in epochs or tokens per parameter as the map turns them into steps."""
    epochs = cell.epochs if cell.epochs is not None else tokens_per_param_epochs(
        preset, cell.tokens_per_param, int(preset.model_config(cell.moe).num_params.active))
    return spec_cell_overrides(preset, cell.moe, epochs)


def recipe_overrides(preset: Preset, cell: ControlCell, recipe: Recipe, lr: float, moe: bool) -> dict:
    """One run of the recipe: the cell's tokens in ``batch_scale`` x fewer, larger steps at ``lr``
    (min_lr in the preset's proportion), and for the MoE its routers at ``router_lr_scale``."""
    ov = cell_overrides(preset, cell)
    steps = ov["train.max_steps"] if "train.max_steps" in ov else epoch_steps(preset)
    ov["train.max_steps"] = max(1, round(steps / recipe.batch_scale))
    ov["train.batch_size"] = preset.train.batch_size * recipe.batch_scale
    ov["train.lr"], ov["train.min_lr"] = lr, float(f"{lr * preset.train.min_lr / preset.train.lr:.6g}")
    if moe:
        ov["train.router_lr_scale"] = recipe.router_lr_scale
    return ov


def recipe_grids(study: Study, knobs: ControlsKnobs) -> list[Grid]:
    """The recipe's runs (``controls_recipe``; none when absent): per lr, the trio's dense models
    in one grid and its MoE in another (its router lr), the first ``controls_seeds`` seeds."""
    r = knobs.recipe
    if r is None:
        return []
    if r.cell >= len(knobs.cells):
        raise ConfigError(f"study.controls_recipe.cell: {r.cell} is not a cell of study.controls "
                          f"(0..{len(knobs.cells) - 1})")
    cell, seeds, out = knobs.cells[r.cell], study.leading_seeds(knobs.seeds), []
    for lr in r.lrs:
        out.append(Grid([cell.trio[0], cell.trio[2]], seeds, recipe_overrides(study.preset, cell, r, lr, False)))
        out.append(Grid([cell.moe], seeds, recipe_overrides(study.preset, cell, r, lr, True)))
    return out


def grids(study: Study, knobs: ControlsKnobs) -> list[Grid]:
    """One grid per cell (its trio and controls, the first ``controls_seeds`` seeds), then the
    recipe's (:func:`recipe_grids`)."""
    cells = required(knobs.cells, "controls", study.preset, "a list of cells " + CONTROLS_SHAPE)
    seeds = study.leading_seeds(knobs.seeds)
    return [Grid(c.models, seeds, cell_overrides(study.preset, c) or None) for c in cells] + recipe_grids(study, knobs)


def answer(out_dir: Path) -> Answer:
    """The controls' sentence of the first screen (:func:`.analysis.lead_sentence`: the hash and
    frozen routers against the learned one, one expert against its dense twin, Clark et al.'s trend
    at this MoE's size) and, folded, the same with the controls' table (p, gap, verdict) and figures."""
    from studylib.study.comparisons.controls.analysis import lead_sentence, lead_sentences
    from studylib.study.comparisons.glance import markdown_table, read_table
    from studylib.study.comparisons.controls.clark_tables import CLARK_TREND, POSITION_AGAINST_SIZE

    cols = ("cell", "role", "model", "position", "position_low", "position_high", "position_defined")
    pos, gap = read_table(out_dir, POSITIONS, cols), read_table(out_dir, GAPS, ("a", "mean", "ci_low", "ci_high",
                                                                               "verdict", "margin", "family"))
    if pos is None or gap is None:
        return Answer(f"**Controls.** Not computed: no `tables/{POSITIONS}.csv` (notebook 13 did not run in this study).")
    twin = read_table(out_dir, TWIN, ("mean", "ci_low", "ci_high", "verdict", "family"))
    full = lead_sentence(pos, gap, twin, read_table(out_dir, CLARK_TREND, ("router", "experts", "size", "p", "ci_lo",
                                                                           "ci_hi", "decades_out")))
    lead = lead_sentences(pos, gap, twin)
    figures = tuple(p for p in (out_dir / "figures" / f"{f}.png" for f in (POSITION_AGAINST_SIZE, GAPS)) if p.is_file())
    shown_cols = ("cell", "role", "model", "p [95% CI]", "gap to the reference", "verdict")
    shown = read_table(out_dir, CONTROLS, shown_cols)
    table = "" if shown is None else "\n\n" + markdown_table(shown_cols, shown[list(shown_cols)].itertuples(index=False))
    said = full or ("No sentence on the first screen: its first cell has no hash or frozen router, nor one expert "
                    "with its twin.")
    return Answer(f"**Controls (notebook 13).** {said}{table}", figures, lead=tuple(lead),
                  lead_topics=("routers",) * len(lead))


COMPARISON = Comparison("controls", "13_controls", ControlsKnobs, grids, tables=(GAPS, TWIN), answer=answer)
