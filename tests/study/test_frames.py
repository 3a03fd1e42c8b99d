"""Frames across runs (studylib.study.frames): aggregates, paired gaps and the per-layer router
frames read from metrics.jsonl (no training)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from _tiny import tiny_preset
from studylib.run.files import write_json_atomic
from studylib.run.rundir import run_dir_for
from studylib.study import frames


def test_aggregate_and_paired_gaps_on_synthetic_frame():
    df = pd.DataFrame({"model": ["a"] * 3 + ["b"] * 3, "seed": [1, 2, 3] * 2,
                       "best_val_loss": [1.66, 1.65, 1.653, 1.58, 1.577, 1.579]})
    agg = frames.aggregate(df)
    assert list(agg.index) == ["a", "b"] and agg.loc["b", "n"] == 3
    assert agg.loc["b", "best_val_loss_std"] == pytest.approx(np.std([1.58, 1.577, 1.579], ddof=1))
    assert agg.loc["b", "ppl_mean"] == pytest.approx(np.mean(np.exp([1.58, 1.577, 1.579])))
    pg = frames.paired_gaps(df, "a", "b")
    per_seed = np.array([1.66, 1.65, 1.653]) - [1.58, 1.577, 1.579]
    np.testing.assert_allclose(pg["per_seed"].to_numpy(), per_seed)
    assert pg["std"] == pytest.approx(np.std(per_seed, ddof=1))
    # one shared seed: a mean, but no std
    one = frames.paired_gaps(df[df.seed == 1], "a", "b")
    assert one["n"] == 1 and np.isnan(one["std"])
    with pytest.raises(KeyError):
        frames.paired_gaps(df, "a", "zzz")


def test_sample_std_is_ddof1_and_nan_below_two_values():
    assert frames.sample_std([1.0, 2.0, 4.0]) == pytest.approx(np.std([1, 2, 4], ddof=1))
    assert frames.sample_std([1.0, float("nan"), 3.0]) == pytest.approx(np.std([1, 3], ddof=1))
    assert np.isnan(frames.sample_std([5.0]))


def test_routing_frame_from_metrics_jsonl(routed_run):
    rd, recs = routed_run
    rf = frames.routing_frame(rd)
    assert list(rf.columns) == ["step", "tokens", "layer", "metric", "value"]
    assert sorted(rf["step"].unique()) == [10, 20]  # train records and the torn line are skipped
    assert sorted(rf["layer"].unique()) == [1, 2]  # layer 0 is dense (None)
    assert set(rf["metric"]) == {"busiest", "usage_var", "entropy", "top1", "margin", "logz"}
    v = rf.set_index(["step", "layer", "metric"])["value"]
    # busiest / usage variance come from the shares of the whole eval set, not the stored 0.99 / 0.5
    assert v[(10, 1, "busiest")] == pytest.approx(0.5)
    assert v[(20, 1, "busiest")] == pytest.approx(0.97)
    assert v[(10, 2, "usage_var")] == pytest.approx(0.0)
    assert v[(10, 1, "usage_var")] == pytest.approx(np.var([0.5, 0.3, 0.2, 0.0]))
    assert v[(20, 2, "logz")] == pytest.approx(1.5)
    assert rf[rf.step == 20]["tokens"].iloc[0] == 2000
    # the same from the records, from the path and from the RunDir
    pd.testing.assert_frame_equal(frames.routing_frame(recs), rf)
    pd.testing.assert_frame_equal(frames.routing_frame(str(rd.path)), rf)
    assert list(frames.routing_frame(rd, metrics=["logz"])["metric"].unique()) == ["logz"]


def test_shares_frame_is_a_distribution_per_layer_and_step(routed_run):
    rd, _ = routed_run
    sh = frames.shares_frame(rd)
    assert list(sh.columns) == ["step", "tokens", "layer", "expert", "share"]
    assert len(sh) == 2 * 2 * 4
    assert (sh.groupby(["step", "layer"])["share"].sum() - 1).abs().max() < 1e-9
    assert sh.set_index(["step", "layer", "expert"]).loc[(20, 1, 0), "share"] == pytest.approx(0.97)
    assert frames.shares_frame(rd, key="argmax_shares").empty  # not a soft MoE


def test_routing_frame_dense_model_is_empty(eval_record):
    rec = eval_record(5, [])
    rec["router"] = [None, None]
    assert frames.routing_frame([rec]).empty
    assert frames.shares_frame([rec]).empty
    assert frames.router_records([{"kind": "eval", "step": 1, "router": None}]) == []


def test_collect_runs_and_metrics_over_a_preset(tmp_path, eval_record):
    from _tiny import tiny_preset
    from studylib.run.rundir import RunDir

    p = tiny_preset()
    for seed in (1, 2):
        rd = RunDir.of(p, "dense", seed, root=tmp_path)
        rd.path.mkdir(parents=True)
        rd.append_metrics({"kind": "train", "step": 1, "train_loss": 3.0})
        rd.append_metrics(eval_record(4, []))
        if seed == 1:
            rd.write_summary({"best_val_loss": 2.5, "finished": True, "params": {"total": 7}})
    runs = frames.collect_runs(p, ["dense", "moe"], [1, 2], root=tmp_path)
    assert list(runs["seed"]) == [1] and runs.loc[0, "params_total"] == 7 and runs.loc[0, "model"] == "dense"
    assert runs.attrs["missing"] == [("dense", 2), ("moe", 1), ("moe", 2)]
    m = frames.collect_metrics(p, ["dense", "moe"], [1, 2], root=tmp_path)
    assert list(zip(m["seed"], m["step"])) == [(1, 4), (2, 4)] and set(m["kind"]) == {"eval"}
    assert len(frames.collect_metrics(p, ["dense"], [1], kind=None, root=tmp_path)) == 2


def test_collect_aggregate_and_paired_gaps(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path))
    preset = tiny_preset(seeds=[1, 2, 3])
    losses = {"dense": [2.0, 2.1, 2.3], "moe": [1.9, 2.05, 2.1]}
    for m, vals in losses.items():
        for seed, v in zip([1, 2, 3], vals):
            d = run_dir_for(preset, m, seed)
            d.mkdir(parents=True)
            write_json_atomic(d / "summary.json", {"best_val_loss": v, "finished": True,
                                                   "params": {"total": 10}, "seed": seed})
            (d / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "step": 1, "val_loss": v}) + "\n")
    df = frames.collect_runs(preset, ["dense", "moe"])
    assert len(df) == 6 and "params_total" in df and df.attrs["missing"] == []
    agg = frames.aggregate(df)
    assert agg.loc["dense", "best_val_loss_mean"] == pytest.approx(np.mean(losses["dense"]))
    assert agg.loc["moe", "best_val_loss_std"] == pytest.approx(np.std(losses["moe"], ddof=1))
    assert agg.loc["moe", "ppl_mean"] == pytest.approx(np.mean(np.exp(losses["moe"])))
    gap = frames.paired_gaps(df, "dense", "moe")
    diffs = np.subtract(losses["dense"], losses["moe"])
    assert gap["n"] == 3 and gap["mean"] == pytest.approx(diffs.mean())
    assert gap["std"] == pytest.approx(diffs.std(ddof=1))
    assert list(gap["per_seed"].index) == [1, 2, 3]
    curves = frames.collect_metrics(preset, ["dense", "moe"])
    assert len(curves) == 6 and set(curves.columns) >= {"model", "seed", "val_loss"}
    part = frames.collect_runs(preset, ["dense"], seeds=[1, 4])
    assert len(part) == 1 and part.attrs["missing"] == [("dense", 4)]
