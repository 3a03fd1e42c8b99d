"""``metrics.jsonl``, one JSON record per line, appended as a run trains: reading it, appending to it
(a full disk is one line naming it) and making it hold exactly the records up to a checkpoint on
resume. Used through :class:`studylib.run.rundir.RunDir`, the one owner of a run directory.

Reading is strict (:func:`read`): a torn last line, what a kill or a full disk leaves mid-write,
is dropped with a warning naming the file; any other line that is not a JSON object, or a loss
field (``train_loss``, ``val_loss``, ``aux_loss``, ...) that is not a finite number, is
:class:`MetricsDamaged` naming the file and the line. Resuming (:func:`resume`) keeps the
parsable lines up to the checkpoint and rewrites the file from the checkpoint's copy of them."""
from __future__ import annotations

import errno
import json
import math
import os
import warnings
from pathlib import Path
from typing import Optional

from studylib.config import ConfigError
from studylib.storage.files import atomic_open, disk_full_error


class MetricsGap(ConfigError):
    """``metrics.jsonl`` lacks records written before the checkpoint and nothing can rebuild them."""


class MetricsDamaged(ConfigError):
    """``metrics.jsonl`` holds a line that is not a record a trainer writes (not the torn last one)."""


class TornLineWarning(UserWarning):
    """``metrics.jsonl`` ends in a torn line (a kill or a full disk mid-write); it was left out."""


def lines(path: Path) -> list[str]:
    """The lines of the file that are JSON objects (no newlines; any other line is left out): what
    a resume keeps before it restores the records from the checkpoint's copy, and what the
    progress display counts. Analysis reads :func:`read`."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            ok = isinstance(json.loads(line), dict)
        except json.JSONDecodeError:
            ok = False
        if ok:
            out.append(line)
    return out


def read(path: Path, kind: Optional[str] = None) -> list[dict]:
    """The records (optionally only ``kind`` "train" or "eval"), read strictly: a torn last line is
    left out with a :class:`TornLineWarning`; a line that is not a JSON object elsewhere, a record
    that is not an object, or a loss field that is not a finite number is :class:`MetricsDamaged`
    naming the file and the line number. No file: no records."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    last = max((i for i, line in enumerate(text) if line.strip()), default=-1)
    recs = []
    for i, line in enumerate(text):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if i == last:
                warnings.warn(f"{path}: line {i + 1} is torn (a kill or a full disk mid-write, {_shown(line)}); "
                              "left out", TornLineWarning, stacklevel=2)
                continue
            raise MetricsDamaged(f"{path}: line {i + 1} is not JSON ({e.msg}: {_shown(line)}); expected one "
                                 f"record per line as the trainer writes them; restore the file or delete the "
                                 f"run's folder to rerun it") from None
        problem = record_problem(rec)
        if problem:
            raise MetricsDamaged(f"{path}: line {i + 1}: {problem}; restore the file or delete the run's folder "
                                 "to rerun it")
        if kind is None or rec.get("kind") == kind:
            recs.append(rec)
    return recs


def record_problem(rec) -> Optional[str]:
    """What keeps ``rec`` from being a record a trainer writes (None: nothing): not a JSON object,
    one without its ``kind`` and ``step`` (``{}``), or a loss field (a key ending in ``loss``) that is not a finite number."""
    if not isinstance(rec, dict):
        return f"expected a JSON object (a record), got {_shown(json.dumps(rec))}"
    if not isinstance(rec.get("kind"), str) or "step" not in rec:
        return f"expected a record with its kind and step, got {_shown(json.dumps(rec))}"
    for key, value in rec.items():
        if key.endswith("loss") and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                         and math.isfinite(value)):
            return f"{key} is {value!r}; expected a finite number"
    return None


def _shown(line: str, most: int = 60) -> str:
    return repr(line if len(line) <= most else line[:most] + "...")


def append(path: Path, rec: dict) -> str:
    """Append ``rec`` as one line; returns the line written (its newline included)."""
    line = json.dumps(rec, default=json_default) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
    except OSError as e:  # a torn last line is skipped by readers and replaced on resume
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise disk_full_error(path, len(line), 0) from None
        raise
    return line


def resume(path: Path, run: os.PathLike, step: int, written: Optional[str],
           expected: dict[str, list[int]]) -> Optional[str]:
    """Make the file hold exactly the records up to optimizer step ``step`` (resuming run ``run``).

    ``written``: the lines the run had written up to ``step``, as its checkpoint carries them;
    the file is rewritten from them if it lacks or changed any (the message returned says so).
    Without that copy (an older checkpoint) the records left are checked against ``expected``
    ({"train": steps, "eval": steps}); a gap is :class:`MetricsGap`, never a silent loss.
    """
    kept = [line for line in lines(path) if _step_of(line) <= step]
    if written is not None:
        want = written.splitlines()
        _rewrite(path, want)
        if kept != want:
            return (f"{path}: restored its {len(want)} records up to step {step} from "
                    f"the checkpoint (the file held {len(kept)} of them)")
        return None
    have: dict[str, set] = {}
    for line in kept:
        rec = json.loads(line)
        have.setdefault(rec.get("kind"), set()).add(rec.get("step"))
    gaps = {k: [s for s in steps if s not in have.get(k, set())] for k, steps in expected.items()}
    gaps = {k: v for k, v in gaps.items() if v}
    if gaps:
        what = "; ".join(f"{k} records of steps {_short(v)}" for k, v in gaps.items())
        raise MetricsGap(f"{path}: lacks the {what}, written before the checkpoint at "
                         f"step {step}, and that checkpoint holds no copy of them; restore the file "
                         f"or delete {run} to rerun the run")
    _rewrite(path, kept)
    return None


def _rewrite(path: Path, keep: list[str]) -> None:
    with atomic_open(path, "w") as f:
        f.write("".join(line + "\n" for line in keep))


def _step_of(line: str) -> float:
    step = json.loads(line).get("step", 0)
    return step if isinstance(step, (int, float)) else float("inf")


def _short(steps: list[int]) -> str:
    return str(steps) if len(steps) <= 8 else f"[{', '.join(map(str, steps[:8]))}, ... ({len(steps)} in all)]"


def json_default(o):
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")

