"""Tests of studylib.run.batches: the training batch stream and the evaluation subset."""
from __future__ import annotations

import numpy as np

from studylib.run.batches import BatchSampler, eval_subset


def test_batches_pure_function_of_seed_step_micro():
    idx = np.arange(100, 200, dtype=np.int64)
    a, b = BatchSampler(idx, 7, 8, 2), BatchSampler(idx, 7, 8, 2)
    assert np.array_equal(a.indices(5, 1), b.indices(5, 1))
    assert not np.array_equal(a.indices(5, 1), BatchSampler(idx, 8, 8, 2).indices(5, 1))
    # one epoch = 100 // 16 = 6 steps: no window repeats within it, all from the train set
    seen = np.concatenate([a.indices(s, m) for s in range(6) for m in range(2)])
    assert len(np.unique(seen)) == len(seen) == 96 and set(seen) <= set(idx.tolist())
    # the stream crosses into epoch 1 with a new permutation (position 96..111 straddles it)
    straddle = a.indices(6, 0)
    assert len(straddle) == 8 and set(straddle) <= set(idx.tolist())
    # 2x8 and 1x16 read the same windows per optimizer step
    one = BatchSampler(idx, 7, 16, 1)
    for s in range(4):
        assert np.array_equal(np.concatenate([a.indices(s, 0), a.indices(s, 1)]), one.indices(s, 0))


def test_eval_subset_is_fixed_and_shared():
    val = np.arange(1000, 1100, dtype=np.int64)
    s1, s2 = eval_subset(val, 10, 1337), eval_subset(val, 10, 1337)
    assert np.array_equal(s1, s2) and len(np.unique(s1)) == 10 and np.all(np.diff(s1) > 0)
    assert np.array_equal(eval_subset(val, None, 1337), val)
    assert np.array_equal(eval_subset(val, 500, 1337), val)


def test_data_position_locates_the_stream():
    s = BatchSampler(np.arange(100, dtype=np.int64), 7, 8, 2)
    assert s.data_position(7) == {"step": 7, "windows": 112, "epoch": 1, "offset": 12, "seed": 7}
    assert s.position(7, 1) == 120
