"""The bootstrap every fit shares: seeds resampled within cells, the percentile interval, and the
Bootstrap type's intervals and predictions, against numpy's percentile and exact identities."""
import math

import numpy as np
import pandas as pd
import pytest

from studylib.study.analysis.bootstrap import Bootstrap, bootstrap_values, cell_frame, no_interval, percentile_ci


def test_the_interval_is_numpys_percentile_per_column_and_nan_without_draws():
    rng = np.random.default_rng(0)
    draws = rng.normal(size=(400, 3))
    draws[:, 2] = math.nan
    draws[::7, 1] = math.nan  # some replicates without a draw: left out, not counted
    lo, hi = Bootstrap(np.zeros(3), draws, 0.9).interval()
    kept = draws[~np.isnan(draws[:, 1]), 1]
    for got, want in ((lo[0], np.percentile(draws[:, 0], 5)), (hi[0], np.percentile(draws[:, 0], 95)),
                      (lo[1], np.percentile(kept, 5)), (hi[1], np.percentile(kept, 95))):
        assert got == pytest.approx(want, abs=1e-12)
    assert math.isnan(lo[2]) and math.isnan(hi[2])
    one_lo, one_hi = percentile_ci(draws[:, 0], 0.9)  # a vector of draws: one interval
    assert (one_lo, one_hi) == (lo[0], hi[0])
    none = Bootstrap(np.zeros(2), np.empty((0, 2))).interval()  # no replicate at all
    assert np.isnan(none).all()


def test_predictions_carry_the_replicates_through_the_function():
    rng = np.random.default_rng(1)
    b = Bootstrap(np.array([1.0, 2.0]), rng.normal(size=(300, 2)))
    design = np.array([[1.0, 0.0], [1.0, 3.0], [0.0, -2.0]])
    pred = b.map(lambda t: t @ design.T)
    assert pred.point.tolist() == [1.0, 7.0, -4.0] and pred.draws.shape == (300, 3)
    assert pred.draws == pytest.approx(b.draws @ design.T, abs=0)
    # a percentile interval is carried exactly through an increasing map (here 2 x + 1 of the first)
    lo, hi = b.map(lambda t: 2 * t[..., :1] + 1).interval()
    lo0, hi0 = b.interval()
    assert lo[0] == pytest.approx(2 * lo0[0] + 1, abs=1e-12) and hi[0] == pytest.approx(2 * hi0[0] + 1, abs=1e-12)
    assert b.map(lambda t: t[..., 0]).draws.shape == (300,)


def test_seeds_resampled_within_cells_vary_as_fresh_seeds_would():
    """A cell of n seeds: its replicate mean's variance is the seeds' sample variance / n (the
    sqrt(n / (n - 1)) scaling undoes plain resampling's (n - 1) / n shrinkage); each replicate keeps
    every cell's size; a cell of one seed stays as it is."""
    y = np.array([1.0, 2.0, 4.0, 7.0, 10.0, 10.5, 5.0])
    cell = np.array([0, 0, 0, 0, 1, 1, 2])
    reps = bootstrap_values(y, cell, 40_000, np.random.default_rng(2))
    assert reps.shape == (40_000, 7) and (reps[:, 6] == 5.0).all()
    means = reps[:, :4].mean(axis=1)
    assert means.mean() == pytest.approx(y[:4].mean(), abs=0.02)
    assert means.var() == pytest.approx(y[:4].var(ddof=1) / 4, rel=0.03)


def test_a_cell_of_one_seed_carries_no_interval():
    df = cell_frame(pd.DataFrame({"x": [1.0, 1.0, 2.0], "seed": [1, 2, 1], "value": [0.1, 0.2, 0.3]}), ("x",),
                    "value", "test")
    assert no_interval(df) == ("no interval: 1 of 2 map points have one seed (a point needs at least 2 seeds to "
                               "carry an interval)")
    with pytest.raises(ValueError, match="test: column 'x' must be positive"):
        cell_frame(pd.DataFrame({"x": [0.0], "value": [1.0]}), ("x",), "value", "test")
