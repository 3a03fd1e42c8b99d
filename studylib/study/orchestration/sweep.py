"""Make sure a grid of runs (models x seeds) exists: reuse finished runs, train the missing ones.

``ensure_grids(preset, grids, jobs)`` is what a comparison (:mod:`studylib.study.comparisons`)
calls before it reads runs; it returns the runs' :class:`~studylib.run.spec.RunSpec` handles, which
the frames read (:func:`studylib.study.analysis.frames.runs_frame`) without resolving them again:

* each run is resolved once into a :class:`~studylib.run.spec.RunSpec` (its own preset, model,
  seed and run directory: :func:`plan_runs`); a finished run (``summary.json`` with
  ``finished: true`` and the same config hash) is reused; a run directory holding a *different*
  configuration is an error raised before anything trains;
* the data (tokenizer + token cache) is prepared once, up front, in this process, so workers
  never race to build the cache;
* the missing runs form one queue, longest first. ``jobs == 1`` (and no scheduler) trains them in
  this process, one after the other. Otherwise they train on Dask distributed
  (:mod:`studylib.study.orchestration.cluster`): a LocalCluster of ``jobs`` one-thread worker processes here
  (each with ``cores // jobs`` torch threads; at most one per missing run), or the cluster at
  ``--scheduler`` / ``$STUDYLIB_SCHEDULER`` / ``study.scheduler``. Each run's output goes to
  ``<run_dir>/train.log``;
* one overall progress bar (``tqdm.auto``) counts runs; its status names the runs in flight and
  their step;
* a failed run stops the sweep with an error naming the model, the seed, the log file and its last
  lines (the other runs stop too and resume later from their last checkpoint).
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from studylib.config import ConfigError, Preset, override, override_pairs
from studylib.config.presets import Overrides
from studylib.data.split import fingerprint_now
from studylib.run.layout import outputs_root
from studylib.run.provenance import check_reuse, code_differs, flag_reused
from studylib.run.spec import RunSpec
from studylib.study.orchestration.common import ClusterError, SweepError, available_cores


def _unique(items: Iterable) -> list:
    out = []
    for x in items:
        if x not in out:
            out.append(x)
    return out


def default_jobs(preset: Preset) -> int:
    """``study.jobs`` of the preset (1 if unset)."""
    return preset.study.jobs


SCHEDULER_ENV = "STUDYLIB_SCHEDULER"


def scheduler_address(preset: Preset, scheduler: Optional[str] = None) -> Optional[str]:
    """Where the runs train: ``scheduler`` (``--scheduler``), else ``$STUDYLIB_SCHEDULER``, else
    the preset's ``study.scheduler``; None: here (a LocalCluster, or this process for one job)."""
    for value, where in ((scheduler, "--scheduler"), (os.environ.get(SCHEDULER_ENV), SCHEDULER_ENV),
                         (preset.study.scheduler, "study.scheduler")):
        if value is None or value == "":
            continue
        if not isinstance(value, str) or ":" not in value:
            raise ConfigError(f"{where}: expected a Dask scheduler address like tcp://host:8786, got {value!r}")
        return value.strip()
    return None


def run_key(model: str, seed: int, overrides=None, tag: Optional[str] = None) -> tuple:
    """What names one run of a sweep before it is resolved: model, seed, the overrides (as
    written) and the tag; two grids that share a run give it the same key."""
    return model, int(seed), tuple((k, repr(v)) for k, v, _ in override_pairs(overrides)), tag


def plan_runs(preset: Preset, models: Sequence[str], seeds: Sequence[int], overrides=None,
              tag: Optional[str] = None, resolved: Optional[dict] = None) -> tuple[list[RunSpec], list[RunSpec]]:
    """(finished, missing) runs of ``models x seeds`` of ``preset`` + ``overrides``, each resolved
    once (:meth:`RunSpec.resolve`; ``resolved``: the runs other grids of the same sweep resolved,
    keyed by model, seed, overrides and tag, filled as resolved). A run dir holding another config
    raises."""
    resolved = {} if resolved is None else resolved
    finished, missing = [], []
    for m in models:
        for s in seeds:
            key = run_key(m, s, overrides, tag)
            if key not in resolved:
                spec = RunSpec.resolve(preset, m, s, overrides, tag)
                spec.rundir.check(spec.document())
                resolved[key] = spec
            spec = resolved[key]
            (finished if spec.rundir.finished() else missing).append(spec)
    return finished, missing


@dataclass(frozen=True)
class Grid:
    """One group of runs for :func:`ensure_grids`: ``models x seeds`` (default: the preset's
    seeds) of the preset + ``overrides``, in ``runs/<model>/<tag>/`` (see :func:`ensure_runs`)."""

    models: Sequence[str]
    seeds: Optional[Sequence[int]] = None
    overrides: Overrides = None
    tag: Optional[str] = None

    def seeds_of(self, preset: Preset) -> list[int]:
        """The grid's seeds (default: the preset's, or those the grid's overrides set), each once."""
        if self.seeds is not None:
            return _unique(self.seeds)
        sets_seeds = any(k == "seeds" for k, _, _ in override_pairs(self.overrides))
        return _unique(override(preset, self.overrides).seeds if sets_seeds else preset.seeds)


def ensure_runs(preset: Preset, models: Sequence[str], seeds: Optional[Sequence[int]] = None,
                jobs: Optional[int] = None, overrides=None, progress: bool = True, tag: Optional[str] = None,
                scheduler: Optional[str] = None) -> list[RunSpec]:
    """The runs (:class:`~studylib.run.spec.RunSpec`, models x seeds order) of ``models x seeds``
    trained under ``preset`` + ``overrides``, training whatever is missing (see the module
    docstring). A variant's runs live in ``runs/<model>/<tag>/seed<seed>`` unless the overrides
    leave a run's identity unchanged (then the preset's own run is reused); ``tag`` defaults to
    :func:`~studylib.config.variant_tag` of the overrides. ``jobs=None``: ``study.jobs``."""
    return ensure_grids(preset, [Grid(models, seeds, overrides, tag)], jobs=jobs, progress=progress,
                        scheduler=scheduler)[0]


def ensure_grid(preset: Preset, grid: Grid, jobs: Optional[int] = None, progress: bool = True,
                scheduler: Optional[str] = None) -> list[RunSpec]:
    """:func:`ensure_runs` of one :class:`Grid`."""
    return ensure_grids(preset, [grid], jobs=jobs, progress=progress, scheduler=scheduler)[0]


def ensure_grids(preset: Preset, grids: Sequence[Grid], jobs: Optional[int] = None,
                 progress: bool = True, scheduler: Optional[str] = None) -> list[list[RunSpec]]:
    """:func:`ensure_runs` of several grids (e.g. budgets or learning rates) at once: one list of
    finished runs per grid (models x seeds order), in order, each run resolved once by
    :func:`plan_runs`. Their missing runs share one queue, longest first (optimizer steps x training
    FLOPs per token), so a job slot idles only at the very end, not at the end of every grid.
    ``scheduler``: a Dask scheduler's address (default: :func:`scheduler_address`)."""
    jobs = default_jobs(preset) if jobs is None else int(jobs)
    if jobs < 1:
        raise ConfigError(f"ensure_runs: jobs must be >= 1, got {jobs}")
    address = scheduler_address(preset, scheduler)
    plans, runs, missing, corpora, reused, resolved = [], set(), [], {}, {}, {}
    for g in grids:
        models = _unique(g.models)
        seeds = g.seeds_of(preset)
        if not models or not seeds:
            raise ConfigError("ensure_runs: give at least one model and one seed")
        finished, todo = plan_runs(preset, models, seeds, g.overrides, g.tag, resolved)
        reused.update(check_finished_data(finished, corpora))  # the stories read once for every grid
        order = {(spec.model, spec.seed): spec for spec in finished + todo}
        plans.append([order[(m, s)] for m in models for s in seeds])
        runs |= {spec.run_dir for spec in finished}
        missing += [spec for spec in todo if spec.run_dir not in runs]
        runs |= {spec.run_dir for spec in todo}  # a run two grids share is trained once
    flag_reused(reused)  # one line for the runs other code trained
    total = len(runs)
    if missing:
        from tqdm.auto import tqdm

        from studylib.data.pipeline import DataMemo

        datas = DataMemo(progress)
        steps = {spec.run_dir: _steps(spec, datas) for spec in missing}  # the data: once, before any worker starts
        missing.sort(key=lambda spec: -steps[spec.run_dir] * _flops(spec))
        bar = tqdm(total=total, initial=total - len(missing), unit="run", desc=f"{preset.name} runs",
                   disable=not progress, dynamic_ncols=True)
        try:
            if jobs == 1 and address is None:
                _train_in_process(missing, datas, bar, progress)
            else:
                _train_on_cluster(preset, missing, min(jobs, len(missing)), address, steps, bar, progress)
        finally:
            bar.close()
    unfinished = [spec.label for specs in plans for spec in specs if not spec.rundir.finished()]
    if unfinished:
        raise SweepError(f"runs still missing after the sweep: {unfinished}")
    return plans


def check_finished_data(finished: Sequence[RunSpec], corpora: Optional[dict] = None) -> dict:
    """Refuse finished runs whose recorded corpus fingerprint is not the stories their preset
    reads now (:func:`studylib.run.provenance.check_reuse`): a study never mixes runs of two
    corpora. Checked when the stories are local files (read once per data config: ~0.03 s for
    the shared subset); a hub corpus is not re-read (that needs the network), nor are runs trained
    before fingerprints existed. ``corpora``: ``{data config: sha256 or None}``, filled as read.
    Returns ``{run dir: recorded fingerprints}`` of the runs another code trained (or before code
    fingerprints existed), for :func:`studylib.run.provenance.flag_reused`."""
    corpora = {} if corpora is None else corpora
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


def _steps(spec: RunSpec, datas) -> int:
    from studylib.run.optim import total_steps_for

    return total_steps_for(spec.preset.train, len(datas.get(spec.preset.data).train_idx))


def _flops(spec: RunSpec) -> float:
    from studylib.config.accounting import train_flops_per_token

    return train_flops_per_token(spec.preset.model_config(spec.model), spec.preset.data.context)


def _train_in_process(missing: Sequence[RunSpec], datas, bar, progress: bool) -> None:
    from studylib.run.trainer import train_spec

    for spec in missing:
        bar.set_postfix_str(f"{spec.model} seed{spec.seed}")
        try:
            train_spec(spec, progress=progress, data=datas.get(spec.preset.data))
        except ConfigError:  # another process trains the run, other data or code: one line, exit 2 (a known error)
            raise
        except Exception as e:
            raise SweepError(f"training {spec.label} failed ({spec.run_dir}): {type(e).__name__}: {e}") from e
        bar.update(1)


def _train_on_cluster(preset: Preset, missing: Sequence[RunSpec], slots: int, address: Optional[str],
                      steps: dict, bar, progress: bool) -> None:
    from studylib.study.orchestration.cluster import Cluster, Markers  # here: importing distributed takes ~1.5 s

    shown = {"at": 0.0}
    every = 2.0 if sys.stderr.isatty() else 10.0  # a log file gets a line every 10 s

    def tick(running: list) -> None:
        if time.monotonic() - shown["at"] >= every:
            shown["at"] = time.monotonic()
            bar.set_postfix_str(", ".join(f"{s.model} s{s.seed} {_step(s)}/{steps[s.run_dir]}" for s in running))

    runs_root = Path(os.path.abspath(outputs_root(preset) / preset.name / "runs"))
    echo = bar.write if progress else (lambda msg: None)
    with Markers(runs_root, [spec.preset.data.cache_dir for spec in missing]) as markers, \
            Cluster(slots, address, echo) as cluster:
        cluster.check_workers(markers.files)
        cluster.train(missing, markers.files, on_done=lambda spec: bar.update(1), on_tick=tick)


def _step(spec: RunSpec) -> int:
    lines = spec.rundir.metric_lines()
    try:
        return int(json.loads(lines[-1]).get("step") or 0) if lines else 0
    except (ValueError, AttributeError):
        return 0


__all__ = ["ensure_runs", "ensure_grid", "ensure_grids", "Grid", "run_key", "plan_runs", "check_finished_data", "SweepError",
           "ClusterError",
           "available_cores", "default_jobs", "scheduler_address", "SCHEDULER_ENV"]
