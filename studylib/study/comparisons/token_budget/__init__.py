"""Notebook 09, the token-budget map, and the law fitted over it. Its files group as the plan
(:mod:`.knobs`, :mod:`.budgets`: each trio's cells, one grid per trio x cell), the map (:mod:`.gaps`,
:mod:`.repetition`, :mod:`.plane`), the per-role laws (:mod:`.law_roles`; the law itself is
:mod:`studylib.study.analysis.law`) and the report's part (:mod:`.glance`,
:mod:`.plots`). The tables notebook 09 writes are named once here (:data:`MAP` ...); :func:`answer`
reads them back for the report."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from studylib.study.comparisons.base import Answer, Comparison, Runs
from studylib.study.comparisons.glance import read_table
from studylib.study.comparisons.knobs import Study
from studylib.run.spec import cell_overrides, epoch_steps
from studylib.study.comparisons.token_budget import budgets, gaps
from studylib.study.comparisons.token_budget.knobs import TokenBudgetKnobs, TrioConfig
from studylib.study.orchestration.plan import Grid

#: the tables (and figures) notebook 09 writes, each read back by name
SHAPES, PLAN = "token_budget_shapes", "token_budget_plan"
MAP, PER_SEED = "token_budget_gaps", "token_budget_per_seed"
REPETITION, REPETITION_FIT = "token_budget_repetition", "token_budget_repetition_fit"
MEMORISATION, POWER = "token_budget_memorisation", "token_budget_power"
FIT, CROSSING, LOO = "token_budget_fit", "token_budget_crossing", "token_budget_loo"
LOSSES, LOSS_LAW, LOSS_LOO = "token_budget_losses", "token_budget_loss_law", "token_budget_loss_loo"
EXTRAPOLATION = "token_budget_extrapolation"
LAW, LAW_CHOICE = "token_budget_law", "token_budget_law_choice"
LAW_HELD_OUT, LAW_PAPER = "token_budget_law_held_out", "token_budget_law_paper"
LAW_INFLUENCE = "token_budget_law_influence"
#: the one-lambda and the size form (lambda(N)) side by side: parameters, and at the paper's point
LAW_FORMS, LAW_FORMS_PAPER = "token_budget_law_forms", "token_budget_law_forms_paper"
PAPER_PRESET = "token_budget_gaps_paper_preset"


def cell_grids(preset, trios: Sequence[TrioConfig], seeds: Sequence[int], epoch: int) -> list[Grid]:
    """One :class:`~studylib.study.orchestration.plan.Grid` per trio x cell (trio order, then
    :meth:`TrioConfig.cells`), with :func:`~studylib.run.spec.cell_overrides` over one epoch of ``epoch`` steps."""
    return [Grid(list(t.models), t.seeds_of(seeds, (e, f)), cell_overrides(preset, t.moe, e, f, epoch))
            for t in trios for e, f in t.cells()]


def grids(study: Study, knobs: TokenBudgetKnobs) -> list[Grid]:
    trios = budgets.budget_trios(study.preset, knobs)
    return cell_grids(study.preset, trios, study.preset.seeds, epoch_steps(study.preset))


def summaries(runs: Runs, trios: Sequence[TrioConfig]) -> pd.DataFrame:
    """Summaries (``runs_frame`` rows plus :func:`.budgets.budget_columns`'s cell, passes, unique
    tokens and bits per byte) of every trio x cell x seed of :func:`grids`."""
    cells = [(t, e, f) for t in trios for e, f in t.cells()]
    return pd.concat([budgets.budget_columns(runs.frame(i), t, e, f, runs.specs[i][0].preset.data)
                      for i, (t, e, f) in enumerate(cells)], ignore_index=True)


def cell_metrics(runs: Runs, trios: Sequence[TrioConfig]) -> dict:
    """``{(size, epochs, stories): the eval records of that cell's runs}`` (grid order)."""
    cells = [(t.size, e, f) for t in trios for e, f in t.cells()]
    return {cell: runs.metrics(i) for i, cell in enumerate(cells)}


LIMITS = ("The map's points are few sizes and budgets with a handful of seeds each; the gap model is a plane in "
          "log tokens/param and log size, and its crossing line is where that plane is zero. Nothing here is "
          "measured at the paper's scale (the fits' predictions there are extrapolations, compared in sign and "
          "ordering only); only the `paper` preset on a GPU measures its regime.")


#: the columns the answer at a glance reads (:mod:`.glance`); a table without them is one line naming it
GLANCE_COLUMNS = {
    MAP: ("size", "epochs", "tokens_per_param", "data_passes", "active_n", "moe_active", "active_mean",
          "active_ci_low", "active_ci_high", "total_mean", "total_ci_low", "total_ci_high"),
    PER_SEED: ("size", "epochs", "gap", "dense", "moe"),
    LAW_PAPER: ("quantity", "estimate", "ci_low", "ci_high", "identified"),
    LAW_FORMS_PAPER: ("form", "quantity", "estimate", "ci_low", "ci_high", "identified", "chosen"),
    LAW_CHOICE: ("form", "chosen"),
}


def _table(out_dir: Path, name: str):
    return read_table(out_dir, name, GLANCE_COLUMNS.get(name, ()))


def map_sentences(out_dir: Path, table: pd.DataFrame) -> list[str]:
    """The map's sentences, notebook 09's words rebuilt from its tables: each gap's points by
    verdict, the fits (when their tables exist) and the paper's range."""
    from studylib.study.analysis.law import size, words
    from studylib.study.comparisons.token_budget import law_roles, plane, repetition

    out = [gaps.point_sentences(table, gap) for gap in gaps.GAPS]
    if "position_defined" in table:
        out.append(gaps.position_sentence(table))
    fit, rep = _table(out_dir, REPETITION_FIT), _table(out_dir, REPETITION)
    if fit is not None and rep is not None:
        out += repetition.repetition_sentences(fit, rep)
    fits = [_table(out_dir, n) for n in (FIT, CROSSING, LOO, LOSS_LAW, EXTRAPOLATION)]
    if all(f is not None for f in fits):
        out += plane.plane_sentences(*fits[:3])
        out += law_roles.role_law_sentences(fits[3], _table(out_dir, LOSS_LOO))
        out += law_roles.extrapolation_sentences(fits[4])
    joint = [_table(out_dir, n) for n in (LAW, LAW_CHOICE, LAW_HELD_OUT, LAW_PAPER)]
    if all(t is not None for t in joint):
        out += words.law_sentences(*joint, runs=_table(out_dir, LAW_INFLUENCE))
    forms = [_table(out_dir, n) for n in (LAW_FORMS_PAPER, LAW_FORMS)]
    if all(t is not None for t in forms):
        out += size.size_form_sentences(*forms)
    return out + [gaps.paper_sentence(table)]


def answer(out_dir: Path) -> Answer:
    table = _table(out_dir, MAP)
    if table is None or not len(table):
        return Answer(f"**The token-budget map.** Not computed: no `tables/{MAP}.csv` "
                      "(notebook 09 did not run in this study).", limits=(LIMITS,))
    from studylib.study.comparisons.token_budget.glance import map_glance, map_sentence

    figures = tuple(p for p in (out_dir / "figures" / f"{f}.png" for f in (MAP, CROSSING))
                    if p.is_file())
    rows, lead = map_glance(table, _table(out_dir, PER_SEED), _table(out_dir, LAW_PAPER))
    key = out_dir / "figures" / f"{MAP}.png"
    summary = map_sentence(table, _table(out_dir, LAW_PAPER), _table(out_dir, LAW_FORMS_PAPER), _table(out_dir, LAW_CHOICE))
    return Answer("**The token-budget map (notebook 09).** " + summary + "\n\n"
                  + "\n".join(f"* {s}" for s in map_sentences(out_dir, table)),
                  figures, (LIMITS,), glance=tuple(rows), lead=tuple(lead), lead_topics=(None, "law"), key_figure=key if key.is_file() else None)


COMPARISON = Comparison("token_budget", "09_token_budget", TokenBudgetKnobs, grids, answer=answer)
