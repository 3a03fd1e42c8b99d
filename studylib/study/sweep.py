"""Make sure a grid of runs (models x seeds) exists: reuse finished runs, train the missing ones.

``ensure_runs(preset, models, seeds, jobs)`` is what every notebook calls before it reads runs:

* a finished run (``summary.json`` with ``finished: true`` and the same config hash) is reused;
  a run directory holding a *different* configuration is an error raised before anything trains;
* the data (tokenizer + token cache) is prepared once, up front, in this process, so parallel
  children never race to build the cache;
* ``jobs == 1`` trains in this process (one run after the other); ``jobs > 1`` runs
  ``python -m studylib train ... --no-progress`` subprocesses, ``jobs`` at a time (at most one
  per missing run), each with ``cores // jobs`` torch/OpenMP threads and, when several GPUs are
  visible, its own GPU (``CUDA_VISIBLE_DEVICES`` round-robin over the job slots). Each child's
  stdout/stderr goes to ``<run_dir>/train.log``. Each child leads its own process group (a
  terminal's Ctrl-C reaches this process, which stops them) and gets SIGTERM from the kernel if
  this process dies, even by SIGKILL (``PR_SET_PDEATHSIG``), so none outlives the sweep;
* one overall progress bar (``tqdm.auto``) counts runs;
* a failed run stops the sweep (the other children are stopped; they resume later from their
  last checkpoint) with an error naming the model, the seed, the log file and its last lines.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

import yaml

from studylib.config import ConfigError, Preset, load_preset, override, run_document, to_dict
from studylib.run.rundir import RunDir
from studylib.study.frames import collect_runs

LOG_FILE = "train.log"


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
    proc: Optional[subprocess.Popen] = None
    log: Optional[object] = None
    slot: int = 0
    t0: float = 0.0


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
    """A preset file the children can load to get exactly ``preset``: its own file when that
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


def train_command(params_file: str, model: str, seed: int, run_dir: Path, threads: int) -> list[str]:
    return [sys.executable, "-m", "studylib", "train", "--params", params_file, "--model", model,
            "--seed", str(seed), "--run-dir", str(run_dir), "--no-progress",
            "--set", f"train.num_threads={threads}"]


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


def ensure_runs(preset: Preset, models: Sequence[str], seeds: Optional[Sequence[int]] = None,
                jobs: Optional[int] = None, overrides=None, progress: bool = True, tag: Optional[str] = None):
    """Summaries (one row per run, as :func:`studylib.study.frames.collect_runs`) of ``models x seeds``
    trained under ``preset`` + ``overrides``, training whatever is missing (see the module
    docstring). A variant's runs live in ``runs/<model>/<tag>/seed<seed>`` unless the overrides
    leave a run's identity unchanged (then the preset's own run is reused); ``tag`` defaults to
    :func:`~studylib.config.variant_tag` of the overrides. ``jobs=None``: ``study.jobs``."""
    base, preset = preset, override(preset, overrides)
    models = _unique(models)
    seeds = _unique(seeds if seeds is not None else preset.seeds)
    if not models or not seeds:
        raise ConfigError("ensure_runs: give at least one model and one seed")
    jobs = default_jobs(preset) if jobs is None else int(jobs)
    if jobs < 1:
        raise ConfigError(f"ensure_runs: jobs must be >= 1, got {jobs}")
    finished, missing = plan_runs(base, models, seeds, overrides, tag)
    if missing:
        from tqdm.auto import tqdm

        from studylib.run.data import load_data

        data = load_data(preset.data, progress=progress)  # once, before any child starts
        bar = tqdm(total=len(finished) + len(missing), initial=len(finished), unit="run",
                   desc=f"{preset.name} runs", disable=not progress, dynamic_ncols=True)
        try:
            if jobs == 1:
                _train_in_process(preset, missing, data, bar, progress)
            else:
                _train_parallel(preset, missing, min(jobs, len(missing)), bar)
        finally:
            bar.close()
    df = collect_runs(base, models, seeds, overrides=overrides, tag=tag)
    if df.attrs.get("missing"):
        raise SweepError(f"runs still missing after the sweep: {df.attrs['missing']}")
    return df


def _train_in_process(preset, missing, data, bar, progress) -> None:
    from studylib.run.trainer import train_run

    for m, s, rd in missing:
        bar.set_postfix_str(f"{m} seed{s}")
        try:
            train_run(preset, m, s, run_dir=rd, progress=progress, data=data)
        except Exception as e:
            raise SweepError(f"training {m} seed {s} failed ({rd}): {type(e).__name__}: {e}") from e
        bar.update(1)


def _start(job: _Job, params_file: str, threads: int, gpus: int) -> None:
    """Launch ``job``'s training child (its output appended to ``<run_dir>/train.log``)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if gpus > 1:
        env["CUDA_VISIBLE_DEVICES"] = str(job.slot % gpus)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    job.log = open(job.run_dir / LOG_FILE, "a")
    cmd = train_command(params_file, job.model, job.seed, job.run_dir, threads)
    job.log.write(f"$ {' '.join(cmd)}\n")
    job.log.flush()
    job.t0 = time.perf_counter()
    job.proc = subprocess.Popen(cmd, stdout=job.log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=die_with_parent)


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """``preexec_fn`` of a training child: the kernel sends it SIGTERM when this process dies,
    however it dies (SIGKILL included), so no child trains on unseen after a killed sweep; it
    resumes from its last checkpoint on the next sweep. Linux only (elsewhere a no-op)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _check_finished(job: _Job, rc: int) -> None:
    """Raise :class:`SweepError` (naming the model, seed and log) unless ``job`` ended well."""
    if rc != 0 or not RunDir(job.run_dir).finished():
        log = job.run_dir / LOG_FILE
        raise SweepError(f"training {job.model} seed {job.seed} failed (exit code {rc}); its log is "
                         f"{log}. Last lines:\n{_log_tail(log)}")


def _stop(running: list) -> None:
    """A failure or an interrupt: stop the other children and their own children (each leads
    its own process group), wait for them (they resume later), and close their logs."""
    import signal

    for job in running:
        if job.proc is not None and job.proc.poll() is None:
            try:
                os.killpg(job.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                job.proc.terminate()
    for job in running:
        if job.proc is not None:
            try:
                job.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # pragma: no cover
                job.proc.kill()
                job.proc.wait()
        if job.log is not None and not job.log.closed:
            job.log.close()


def _train_parallel(preset, missing, slots: int, bar) -> None:
    threads = max(1, available_cores() // slots)
    gpus = _gpu_count()
    queue = [_Job(m, s, Path(rd)) for m, s, rd in missing]
    running: list[_Job] = []
    free = list(range(slots))
    shown = ""
    with tempfile.TemporaryDirectory(prefix="studylib-sweep-") as tmp:
        params_file = _child_params_file(preset, tmp)
        try:
            while queue or running:
                while queue and free:
                    job = queue.pop(0)
                    job.slot = free.pop(0)
                    _start(job, params_file, threads, gpus)
                    running.append(job)
                now = ", ".join(f"{j.model} s{j.seed}" for j in running)
                if now != shown:
                    bar.set_postfix_str(now)
                    shown = now
                time.sleep(0.2)
                for job in [j for j in running if j.proc.poll() is not None]:
                    running.remove(job)
                    job.log.close()
                    free.append(job.slot)
                    _check_finished(job, job.proc.returncode)
                    bar.update(1)
        finally:
            _stop(running)


__all__ = ["ensure_runs", "plan_runs", "budget_overrides", "epoch_steps", "SweepError", "available_cores", "default_jobs", "LOG_FILE"]
