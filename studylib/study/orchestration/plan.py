"""The plan: which runs some grids need, each resolved once, checked, counted and ordered, before
anything trains (:func:`plan_runs` -> :class:`Plan`). Training takes the plan's missing runs
(:func:`studylib.study.orchestration.train.train_plan`); reading takes the plan
(:class:`studylib.study.comparisons.base.Runs`).

* Each run ``models x seeds`` of a :class:`Grid` is resolved once into a
  :class:`~studylib.run.spec.RunSpec` (its own preset, model, seed and run directory); a run two
  grids share (same model, seed, overrides and tag: :func:`run_key`) is one run.
* A run directory holding a *different* configuration, or a finished run trained on other stories
  than the preset reads now, is an error raised here, before anything trains.
* A finished run (``summary.json`` with ``finished: true`` and the same config hash) is reused.
* The missing runs form one queue, longest first (optimizer steps x training FLOPs per token), so
  a job slot idles only at the very end. Their steps are ``train.max_steps`` or one epoch of their
  data's training windows, counted from the data loaded once per process
  (:func:`studylib.data.pipeline.shared_data`).

``studylib study`` plans the selected notebooks' comparisons in ONE plan, trains it, and writes
each comparison's part (:mod:`studylib.study.orchestration.plan_file`); each notebook then reads
its part. Run alone (JupyterLab, plain papermill), a notebook plans and trains its own runs.

Why one queue: notebook by notebook, a job slot sat idle at the end of every sweep whose run count
is odd (9 headline runs, 3 iso-width runs, ...). Measured on the 2-core AVX2 machine, ``cpu``
preset: the notebooks' training cells took about 1,590 s for 1,455 s of runs per slot; in one
queue, 1,685 s for 1,674 s (a slower hour of the same machine).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

from studylib.config import ConfigError, Preset, override_pairs
from studylib.config.presets import Overrides
from studylib.data.split import fingerprint_now
from studylib.run.provenance import check_reuse, code_differs
from studylib.run.rundir import RunDirConflict
from studylib.run.spec import RunSpec, epoch_steps


@dataclass(frozen=True)
class Grid:
    """One group of runs: ``models x seeds`` (default: the preset's seeds) of the preset +
    ``overrides``, in ``runs/<model>/<tag>/`` (the tag defaults to
    :func:`~studylib.config.variant_tag` of the overrides; overrides that leave a run's identity
    unchanged give the preset's own run)."""

    models: Sequence[str]
    seeds: Optional[Sequence[int]] = None
    overrides: Overrides = None
    tag: Optional[str] = None

    def seeds_of(self, preset: Preset) -> list[int]:
        """The grid's seeds (default: the preset's, or those the grid's overrides set), each once."""
        if self.seeds is not None:
            return list(dict.fromkeys(self.seeds))
        given = [v for k, v, _ in override_pairs(self.overrides) if k == "seeds"]
        return list(dict.fromkeys(given[-1] if given else preset.seeds))


def run_key(model: str, seed: int, overrides=None, tag: Optional[str] = None) -> tuple:
    """What names one run of a plan before it is resolved: model, seed, the overrides (as
    written) and the tag; two grids that share a run give it the same key."""
    return model, int(seed), tuple((k, repr(v)) for k, v, _ in override_pairs(overrides)), tag


@dataclass(frozen=True)
class Plan:
    """Some grids' runs, resolved once: per grid its runs (models x seeds order, finished or not);
    ``missing``: the runs to train, each once, longest first, with their optimizer ``steps``;
    ``other_code``: the finished runs another code trained (``{run dir: recorded fingerprints}``,
    for :func:`studylib.run.provenance.flag_reused`)."""

    preset: Preset
    grids: tuple[Grid, ...]
    specs: tuple[tuple[RunSpec, ...], ...]
    missing: tuple[RunSpec, ...] = ()
    steps: Mapping[Path, int] = field(default_factory=dict)
    other_code: Mapping[Path, dict] = field(default_factory=dict)

    @property
    def runs(self) -> int:
        """How many distinct runs the plan holds."""
        return len({spec.run_dir for specs in self.specs for spec in specs})

    def unfinished(self) -> list[str]:
        """The labels of the plan's runs that are not finished (read now)."""
        return [spec.label for specs in self.specs for spec in specs if not spec.rundir.finished()]


#: the most runs a study plans: 1,000 runs are already days of training on the CPU presets (more is
#: a typo, e.g. seeds 1-100000, that would plan for minutes). Counted over the plan's runs
#: (:func:`plan_size`: seeds x the models of every grid), before any run is resolved
MAX_RUNS = 1000


def plan_size(preset: Preset, grids: Sequence[Grid]) -> int:
    """The runs of ``grids`` under ``preset``: each grid's models x its seeds, a run two grids share
    (same model, seed, overrides and tag) counted once."""
    return len({run_key(m, s, g.overrides, g.tag) for g in grids for m in g.models for s in g.seeds_of(preset)})


def check_plan_size(preset: Preset, grids: Sequence[Grid], where: str) -> int:
    """The number of runs of ``grids`` (:func:`plan_size`); more than :data:`MAX_RUNS` is a
    :class:`ConfigError` with the count, raised before anything is resolved (``where``: whose plan
    it is, e.g. "notebooks 03, 04")."""
    n = plan_size(preset, grids)
    if n > MAX_RUNS:
        raise ConfigError(f"seeds: {len(preset.seeds):,} seeds give {n:,} runs in the plan of {where} (each seed trains "
                          f"every model a notebook compares), more than the {MAX_RUNS:,} runs a study takes; give "
                          f"fewer seeds (-p seeds) or fewer notebooks")
    return n


def plan_runs(preset: Preset, grids: Sequence[Grid], where: str = "the study", progress: bool = False) -> Plan:
    """The :class:`Plan` of ``grids`` under ``preset`` (see the module docstring); nothing is
    trained or written. More than :data:`MAX_RUNS` runs: one ConfigError line naming ``where``
    (whose plan it is), before any run is resolved. ``progress``: show the data's progress if
    counting steps loads it."""
    check_plan_size(preset, grids, where)
    resolved: dict = {}
    specs, finished, missing, seen, conflicts = [], [], [], set(), []
    for g in grids:
        models, seeds = list(dict.fromkeys(g.models)), g.seeds_of(preset)
        if not models or not seeds:
            raise ConfigError("plan: a grid needs at least one model and one seed")
        row = []
        for m in models:
            for s in seeds:
                key = run_key(m, s, g.overrides, g.tag)
                if key not in resolved:
                    spec = RunSpec.resolve(preset, m, s, g.overrides, g.tag)
                    try:
                        spec.rundir.check(spec.document())
                    except RunDirConflict as e:
                        conflicts.append((spec.run_dir, e))
                    resolved[key] = spec
                spec = resolved[key]
                row.append(spec)
                if spec.run_dir not in seen:  # a run two grids share is trained once
                    seen.add(spec.run_dir)
                    (finished if spec.rundir.finished() else missing).append(spec)
        specs.append(tuple(row))
    if conflicts:
        raise _conflicts(conflicts)
    other_code = check_finished_data(finished)
    steps = {spec.run_dir: run_steps(spec, progress) for spec in missing}
    missing.sort(key=lambda spec: -steps[spec.run_dir] * _flops(spec))
    return Plan(preset, tuple(grids), tuple(specs), tuple(missing), steps, other_code)


def _conflicts(found: Sequence[tuple[Path, RunDirConflict]]) -> RunDirConflict:
    """One line for every folder of the plan that holds another run: the first's reason, and how
    many more there are under which folder (runs of an earlier code are usually all of them)."""
    (first, e), more = found[0], len(found) - 1
    if not more:
        return e
    under = os.path.commonpath([str(d) for d, _ in found])
    return RunDirConflict(f"{e} And {more} more run folder(s) of this plan under {under} hold another run "
                          f"(each refused alike; delete them, or that folder, to retrain)")


def run_steps(spec: RunSpec, progress: bool = False) -> int:
    """Optimizer steps of one run: ``train.max_steps``, else one epoch of its training windows
    (:func:`studylib.run.spec.epoch_steps`: the data loaded once per process)."""
    if spec.preset.train.max_steps is not None:
        return spec.preset.train.max_steps
    if progress:  # show the tokenizer / token cache being built, if it is
        from studylib.data.pipeline import shared_data

        shared_data(spec.preset.data, progress=True)
    return epoch_steps(spec.preset)


def _flops(spec: RunSpec) -> float:
    from studylib.config.accounting import train_flops_per_token

    return train_flops_per_token(spec.preset.model_config(spec.model), spec.preset.data.context)


def check_finished_data(finished: Sequence[RunSpec]) -> dict:
    """Refuse finished runs whose recorded corpus fingerprint is not the stories their preset
    reads now (:func:`studylib.run.provenance.check_reuse`): a study never mixes runs of two
    corpora. Checked when the stories are local files (read once per data config: ~0.03 s for
    the shared subset); a hub corpus is not re-read (that needs the network), nor are runs trained
    before fingerprints existed. Returns ``{run dir: recorded fingerprints}`` of the runs another
    code trained (or before code fingerprints existed), for
    :func:`studylib.run.provenance.flag_reused`."""
    corpora: dict = {}
    other_code = {}
    for spec in finished:
        recorded = (spec.rundir.summary() or {}).get("provenance") or {}
        if code_differs(recorded):
            other_code[spec.run_dir] = recorded
        if not recorded.get("corpus_sha256"):
            continue
        cfg = spec.preset.data
        if cfg not in corpora:
            corpora[cfg] = fingerprint_now(cfg)
        if corpora[cfg] is not None:
            check_reuse(spec.run_dir, recorded, {"corpus_sha256": corpora[cfg]})
    return other_code


__all__ = ["Grid", "MAX_RUNS", "Plan", "check_finished_data", "check_plan_size", "plan_runs", "plan_size", "run_key",
           "run_steps"]
