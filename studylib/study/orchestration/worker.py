"""What runs on a Dask worker of the sweep (:mod:`studylib.study.orchestration.cluster` is the sweep's side).

* :class:`StudyPlugin`, registered on every worker: the torch threads a run gets (on a worker the
  sweep did not start: ``$STUDYLIB_THREADS``, else its share of its host's cores), the GPU a local
  worker owns, the data of each distinct data section loaded once per worker process, and Dask's
  housekeeping turned down (its profiler and its 20 ms tick took the GIL from the training loop).
  At set-up, before it gets work, it takes the worker's fingerprint: the ``studylib`` code and
  torch it imports and its thread count (:func:`studylib.run.provenance.of_code`), which the
  sweep reads (:func:`fingerprint`) and compares (:func:`fingerprint_error`);
* :func:`train_task`, one run: it checks that this worker sees the run directory and the data
  cache (:func:`visibility_error`) and runs the study's code, torch and threads (a worker that
  joined after the sweep's check), then trains the run with everything it prints appended to the
  run's ``train.log`` (:func:`train_logged`) and answers ``{"ok": True}`` or
  ``{"ok": False, "error": ...}`` (``"refused"``: one line, nothing trained, and ``"worker"``: its
  address, which the sweep then leaves out).
"""
from __future__ import annotations

import os
import socket
import sys
import traceback
import warnings
from pathlib import Path
from typing import Callable, Optional

from distributed import WorkerPlugin

from studylib.config import ConfigError
from studylib.run import provenance
from studylib.run.dirlock import RunDirLocked
from studylib.run.layout import LOG_FILE
from studylib.run.spec import RunSpec
from studylib.study.orchestration.common import available_cores

THREADS_ENV = "STUDYLIB_THREADS"  # a remote worker's torch threads (default: its share of the host's cores)
PLUGIN = "studylib"
SHARED_FS = ("outputs and the data cache must be on a filesystem every worker sees, at the same path "
             "(see docs/distributed.md, 'Runs on several machines')")



class StudyPlugin(WorkerPlugin):
    """Per-worker state (a Dask worker plugin): the torch threads a run gets, the GPU a local
    worker owns, and the data each distinct data section loaded once per worker process."""

    name = PLUGIN

    def __init__(self, threads: Optional[int] = None, per_host: Optional[dict] = None, gpus: int = 0):
        self.threads, self.per_host, self.gpus = threads, per_host or {}, gpus
        self.fingerprint: Optional[dict] = None

    def setup(self, worker) -> None:
        from distributed.comm import get_address_host

        if self.threads is None:  # a worker we did not start: its share of its host's cores
            env = os.environ.get(THREADS_ENV)
            share = available_cores() // max(1, self.per_host.get(get_address_host(worker.address), 1))
            self.threads = int(env) if env and env.isdigit() and int(env) > 0 else max(1, share)
        self.fingerprint = {**provenance.of_code(), provenance.THREADS: self.threads}
        for name in ("profile", "profile-cycle"):  # see cluster.QUIET_WORKERS
            pc = worker.periodic_callbacks.get(name)
            if pc is not None:
                pc.stop()
        tick = worker.periodic_callbacks.get("tick")
        if tick is not None:  # the event loop's health check: every 1 s, not every 20 ms
            tick.callback_time = max(tick.callback_time, 1000)
        if self.gpus:  # a LocalCluster worker on a GPU machine: GPU number <worker name> (before CUDA starts)
            os.environ["CUDA_VISIBLE_DEVICES"] = str(int(worker.name) % self.gpus)

    def data(self, cfg):
        from studylib.data.pipeline import shared_data

        return shared_data(cfg)


def visibility_error(markers: dict, where: str = "") -> Optional[str]:
    """None when this process sees every marker file (``{path: token}``, written by the sweep
    into the runs folder and the data cache) with its token; else one line naming the worker and
    the folder it cannot see."""
    for path, (what, token) in markers.items():
        try:
            seen = Path(path).read_text()
        except OSError:
            seen = None
        if seen != token:
            state = "missing" if seen is None else "another sweep's"
            return (f"worker {where or '?'} on host {socket.gethostname()} cannot see the {what} "
                    f"{Path(path).parent} (its marker file {Path(path).name} is {state}): {SHARED_FS}")
    return None


def fingerprint(dask_worker) -> Optional[dict]:
    """What this worker trains with (``client.run``): ``{code_sha256, torch_version, torch_threads}``
    from its :class:`StudyPlugin`."""
    return dask_worker.plugins[PLUGIN].fingerprint


def fingerprint_error(where: str, got: Optional[dict], expect: dict) -> Optional[str]:
    """None when a worker's fingerprint ``got`` is the study's ``expect`` (its code and torch are
    the study process's, its threads the study's workers'); else one line naming the worker and
    what differs."""
    got = got or {}
    diff = provenance.mismatches(expect, got, provenance.CODE_KEYS)
    if diff or not got.get("code_sha256"):
        return (f"worker {where} runs other code than this study ({'; '.join(diff) or 'no fingerprint reported'}; "
                f"this study -> the worker): its runs would train on other code under the same config hash. "
                f"Start it from the same studylib checkout and torch as the study, or stop it")
    threads, want = got.get(provenance.THREADS), expect.get(provenance.THREADS)
    if want is not None and threads != want:
        return (f"worker {where} trains with {threads} torch threads, this study's workers with {want}: fp32 "
                f"results differ between thread counts, so a study does not mix them; start every worker "
                f"with the same {THREADS_ENV}")
    return None


def train_task(spec: RunSpec, markers: dict, expect: dict) -> dict:
    """One run on a Dask worker (see the module docstring); the reply ``{"ok": ...}``. ``expect``:
    the fingerprint the study's runs train with (:func:`fingerprint_error`)."""
    from distributed import get_worker

    worker = get_worker()
    plugin = worker.plugins[PLUGIN]
    refused = visibility_error(markers, worker.address) or fingerprint_error(worker.address, plugin.fingerprint,
                                                                             expect)
    if refused:
        return {"ok": False, "refused": refused, "worker": worker.address}
    import torch

    torch.set_num_threads(plugin.threads)
    from studylib.run.trainer import train_spec

    return train_logged(lambda: train_spec(spec, progress=False, data=plugin.data(spec.preset.data)), spec,
                        f"dask worker {worker.address} (pid {os.getpid()}, {plugin.threads} torch threads)")


def train_logged(train: Callable[[], dict], spec: RunSpec, who: str) -> dict:
    """``train()`` with file descriptors 1 and 2 appended to the run's ``train.log``; the reply
    ``{"ok": True}`` or ``{"ok": False, "error": "<Type>: <message>"}`` (the traceback is in the log)."""
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(spec.run_dir / LOG_FILE, "a") as log:
        log.write(f"$ {who}: {spec.label} -> {spec.run_dir}\n")
        log.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            with warnings.catch_warnings():  # a fresh "warn once" memory for this run's log
                s = train()
            print(f"{spec.label}: best val loss {s['best_val_loss']:.4f} at step {s.get('best_step')}; "
                  f"final {s.get('final_val_loss', float('nan')):.4f}; {s.get('steps')} steps")
            reply = {"ok": True}
        except Exception as e:
            traceback.print_exc()
            line = " ".join(str(e).split())
            reply = {"ok": False, "error": f"{type(e).__name__}: {line}",
                     "locked": line if isinstance(e, RunDirLocked) else None,
                     "config": line if isinstance(e, ConfigError) else None}  # a known error: its own line
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return reply


def worker_visibility(markers: dict, dask_worker=None) -> Optional[str]:
    return visibility_error(markers, getattr(dask_worker, "address", ""))


__all__ = ["StudyPlugin", "train_task", "train_logged", "visibility_error", "worker_visibility", "fingerprint",
           "fingerprint_error", "PLUGIN", "THREADS_ENV"]
