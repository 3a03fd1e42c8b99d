"""Where a sweep's runs train: Dask distributed, on this machine or on a cluster.

:class:`Cluster` is a Dask client on either

* a ``LocalCluster`` started here (the default): ``slots`` worker processes of one thread each,
  each with ``cores // slots`` torch threads (``OMP_NUM_THREADS``), one GPU each when the machine
  has GPUs (then at most one worker per GPU). Closing it (the end, a failure, Ctrl-C) stops the
  workers, and a killed ``study`` takes them with it (Dask's worker processes exit when their
  parent dies); a run stopped that way resumes from its last checkpoint on the next sweep;
* or an existing scheduler (``--scheduler tcp://host:8786``, ``$STUDYLIB_SCHEDULER`` or
  ``study.scheduler``) whose workers were started with ``dask worker ADDRESS --nthreads 1``, on
  any machines that see the same outputs and data cache (a shared filesystem). Each worker trains
  one run at a time; a worker that declares ``--resources GPU=1`` takes the runs that need a GPU.
  An address where no Dask scheduler answers within :data:`SCHEDULER_TIMEOUT_S` is one error line
  (:func:`studylib.study.orchestration.scheduler.probe_scheduler`), not a wait.

Before anything is queued every worker reports what it trains with (the worker plugin's
fingerprint, :func:`studylib.study.orchestration.worker.fingerprint`): a worker whose ``studylib``
code or torch differs from this process's is refused, and so are workers of mixed torch thread
counts (the study's runs would differ in their last fp32 digits by worker; the study does not
mix them). The runs' tasks carry the fingerprint, so a worker that joins later is refused the same
way, alone: one warning line names it and the runs it refused go to the other workers
(:mod:`studylib.study.orchestration.refusals`; none left: the study's one error line). A task's
key is the run's identity (:func:`task_key`: preset, variant tag, model, seed and a digest of its
run directory and config hash), so two studies on one scheduler never share a task.
Whatever goes wrong on the way (the scheduler killed, a lost connection) is a
:class:`~studylib.study.orchestration.common.ClusterError`: one line, exit 2 from the CLI;
a run that fails is a :class:`~studylib.study.orchestration.common.SweepError` naming it and its log.

A run is one task (:func:`studylib.study.orchestration.worker.train_task`): it checks that its worker sees the run directory and the
data cache (:func:`visibility_error`, also run on every worker before anything is queued), trains
the run with the worker's torch threads and everything it prints appended to the run's
``train.log``, and answers ``{"ok": True}`` or ``{"ok": False, "error": ...}``. A run that fails
by itself is not retried. A worker that dies mid-run (killed, out of memory) has its run
rescheduled on another worker by the scheduler, where it resumes from the run's last checkpoint
(the run directory's lock is the kernel's, so it goes with the dead process); after
``distributed.scheduler.allowed-failures`` deaths (3) the run is given up.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from studylib.config import ConfigError
from studylib.run import provenance
from studylib.run.alloc import GUARD, fast_allocator_env
from studylib.run.dirlock import RunDirLocked
from studylib.run.layout import LOG_FILE
from studylib.run.spec import RunSpec
from studylib.study.orchestration.common import ClusterError, SweepError, available_cores
from studylib.study.orchestration.refusals import LeftOut
from studylib.study.orchestration.scheduler import SCHEDULER_TIMEOUT_S, one_line as _one_line, probe_scheduler
from studylib.study.orchestration.worker import (PLUGIN, THREADS_ENV, StudyPlugin, fingerprint, fingerprint_error,
                                                 train_task, worker_visibility)


# --------------------------------------------------------------------------------------------
# in the sweep's process
# --------------------------------------------------------------------------------------------
def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # pragma: no cover
        return 0


#: Dask's housekeeping that shares a worker process with a training run: its statistical profiler
#: samples the training thread's stack every 10 ms and its event loop ticks every 20 ms, each time
#: taking the GIL from a Python-heavy training loop (measured: 8% slower training on the 2-core
#: machine, two runs side by side). Off, or at a slow pace, in the clusters started here; workers
#: started elsewhere get the same from :class:`studylib.study.orchestration.worker.StudyPlugin`.
QUIET_WORKERS = {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
                 "distributed.admin.system-monitor.interval": "5s"}


def worker_environment(threads: int) -> dict:
    """The environment a local worker process starts with: ``threads`` OpenMP / MKL / OpenBLAS
    threads and the fast allocator (:func:`studylib.run.alloc.fast_allocator_env`; already in
    this process's environment when it was started by ``python -m studylib``)."""
    env = {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    fast = fast_allocator_env(os.environ) or {}
    env.update({k: v for k, v in fast.items() if k in ("LD_PRELOAD", "GLIBC_TUNABLES", GUARD)})
    return env


def needs_gpu(spec: RunSpec, gpus_available: bool) -> bool:
    """Whether a run asks its worker for a GPU: ``train.device`` cuda, or auto where the cluster
    has GPUs."""
    device = spec.preset.train.device
    return device.startswith("cuda") or (device == "auto" and gpus_available)


class Cluster:
    """A Dask client for one sweep (a context manager; see the module docstring). ``slots``: the
    LocalCluster's worker processes (ignored with ``address``)."""

    def __init__(self, slots: int = 1, address: Optional[str] = None, echo: Optional[Callable[[str], None]] = None,
                 wait_for_workers: float = 60.0):
        self.slots, self.address = max(1, int(slots)), address
        self.echo = echo or (lambda msg: None)
        self.wait_s = wait_for_workers
        self.cluster = self.client = None
        self.gpus = False
        self.expect: Optional[dict] = None  # what the runs train with (check_workers)
        self.where = f"scheduler {address}" if address else "the local Dask cluster"
        self._log_levels: dict = {}

    # ---- start / stop ----------------------------------------------------------------------
    def __enter__(self) -> "Cluster":
        # distributed's client logs a traceback for every failed reconnect before our one line: the
        # errors reach the sweep as one-line ClusterErrors instead (restored by close)
        for name in ("distributed", "distributed.client"):
            log = logging.getLogger(name)
            self._log_levels[name] = log.level
            log.setLevel(logging.CRITICAL)
        try:
            with self.connection():
                self._start()
        except BaseException:
            self.close(abort=True)
            raise
        return self

    @contextlib.contextmanager
    def connection(self):
        """Errors of the connection to the scheduler (it was killed, the network went) as one
        ClusterError line."""
        try:
            yield
        except (OSError, TimeoutError, asyncio.CancelledError) as e:
            raise ClusterError(f"{self.where}: the connection failed ({_one_line(e)}); is it still running? Run the "
                               f"sweep again once it is: its runs resume from their last checkpoints") from None

    def __exit__(self, exc_type, *exc) -> None:
        self.close(abort=exc_type is not None)

    def _start(self) -> None:
        import dask
        from distributed import Client, LocalCluster

        if self.address is None:
            gpus = gpu_count()
            slots = min(self.slots, gpus) if gpus else self.slots
            threads = max(1, available_cores() // slots)
            # worker-saturation 1.0: a worker holds only the run it trains, so the queue's order
            # (longest first) holds to the end and a worker that frees up takes the next run.
            # pre-spawn-environ: what a worker process starts with; Dask's default would also set
            # MALLOC_TRIM_THRESHOLD_=65536, which overrides the allocator studylib chose
            # (run/alloc.py), so the workers get that allocator and their thread count instead
            with dask.config.set({"distributed.scheduler.worker-saturation": 1.0,
                                  "distributed.nanny.pre-spawn-environ": worker_environment(threads),
                                  **QUIET_WORKERS}):
                self.cluster = LocalCluster(n_workers=slots, threads_per_worker=1, processes=True, memory_limit=0,
                                            resources={"GPU": 1} if gpus else None,
                                            silence_logs=logging.ERROR, dashboard_address=":8787")
            self.client = Client(self.cluster)
            self.client.register_plugin(StudyPlugin(threads=threads, gpus=gpus), name=PLUGIN)
            self.gpus = gpus > 0
            self.echo(f"training on a local Dask cluster: {slots} worker(s) x {threads} torch thread(s)"
                      + (", one GPU each" if gpus else "") + f"; dashboard {self.client.dashboard_link}")
            return
        probe_scheduler(self.address)
        try:
            self.client = Client(self.address, timeout=f"{SCHEDULER_TIMEOUT_S:.0f}s")
        except (OSError, TimeoutError) as e:
            raise ClusterError(f"scheduler {self.address}: cannot connect ({_one_line(e)}); start one with `dask "
                               f"scheduler` and workers with `dask worker {self.address} --nthreads 1`") from None
        try:
            self.client.wait_for_workers(1, timeout=self.wait_s)
        except TimeoutError:
            raise ClusterError(f"scheduler {self.address}: no worker joined within {self.wait_s:.0f} s; start one "
                               f"with `dask worker {self.address} --nthreads 1`") from None
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        crowded = [f"{a} ({w['nthreads']} threads)" for a, w in workers.items() if w.get("nthreads", 1) != 1]
        if crowded:
            raise ClusterError(f"scheduler {self.address}: worker {crowded[0]} runs several tasks at once; start "
                               "each worker with --nthreads 1 (it trains one run at a time with all its torch "
                               "threads)")
        per_host: dict = {}
        for w in workers.values():
            per_host[w["host"]] = per_host.get(w["host"], 0) + 1
        self.client.register_plugin(StudyPlugin(per_host=per_host), name=PLUGIN)
        self.gpus = any(w.get("resources", {}).get("GPU") for w in workers.values())
        self.echo(f"training on the Dask cluster at {self.address}: {len(workers)} worker(s) on "
                  f"{len(per_host)} host(s); dashboard {self.client.dashboard_link}")

    def close(self, abort: bool = False) -> None:
        """Stop this client and the LocalCluster's workers. ``abort`` (a failure, Ctrl-C): SIGTERM
        to the workers first, so no run goes on training during a graceful close (they resume
        later from their last checkpoint)."""
        if abort and self.cluster is not None:
            import signal

            for nanny in list(self.cluster.workers.values()):
                pid = getattr(nanny, "pid", None)
                if pid:
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except (ProcessLookupError, PermissionError):
                        pass
        for thing in (self.client, self.cluster):
            if thing is not None:
                try:
                    thing.close()
                except Exception:  # pragma: no cover - closing must not hide the real error
                    pass
        self.client = self.cluster = None
        for name, level in self._log_levels.items():
            logging.getLogger(name).setLevel(level)
        self._log_levels = {}

    # ---- the runs ----------------------------------------------------------------------------
    def check_workers(self, markers: dict) -> None:
        """Every connected worker sees every marker (:func:`visibility_error`) and trains with this
        process's code and torch and the same threads as the others (:meth:`check_fingerprints`),
        else a ClusterError."""
        with self.connection():
            self.check_fingerprints()
            for addr, err in sorted(self.client.run(worker_visibility, markers).items()):
                if err:
                    raise ClusterError(err)

    def check_fingerprints(self) -> dict:
        """The fingerprint the study's runs train with (``self.expect``): this process's code and
        torch, the workers' one thread count; a worker that differs is a ClusterError naming it."""
        mine = provenance.of_code()
        by_threads: dict = {}
        for addr, got in sorted(self.client.run(fingerprint, on_error="return").items()):
            got = None if isinstance(got, BaseException) else got  # an older studylib has no fingerprint
            err = fingerprint_error(addr, got, mine)
            if err:
                raise ClusterError(err)
            by_threads.setdefault(got[provenance.THREADS], []).append(addr)
        if len(by_threads) > 1:
            groups = "; ".join(f"{n} thread(s): {', '.join(addrs)}" for n, addrs in sorted(by_threads.items()))
            raise ClusterError(f"{self.where}: its workers train with different torch thread counts ({groups}): fp32 "
                               f"results differ between thread counts, so a study does not mix them; start every "
                               f"worker with the same {THREADS_ENV}")
        self.expect = {**mine, provenance.THREADS: next(iter(by_threads), None)}
        return self.expect

    def train(self, specs: Sequence[RunSpec], markers: dict, on_done: Callable[[RunSpec], None],
              on_tick: Callable[[list], None] = lambda running: None) -> None:
        """Train ``specs`` (in this order of priority); ``on_done(spec)`` after each finished run,
        ``on_tick(specs in flight)`` about every 2 s. The first failure raises a SweepError (a
        ClusterError when the cluster is at fault; the other runs are cancelled, those in flight on a
        LocalCluster stop with it)."""
        with self.connection():
            self._train(specs, markers, on_done, on_tick)

    def _train(self, specs, markers, on_done, on_tick) -> None:
        from distributed import wait

        expect = self.expect if self.expect is not None else self.check_fingerprints()
        left, futures, attempts = LeftOut(self.client), {}, {}
        priority = {spec.run_dir: len(specs) - i for i, spec in enumerate(specs)}

        def submit(spec: RunSpec, why: str = ""):  # why: a task queued again (refused, or its workers gone)
            workers = None
            if why:
                attempts[spec.run_dir] = attempts.get(spec.run_dir, 0) + 1
                workers = left.choice()
                if workers is None:
                    raise ClusterError(why)
            fut = self.client.submit(train_task, spec.portable() if self.address else spec, markers, expect,
                                     key=task_key(spec) + (f"-again{attempts[spec.run_dir]}" if why else ""),
                                     pure=False, priority=priority[spec.run_dir], retries=0, workers=workers,
                                     resources={"GPU": 1} if needs_gpu(spec, self.gpus) else None)
            futures[fut], by_key[fut.key] = spec, spec
            if workers:
                left.allowed[fut.key] = set(workers)
            pending.add(fut)

        by_key, pending = {}, set()
        for spec in specs:
            submit(spec)
        try:
            while pending:
                try:
                    wait(pending, timeout=2.0, return_when="FIRST_COMPLETED")
                except TimeoutError:
                    pass
                except Exception:  # cancelled futures (a scheduler restarted): _check names the run
                    pass
                done = {f for f in pending if f.status != "pending"}
                pending -= done
                for fut in sorted(done, key=list(futures).index):
                    spec = futures[fut]
                    reply = fut.result() if fut.status == "finished" else {}
                    if reply.get("refused"):  # a worker that joined later and differs: left out alone
                        left.add(reply)
                        submit(spec, reply["refused"])
                        continue
                    self._check(spec, fut, self.where)
                    on_done(spec)
                gone = set(left.stale([f.key for f in pending]))
                for fut in [f for f in pending if f.key in gone]:  # queued again, and its workers all gone
                    pending.discard(fut)
                    self.client.cancel([fut])
                    submit(futures[fut], f"{self.where}: no worker left to train {futures[fut].label} (those that "
                                         f"joined later were left out: other code, threads or folders)")
                if pending:
                    on_tick(self._in_flight(by_key))
        finally:
            if pending:
                self.client.cancel(list(pending))

    def _in_flight(self, by_key: dict) -> list:
        try:
            processing = self.client.processing()
        except Exception:  # pragma: no cover - a progress line must not break the sweep
            return []
        running = [by_key[k] for keys in processing.values() for k in keys if k in by_key]
        return [s for s in running if _locked(s)]  # assigned and started (a worker may hold a queued one)

    @staticmethod
    def _check(spec: RunSpec, fut, where: str) -> None:
        """One line for a run whose task did not end with a finished run (its traceback, if any, is
        in the run's log)."""
        log = spec.run_dir / LOG_FILE
        if fut.status == "cancelled":
            raise ClusterError(f"training {spec.label}: its task was cancelled ({where} stopped or restarted?); run "
                               f"the sweep again: the run resumes from its last checkpoint ({spec.run_dir})")
        exc = fut.exception() if fut.status == "error" else None
        if exc is not None:
            from distributed import KilledWorker

            if isinstance(exc, KilledWorker):
                raise SweepError(f"training {spec.label} failed: every worker that trained it died (Dask gives a run "
                                 f"up after `distributed.scheduler.allowed-failures` worker deaths); its log is {log}")
            raise SweepError(f"training {spec.label} failed ({_one_line(exc, 400)}); its log is {log}")
        reply = fut.result()
        if reply.get("locked"):  # another process trains this run: one line, exit 2 (a known error)
            raise RunDirLocked(reply["locked"])
        if reply.get("config"):  # other data or code than the run's checkpoint, ...: the same, its own line
            raise ConfigError(reply["config"])
        if not reply.get("ok"):
            raise SweepError(f"training {spec.label} failed ({reply.get('error')}); its log is {log}")
        if not spec.rundir.finished():
            raise SweepError(f"training {spec.label} ended without a finished summary in {spec.run_dir}; its log "
                             f"is {log}")


def _locked(spec: RunSpec) -> bool:
    """Whether a process holds the run's lock now (the holder's PID is in the lock file)."""
    try:
        return spec.rundir.lock_path.stat().st_size > 0
    except OSError:
        return False


def task_key(spec: RunSpec) -> str:
    """``train-<preset>[-<tag>]-<model>-seed<N>-<digest>``: the run's identity (its preset, the
    variant tag of its overrides, its model and seed) and 8 hex digits of its run directory and
    config hash, so no two runs share a Dask task, whichever study on the scheduler queues them;
    the same run queued twice (one run directory) is one task."""
    tag = spec.run_dir.parent.name if spec.run_dir.parent.name != spec.model else ""
    digest = hashlib.sha256(f"{spec.run_dir}\0{spec.document()['run']['config_hash']}".encode()).hexdigest()[:8]
    return f"train-{spec.preset.runs}" + (f"-{tag}" if tag else "") + f"-{spec.model}-seed{spec.seed}-{digest}"


class Markers:
    """The marker files a sweep writes into the folders every worker must see (the runs folder and
    each data cache), removed again at the end (a context manager; ``.files``: ``{path: (what,
    token)}`` for :func:`visibility_error`)."""

    def __init__(self, runs_root: Path, caches: Iterable[str]):
        token = secrets.token_hex(8)
        name = f".studylib-sweep-{token}"
        dirs = [("run directory", Path(runs_root))] + [("data cache", Path(c).resolve()) for c in dict.fromkeys(caches)]
        self.files = {str(d / name): (what, token) for what, d in dirs}

    def __enter__(self) -> "Markers":
        for path, (_, token) in self.files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(token)
        return self

    def __exit__(self, *exc) -> None:
        for path in self.files:
            try:
                os.unlink(path)
            except OSError:
                pass


__all__ = ["Cluster", "Markers", "QUIET_WORKERS", "SCHEDULER_TIMEOUT_S", "probe_scheduler", "task_key",
           "worker_environment", "needs_gpu", "gpu_count"]
