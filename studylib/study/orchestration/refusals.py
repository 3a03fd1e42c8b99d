"""The workers a sweep leaves out: those that joined the Dask cluster after the sweep checked its
workers (:meth:`studylib.study.orchestration.cluster.Cluster.check_workers`) and refused a run
(other code, torch or threads, or without the shared folders:
:func:`studylib.study.orchestration.worker.train_task`).

A refusal is one warning line, the first time a worker refuses; the run is queued again on the
workers not left out (Dask has no "any worker but these", so the task names the workers there
now), and a run whose named workers have all gone is queued again on those there then. With no
worker left, the refusal stops the study as before (one line, exit 2).
"""
from __future__ import annotations

import sys
from typing import Optional


class LeftOut:
    """The workers left out of one sweep on ``client`` (:attr:`workers`), and the workers each
    queued-again task may run on (:attr:`allowed`, by task key)."""

    def __init__(self, client):
        self.client = client
        self.workers: set = set()
        self.allowed: dict = {}

    def add(self, reply: dict) -> None:
        """A worker refused a run (``reply``: the task's, with ``refused`` and ``worker``): one warning
        line the first time."""
        worker = reply.get("worker")
        if worker in self.workers:
            return
        self.workers.add(worker)
        from tqdm.auto import tqdm

        tqdm.write(f"warning: {reply['refused']}; that worker is left out, the other workers train its runs",
                   file=sys.stderr)

    def _connected(self) -> set:
        return set(self.client.scheduler_info(n_workers=-1)["workers"])

    def choice(self) -> Optional[list]:
        """The workers a task queued again may run on: those connected now and not left out (None:
        there are none)."""
        return sorted(self._connected() - self.workers) or None

    def stale(self, keys) -> list:
        """The task keys among ``keys`` queued again whose workers have all gone."""
        keys = [k for k in keys if k in self.allowed]
        if not keys:
            return []
        there = self._connected()
        return [k for k in keys if not self.allowed[k] & there]


__all__ = ["LeftOut"]
