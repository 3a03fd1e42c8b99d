"""Notebook 09, the token-budget map: every trio of ``study.token_budget`` at each of its budgets
(one grid per trio x budget, trio order then epochs; :mod:`studylib.study.analysis.budget_map`)."""
from __future__ import annotations

from typing import Optional, Sequence

import pandas as pd

from studylib.config import Preset, TrioConfig
from studylib.study.analysis import budget_map as bm
from studylib.study.comparisons.base import Comparison, Runs
from studylib.study.orchestration.sweep import Grid, ensure_grids


def budget_grids(trios: Sequence[TrioConfig], seeds: Sequence[int], budget_map: dict) -> list[Grid]:
    """One :class:`~studylib.study.orchestration.sweep.Grid` per trio x budget (trio order, then epochs)."""
    return [Grid(list(t.models), t.seeds_of(seeds), budget_map[e]) for t in trios for e in t.epochs]


def grids(preset: Preset) -> list[Grid]:
    trios = bm.budget_trios(preset)
    return budget_grids(trios, preset.seeds, bm.budgets(preset, trios))


def summaries(runs: Runs, trios: Sequence[TrioConfig]) -> pd.DataFrame:
    """Summaries (``collect_runs`` rows plus ``size``, ``epochs``, ``train_targets``) of every
    trio x budget x seed of :func:`grids`."""
    cells = [(t, e) for t in trios for e in t.epochs]
    return pd.concat([bm.budget_columns(runs.frame(i), t, e) for i, (t, e) in enumerate(cells)], ignore_index=True)


def cell_metrics(runs: Runs, trios: Sequence[TrioConfig]) -> dict:
    """``{(size, epochs): the eval records of that trio x budget's runs}`` (grid order)."""
    cells = [(t.size, e) for t in trios for e in t.epochs]
    return {cell: runs.metrics(i) for i, cell in enumerate(cells)}


def train(preset: Preset, trios: Sequence[TrioConfig], seeds: Sequence[int], budget_map: dict,
          jobs: Optional[int] = None, progress: bool = True) -> Runs:
    """The runs of the given trios, seeds and budgets, training the missing ones in one queue
    (finished ones are reused)."""
    grids_ = budget_grids(trios, seeds, budget_map)
    specs = ensure_grids(preset, grids_, jobs=jobs, progress=progress)
    return Runs(preset, tuple(grids_), tuple(tuple(s) for s in specs))


def train_budgets(preset: Preset, trios: Sequence[TrioConfig], seeds: Sequence[int], budget_map: dict,
                  jobs: Optional[int] = None, progress: bool = True) -> pd.DataFrame:
    """:func:`summaries` of :func:`train`."""
    return summaries(train(preset, trios, seeds, budget_map, jobs, progress), trios)


COMPARISON = Comparison("token_budget", "09_token_budget", grids, section="token_budget")
