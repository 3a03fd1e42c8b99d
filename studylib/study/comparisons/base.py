"""A comparison: one notebook's question, the runs it needs from a preset, and those runs trained.

A :class:`Comparison` names its notebook and says which runs it reads (:meth:`Comparison.plan`:
:class:`~studylib.study.orchestration.sweep.Grid` s built from the preset's knobs and the notebook's
own ``-p`` parameters). ``studylib study`` trains the plans of every selected comparison in one
queue before any notebook starts; a notebook then opens its comparison
(:func:`studylib.study.runner.notebooks.open_comparison`), which finds the runs finished and hands
back their :class:`Runs`: every run resolved once into a :class:`~studylib.run.spec.RunSpec` by the
sweep, and every frame read from those handles (:func:`studylib.study.analysis.frames.runs_frame`),
never resolved again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import pandas as pd

from studylib.config import SECTIONS, ConfigError, Preset
from studylib.run.rundir import RunDir
from studylib.run.spec import RunSpec
from studylib.study.analysis.frames import runs_frame, runs_metrics
from studylib.study.orchestration.sweep import Grid, ensure_grids


def no_runs(preset: Preset, **parameters) -> list[Grid]:
    """The plan of a comparison that trains nothing (it reads configs, benchmarks or one run)."""
    return []


@dataclass(frozen=True)
class Runs:
    """The finished runs of a comparison: per grid of its plan (in order), the runs as the sweep
    resolved them (models x seeds order)."""

    preset: Preset
    grids: tuple[Grid, ...]
    specs: tuple[tuple[RunSpec, ...], ...]

    def frame(self, i: int = 0) -> pd.DataFrame:
        """One row per run of grid ``i`` (the summaries of :func:`~studylib.study.analysis.frames.collect_runs`)."""
        return runs_frame(self.specs[i])

    def metrics(self, i: int = 0, kind: Optional[str] = "eval") -> pd.DataFrame:
        """The ``metrics.jsonl`` records of grid ``i``'s runs with ``model`` and ``seed``."""
        return runs_metrics(self.specs[i], kind)

    def run_dirs(self, i: int = 0) -> dict[str, dict[int, RunDir]]:
        """``{model: {seed: RunDir}}`` of grid ``i``."""
        out: dict = {}
        for spec in self.specs[i]:
            out.setdefault(spec.model, {})[spec.seed] = spec.rundir
        return out

    def seeds(self, i: int = 0) -> list[int]:
        """The seeds of grid ``i``, in order."""
        return list(dict.fromkeys(spec.seed for spec in self.specs[i]))


@dataclass(frozen=True)
class Comparison:
    """One notebook's comparison: ``name`` (its module), ``notebook`` (the file stem), ``grids``
    (``(preset, **parameters) -> [Grid]``: the runs it reads), ``parameters`` (the notebook's own
    ``-p`` parameters the plan depends on, e.g. notebook 04's ``model``), ``jobs`` (runs at a
    time when the notebook trains them itself, whatever its ``jobs``; None: the notebook's) and
    ``section``: the attribute of ``preset.study`` holding its own knobs (a key of
    :data:`studylib.config.SECTIONS`; None: it reads the general knobs only). Another
    comparison's section may be read too (notebook 04 reads 12's router variants), but each
    section belongs to one comparison."""

    name: str
    notebook: str
    grids: Callable[..., list[Grid]] = no_runs
    parameters: tuple[str, ...] = ()
    jobs: Optional[int] = None
    section: Optional[str] = None

    def __post_init__(self):
        if self.section is not None and self.section not in SECTIONS:
            raise ConfigError(f"comparison {self.name!r}: section {self.section!r} is not one of {sorted(SECTIONS)}")

    def knobs(self, preset: Preset):
        """This comparison's section of ``preset.study`` (None if it has none, or the preset lacks a
        whole-mapping section such as ``lr_sweep``)."""
        return None if self.section is None else getattr(preset.study, self.section)

    def plan(self, preset: Preset, parameters: Optional[Mapping[str, Any]] = None) -> list[Grid]:
        """The grids of this comparison under ``preset`` and the notebook's ``parameters`` (those
        the plan does not take are ignored: they are the notebook's alone)."""
        given = {k: v for k, v in (parameters or {}).items() if k in self.parameters}
        return self.grids(preset, **given)

    def train(self, preset: Preset, jobs: Optional[int] = None, progress: bool = True,
              parameters: Optional[Mapping[str, Any]] = None) -> Runs:
        """:meth:`plan` trained (the missing runs; finished ones are reused) and returned as :class:`Runs`."""
        grids = self.plan(preset, parameters)
        jobs = self.jobs if self.jobs is not None else jobs
        specs = ensure_grids(preset, grids, jobs=jobs, progress=progress) if grids else []
        return Runs(preset, tuple(grids), tuple(tuple(s) for s in specs))


def grids_of(comparisons: Sequence[Comparison], preset: Preset,
             parameters: Optional[Mapping[str, Mapping[str, Any]]] = None) -> list[Grid]:
    """The grids of several comparisons, in order; ``parameters``: ``{notebook stem: {name: value}}``."""
    parameters = parameters or {}
    return [g for c in comparisons for g in c.plan(preset, parameters.get(c.notebook))]


__all__ = ["Comparison", "Runs", "grids_of", "no_runs"]
