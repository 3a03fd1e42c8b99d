"""The faster execution paths train the same model as the plain one to fp32 tolerance.

``model.lm_head_chunk`` (rows per logits matmul of the fused LM-head loss; 256 is ~1.05x faster at
the map's vocabularies: docs/performance.md#speed-of-a-training-step-at-the-maps-sizes) changes only the order of fp32 sums: a run
with chunks that do not divide the micro-batch (256 rows -> 5 x 48 + 16) logs the same
training losses and ends with the same weights as the default (2,048 rows: one chunk) after a
few steps, for a dense model and an MoE. (``train.compile``'s parity: tests/run/test_trainer.py.)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from _tiny import TINY_RAW, synthetic_data, tiny_preset
from studylib.config import override
from studylib.run import checkpoint as C
from studylib.run import trainer as T
from studylib.run.rundir import RunDir

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data():
    return synthetic_data()


def _losses(run) -> list[float]:
    return [r["train_loss"] for r in RunDir(run).read_metrics() if r["kind"] == "train"]


def _weights(run) -> dict:
    return C.load(Path(run) / "checkpoints" / "latest.pt")["model"]


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_lm_head_chunks_train_the_same_model(tmp_path, data, model):
    preset = tiny_preset(train={"max_steps": 4, "eval_every": 2, "grad_accum": 1},
                         model={**TINY_RAW["model"], "dropout": 0.0})
    plain = T.train_run(preset, model, 1, run_dir=tmp_path / "plain", progress=False, data=data)
    chunked = T.train_run(override(preset, {"model.lm_head_chunk": 48}), model, 1, run_dir=tmp_path / "chunked",
                          progress=False, data=data)
    la, lb = _losses(tmp_path / "plain"), _losses(tmp_path / "chunked")
    assert len(la) == 4 and np.allclose(la, lb, rtol=0, atol=1e-5)
    assert chunked["best_val_loss"] == pytest.approx(plain["best_val_loss"], abs=1e-5)
    wa, wb = _weights(tmp_path / "plain"), _weights(tmp_path / "chunked")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=1e-4)
    # the chunked run did run with its chunk (its stored config says so)
    assert "lm_head_chunk: 48" in RunDir(tmp_path / "chunked").config_path.read_text()
