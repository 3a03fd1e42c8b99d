"""Routing tables (studylib.study.analysis.routing) and the collapse sentence, from hand-written
metrics.jsonl records (no training)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from studylib.study.analysis import frames, routing, text


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


def test_ablation_table_over_seeds_against_the_reference(routed_run, tmp_path):
    from _tiny import tiny_raw
    from studylib.config import preset_from_dict
    from studylib.study.analysis.stats import paired

    rd, recs = routed_run
    balanced = [dict(r, router=[None, {**r["router"][2]}, {**r["router"][2]}]) if r.get("router") else r for r in recs]
    summaries = pd.DataFrame({"model": ["m", "m", "ref", "ref"], "seed": [1, 2, 1, 2],
                              "final_val_loss": [2.1, 2.3, 2.0, 2.1], "best_val_loss": [2.0, 2.2, 1.9, 2.05]})
    t1 = routing.ablation_table(summaries, {"m": {1: rd, 2: rd}, "ref": {1: balanced, 2: balanced}}, "ref")
    p = paired([2.0, 2.2], [1.9, 2.05])
    assert t1.loc["m", "n"] == 2 and t1.loc["m", "best_val_loss"] == pytest.approx(2.1)
    assert t1.loc["m", "delta_vs_ref"] == pytest.approx(p.mean)
    assert [t1.loc["m", "ci_low"], t1.loc["m", "ci_high"]] == pytest.approx([p.ci_low, p.ci_high])
    assert t1.loc["ref", "delta_vs_ref"] == 0.0 and np.isnan(t1.loc["ref", "ci_low"])
    assert t1.loc["m", "busiest_L1"] == pytest.approx(0.97) and t1.loc["m", "busiest_L2"] == pytest.approx(0.4)
    assert t1.loc["m", "logz_mean"] == pytest.approx(1.5)
    assert t1.loc["m", "collapsed_runs"] == "2/2" and t1.loc["ref", "collapsed_runs"] == "0/2"
    assert list(t1.attrs["comparisons"].index) == ["m"]
    # the paper's Table 1 row of the same recipe (renormalised gate; the Switch gate is not in the paper)
    raw = tiny_raw()
    ffn = raw["models"]["moe"]["ffn"]
    raw["models"] = {"top1": {"ffn": {**ffn, "top_k": 1, "balance_coef": 0.0, "z_coef": 0.0}},
                     "top1_bal": {"ffn": {**ffn, "top_k": 1, "z_coef": 0.0}},
                     "switch": {"ffn": {**ffn, "top_k": 1, "renormalize": False}},
                     "top2_z": {"ffn": ffn}}
    pr = preset_from_dict(raw)
    assert routing.paper_recipe(pr.model_config("top1"))["budget"] == "100-step smoke"
    assert routing.paper_recipe(pr.model_config("top1_bal"))["final_val_loss"] == 2.1981
    assert routing.paper_recipe(pr.model_config("switch")) is None
    assert routing.paper_recipe(pr.model_config("top2_z"))["final_val_loss"] == 2.1619
    s2 = pd.DataFrame({"model": ["top1_bal", "top2_z"], "seed": [1, 1], "final_val_loss": [2.0, 2.0],
                       "best_val_loss": [2.0, 1.9]})
    t = routing.ablation_table(s2, {"top1_bal": {1: rd}, "top2_z": {1: rd}}, "top2_z",
                               configs={m: pr.model_config(m) for m in ("top1_bal", "top2_z")})
    assert t.loc["top1_bal", "paper_delta"] == pytest.approx(2.1981 - 2.1619)
    assert "one seed" in t.loc["top1_bal", "gap"] or "no interval" in t.loc["top1_bal", "gap"]


def test_diagnostics_table(routed_run):
    rd, _ = routed_run
    rf = pd.concat([frames.routing_frame(rd).assign(seed=s) for s in (1, 2)])
    t7 = routing.diagnostics_table(rf)
    # a router without a selection bias has no bias_picked column
    assert list(t7.columns) == [m for m in frames.TABLE7_METRICS if m != "bias_picked"] and list(t7.index) == [1, 2]
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
