"""Pure analysis functions on synthetic frames and metrics (no training)."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from studylib.study import analysis

from studylib.run import rundir as runs

MODELS = ("dense_active", "moe", "dense_total")


def summary_frame(values: dict) -> pd.DataFrame:
    """``{model: [loss per seed]}`` -> a collect_runs-like frame (seeds 1, 2, ...)."""
    rows = [{"model": m, "seed": s + 1, "best_val_loss": v, "final_val_loss": v + 0.01, "tokens": 1000}
            for m, vals in values.items() for s, v in enumerate(vals)]
    return pd.DataFrame(rows)


@pytest.fixture
def df():
    return summary_frame({"dense_active": [1.66, 1.65, 1.653], "moe": [1.58, 1.577, 1.579],
                          "dense_total": [1.562, 1.558, 1.561]})


def test_headline_table_mean_std_ddof1(df):
    t = analysis.headline_table(df, list(MODELS))
    assert list(t.index) == list(MODELS)
    for m in MODELS:
        v = df[df.model == m]["best_val_loss"]
        assert t.loc[m, "best_val_loss_mean"] == pytest.approx(v.mean())
        assert t.loc[m, "best_val_loss_std"] == pytest.approx(np.std(v, ddof=1))
        assert t.loc[m, "ppl_mean"] == pytest.approx(np.exp(v).mean())
        assert t.loc[m, "ppl_std"] == pytest.approx(np.std(np.exp(v), ddof=1))
    assert t.loc["moe", "loss"] == analysis.pm(df[df.model == "moe"]["best_val_loss"].mean(),
                                               df[df.model == "moe"]["best_val_loss"].std(ddof=1))


def test_seed_table_and_gap_std_is_std_of_per_seed_gaps(df):
    t = analysis.seed_table(df, *MODELS)
    w = df.pivot(index="seed", columns="model", values="best_val_loss")
    active = w["dense_active"] - w["moe"]
    total = w["moe"] - w["dense_total"]
    assert list(t.index) == [1, 2, 3, "mean", "std"]
    np.testing.assert_allclose(t.loc[[1, 2, 3], "active_gap"].astype(float), active.values)
    assert t.loc["mean", "active_gap"] == pytest.approx(active.mean())
    assert t.loc["std", "active_gap"] == pytest.approx(np.std(active.values, ddof=1))
    assert t.loc["std", "total_gap"] == pytest.approx(np.std(total.values, ddof=1))
    # the paired std is not the std of the difference of means (it uses the per-seed pairing)
    g = analysis.gaps(df, *MODELS)
    assert g["active"]["std"] == pytest.approx(np.std(active.values, ddof=1))
    assert g["total"]["mean"] == pytest.approx(total.mean())
    assert g["active"]["n"] == 3


def test_aggregate_and_paired_gaps_on_synthetic_frame(df):
    agg = runs.aggregate(df)
    assert agg.loc["moe", "n"] == 3
    assert agg.loc["moe", "best_val_loss_std"] == pytest.approx(np.std([1.58, 1.577, 1.579], ddof=1))
    pg = runs.paired_gaps(df, "dense_active", "moe")
    assert pg["std"] == pytest.approx(np.std(np.array([1.66, 1.65, 1.653]) - [1.58, 1.577, 1.579], ddof=1))


def test_ordering_holds_and_gaps_exceed_std(df):
    o = analysis.ordering(df, *MODELS)
    assert o["holds"]
    assert o["active_exceeds_std"] and o["total_exceeds_std"]
    text = analysis.verdict(o, "x")
    assert "HOLDS" in text and "larger than its seed std" in text


def test_ordering_fails_when_reversed():
    df = summary_frame({"dense_active": [1.5, 1.51], "moe": [1.6, 1.62], "dense_total": [1.4, 1.41]})
    o = analysis.ordering(df, *MODELS)
    assert not o["holds"]
    assert not o["active_exceeds_std"]
    assert "does NOT hold" in analysis.verdict(o)
    assert "reversed" in analysis.verdict(o)


def test_ordering_gap_within_noise():
    # ordering holds in the means but the active gap is smaller than its seed std
    df = summary_frame({"dense_active": [1.70, 1.50, 1.61], "moe": [1.58, 1.59, 1.58],
                        "dense_total": [1.50, 1.50, 1.50]})
    o = analysis.ordering(df, *MODELS)
    assert o["holds"] and not o["active_exceeds_std"] and o["total_exceeds_std"]
    assert "within its seed std" in analysis.verdict(o)


def test_single_seed_has_no_std():
    df = summary_frame({"dense_active": [1.7], "moe": [1.6], "dense_total": [1.5]})
    o = analysis.ordering(df, *MODELS)
    assert o["holds"] and math.isnan(o["active_gap_std"]) and not o["active_exceeds_std"]
    assert "no std" in analysis.verdict(o)


def test_collapsed():
    assert analysis.collapsed([0.95, 0.05, 0, 0])
    assert analysis.collapsed([0.9, 0.1], threshold=0.9)
    assert not analysis.collapsed([0.25, 0.25, 0.25, 0.25])
    assert not analysis.collapsed([0.6, 0.4], threshold=0.9)
    assert analysis.collapsed(np.array([0.5, 0.5]), threshold=0.5)
    with pytest.raises(ValueError):
        analysis.collapsed([])


def _eval_rec(step, shares_per_layer, logz=1.0, dense_first=False):
    router = []
    if dense_first:
        router.append(None)
    for sh in shares_per_layer:
        router.append({"shares": sh, "busiest": 0.99, "usage_var": 0.5, "entropy": 1.0, "top1": 0.5,
                       "margin": 0.1, "logz": logz})
    return {"kind": "eval", "step": step, "tokens": step * 100, "val_loss": 2.0, "val_ppl": math.exp(2.0),
            "train_loss": 2.1, "lr": 1e-3, "tok_per_s": 1.0, "elapsed_s": 1.0, "eval_s": 0.1, "full": False,
            "router": router}


def write_metrics(run_dir, recs):
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / runs.METRICS_FILE, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
        f.write('{"kind": "eval", "step": 99')  # a torn last line is ignored


def test_routing_frame_from_metrics_jsonl(tmp_path):
    recs = [
        {"kind": "train", "step": 1, "train_loss": 3.0, "lr": 1e-3},
        _eval_rec(10, [[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]], logz=2.0, dense_first=True),
        {"kind": "train", "step": 11, "train_loss": 2.5, "lr": 1e-3},
        _eval_rec(20, [[0.97, 0.01, 0.01, 0.01], [0.4, 0.2, 0.2, 0.2]], logz=1.5, dense_first=True),
    ]
    rd = tmp_path / "run"
    write_metrics(rd, recs)
    rf = analysis.routing_frame(rd)
    assert list(rf.columns) == ["step", "tokens", "layer", "metric", "value"]
    assert sorted(rf["step"].unique()) == [10, 20]
    assert sorted(rf["layer"].unique()) == [1, 2]  # layer 0 is dense (None)
    assert set(rf["metric"]) == {"busiest", "usage_var", "entropy", "top1", "margin", "logz"}
    v = rf.set_index(["step", "layer", "metric"])["value"]
    # busiest / usage variance come from the shares of the whole eval set
    assert v[(10, 1, "busiest")] == pytest.approx(0.5)
    assert v[(20, 1, "busiest")] == pytest.approx(0.97)
    assert v[(10, 2, "usage_var")] == pytest.approx(0.0)
    assert v[(10, 1, "usage_var")] == pytest.approx(np.var([0.5, 0.3, 0.2, 0.0]))
    assert v[(20, 2, "logz")] == pytest.approx(1.5)
    assert rf[rf.step == 20]["tokens"].iloc[0] == 2000
    # the same from records or a DataFrame
    pd.testing.assert_frame_equal(analysis.routing_frame(recs), rf)
    pd.testing.assert_frame_equal(analysis.routing_frame(runs.load_metrics(rd)), rf, check_dtype=False)

    sh = analysis.shares_frame(rd)
    assert len(sh) == 2 * 2 * 4
    assert (sh.groupby(["step", "layer"])["share"].sum() - 1).abs().max() < 1e-9

    trend = analysis.routing_trend(rf, "logz")
    assert trend.loc[1, "first"] == pytest.approx(2.0) and trend.loc[1, "last"] == pytest.approx(1.5)
    assert trend.loc[1, "trend"] == "falls"

    col = analysis.collapse_table({"m": rd})
    row = col[col.layer == 1].iloc[0]
    assert row["collapsed_at_end"] and row["first_collapse_step"] == 20
    assert not col[col.layer == 2].iloc[0]["collapsed_at_end"]
    assert "m: 1/2 layer(s) collapsed" in analysis.collapse_sentence(col)

    fin = analysis.final_routing(rd)
    assert list(fin.index) == [1, 2] and fin.loc[1, "busiest"] == pytest.approx(0.97)


def test_routing_frame_dense_model_is_empty(tmp_path):
    rec = _eval_rec(5, [])
    rec["router"] = [None, None]
    assert analysis.routing_frame([rec]).empty
    assert analysis.shares_frame([rec]).empty


def test_gap_curves_per_seed_then_mean_std():
    rows = []
    for seed, off in ((1, 0.0), (2, 0.02), (3, -0.01)):
        for step in (10, 20):
            rows.append({"kind": "eval", "model": "a", "seed": seed, "step": step, "tokens": step * 5,
                         "val_loss": 3.0 - step / 100 + off})
            rows.append({"kind": "eval", "model": "b", "seed": seed, "step": step, "tokens": step * 5,
                         "val_loss": 2.9 - step / 100 + 2 * off})
    m = pd.DataFrame(rows)
    gc = analysis.gap_curves(m, {"a-b": ("a", "b")})
    assert list(gc["step"]) == [10, 20]
    per_seed = np.array([0.1 - off for off in (0.0, 0.02, -0.01)])
    assert gc["mean"].iloc[0] == pytest.approx(per_seed.mean())
    assert gc["std"].iloc[0] == pytest.approx(np.std(per_seed, ddof=1))
    assert gc["tokens"].iloc[1] == 100 and gc["n"].iloc[0] == 3
    assert len(gc.attrs["per_seed"]) == 6
    with pytest.raises(KeyError):
        analysis.gap_curves(m, {"x": ("a", "zzz")})


def test_param_split_sums_to_total():
    from _tiny import tiny_preset
    from studylib.config import count_params

    p = tiny_preset()
    cfgs = [p.model_config(m) for m in ("dense", "moe")]
    split = analysis.param_split(cfgs)
    for c in cfgs:
        n = count_params(c)
        assert split.loc[c.name].sum() == n.total
        assert split.loc[c.name, ["embedding", "non_ffn", "ffn_active", "router"]].sum() == n.active
    acct = analysis.accounting_frame(cfgs)
    assert acct.loc["moe", "ffn"] == "4x32 top-2"


def test_throughput_table_ratio():
    raw = pd.DataFrame({"model": ["d", "m", "m"], "dispatch": ["", "naive", "grouped"], "impl": "studylib",
                        "tok_s": [100.0, 50.0, 80.0], "tok_s_min": [90.0, 40, 70], "tok_s_max": [110.0, 60, 90],
                        "ratio_ref": [1.0, 0.49, 0.81]})
    t = analysis.throughput_table(raw, ref="d")
    assert list(t.index) == ["d", "m[naive]", "m[grouped]"]
    assert list(t["ratio_to_d"]) == [1.0, 0.49, 0.81]  # the bench's paired ratios
    t2 = analysis.throughput_table(raw, ref="m")
    assert t2["ratio_to_m"].iloc[0] == pytest.approx(2.0)
