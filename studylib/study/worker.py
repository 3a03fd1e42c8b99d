"""A training worker of the parallel sweep: one process per job slot that trains run after run.

``python -m studylib train-worker --params FILE --threads N`` reads one JSON request per line on
stdin, ``{"model": ..., "seed": ..., "run_dir": ..., "overrides": ...}`` (overrides of the preset
for this run, e.g. ``{"train.max_steps": 100}``, or null), trains that run (as ``studylib train``
would: a finished run is reused, an unfinished one resumes) with everything it prints, file
descriptors 1 and 2 included, appended to ``<run_dir>/train.log``, and answers one JSON line on
its stdout: ``{"ok": true}`` or ``{"ok": false, "error": "<Type>: <message>"}`` (the traceback
is in the log). It exits when stdin closes.

Why a worker and not one ``studylib train`` process per run: a child spends ~4 s starting before
its first step (measured on the 2-core machine: importing torch ~2.1 s, and ``torch._dynamo``,
which the first AdamW imports, ~1.7 s), against ~60-80 s of training for a full ``cpu`` run; the
default study trains 80-odd runs. The preset is loaded once per worker, the data once per distinct
data section.

Each run starts from the same process state as a fresh ``studylib train``: the trainer seeds every
generator from the run's seed and restores the thread count it changed, and Python's "warn once"
memory is reset per run so each log has its own warnings (tests/study/test_sweep.py trains a run
after another in one worker and compares it with the run alone).
"""
from __future__ import annotations

import json
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Callable, Optional, TextIO

from studylib.config.presets import Overrides

LOG_FILE = "train.log"

TrainFn = Callable[[str, int, Path, Optional[Overrides]], dict]


def add_cli(parser) -> None:
    parser.add_argument("--params", required=True, help="preset YAML the runs belong to")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per run (0: torch's default)")


def run_cli(args) -> int:
    from studylib.config import load_preset, override
    from studylib.run.data import DataMemo
    from studylib.run.trainer import train_run

    preset = load_preset(args.params, [f"train.num_threads={args.threads}"] if args.threads > 0 else [])
    datas = DataMemo(progress=False)

    def train(model: str, seed: int, run_dir: Path, overrides: Optional[Overrides] = None) -> dict:
        p = override(preset, overrides)
        return train_run(p, model, seed, run_dir=run_dir, progress=False, data=datas.get(p.data))

    return serve(train)


def serve(train: TrainFn, requests: TextIO | None = None) -> int:
    """Answer every request line of ``requests`` (default stdin) with one reply line on the
    original stdout; between runs stray output goes to stderr, never into the replies."""
    requests = sys.stdin if requests is None else requests
    sys.stdout.flush()
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    for line in requests:
        if line.strip():
            req = json.loads(line)
            reply = train_logged(train, req["model"], int(req["seed"]), Path(req["run_dir"]), req.get("overrides"))
            replies.write(json.dumps(reply) + "\n")
    replies.close()
    return 0


def train_logged(train: TrainFn, model: str, seed: int, run_dir: Path, overrides: Optional[Overrides] = None) -> dict:
    """``train(model, seed, run_dir, overrides)`` with fds 1 and 2 appended to ``run_dir/train.log``; the
    reply ``{"ok": True}`` or ``{"ok": False, "error": ...}``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(run_dir / LOG_FILE, "a") as log:
        log.write(f"$ studylib train-worker (pid {os.getpid()}): {model} seed {seed} -> {run_dir}"
                  + (f" with {json.dumps(overrides)}" if overrides else "") + "\n")
        log.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            with warnings.catch_warnings():  # a fresh "warn once" memory for this run's log
                s = train(model, seed, run_dir, overrides)
            print(f"{model} seed {seed}: best val loss {s['best_val_loss']:.4f} at step {s.get('best_step')}; "
                  f"final {s.get('final_val_loss', float('nan')):.4f}; {s.get('steps')} steps")
            reply = {"ok": True}
        except Exception as e:
            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(e).__name__}: {' '.join(str(e).split())}"}
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return reply


__all__ = ["serve", "train_logged", "LOG_FILE"]
