"""The shared figures (studylib.study.analysis.plots): training curves stay on one sample of validation
windows (the final full-split value is marked apart), and interval plots draw the paired CI."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from studylib.study.analysis import plots, tables
from studylib.study.analysis.stats import paired


@pytest.fixture(autouse=True)
def _close():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


def _metrics() -> pd.DataFrame:
    """Two seeds of one model: subset evaluations at steps 4 and 8, then the full split at step 12
    (5.0, far from the subset's 2.7 / 2.8), as the trainer writes them."""
    rows = []
    for seed, off in ((1, 0.0), (2, 0.1)):
        ev = {"kind": "eval", "model": "m", "seed": seed}
        rows += [{**ev, "step": 4, "tokens": 40, "val_loss": 3.0 + off, "full": False},
                 {**ev, "step": 8, "tokens": 80, "val_loss": 2.8 + off, "full": False},
                 {**ev, "step": 12, "tokens": 120, "val_loss": 5.0 + off, "full": True, "subset_val_loss": 2.7 + off}]
    return pd.DataFrame(rows)


def test_val_curves_keep_the_full_split_off_the_curve(tmp_path):
    fig = plots.val_curves(_metrics(), outdir=tmp_path, name="curves")
    ax = fig.axes[0]
    curve = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 3]
    assert len(curve) == 1
    np.testing.assert_allclose(curve[0].get_ydata(), [3.05, 2.85, 2.75])  # the subset, mean over seeds
    # the full split is one separate diamond at the end: mean 5.05, whiskers the paired-t CI
    diamonds = [ln for ln in ax.get_lines() if ln.get_marker() == "D"]
    assert len(diamonds) == 1 and list(diamonds[0].get_ydata()) == pytest.approx([5.05])
    p = paired([5.0, 5.1])
    caps = sorted(float(y) for ln in ax.get_lines() if ln.get_marker() == "_" for y in ln.get_ydata())
    assert caps == pytest.approx([p.ci_low, p.ci_high])
    assert "full validation split, end" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert (tmp_path / "figures" / "curves.png").is_file()


def test_intervals_draw_the_paired_ci_and_mark_unresolved_open():
    df = pd.DataFrame({"model": ["a", "b", "c"] * 3, "seed": np.repeat([1, 2, 3], 3),
                       "best_val_loss": [2.0, 1.9, 1.95, 2.1, 2.0, 2.2, 2.05, 1.96, 1.9]})
    t = tables.comparison_table(df, {"a-b": ("a", "b"), "a-c": ("a", "c")})
    assert bool(t.loc["a-b", "resolved"]) and not bool(t.loc["a-c", "resolved"])
    ax = plots.intervals(t).axes[0]
    markers = [ln for ln in ax.get_lines() if ln.get_marker() == "o" and len(ln.get_xdata()) == 1]
    assert [float(ln.get_xdata()[0]) for ln in markers] == pytest.approx(list(t["mean"]))
    assert [ln.get_markerfacecolor() == "white" for ln in markers] == [False, True]
    caps = sorted(float(x) for ln in ax.get_lines() if ln.get_marker() == "|" for x in ln.get_xdata())
    assert caps == pytest.approx(sorted(list(t["ci_low"]) + list(t["ci_high"])))
    from matplotlib.collections import PathCollection

    dots = np.concatenate([c.get_offsets()[:, 0] for c in ax.collections if isinstance(c, PathCollection)])
    assert sorted(dots) == pytest.approx(sorted(t.attrs["per_seed"]["gap"]))
