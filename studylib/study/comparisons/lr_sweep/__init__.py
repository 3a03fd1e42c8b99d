"""Notebook 11, the learning-rate check: the headline trio at each rate of ``study.lr_sweep``
(:mod:`.knobs`; one grid per rate), its seeds and budget; the rule and the ranking check
(:mod:`.analysis`), the figure (:mod:`.plots`)."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from studylib.run.layout import run_dir_for
from studylib.run.spec import budget_overrides
from studylib.study.comparisons.base import Comparison, Runs
from studylib.study.comparisons.knobs import Study
from studylib.study.comparisons.lr_sweep.analysis import run_overrides
from studylib.study.comparisons.lr_sweep.knobs import LrSweepKnobs, SweepSpec
from studylib.study.orchestration.plan import Grid


def sweep_spec(study: Study, knobs: LrSweepKnobs) -> SweepSpec:
    """The sweep resolved against the preset's own ``train.lr`` (one of the grid's rates) and seeds."""
    return knobs.resolve(study.preset.train.lr, study.preset.seeds)


def grids(study: Study, knobs: LrSweepKnobs) -> list[Grid]:
    """One grid per lr of the sweep: the headline trio x the sweep's seeds at its budget."""
    spec = sweep_spec(study, knobs)
    budget = budget_overrides(study.preset, spec.epochs)
    return [Grid(list(study.headline), list(spec.seeds), run_overrides(study.preset, lr, budget)) for lr in spec.lrs]


def sweep_frame(runs: Runs, spec: SweepSpec) -> pd.DataFrame:
    """One row per run of the sweep with columns ``lr`` and ``reused`` (True where the run is the
    preset's own run directory, e.g. the headline run)."""
    out = []
    for i, lr in enumerate(spec.lrs):
        own = [s.run_dir == Path(os.path.abspath(run_dir_for(runs.preset, s.model, s.seed))) for s in runs.specs[i]]
        out.append(runs.frame(i).assign(lr=lr, reused=own))
    return pd.concat(out, ignore_index=True)


COMPARISON = Comparison("lr_sweep", "11_learning_rate", LrSweepKnobs, grids)
