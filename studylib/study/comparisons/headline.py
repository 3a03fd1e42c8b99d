"""Notebook 03, the headline sweep: the headline trio at the preset's budget, every seed, and,
with ``study.noise_split: {seeds: k}``, the noise-split design around the first seed (grids 1..:
init only, then order only, one grid per data seed; :mod:`studylib.study.analysis.noise`)."""
from __future__ import annotations

from typing import Sequence

import pandas as pd

from studylib.config import Preset
from studylib.study.analysis import noise
from studylib.study.comparisons.base import Comparison, Runs
from studylib.study.orchestration.plan import study_list
from studylib.study.orchestration.sweep import Grid


def headline_grid(preset: Preset) -> Grid:
    """The headline trio at the preset's budget, every seed (notebooks 03, 04 and 12 share its runs)."""
    return Grid(study_list(preset, "headline"), list(preset.seeds))


def noise_grids(models: Sequence[str], seeds: Sequence[int]) -> list[Grid]:
    """The runs of the design over the draws ``seeds`` (:func:`~studylib.study.analysis.noise.noise_seeds`;
    the first is the fixed seed): [both, init only, order only (one grid per data seed)]."""
    s0 = seeds[0]
    return [Grid(list(models), list(seeds)),
            Grid(list(models), list(seeds), {"train.data_seed": s0}),
            *[Grid(list(models), [s0], {"train.data_seed": s}) for s in seeds]]


def grids(preset: Preset) -> list[Grid]:
    seeds = noise.noise_seeds(preset)
    return [headline_grid(preset), *([] if seeds is None else noise_grids(study_list(preset, "headline"), seeds))]


def noise_frame(runs: Runs, seeds: Sequence[int]) -> pd.DataFrame:
    """The summaries of the design (grids 1.. of :func:`grids`), with ``factor`` (one of
    :data:`studylib.study.analysis.noise.FACTORS`) and ``draw`` (the varied seed: the run seed, or
    the data seed)."""
    both, init, *order = [runs.frame(i) for i in range(1, len(runs.specs))]
    parts = [both.assign(factor="both", draw=both["seed"]), init.assign(factor="init only", draw=init["seed"])]
    parts += [f.assign(factor="order only", draw=s) for f, s in zip(order, seeds)]
    return pd.concat(parts, ignore_index=True)


COMPARISON = Comparison("headline", "03_headline_sweep", grids, section="headline_sweep")
