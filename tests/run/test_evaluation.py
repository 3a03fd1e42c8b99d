"""Tests of studylib.run.evaluation: window-weighted validation loss and router statistics."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from _tiny import synthetic_data, tiny_preset
from studylib.nn.model import Decoder
from studylib.run.evaluation import _tree_add, _tree_scale, evaluate


def test_tree_mean_of_router_stats():
    acc = _tree_add(None, [None, {"a": 1.0, "s": [1.0, 0.0], "name": "x"}], 2)
    acc = _tree_add(acc, [None, {"a": 4.0, "s": [0.0, 1.0], "name": "y"}], 1)
    out = _tree_scale(acc, 1 / 3)
    assert out[0] is None and out[1]["a"] == pytest.approx(2.0) and out[1]["name"] == "x"
    assert out[1]["s"] == pytest.approx([2 / 3, 1 / 3])


def test_evaluate_is_the_window_mean_whatever_the_batching(one_thread):
    """Batches of 5 (the last one short) give the mean over windows, not over batches; the
    model's train/eval mode is restored."""
    data = synthetic_data(n_windows=60, val=11)
    torch.manual_seed(0)
    model = Decoder(tiny_preset().model_config("moe")).train()
    idx, cpu = data.val_idx, torch.device("cpu")
    one = [evaluate(model, data, idx[i:i + 1], 1, cpu, None)["val_loss"] for i in range(len(idx))]
    ev = evaluate(model, data, idx, 5, cpu, None)
    assert model.training and ev["n_windows"] == 11
    assert ev["val_loss"] == pytest.approx(np.mean(one), rel=1e-5)
    assert len(ev["router"]) == 2 and sum(ev["router"][0]["shares"]) == pytest.approx(1.0)
