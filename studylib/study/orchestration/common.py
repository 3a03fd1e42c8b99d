"""What the sweep (:mod:`.sweep`), its Dask client (:mod:`.cluster`) and the workers
(:mod:`.worker`) share: the error a sweep stops with and the cores this process may use. A leaf:
it imports none of them, so they import one way (sweep -> cluster -> worker -> here)."""
from __future__ import annotations

import os


class SweepError(RuntimeError):
    """A training run of the sweep failed (the message names the model, seed and log file), or the
    cluster cannot train the sweep (the message names the scheduler or the worker and what is
    wrong). A known error: the CLI prints its one line and exits with 2."""


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


__all__ = ["SweepError", "available_cores"]
