"""A run directory whose ``metrics.jsonl`` holds hand-written router statistics (no training):
the routing frames (test_frames) and routing tables (test_routing) read it."""
from __future__ import annotations

import math

import pytest

from studylib.run.rundir import RunDir


def _eval_record(step, shares_per_layer, logz=1.0, dense_first=False):
    """An eval record as the trainer writes it; the stored busiest / usage_var are deliberately
    wrong (they are recomputed from the shares)."""
    router = [None] if dense_first else []
    for sh in shares_per_layer:
        router.append({"shares": sh, "busiest": 0.99, "usage_var": 0.5, "entropy": 1.0, "top1": 0.5,
                       "margin": 0.1, "logz": logz})
    return {"kind": "eval", "step": step, "tokens": step * 100, "val_loss": 2.0, "val_ppl": math.exp(2.0),
            "train_loss": 2.1, "lr": 1e-3, "tok_per_s": 1.0, "elapsed_s": 1.0, "eval_s": 0.1, "full": False,
            "router": router}


@pytest.fixture
def eval_record():
    """Builds an eval record: ``eval_record(step, [shares of each routed layer], logz, dense_first)``."""
    return _eval_record


@pytest.fixture
def routed_run(tmp_path):
    """(run directory, its records): a dense layer 0, then layer 1 collapsing at step 20 and a
    balanced-ish layer 2; a torn last line, as a crash leaves it."""
    recs = [
        {"kind": "train", "step": 1, "train_loss": 3.0, "lr": 1e-3},
        _eval_record(10, [[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]], logz=2.0, dense_first=True),
        {"kind": "train", "step": 11, "train_loss": 2.5, "lr": 1e-3},
        _eval_record(20, [[0.97, 0.01, 0.01, 0.01], [0.4, 0.2, 0.2, 0.2]], logz=1.5, dense_first=True),
    ]
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir(parents=True)
    for r in recs:
        rd.append_metrics(r)
    with open(rd.metrics_path, "a") as f:
        f.write('{"kind": "eval", "step": 99')
    return rd, recs
