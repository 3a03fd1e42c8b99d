"""Notebook 11, the learning-rate check: the headline trio at each rate of ``study.lr_sweep``
(one grid per rate), its seeds and budget (:mod:`studylib.study.analysis.lr_sweep`)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from studylib.config import Preset
from studylib.run.layout import run_dir_for
from studylib.run.spec import budget_overrides
from studylib.study.analysis import lr_sweep
from studylib.study.comparisons.base import Comparison, Runs
from studylib.study.orchestration.plan import study_list
from studylib.study.orchestration.sweep import Grid, ensure_grids


def sweep_grids(preset: Preset, models: Sequence[str], spec: lr_sweep.SweepSpec) -> list[Grid]:
    """The sweep's runs, one :class:`~studylib.study.orchestration.sweep.Grid` per lr of ``spec.lrs``."""
    budget = budget_overrides(preset, spec.epochs)
    return [Grid(list(models), list(spec.seeds), lr_sweep.run_overrides(preset, spec, lr, budget)) for lr in spec.lrs]


def grids(preset: Preset) -> list[Grid]:
    return sweep_grids(preset, study_list(preset, "headline"), lr_sweep.sweep_spec(preset))


def sweep_frame(runs: Runs, spec: lr_sweep.SweepSpec) -> pd.DataFrame:
    """One row per run of the sweep with columns ``lr`` and ``reused`` (True where the run is the
    preset's own run directory, e.g. the headline run)."""
    out = []
    for i, lr in enumerate(spec.lrs):
        own = [s.run_dir == Path(os.path.abspath(run_dir_for(runs.preset, s.model, s.seed))) for s in runs.specs[i]]
        out.append(runs.frame(i).assign(lr=lr, reused=own))
    return pd.concat(out, ignore_index=True)


def ensure_sweep(preset: Preset, models: Sequence[str], spec: lr_sweep.SweepSpec, jobs: Optional[int] = None,
                 progress: bool = True) -> pd.DataFrame:
    """:func:`sweep_frame` of ``models`` x ``spec.lrs`` x ``spec.seeds``, training what is missing."""
    grids_ = sweep_grids(preset, models, spec)
    specs = ensure_grids(preset, grids_, jobs=jobs, progress=progress)  # one queue for every lr
    return sweep_frame(Runs(preset, tuple(grids_), tuple(tuple(s) for s in specs)), spec)


COMPARISON = Comparison("lr_sweep", "11_learning_rate", grids, section="lr_sweep")
