"""Make sure a grid of runs (models x seeds) exists: reuse finished runs, train the missing ones.

``ensure_runs(preset, models, seeds, jobs)`` is what every notebook calls before it reads runs:

* a finished run (``summary.json`` with ``finished: true`` and the same config hash) is reused;
  a run directory holding a *different* configuration is an error raised before anything trains;
* the data (tokenizer + token cache) is prepared once, up front, in this process, so parallel
  workers never race to build the cache;
* ``jobs == 1`` trains in this process (one run after the other); ``jobs > 1`` starts ``jobs``
  training workers (``python -m studylib train-worker``, :mod:`studylib.study.worker`; at most one
  per missing run) and hands each the next missing run as it becomes free. A worker trains run
  after run in one process (saving the ~4 s a fresh process spends importing torch before each
  run) with ``cores // jobs`` torch/OpenMP threads and, when several GPUs are visible, its own GPU
  (``CUDA_VISIBLE_DEVICES`` round-robin over the job slots). Each run's output goes to
  ``<run_dir>/train.log``. Each worker leads its own process group (a terminal's Ctrl-C reaches
  this process, which stops them) and gets SIGTERM from the kernel if this process dies, even by
  SIGKILL (``PR_SET_PDEATHSIG``), so none outlives the sweep;
* one overall progress bar (``tqdm.auto``) counts runs;
* a failed run (or a worker that dies) stops the sweep (the other workers are stopped; they resume later from their
  last checkpoint) with an error naming the model, the seed, the log file and its last lines.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

import yaml

from studylib.config import ConfigError, Preset, load_preset, override, run_document, to_dict
from studylib.config.presets import Overrides
from studylib.run.rundir import RunDir
from studylib.study.frames import collect_runs
from studylib.study.worker import LOG_FILE



class SweepError(RuntimeError):
    """A training run of the sweep failed; the message names the model, seed and log file."""


def _unique(items: Iterable) -> list:
    out = []
    for x in items:
        if x not in out:
            out.append(x)
    return out


def available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def default_jobs(preset: Preset) -> int:
    """``study.jobs`` of the preset (1 if unset)."""
    j = preset.study.get("jobs", 1)
    if not isinstance(j, int) or isinstance(j, bool) or j < 1:
        raise ConfigError(f"study.jobs: must be a positive integer, got {j!r}")
    return j


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # pragma: no cover
        return 0


def _log_tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + ln for ln in lines[-n:]) or "    (empty log)"


@dataclass
class _Job:
    model: str
    seed: int
    run_dir: Path
    overrides: Overrides = None


@dataclass
class _Worker:
    """One job slot: a ``studylib train-worker`` process and the job it is training (if any)."""

    proc: subprocess.Popen
    errlog: Path
    job: Optional[_Job] = None


def plan_runs(preset: Preset, models: Sequence[str], seeds: Sequence[int], overrides=None,
              tag: Optional[str] = None) -> tuple[list, list]:
    """(finished, missing) lists of (model, seed, run_dir) of ``preset`` + ``overrides`` (see
    :meth:`RunDir.variant`). A run dir holding another config raises."""
    finished, missing = [], []
    varied = override(preset, overrides)
    for m in models:
        mcfg = varied.model_config(m)  # validates the name (clear error for a typo)
        for s in seeds:
            rd = RunDir.variant(preset, m, s, overrides, tag)
            rd.check(run_document(varied, mcfg, m, s))
            (finished if rd.finished() else missing).append((m, s, rd.path))
    return finished, missing


def _child_params_file(preset: Preset, tmpdir: str) -> str:
    """A preset file the workers can load to get exactly ``preset``: its own file when that
    still describes it, else a resolved copy written to ``tmpdir``."""
    if preset.path and Path(preset.path).is_file():
        try:
            if load_preset(preset.path) == preset:
                return str(Path(preset.path).resolve())
        except ConfigError:
            pass
    raw = to_dict(preset)
    raw.pop("path", None)
    raw["seeds"] = list(raw["seeds"])
    for key in ("data_dir", "cache_dir"):  # as this process resolves them (the copy lives elsewhere)
        v = raw["data"].get(key)
        if isinstance(v, str) and not os.path.isabs(v):
            raw["data"][key] = os.path.abspath(v)
    path = Path(tmpdir) / "params" / f"{preset.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def worker_command(params_file: str, threads: int) -> list[str]:
    """The command line of one job slot's training worker (:mod:`studylib.study.worker`)."""
    return [sys.executable, "-m", "studylib", "train-worker", "--params", params_file, "--threads", str(threads)]


def epoch_steps(preset: Preset) -> int:
    """Optimizer steps of the preset's own schedule: ``train.max_steps`` when set, else one epoch
    of its training windows (builds or loads the data cache to count them)."""
    if preset.train.max_steps is not None:
        return preset.train.max_steps
    from studylib.run.data import load_data
    from studylib.run.optim import total_steps_for

    return total_steps_for(preset.train, len(load_data(preset.data, progress=False).train_idx))


def budget_overrides(preset: Preset, epochs: float) -> dict:
    """Overrides that train ``epochs`` times the preset's own schedule (:func:`epoch_steps`) as a
    run of its own (its own warmup and cosine to its own end): ``{"train.max_steps": N}``, or
    ``{}`` for ``epochs == 1`` (the preset's runs themselves, reused)."""
    if not epochs > 0:
        raise ConfigError(f"budget: epochs must be > 0, got {epochs!r}")
    if epochs == 1:
        return {}
    return {"train.max_steps": max(1, round(epochs * epoch_steps(preset)))}


@dataclass(frozen=True)
class Grid:
    """One group of runs for :func:`ensure_grids`: ``models x seeds`` (default: the preset's
    seeds) of the preset + ``overrides``, in ``runs/<model>/<tag>/`` (see :func:`ensure_runs`)."""

    models: Sequence[str]
    seeds: Optional[Sequence[int]] = None
    overrides: Overrides = None
    tag: Optional[str] = None


def ensure_runs(preset: Preset, models: Sequence[str], seeds: Optional[Sequence[int]] = None,
                jobs: Optional[int] = None, overrides=None, progress: bool = True, tag: Optional[str] = None):
    """Summaries (one row per run, as :func:`studylib.study.frames.collect_runs`) of ``models x seeds``
    trained under ``preset`` + ``overrides``, training whatever is missing (see the module
    docstring). A variant's runs live in ``runs/<model>/<tag>/seed<seed>`` unless the overrides
    leave a run's identity unchanged (then the preset's own run is reused); ``tag`` defaults to
    :func:`~studylib.config.variant_tag` of the overrides. ``jobs=None``: ``study.jobs``."""
    return ensure_grids(preset, [Grid(models, seeds, overrides, tag)], jobs=jobs, progress=progress)[0]


def ensure_grid(preset: Preset, grid: Grid, jobs: Optional[int] = None, progress: bool = True):
    """:func:`ensure_runs` of one :class:`Grid`."""
    return ensure_grids(preset, [grid], jobs=jobs, progress=progress)[0]


def ensure_grids(preset: Preset, grids: Sequence[Grid], jobs: Optional[int] = None,
                 progress: bool = True) -> list:
    """:func:`ensure_runs` of several grids (e.g. budgets or learning rates) at once: one frame per
    grid, in order. Their missing runs share one queue, longest first (optimizer steps x training
    FLOPs per token), so a job slot idles only at the very end, not at the end of every grid."""
    jobs = default_jobs(preset) if jobs is None else int(jobs)
    if jobs < 1:
        raise ConfigError(f"ensure_runs: jobs must be >= 1, got {jobs}")
    plans, runs, missing = [], set(), []
    for g in grids:
        models = _unique(g.models)
        seeds = _unique(g.seeds if g.seeds is not None else override(preset, g.overrides).seeds)
        if not models or not seeds:
            raise ConfigError("ensure_runs: give at least one model and one seed")
        finished, todo = plan_runs(preset, models, seeds, g.overrides, g.tag)
        plans.append((g, models, seeds))
        runs |= {Path(rd) for _, _, rd in finished}
        missing += [_Job(m, s, Path(rd), g.overrides) for m, s, rd in todo if Path(rd) not in runs]
        runs |= {Path(rd) for _, _, rd in todo}  # a run two grids share is trained once
    total = len(runs)
    if missing:
        from tqdm.auto import tqdm

        from studylib.run.data import DataMemo

        datas = DataMemo(progress)
        for j in missing:  # once, before any worker starts
            datas.get(override(preset, j.overrides).data)
        missing.sort(key=lambda j: -_cost(preset, j, datas))
        bar = tqdm(total=total, initial=total - len(missing), unit="run", desc=f"{preset.name} runs",
                   disable=not progress, dynamic_ncols=True)
        try:
            if jobs == 1:
                _train_in_process(preset, missing, datas, bar, progress)
            else:
                _train_parallel(preset, missing, min(jobs, len(missing)), bar)
        finally:
            bar.close()
    frames = []
    for g, models, seeds in plans:
        df = collect_runs(preset, models, seeds, overrides=g.overrides, tag=g.tag)
        if df.attrs.get("missing"):
            raise SweepError(f"runs still missing after the sweep: {df.attrs['missing']}")
        frames.append(df)
    return frames


def _cost(preset: Preset, job: _Job, datas) -> float:
    """A job's expected training cost for the queue order: optimizer steps x FLOPs per token."""
    from studylib.config.accounting import train_flops_per_token
    from studylib.run.optim import total_steps_for

    p = override(preset, job.overrides)
    steps = total_steps_for(p.train, len(datas.get(p.data).train_idx))
    return steps * train_flops_per_token(p.model_config(job.model), p.data.context)


def _train_in_process(preset, missing, datas, bar, progress) -> None:
    from studylib.run.trainer import train_run

    for job in missing:
        bar.set_postfix_str(f"{job.model} seed{job.seed}")
        p = override(preset, job.overrides)
        try:
            train_run(p, job.model, job.seed, run_dir=job.run_dir, progress=progress, data=datas.get(p.data))
        except Exception as e:
            raise SweepError(f"training {job.model} seed {job.seed} failed ({job.run_dir}): "
                             f"{type(e).__name__}: {e}") from e
        bar.update(1)


def _start_worker(slot: int, params_file: str, threads: int, gpus: int, tmpdir: str) -> _Worker:
    """Launch job slot ``slot``'s worker (its own stderr, before and between runs, goes to a file
    in ``tmpdir``; each run's output goes to the run's own log)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if gpus > 1:
        env["CUDA_VISIBLE_DEVICES"] = str(slot % gpus)
    errlog = Path(tmpdir) / f"worker{slot}.log"
    with open(errlog, "w") as err:
        proc = subprocess.Popen(worker_command(params_file, threads), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, env=env, text=True, bufsize=1, start_new_session=True,
                                preexec_fn=die_with_parent)
    return _Worker(proc, errlog)


def _assign(worker: _Worker, job: _Job) -> None:
    worker.job = job
    req = {"model": job.model, "seed": job.seed, "run_dir": str(job.run_dir), "overrides": job.overrides}
    try:
        worker.proc.stdin.write(json.dumps(req) + "\n")
        worker.proc.stdin.flush()
    except (BrokenPipeError, OSError):
        pass  # the worker is gone: its reply pipe reports end-of-file, handled as a crash


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """``preexec_fn`` of a training worker: the kernel sends it SIGTERM when this process dies,
    however it dies (SIGKILL included), so no worker trains on unseen after a killed sweep; its
    run resumes from its last checkpoint on the next sweep. Linux only (elsewhere a no-op)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _collect(worker: _Worker) -> None:
    """Read ``worker``'s reply to its job; raise :class:`SweepError` (naming the model, seed and
    log) unless the run finished."""
    job, line = worker.job, worker.proc.stdout.readline()
    worker.job = None
    log = job.run_dir / LOG_FILE
    if not line:  # the worker died mid-run (killed, out of memory, a crash in native code)
        rc = worker.proc.wait()
        raise SweepError(f"training {job.model} seed {job.seed} failed: its worker process exited with code {rc}; "
                         f"its log is {log}. Last lines:\n{_log_tail(log)}\nWorker:\n{_log_tail(worker.errlog, 5)}")
    reply = json.loads(line)
    if not reply.get("ok"):
        raise SweepError(f"training {job.model} seed {job.seed} failed ({reply.get('error')}); its log is {log}. "
                         f"Last lines:\n{_log_tail(log)}")
    if not RunDir(job.run_dir).finished():
        raise SweepError(f"training {job.model} seed {job.seed} ended without a finished summary; its log is "
                         f"{log}. Last lines:\n{_log_tail(log)}")


def _stop(workers: list) -> None:
    """The end, a failure or an interrupt: close the workers' request pipes (an idle worker
    exits), stop the busy ones and their own children (each leads its own process group; their
    runs resume later from the last checkpoint), and wait for all of them."""
    import signal

    for w in workers:
        try:
            w.proc.stdin.close()
        except OSError:
            pass
        if w.job is not None and w.proc.poll() is None:
            try:
                os.killpg(w.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                w.proc.terminate()
    for w in workers:
        try:
            w.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover
            w.proc.kill()
            w.proc.wait()
        w.proc.stdout.close()


def _train_parallel(preset, missing, slots: int, bar) -> None:
    threads = max(1, available_cores() // slots)
    gpus = _gpu_count()
    queue = list(missing)
    workers: list[_Worker] = []
    shown = ""
    with tempfile.TemporaryDirectory(prefix="studylib-sweep-") as tmp:
        params_file = _child_params_file(preset, tmp)
        try:
            workers = [_start_worker(slot, params_file, threads, gpus, tmp) for slot in range(slots)]
            while queue or any(w.job for w in workers):
                for w in workers:
                    if w.job is None and queue:
                        _assign(w, queue.pop(0))
                busy = [w for w in workers if w.job is not None]
                now = ", ".join(f"{w.job.model} s{w.job.seed}" for w in busy)
                if now != shown:
                    bar.set_postfix_str(now)
                    shown = now
                ready, _, _ = select.select([w.proc.stdout for w in busy], [], [], 1.0)
                for w in busy:
                    if w.proc.stdout in ready:
                        _collect(w)
                        bar.update(1)
        finally:
            _stop(workers)


__all__ = ["ensure_runs", "ensure_grid", "ensure_grids", "Grid", "plan_runs", "budget_overrides", "epoch_steps", "worker_command", "SweepError",
           "available_cores", "default_jobs", "LOG_FILE"]
