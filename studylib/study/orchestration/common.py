"""What the trainer of a plan (:mod:`.train`), its Dask client (:mod:`.cluster`) and the workers
(:mod:`.worker`) share: the errors a sweep stops with and the cores this process may use. A leaf:
it imports none of them, so they import one way (sweep -> cluster -> worker / scheduler -> here)."""
from __future__ import annotations

import os

from studylib.config import ConfigError


class SweepError(RuntimeError):
    """A training run of the sweep failed: the message names the model, the seed and the log file
    (which holds the traceback). A known error: the CLI prints its one line and exits with 2."""


class ClusterError(ConfigError):
    """The Dask cluster cannot train the sweep: no Dask scheduler answers at the address, the
    connection to it went (the scheduler was killed), or a worker is refused (other code, torch or
    threads; it cannot see the outputs; it runs several tasks). The message names the scheduler or
    the worker and what to fix: one line, exit 2, nothing trained on a refused worker."""


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


__all__ = ["SweepError", "ClusterError", "available_cores"]
