"""What the terminal shows while a notebook trains: the runs in flight, their step and an ETA.

:class:`RunWatcher` polls the run directories of a preset (``<outputs>/<preset>/runs/<model>/
seed<N>/`` and variants' ``runs/<model>/<tag>/seed<N>/``) from a background thread while papermill executes a notebook. A run is *in flight*
when its ``metrics.jsonl`` changed since the watcher started and it has no finished summary; its
step is the last record's (of :meth:`studylib.run.rundir.RunDir.metric_lines`: a line being written
now is no warning here), its total
``train.max_steps`` of its ``config.yaml``, its ETA the step rate seen so far.

On a terminal it prints a compact status line at most every ``interval`` seconds (when it
changed); elsewhere (CI, a log file) one line each time the *set* of runs in flight changes.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from studylib.run.layout import run_dirs
from studylib.run.rundir import RunDir


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class RunWatcher:
    def __init__(self, runs_root: os.PathLike, echo: Callable[[str], None], tty: bool,
                 interval: float = 5.0):
        self.root = Path(runs_root)
        self.echo, self.tty, self.interval = echo, tty, interval
        self.t0 = time.time()
        self.first: dict = {}  # run name -> (time, step) when first seen in flight
        self.shown = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def in_flight(self) -> list[tuple[str, int, Optional[int], Optional[float]]]:
        """(name, step, total steps or None, ETA seconds or None) of each run in flight."""
        out = []
        now = time.time()
        for path in run_dirs(self.root):
            rd = RunDir(path)
            metrics = rd.metrics_path
            try:
                if metrics.stat().st_mtime < self.t0:
                    continue
            except OSError:
                continue
            if rd.finished():
                continue
            recs = [json.loads(line) for line in rd.metric_lines()]
            step = max((int(r.get("step") or 0) for r in recs if isinstance(r.get("step"), (int, float))), default=0)
            name = " ".join(metrics.parent.relative_to(self.root).parts)
            t_first, s_first = self.first.setdefault(name, (now, step))
            total = self._total(rd)
            rate = (step - s_first) / (now - t_first) if now > t_first else 0.0
            eta = (total - step) / rate if total and rate > 0 else None
            out.append((name, step, total, eta))
        return out

    @staticmethod
    def _total(rd: RunDir) -> Optional[int]:
        try:
            doc = rd.read_config() or {}
            total = doc.get("preset", {}).get("train", {}).get("max_steps")
            return int(total) if total else None
        except Exception:  # a config being written, or unreadable: no total, no ETA
            return None

    def status(self, runs: list) -> str:
        parts = []
        for name, step, total, eta in runs:
            part = f"{name} {step}/{total}" if total else f"{name} step {step}"
            parts.append(part + (f" eta {_duration(eta)}" if eta is not None else ""))
        return "training: " + ", ".join(parts) if parts else ""

    def poll(self) -> None:
        """Print the status if it should be shown now (see the module docstring)."""
        runs = self.in_flight()
        key = self.status(runs) if self.tty else tuple(r[0] for r in runs)
        if key != self.shown:
            self.shown = key
            if runs:
                self.echo(self.status(runs))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception:  # the status line must never break the study
                pass

    def __enter__(self) -> "RunWatcher":
        self._thread = threading.Thread(target=self._loop, name="run-watcher", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
