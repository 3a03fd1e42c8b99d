"""A comparison: one notebook's question, its knobs, the runs it needs from a preset, the tables
whose families the report words and what it adds to the report's answer.

A :class:`Comparison` names its notebook, its :class:`~studylib.study.comparisons.knobs.Knobs` type
(the flat ``study`` keys it owns) and its plan (``grids(study, knobs, **parameters)``:
:class:`~studylib.study.orchestration.plan.Grid` s built from its typed knobs, the general knobs and
the notebook's own ``-p`` parameters). ``studylib study`` plans every selected comparison once
(:func:`studylib.study.orchestration.plan.plan_runs`), trains the missing runs in one queue and
writes each comparison's plan under the preset's outputs; a notebook then opens its comparison
(:func:`studylib.study.runner.notebooks.open_comparison`), reads that plan and hands back its
:class:`Runs`: every run resolved once into a :class:`~studylib.run.spec.RunSpec`, every frame read
from those handles (:func:`studylib.study.analysis.frames.runs_frame`), never resolved again.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import pandas as pd

from studylib.config import Preset
from studylib.run.rundir import RunDir
from studylib.run.spec import RunSpec, budget_overrides
from studylib.study.analysis.frames import runs_frame, runs_metrics
from studylib.study.comparisons.knobs import Knobs, Study, required
from studylib.study.orchestration.plan import Grid, Plan, plan_runs
from studylib.study.orchestration.train import train_plan


def no_runs(study: Study, knobs: Knobs, **parameters) -> list[Grid]:
    """The plan of a comparison that trains nothing (it reads configs, benchmarks or one run)."""
    return []


def models_at_epochs(study: Study, knobs: Knobs, **parameters) -> list[Grid]:
    """The plan of a comparison whose knobs hold ``models`` (a model list; absent: one ConfigError
    line naming its key) and ``epochs``: those models at ``epochs`` times the preset's schedule, the
    first ``study.comparison_seeds`` seeds."""
    models = required(knobs.models, type(knobs).key("models"), study.preset,
                      "a non-empty list of model names of the preset")
    return [Grid(list(models), study.leading_seeds(study.general.comparison_seeds),
                 budget_overrides(study.preset, knobs.epochs))]


@dataclass(frozen=True)
class Runs:
    """The finished runs of a comparison: per grid of its plan (in order), the runs as the plan
    resolved them (models x seeds order)."""

    preset: Preset
    grids: tuple[Grid, ...]
    specs: tuple[tuple[RunSpec, ...], ...]

    @classmethod
    def of(cls, plan: Plan) -> "Runs":
        return cls(plan.preset, plan.grids, plan.specs)

    def frame(self, i: int = 0) -> pd.DataFrame:
        """One row per run of grid ``i`` (the summaries of :func:`~studylib.study.analysis.frames.runs_frame`)."""
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
class Answer:
    """What a comparison adds to the report's answer (``## The answer``): its sentences in markdown
    (or why it is not computed), its figures, what it does not show, and the MoE whose runs the
    report's facts list (the headline's); and its part of the first screen
    (:mod:`~studylib.study.comparisons.glance`): ``glance`` rows, ``lead`` sentences and the
    ``key_figure``."""

    markdown: str
    figures: tuple[Path, ...] = ()
    limits: tuple[str, ...] = ()
    moe: Optional[str] = None
    glance: tuple = ()
    lead: tuple[str, ...] = ()
    key_figure: Optional[Path] = None
    lead_topics: tuple[Optional[str], ...] = ()
    covers: tuple[str, ...] = ()

    def lead_without(self, covered: set) -> tuple[str, ...]:
        """The lead's sentences but those whose topic (``lead_topics``, parallel to ``lead``; None or
        absent: always said) another comparison's answer ``covers`` (a topic it words better: the
        size ladder's scored law words "law" and "routers" where it ran)."""
        topics = tuple(self.lead_topics) + (None,) * (len(self.lead) - len(self.lead_topics))
        return tuple(s for s, t in zip(self.lead, topics) if t is None or t not in covered)


def family_sentences(table: pd.DataFrame) -> list[str]:
    """One sentence per family of a comparison table (its ``family`` column), in the notebooks'
    words (:func:`studylib.study.analysis.text.comparison_sentences`)."""
    from studylib.study.analysis import text

    return [text.comparison_sentences(g.set_index(g.columns[0]))
            for _, g in table.groupby("family", sort=False, dropna=False)]


@dataclass(frozen=True)
class Stage:
    """Runs a comparison needs finished, and what it does with them, before the rest of its plan
    (and of the study's) trains: ``grids(study, knobs)``, then ``then(study, knobs, runs)`` with
    their :class:`Runs` (notebook 14 writes the law's predictions of the runs still to train)."""

    grids: Callable[..., list[Grid]]
    then: Callable[..., None]

    def run(self, study: Study, knobs: Knobs, jobs: Optional[int] = None, progress: bool = True,
            scheduler: Optional[str] = None, where: str = "the first stage") -> None:
        """Plan and train :attr:`grids` (finished runs are reused), then call :attr:`then`."""
        planned = plan_runs(study.preset, self.grids(study, knobs), where, progress)
        train_plan(planned, jobs=jobs, progress=progress, scheduler=scheduler)
        self.then(study, knobs, Runs.of(planned))


@dataclass(frozen=True)
class Comparison:
    """One notebook's comparison.

    ``name`` (its package), ``notebook`` (the file stem), ``knobs`` (its :class:`Knobs` type: the
    flat ``study`` keys it owns), ``grids`` (``(study, knobs, **parameters) -> [Grid]``: the runs
    it reads), ``parameters`` (the notebook's own ``-p`` parameters the plan depends on, e.g.
    notebook 04's ``model``), ``jobs`` (runs at a time when the notebook trains them itself; None:
    the notebook's), ``stage`` (a :class:`Stage` that trains and acts before the rest; None: one
stage), ``builds_on`` (the comparison packages whose plan and tables it reads, the only ones it
may import: notebook 14 builds on the map's), ``tables`` (the CSV names, under ``tables/``, of its families of comparisons:
    the report words each with ``words``, one sentence per family) and ``answer`` (``(outputs dir)
    -> Answer``: what it adds to the report's answer, from its tables and figures; None: nothing)."""

    name: str
    notebook: str
    knobs: type = Knobs
    grids: Callable[..., list[Grid]] = no_runs
    parameters: tuple[str, ...] = ()
    jobs: Optional[int] = None
    tables: tuple[str, ...] = ()
    words: Callable[[pd.DataFrame], list[str]] = family_sentences
    answer: Optional[Callable[[Path], Answer]] = None
    stage: Optional[Stage] = None
    builds_on: tuple[str, ...] = ()

    def given(self, parameters: Optional[Mapping[str, Any]]) -> dict:
        """The notebook's ``parameters`` the plan takes (the others are the notebook's alone)."""
        return {k: v for k, v in (parameters or {}).items() if k in self.parameters}

    def plan(self, study: Study, parameters: Optional[Mapping[str, Any]] = None) -> list[Grid]:
        """The grids of this comparison under ``study`` and the notebook's ``parameters`` (those
        the plan does not take are ignored: :meth:`given`)."""
        return self.grids(study, study[self], **self.given(parameters))

    def train(self, study: Study, jobs: Optional[int] = None, progress: bool = True,
              parameters: Optional[Mapping[str, Any]] = None) -> Runs:
        """:meth:`plan` resolved, its missing runs trained (finished ones are reused; its
        :attr:`stage` first), as :class:`Runs`."""
        jobs = self.jobs if self.jobs is not None else jobs
        if self.stage is not None:
            self.stage.run(study, study[self], jobs, progress, where=f"notebook {self.notebook}'s first stage")
        planned = plan_runs(study.preset, self.plan(study, parameters), f"notebook {self.notebook}", progress)
        train_plan(planned, jobs=jobs, progress=progress)
        return Runs.of(planned)


__all__ = ["Answer", "Comparison", "Runs", "Stage", "family_sentences", "models_at_epochs", "no_runs"]
