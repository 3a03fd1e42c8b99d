"""Notebook 09, the token-budget map: every trio of ``study.token_budget`` (:mod:`.knobs`) at each
of its cells (:mod:`.budgets`: its budgets, then its repeated budgets from fewer stories), one grid
per trio x cell (trio order, then :meth:`~.knobs.TrioConfig.cells`); the map's points and families
(:mod:`.gaps`), its checks (:mod:`.checks`: power, what repeating the data does), the fits
(:mod:`.fits`, :mod:`.loss_law`, :mod:`.report`) and figures (:mod:`.plots`). What it adds to the
report's answer: each gap's points by verdict, the fits' sentences and the map's figures."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from studylib.study.comparisons.base import Answer, Comparison, Runs
from studylib.study.comparisons.glance import read_table
from studylib.study.comparisons.knobs import Study
from studylib.run.spec import epoch_steps
from studylib.study.comparisons.token_budget import budgets, gaps
from studylib.study.comparisons.token_budget.knobs import TokenBudgetKnobs, TrioConfig
from studylib.study.orchestration.plan import Grid

#: the table (and figure) notebook 09 writes for the report's answer
MAP = "token_budget_gaps"
#: its fits' tables, in the order :func:`.report.fit_sentences` reads them
FITS = ("fit", "crossing", "loo", "loss_law", "extrapolation")
#: the joint law's tables, in the order :func:`.law_words.law_sentences` reads them
LAW = ("law", "law_choice", "law_held_out", "law_paper")


def cell_grids(preset, trios: Sequence[TrioConfig], seeds: Sequence[int], epoch: int) -> list[Grid]:
    """One :class:`~studylib.study.orchestration.plan.Grid` per trio x cell (trio order, then
    :meth:`TrioConfig.cells`), with :func:`.budgets.cell_overrides` over one epoch of ``epoch`` steps."""
    return [Grid(list(t.models), t.seeds_of(seeds), budgets.cell_overrides(preset, t, e, f, epoch))
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
    "token_budget_per_seed": ("size", "epochs", "gap", "dense", "moe"),
    "token_budget_law_paper": ("quantity", "estimate", "ci_low", "ci_high", "identified"),
}


def _table(out_dir: Path, name: str):
    return read_table(out_dir, name, GLANCE_COLUMNS.get(name, ()))


def map_sentences(out_dir: Path, table: pd.DataFrame) -> list[str]:
    """The map's sentences, notebook 09's words rebuilt from its tables: each gap's points by
    verdict, the fits (when their tables exist) and the paper's range."""
    from studylib.study.comparisons.token_budget import checks, law_words, report

    out = [gaps.point_sentences(table, gap) for gap in gaps.GAPS]
    if "position_defined" in table:
        out.append(gaps.position_sentence(table))
    fit, rep = _table(out_dir, "token_budget_repetition_fit"), _table(out_dir, "token_budget_repetition")
    if fit is not None and rep is not None:
        out += checks.repetition_sentences(fit, rep)
    fits = [_table(out_dir, f"token_budget_{n}") for n in FITS]
    if all(f is not None for f in fits):
        out += report.fit_sentences(*fits, loss_loo=_table(out_dir, "token_budget_loss_loo"))
    joint = [_table(out_dir, f"token_budget_{n}") for n in LAW]
    if all(t is not None for t in joint):
        out += law_words.law_sentences(*joint)
    return out + [gaps.paper_sentence(table)]


def answer(out_dir: Path) -> Answer:
    table = _table(out_dir, MAP)
    if table is None or not len(table):
        return Answer(f"**The token-budget map.** Not computed: no `tables/{MAP}.csv` "
                      "(notebook 09 did not run in this study).", limits=(LIMITS,))
    from studylib.study.comparisons.token_budget.glance import map_glance

    figures = tuple(p for p in (out_dir / "figures" / f"{f}.png" for f in (MAP, "token_budget_crossing"))
                    if p.is_file())
    rows, lead = map_glance(table, _table(out_dir, "token_budget_per_seed"), _table(out_dir, "token_budget_law_paper"))
    key = out_dir / "figures" / f"{MAP}.png"
    return Answer("**The token-budget map (notebook 09).**\n\n" + "\n".join(f"* {s}" for s in
                                                                          map_sentences(out_dir, table)),
                  figures, (LIMITS,), glance=tuple(rows), lead=tuple(lead), key_figure=key if key.is_file() else None)


COMPARISON = Comparison("token_budget", "09_token_budget", TokenBudgetKnobs, grids, answer=answer)
