"""TensorBoard event files from a run's ``metrics.jsonl`` (written after the run, idempotently).

``python -m studylib tensorboard --runs DIR [--force]``: every run directory under ``DIR``
(:func:`studylib.run.layout.run_dirs`, those holding a ``metrics.jsonl``) gets one event file
beside it, ``events.out.tfevents.metrics``, so ``tensorboard --logdir outputs/<preset>/runs``
shows each run as ``<model>/seed<N>`` and overlays a sweep. An event file written from the
``metrics.jsonl`` as it is now (it carries that file's modification time) is left alone
(``--force`` rewrites it); a new one is written beside the run and swapped in whole. The study
(:func:`studylib.study.runner.notebooks.run_study`, after its notebooks) and the ``train`` command
call :func:`after_runs` once their runs finished.

Every number a record holds becomes one scalar at the record's optimizer step:

* ``train/<field>`` for a training record (``train_loss``, ``lr``, ``aux_loss``, ``grad_norm``);
* ``eval/<field>`` for an evaluation record (``val_loss``, ``val_ppl``, ``train_loss``, ``lr``,
  ``tok_per_s``, ``elapsed_s``, ...);
* ``layer<i>/<stat>`` for layer i's router statistics at an evaluation (``busiest``, ``entropy``,
  ``logz``, ``top1``, ``margin``, ``usage_var``, ``bias_picked``, ...), and
  ``layer<i>/<stat>/e<e>`` for each expert of a per-expert list (``shares``, ``bias``, ...).

Booleans and strings are left out. The wall time of a record is the run's measured ``elapsed_s``
(interpolated by step between evaluations), counted from the file's last write. Needs the
optional ``tensorboard`` package (``pip install -e '.[tensorboard]'``); without it the command
fails with one line saying so.
"""
from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Optional

from studylib.config import ConfigError
from studylib.run import metrics_file
from studylib.run.layout import METRICS_FILE, run_dirs
from studylib.storage.files import move_into_place

EVENT_FILE = "events.out.tfevents.metrics"
_SKIP = ("kind", "step")


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def require() -> None:
    if not available():
        raise ConfigError("tensorboard: the optional package is not installed; "
                          "pip install -e '.[tensorboard]' (or make setup) to write event files")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def scalars(rec: dict) -> Iterator[tuple[str, float]]:
    """(tag, value) of every finite number in one ``metrics.jsonl`` record."""
    kind = rec.get("kind", "train")
    for k, v in rec.items():
        if k not in _SKIP and _number(v):
            yield f"{kind}/{k}", float(v)
    for i, layer in enumerate(rec.get("router") or []):
        for k, v in (layer or {}).items():
            if _number(v):
                yield f"layer{i}/{k}", float(v)
            elif isinstance(v, (list, tuple)):
                for e, x in enumerate(v):
                    if _number(x):
                        yield f"layer{i}/{k}/e{e}", float(x)


def _wall_times(records: list[dict], end: float) -> list[float]:
    """Each record's wall time: ``end`` minus the run's last measured ``elapsed_s``, plus the
    elapsed time at the record's step (linear in the step between measurements)."""
    known = sorted({(int(r["step"]), float(r["elapsed_s"])) for r in records if _number(r.get("elapsed_s"))})
    if not known:
        return [end] * len(records)
    known = [(0, 0.0)] + [p for p in known if p[0] > 0]
    t0 = end - known[-1][1]
    out = []
    for r in records:
        s = int(r["step"])
        lo = max((p for p in known if p[0] <= s), default=known[0])
        hi = min((p for p in known if p[0] >= s), default=None)
        if hi is None:  # after the last measurement: the last rate
            rate = known[-1][1] / known[-1][0] if known[-1][0] else 0.0
            out.append(t0 + known[-1][1] + (s - known[-1][0]) * rate)
        elif hi[0] == lo[0]:
            out.append(t0 + lo[1])
        else:
            out.append(t0 + lo[1] + (s - lo[0]) * (hi[1] - lo[1]) / (hi[0] - lo[0]))
    return out


def up_to_date(run_dir: os.PathLike) -> bool:
    """The event file was written from this ``metrics.jsonl``: it carries the metrics file's
    modification time (set when written)."""
    d = Path(run_dir)
    ev, m = d / EVENT_FILE, d / METRICS_FILE
    return ev.is_file() and m.is_file() and ev.stat().st_mtime_ns == m.stat().st_mtime_ns


def write_run(run_dir: os.PathLike, force: bool = False) -> Optional[Path]:
    """Write ``run_dir``'s event file from its ``metrics.jsonl``; the file, or None when it was
    already up to date (and not ``force``)."""
    require()
    from torch.utils.tensorboard import SummaryWriter

    d = Path(run_dir)
    metrics = d / METRICS_FILE
    if not metrics.is_file():
        raise ConfigError(f"{d}: no {METRICS_FILE}; expected a run directory")
    if not force and up_to_date(d):
        return None
    stamp_ns = metrics.stat().st_mtime_ns  # read first: a record appended meanwhile means a rewrite later
    records = [r for r in metrics_file.read(metrics) if _number(r.get("step"))]
    walls = _wall_times(records, stamp_ns / 1e9)
    tmp = Path(tempfile.mkdtemp(prefix=".tensorboard-", dir=d))
    try:
        w = SummaryWriter(log_dir=str(tmp))
        for rec, wall in zip(records, walls):
            for tag, v in scalars(rec):
                w.add_scalar(tag, v, global_step=int(rec["step"]), walltime=wall)
        w.close()
        (written,) = list(tmp.glob("events.out.tfevents.*"))
        os.utime(written, ns=(stamp_ns, stamp_ns))
        move_into_place(written, d / EVENT_FILE)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return d / EVENT_FILE


def write_all(root: os.PathLike, force: bool = False) -> tuple[list[Path], list[Path]]:
    """(the runs written, the runs already up to date) under ``root``."""
    require()
    if not Path(root).is_dir():
        raise ConfigError(f"--runs {root}: not a folder; expected a folder of run directories "
                          "(e.g. outputs/ci/runs)")
    written, kept = [], []
    for d in (d for d in run_dirs(root) if (d / METRICS_FILE).is_file()):
        (written if write_run(d, force) else kept).append(d)
    return written, kept


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def add_cli(parser) -> None:
    parser.add_argument("--runs", required=True, metavar="DIR",
                        help="a run directory or a folder of them, e.g. outputs/ci/runs")
    parser.add_argument("--force", action="store_true", help="rewrite event files that are up to date")


def after_runs(root: os.PathLike, echo=print) -> None:
    """The hook of the study and of the ``train`` command once runs finished: the event files of
    the runs under ``root``, and one line saying so (nothing without tensorboard installed). A
    run directory it cannot write (read-only, a full disk) is said in that line: the runs are
    fine, only their curves are missing (``python -m studylib tensorboard`` writes them later); so
    is a damaged ``metrics.jsonl`` (a run the study reuses was refused before, when it was planned)."""
    if available() and Path(root).is_dir():
        try:
            written, kept = write_all(root)
        except OSError as e:
            echo(f"tensorboard: event files not written under {root}: {e.filename}: {e.strerror}")
            return
        except ConfigError as e:  # a damaged metrics.jsonl (of a run no study reuses): said, not fatal
            echo(f"tensorboard: event files not written under {root}: {e}")
            return
        echo(f"tensorboard: {len(written)} event file(s) written, {len(kept)} up to date: "
             f"tensorboard --logdir {root}")


def run_cli(args) -> int:
    written, kept = write_all(args.runs, args.force)
    if not written and not kept:
        raise ConfigError(f"--runs {args.runs}: no run directory (a folder holding {METRICS_FILE}) under it")
    print(f"tensorboard: {len(written)} event file(s) written, {len(kept)} up to date under {args.runs}; "
          f"view with: tensorboard --logdir {args.runs}", file=sys.stdout)
    return 0
