"""Train a plan's missing runs (:class:`~studylib.study.orchestration.plan.Plan`, resolved,
checked and ordered before anything trains): :func:`train_plan`.

* the data of the missing runs (tokenizer + token cache) is prepared once, up front, in this
  process, so workers never race to build the cache;
* ``jobs == 1`` (and no scheduler) trains the runs in this process, one after the other, longest
  first. Otherwise they train on Dask distributed (:mod:`studylib.study.orchestration.cluster`): a
  LocalCluster of ``jobs`` one-thread worker processes here (each with ``cores // jobs`` torch
  threads; at most one per missing run), or the cluster at ``--scheduler`` /
  ``$STUDYLIB_SCHEDULER`` / ``study.scheduler``. Each run's output goes to ``<run_dir>/train.log``;
* one overall progress bar (``tqdm.auto``) counts runs; its status names the runs in flight and
  their step;
* a failed run stops the training with an error naming the model, the seed, the log file and its
  last lines (the other runs stop too and resume later from their last checkpoint); a run still
  unfinished afterwards is a :class:`SweepError`.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from studylib.config import ConfigError, Preset
from studylib.run.layout import outputs_root
from studylib.run.provenance import flag_reused
from studylib.run.spec import RunSpec
from studylib.study.orchestration.common import ClusterError, SweepError, available_cores
from studylib.study.orchestration.plan import Plan


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


def train_plan(plan: Plan, jobs: Optional[int] = None, progress: bool = True,
               scheduler: Optional[str] = None) -> None:
    """Train ``plan.missing`` (longest first; see the module docstring): here for ``jobs == 1``
    and no scheduler, else on Dask distributed (``scheduler``: a Dask scheduler's address; default
    :func:`scheduler_address`). ``jobs=None``: ``study.jobs``. Every run of the plan is finished
    afterwards, or a :class:`SweepError` names those that are not."""
    preset = plan.preset
    jobs = default_jobs(preset) if jobs is None else int(jobs)
    if jobs < 1:
        raise ConfigError(f"train: jobs must be >= 1, got {jobs}")
    address = scheduler_address(preset, scheduler)
    flag_reused(dict(plan.other_code))  # one line for the runs other code trained
    if plan.missing:
        from tqdm.auto import tqdm

        from studylib.data.pipeline import shared_data

        for cfg in dict.fromkeys(spec.preset.data for spec in plan.missing):  # before any worker starts
            shared_data(cfg, progress=progress)
        total = plan.runs
        bar = tqdm(total=total, initial=total - len(plan.missing), unit="run", desc=f"{preset.name} runs",
                   disable=not progress, dynamic_ncols=True)
        try:
            if jobs == 1 and address is None:
                _train_in_process(plan.missing, bar, progress)
            else:
                _train_on_cluster(preset, plan.missing, min(jobs, len(plan.missing)), address, plan.steps, bar,
                                  progress)
        finally:
            bar.close()
    unfinished = plan.unfinished()
    if unfinished:
        raise SweepError(f"runs still missing after the sweep: {unfinished}")


def _train_in_process(missing: Sequence[RunSpec], bar, progress: bool) -> None:
    from studylib.data.pipeline import shared_data
    from studylib.run.trainer import train_spec

    for spec in missing:
        bar.set_postfix_str(f"{spec.model} seed{spec.seed}")
        try:
            train_spec(spec, progress=progress, data=shared_data(spec.preset.data))
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

    runs_root = Path(os.path.abspath(outputs_root(preset) / preset.runs / "runs"))
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


__all__ = ["train_plan", "SweepError", "ClusterError", "available_cores",
           "default_jobs", "scheduler_address", "SCHEDULER_ENV"]
