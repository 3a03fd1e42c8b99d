"""Tests of studylib.data.windows: the training batch stream (epochs of ceil(n / batch) steps, the
last one partial) and the evaluation subset."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from _tiny import TINY_RAW, synthetic_data, tiny_preset
from studylib.config import TrainConfig
from studylib.run import checkpoint as C
from studylib.data.windows import BatchSampler, eval_subset
from studylib.run.optim import total_steps_for, warmup_steps


def _step_windows(s: BatchSampler, step: int) -> np.ndarray:
    return np.concatenate([s.indices(step, m) for m in range(s.grad_accum)])


def test_batches_pure_function_of_seed_step_micro():
    idx = np.arange(100, 200, dtype=np.int64)
    a, b = BatchSampler(idx, 7, 8, 2), BatchSampler(idx, 7, 8, 2)
    assert np.array_equal(a.indices(5, 1), b.indices(5, 1))
    assert not np.array_equal(a.indices(5, 1), BatchSampler(idx, 8, 8, 2).indices(5, 1))
    # 2x8 and 1x16 read the same windows per optimizer step, the partial last step included
    one = BatchSampler(idx, 7, 16, 1)
    for s in range(14):
        assert np.array_equal(_step_windows(a, s), one.indices(s, 0))


@pytest.mark.parametrize("B, accum", [(8, 2), (16, 1), (4, 4), (10, 1), (5, 2)])
def test_every_window_once_per_epoch_and_the_last_step_takes_the_rest(B, accum):
    """100 windows: ceil(100 / (B*accum)) steps per epoch; the last one reads exactly the windows
    the others left (fewer than B*accum, none repeated); the next epoch starts with a full step in
    a new order, and covers every window once again."""
    idx = np.arange(1000, 1100, dtype=np.int64)
    s = BatchSampler(idx, 3, B, accum)
    per, S = B * accum, -(-100 // (B * accum))
    assert s.steps_per_epoch == S == total_steps_for(TrainConfig(batch_size=B, grad_accum=accum), 100)
    for epoch in (0, 1):
        steps = [_step_windows(s, epoch * S + l) for l in range(S)]
        seen = np.concatenate(steps)
        assert len(seen) == 100 and np.array_equal(np.sort(seen), idx)  # each window exactly once
        assert all(len(x) == per for x in steps[:-1])
        assert len(steps[-1]) == 100 - (S - 1) * per == s.step_windows(epoch * S + S - 1)
        assert s.windows_before((epoch + 1) * S) == (epoch + 1) * 100
    assert not np.array_equal(_step_windows(s, 0), _step_windows(s, S))  # a new permutation


@pytest.mark.parametrize("world", [1, 2, 3])
def test_micro_batch_weights_sum_to_one_per_step(world):
    """The weights of a step's micro-batches over all ranks sum to 1 and are proportional to the
    windows read: the step's loss is the mean over its windows, also in the partial last step
    (100 = 6 x 16 + 4: the last step's second micro-batch is empty)."""
    s = BatchSampler(np.arange(100, dtype=np.int64), 7, 8, 2)
    for step in (0, 5, 6, 7):
        parts = [s.micro_batch(step, m, r, world) for m in range(2) for r in range(world)]
        assert sum(w for _, w in parts) == pytest.approx(1.0)
        n = s.step_windows(step)
        assert all(w == len(mine) / n for mine, w in parts)
        assert sorted(np.concatenate([mine for mine, _ in parts]).tolist()) == sorted(_step_windows(s, step).tolist())
    assert s.step_windows(6) == 4 and len(s.indices(6, 1)) == 0


def test_paper_epoch_is_26073_steps_with_782_warmup():
    """834,322 train windows / (16 x 2) = 26,072.6: 26,073 steps, the last with the 18 windows
    left; 3% warmup = round(782.19) = 782 steps."""
    paper = TrainConfig()  # batch 16, accumulation 2, warmup 3%, as SPEC section 6
    assert total_steps_for(paper, 834_322) == 26_073
    assert warmup_steps(26_073, paper) == 782
    s = BatchSampler(np.arange(834_322, dtype=np.int64), 1337, 16, 2)
    assert s.step_windows(26_071) == 32 and s.step_windows(26_072) == 18
    assert s.windows_before(26_073) == 834_322 and s.step_windows(26_073) == 32  # epoch 2 starts full


def test_eval_subset_is_fixed_and_shared():
    val = np.arange(1000, 1100, dtype=np.int64)
    s1, s2 = eval_subset(val, 10, 1337), eval_subset(val, 10, 1337)
    assert np.array_equal(s1, s2) and len(np.unique(s1)) == 10 and np.all(np.diff(s1) > 0)
    assert np.array_equal(eval_subset(val, None, 1337), val)
    assert np.array_equal(eval_subset(val, 500, 1337), val)


def test_data_position_locates_the_stream():
    s = BatchSampler(np.arange(100, dtype=np.int64), 7, 8, 2)  # 7 steps per epoch, the last of 4
    assert s.data_position(6) == {"step": 6, "windows": 96, "epoch": 0, "offset": 96, "seed": 7}
    assert s.data_position(7) == {"step": 7, "windows": 100, "epoch": 1, "offset": 0, "seed": 7}
    assert s.data_position(9) == {"step": 9, "windows": 132, "epoch": 1, "offset": 32, "seed": 7}
    assert s.position(9, 1) == 140 and s.position(6, 1) == 100  # (empty micro-batch at the end)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("B, accum", [(8, 2), (4, 4)])
def test_trainer_last_partial_step_loss_is_the_mean_over_the_remaining_windows(tmp_path, B, accum):
    """One epoch of 376 training windows at 16 per step: 24 steps, the last reads the 8 windows
    left (with 2x8 its second micro-batch is empty, with 4x4 the last two). Its logged training
    loss is the mean CE over those 8 windows under the weights before it, not 8/16 of it; the
    summary counts the tokens actually read."""
    from studylib.nn.model import Decoder
    from studylib.run import trainer as T
    from studylib.run.rundir import RunDir

    data = synthetic_data()
    assert len(data.train_idx) == 376
    preset = tiny_preset(model={**TINY_RAW["model"], "dropout": 0.0},
                         train={"max_steps": None, "batch_size": B, "grad_accum": accum, "eval_every": 1,
                                "keep_checkpoints": True})
    run = RunDir(tmp_path / "r")
    s = T.train_run(preset, "dense", 1, run_dir=run.path, progress=False, data=data)
    assert s["steps"] == 24 and s["tokens"] == 376 * (data.context - 1)
    last = [r for r in run.read_metrics(kind="train") if r["step"] == 24][0]
    assert last["tokens"] == s["tokens"]
    model = Decoder(preset.model_config("dense"))
    model.load_state_dict(C.load(C.snapshot_path(run.checkpoints, 23))["model"])
    sampler = BatchSampler(data.train_idx, 1, B, accum)
    rest = _step_windows(sampler, 23)
    assert len(rest) == 8
    w = data.windows(rest)
    with torch.no_grad():
        expected = float(model(w[:, :-1], w[:, 1:]).loss)
    assert last["train_loss"] == pytest.approx(expected, abs=1e-5)
