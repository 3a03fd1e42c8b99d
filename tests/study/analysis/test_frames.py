"""Frames across runs (studylib.study.analysis.frames): aggregates, paired gaps and the per-layer router
frames read from metrics.jsonl (no training)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from _tiny import tiny_preset
from studylib.config import run_document
from studylib.storage.files import write_json_atomic
from studylib.run.layout import run_dir_for
from studylib.run.rundir import RunDir
from studylib.run.spec import RunSpec
from studylib.study.analysis import frames
from studylib.study.analysis.paper import PAPER_TABLE6
from studylib.study.analysis.stats import paired

T_975_2 = 4.302652729911275  # Student t, 97.5th percentile, 2 degrees of freedom (tables)


def _long(wide: pd.DataFrame, value: str = "best_val_loss") -> pd.DataFrame:
    """A collect_runs-like long frame (model / seed / value) of a seed x model table."""
    return wide.rename_axis("seed").reset_index().melt(id_vars="seed", var_name="model", value_name=value)


def test_paired_gaps_is_stats_paired_on_the_papers_table6():
    """The paper's Table 6 per-seed losses: the gap pairs rows by seed (not by position), and its
    summary is stats.paired's: mean 0.0758, the hand-computed t interval, resolved."""
    df = _long(PAPER_TABLE6)
    moe_rows = df[df.model == "moe_top2_z"].iloc[::-1]  # the MoE's seeds in the opposite order
    extra = pd.DataFrame({"seed": [1340], "model": ["dense_active"], "best_val_loss": [9.0]})  # unpaired seed
    df = pd.concat([df[df.model != "moe_top2_z"], moe_rows, extra], ignore_index=True)
    g = frames.paired_gaps(df, "dense_active", "moe_top2_z")
    d = np.array([1.6554 - 1.5774, 1.6532 - 1.5779, 1.6551 - 1.5811])  # 0.0780, 0.0753, 0.0740
    np.testing.assert_allclose(g["per_seed"].to_numpy(), d, rtol=0, atol=1e-12)
    assert list(g["per_seed"].index) == [1337, 1338, 1339]
    assert g["paired"] == paired(d)
    assert g["n"] == 3 and round(g["mean"], 4) == 0.0758 and round(g["std"], 4) == 0.0020
    half = T_975_2 * d.std(ddof=1) / np.sqrt(3)
    assert g["ci_low"] == pytest.approx(d.mean() - half, rel=1e-9)
    assert g["ci_high"] == pytest.approx(d.mean() + half, rel=1e-9)
    assert g["resolved"] and g["p"] < 0.001
    total = frames.paired_gaps(df, "moe_top2_z", "dense_total")
    assert round(total["mean"], 4) == 0.0180 and total["resolved"]


def test_aggregate_and_paired_gaps_on_synthetic_frame():
    df = pd.DataFrame({"model": ["a"] * 3 + ["b"] * 3, "seed": [1, 2, 3] * 2,
                       "best_val_loss": [1.66, 1.65, 1.653, 1.58, 1.577, 1.579]})
    agg = frames.aggregate(df)
    assert list(agg.index) == ["a", "b"] and agg.loc["b", "n"] == 3
    assert agg.loc["b", "best_val_loss_std"] == pytest.approx(np.std([1.58, 1.577, 1.579], ddof=1))
    assert agg.loc["b", "ppl_mean"] == pytest.approx(np.mean(np.exp([1.58, 1.577, 1.579])))
    # one shared seed: a mean, but no std, no interval, not resolved
    one = frames.paired_gaps(df[df.seed == 1], "a", "b")
    assert one["n"] == 1 and np.isnan(one["std"]) and np.isnan(one["ci_low"]) and not one["resolved"]
    assert one["mean"] == pytest.approx(0.08)
    with pytest.raises(KeyError, match="need runs of both"):
        frames.paired_gaps(df, "a", "zzz")
    with pytest.raises(KeyError, match="share no seed"):
        frames.paired_gaps(df[((df.model == "a") & (df.seed == 1)) | ((df.model == "b") & (df.seed == 2))], "a", "b")


def _eval(step, loss, full=False, **kw):
    return {"kind": "eval", "step": step, "tokens": step * 10, "val_loss": loss, "val_ppl": np.exp(loss),
            "full": full, **kw}


def test_eval_curves_keep_the_subset_and_mark_the_full_split_apart():
    """cpu-style runs: subset evaluations during training, the full split at the end (a different
    sample of windows, 'full': true, with the subset's loss as subset_val_loss)."""
    recs = [  # run a: the usual case; run b: the subset is the whole split; run c: an old final record
        {**_eval(4, 3.0), "model": "a", "seed": 1}, {**_eval(8, 2.8), "model": "a", "seed": 1},
        {**_eval(12, 2.9, full=True, subset_val_loss=2.7), "model": "a", "seed": 1},
        {**_eval(4, 3.1, full=True), "model": "b", "seed": 1}, {**_eval(8, 3.05, full=True), "model": "b", "seed": 1},
        {**_eval(4, 3.2), "model": "c", "seed": 1}, {**_eval(8, 3.4, full=True), "model": "c", "seed": 1},
        {"kind": "train", "step": 8, "train_loss": 2.0, "model": "a", "seed": 1},
    ]
    ev = frames.eval_curves(pd.DataFrame(recs)).set_index(["model", "step"])
    assert len(ev) == 7  # train records are dropped
    a = ev.loc["a"]
    assert list(a["val_loss"]) == [3.0, 2.8, 2.7]  # the curve never jumps to the full split
    assert a["full_val_loss"].isna().tolist() == [True, True, False] and a.loc[12, "full_val_loss"] == 2.9
    assert a.loc[12, "val_ppl"] == pytest.approx(np.exp(2.7))
    b = ev.loc["b"]
    assert list(b["val_loss"]) == [3.1, 3.05] and b["full_val_loss"].isna().tolist() == [True, False]
    c = ev.loc["c"]  # the subset's last value is unknown: no point rather than a step to the full split
    assert c.loc[4, "val_loss"] == 3.2 and np.isnan(c.loc[8, "val_loss"]) and c.loc[8, "full_val_loss"] == 3.4
    # frames without a "full" column (hand-made) are all subset
    plain = frames.eval_curves(pd.DataFrame([_eval(4, 3.0)]).drop(columns="full"))
    assert plain["val_loss"].tolist() == [3.0] and plain["full_val_loss"].isna().all()


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
            rd.write_config(run_document(p, p.model_config("dense"), "dense", seed))
            rd.write_summary({"best_val_loss": 2.5, "finished": True, "params": {"total": 7}})
    runs = frames.collect_runs(p, ["dense", "moe"], [1, 2], root=tmp_path)
    assert list(runs["seed"]) == [1] and runs.loc[0, "params_total"] == 7 and runs.loc[0, "model"] == "dense"
    assert runs.attrs["missing"] == [("dense", 2), ("moe", 1), ("moe", 2)]
    specs = [RunSpec.resolve(p, "dense", seed, root=tmp_path) for seed in (1, 2)]
    m = frames.runs_metrics(specs)
    assert list(zip(m["seed"], m["step"])) == [(1, 4), (2, 4)] and set(m["kind"]) == {"eval"}
    assert len(frames.runs_metrics(specs[:1], kind=None)) == 2


def test_collect_aggregate_and_paired_gaps(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path))
    preset = tiny_preset(seeds=[1, 2, 3])
    losses = {"dense": [2.0, 2.1, 2.3], "moe": [1.9, 2.05, 2.1]}
    for m, vals in losses.items():
        for seed, v in zip([1, 2, 3], vals):
            d = run_dir_for(preset, m, seed)
            d.mkdir(parents=True)
            RunDir(d).write_config(run_document(preset, preset.model_config(m), m, seed))
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
    assert gap["paired"] == paired(diffs) and list(gap["per_seed"].index) == [1, 2, 3]
    curves = frames.runs_metrics([RunSpec.resolve(preset, m, s) for m in ("dense", "moe") for s in (1, 2, 3)])
    assert len(curves) == 6 and set(curves.columns) >= {"model", "seed", "val_loss"}
    part = frames.collect_runs(preset, ["dense"], seeds=[1, 4])
    assert len(part) == 1 and part.attrs["missing"] == [("dense", 4)]


def test_the_explorer_shows_notebook_04s_table7_numbers_for_the_same_run(routed_run):
    """One reading of the router statistics: the explorer's diagnostics (08) and Table 7 (04)
    agree, with busiest / usage_var from the eval set's shares (the stored values are wrong)."""
    from studylib.study.analysis.routing import diagnostics_table
    from studylib.tools.explorer import diagnostics_over_training

    rd, _ = routed_run
    table7 = diagnostics_table(frames.routing_frame(rd))
    explorer = diagnostics_over_training(rd, step=20).set_index("layer")
    assert list(table7.index) == [1, 2]
    for layer in table7.index:
        for metric in table7.columns:
            assert explorer.loc[layer, metric] == table7.loc[layer, metric], (layer, metric)
    assert explorer.loc[1, "busiest"] == 0.97 and explorer.loc[2, "busiest"] == 0.4  # not the stored 0.99
    assert explorer.loc[2, "usage_var"] == pytest.approx(0.0075)  # var of (0.4, 0.2, 0.2, 0.2)


def test_seed_pairs_pair_by_seed_over_any_column_and_index():
    """The one pairing: by seed over the seeds both sides have, for models or for another column
    (learning rates), with a composite index (seed x step), and a zero gap against itself."""
    df = pd.DataFrame({"model": ["a", "a", "a", "b", "b"], "seed": [1, 2, 3, 1, 3],
                       "lr": [0.1, 0.1, 0.2, 0.1, 0.2], "v": [4.0, 5.0, 6.0, 3.5, 7.0]})
    g = frames.seed_gaps(df, "a", "b", "v")
    assert g.to_dict() == {1: 0.5, 3: -1.0}  # seed 2 has no b: left out
    assert frames.seed_gaps(df, "a", "a", "v").to_dict() == {1: 0.0, 2: 0.0, 3: 0.0}
    sweep = pd.DataFrame({"seed": [1, 2, 1, 2], "lr": [0.1, 0.1, 0.2, 0.2], "v": [4.0, 5.0, 4.5, 4.75]})
    assert frames.seed_gaps(sweep, 0.2, 0.1, "v", column="lr").to_dict() == {1: 0.5, 2: -0.25}
    with pytest.raises(KeyError, match="share no seed"):
        frames.seed_gaps(df[df["model"] == "a"], 0.2, 0.1, "v", column="lr")  # seed 3 vs seeds 1, 2
    steps = pd.DataFrame({"model": ["a", "b"] * 2, "seed": [1, 1, 1, 1], "step": [10, 10, 20, 20],
                          "v": [2.0, 1.0, 1.5, 1.25]})
    assert frames.seed_gaps(steps, "a", "b", "v", index=["seed", "step"]).to_dict() == {(1, 10): 1.0, (1, 20): 0.25}
    with pytest.raises(KeyError, match="need runs of both 'a' and 'c'"):
        frames.seed_pairs(df, "a", "c", "v")
