"""Routing tables (studylib.study.routing) and the collapse sentence, from hand-written
metrics.jsonl records (no training)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from studylib.study import frames, routing, text


def test_collapsed():
    assert routing.collapsed([0.95, 0.05, 0, 0])
    assert routing.collapsed([0.9, 0.1], threshold=0.9)
    assert not routing.collapsed([0.25, 0.25, 0.25, 0.25])
    assert not routing.collapsed([0.6, 0.4], threshold=0.9)
    assert routing.collapsed(np.array([0.5, 0.5]), threshold=0.5)
    with pytest.raises(ValueError):
        routing.collapsed([])


def test_collapse_table_and_sentence(routed_run):
    rd, _ = routed_run
    col = routing.collapse_table({"m": rd})
    assert list(col.columns) == ["model", "layer", "final_busiest", "max_busiest", "first_collapse_step",
                                 "collapsed_at_end"]
    row = col[col.layer == 1].iloc[0]
    assert row["collapsed_at_end"] and row["first_collapse_step"] == 20
    assert row["final_busiest"] == pytest.approx(0.97) and row["max_busiest"] == pytest.approx(0.97)
    other = col[col.layer == 2].iloc[0]
    assert not other["collapsed_at_end"] and math.isnan(other["first_collapse_step"])
    assert other["max_busiest"] == pytest.approx(0.4)
    assert text.collapse_sentence(col) == ("Collapse (one expert >= 90% of assignments): m: 1/2 layer(s) "
                                           "collapsed at the end (first collapse at step 20), max busiest 0.97.")
    assert text.collapse_sentence(pd.DataFrame()) == "No routed layers."


def test_final_routing_and_logz_trend(routed_run):
    rd, _ = routed_run
    fin = routing.final_routing(rd)
    assert list(fin.index) == [1, 2] and fin.loc[1, "busiest"] == pytest.approx(0.97)
    assert list(fin.columns) == ["busiest", "usage_var", "entropy", "top1", "margin", "logz"]
    rf = frames.routing_frame(rd)
    trend = routing.routing_trend(rf, "logz")
    assert trend.loc[1, "first"] == pytest.approx(2.0) and trend.loc[1, "last"] == pytest.approx(1.5)
    assert trend.loc[1, "trend"] == "falls" and trend.loc[1, "n"] == 1 and math.isnan(trend.loc[1, "change_std"])
    # over seeds: mean and std (ddof=1) of the per-seed change
    rising = rf.assign(value=np.where(rf["metric"] == "logz", 4.0 - rf["value"], rf["value"]))
    both = routing.routing_trend({1: rf, 2: rising}, "logz")
    assert both.loc[1, "change"] == pytest.approx(0.0) and both.loc[1, "trend"] == "flat"
    assert both.loc[1, "change_std"] == pytest.approx(np.std([-0.5, 0.5], ddof=1))


def test_ablation_and_diagnostics_tables(routed_run):
    rd, _ = routed_run
    summaries = pd.DataFrame({"model": ["m"], "final_val_loss": [2.1], "best_val_loss": [2.0]})
    t1 = routing.ablation_table(summaries, {"m": rd})
    assert t1.loc["m", "busiest_L1"] == pytest.approx(0.97) and t1.loc["m", "busiest_L2"] == pytest.approx(0.4)
    assert t1.loc["m", "logz_mean"] == pytest.approx(1.5) and t1.loc["m", "collapsed_layers"] == 1
    rf = pd.concat([frames.routing_frame(rd).assign(seed=s) for s in (1, 2)])
    t7 = routing.diagnostics_table(rf)
    assert list(t7.columns) == list(frames.TABLE7_METRICS) and list(t7.index) == [1, 2]
    assert t7.loc[2, "busiest"] == pytest.approx(0.4)


def test_gate_table_reads_the_last_evaluation():
    gate = {"shares": [0.5, 0.5], "argmax_shares": [0.7, 0.3], "entropy": 0.6, "top1": 0.76,
            "usage_entropy": 0.69, "max_gt_0.9": 0.1, "logz": 1.0, "margin": 0.5}
    recs = [{"kind": "eval", "step": 4, "router": [dict(gate, top1=0.5)]},
            {"kind": "eval", "step": 8, "router": [gate, None]}]
    g = routing.gate_table({"soft2": recs})
    assert len(g) == 1 and g.loc[0, "model"] == "soft2" and g.loc[0, "K"] == 2 and g.loc[0, "layer"] == 0
    assert g.loc[0, "mean_max_gate"] == pytest.approx(0.76) and g.loc[0, "uniform_gate"] == 0.5
    assert g.loc[0, "max_entropy"] == pytest.approx(math.log(2))
    assert g.loc[0, "argmax_shares"] == "0.70 0.30"
    assert routing.gate_table({"dense": [{"kind": "eval", "step": 4, "val_loss": 2.0}]}).empty
