"""The result tables (studylib.study.tables) and the verdict text, on synthetic frames (no training)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from studylib.study import tables, text

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
    t = tables.headline_table(df, list(MODELS))
    assert list(t.index) == list(MODELS)
    for m in MODELS:
        v = df[df.model == m]["best_val_loss"]
        assert t.loc[m, "best_val_loss_mean"] == pytest.approx(v.mean())
        assert t.loc[m, "best_val_loss_std"] == pytest.approx(np.std(v, ddof=1))
        assert t.loc[m, "ppl_mean"] == pytest.approx(np.exp(v).mean())
        assert t.loc[m, "ppl_std"] == pytest.approx(np.std(np.exp(v), ddof=1))
    assert t.loc["moe", "loss"] == "1.5787 ± 0.0015"  # mean 1.578667, std (ddof=1) 0.001528
    assert t.loc["moe", "ppl"].startswith("4.85 ± ")


def test_formatting():
    assert tables.pm(1.5, float("nan")) == "1.5000 ± n/a"
    assert tables.pm(4.848, 0.0071, 2) == "4.85 ± 0.01"
    assert tables.fmt_count(14_890_000) == "14.89M"
    assert tables.fmt_count(147_830) == "147.8k"
    assert tables.fmt_count(147_830, "M") == "0.15M"


def test_seed_table_and_gap_std_is_std_of_per_seed_gaps(df):
    t = tables.seed_table(df, *MODELS)
    w = df.pivot(index="seed", columns="model", values="best_val_loss")
    active = w["dense_active"] - w["moe"]
    total = w["moe"] - w["dense_total"]
    assert list(t.index) == [1, 2, 3, "mean", "std"]
    np.testing.assert_allclose(t.loc[[1, 2, 3], "active_gap"].astype(float), active.values)
    assert t.loc["mean", "active_gap"] == pytest.approx(active.mean())
    assert t.loc["std", "active_gap"] == pytest.approx(np.std(active.values, ddof=1))
    assert t.loc["std", "total_gap"] == pytest.approx(np.std(total.values, ddof=1))
    # the paired std is not the std of the difference of means (it uses the per-seed pairing)
    g = tables.gaps(df, *MODELS)
    assert g["active"]["std"] == pytest.approx(np.std(active.values, ddof=1))
    assert g["total"]["mean"] == pytest.approx(total.mean())
    assert g["active"]["n"] == 3


def test_ordering_holds_and_gaps_exceed_std(df):
    o = tables.ordering(df, *MODELS)
    assert o["holds"]
    assert o["active_exceeds_std"] and o["total_exceeds_std"]
    sentence = text.verdict(o, "x")
    assert "HOLDS" in sentence and "larger than its seed std" in sentence
    assert "in preset 'x'" in sentence and "paper +0.0758" in sentence


def test_ordering_fails_when_reversed():
    df = summary_frame({"dense_active": [1.5, 1.51], "moe": [1.6, 1.62], "dense_total": [1.4, 1.41]})
    o = tables.ordering(df, *MODELS)
    assert not o["holds"]
    assert not o["active_exceeds_std"]
    assert "does NOT hold" in text.verdict(o)
    assert "reversed" in text.verdict(o)


def test_ordering_gap_within_noise():
    # ordering holds in the means but the active gap is smaller than its seed std
    df = summary_frame({"dense_active": [1.70, 1.50, 1.61], "moe": [1.58, 1.59, 1.58],
                        "dense_total": [1.50, 1.50, 1.50]})
    o = tables.ordering(df, *MODELS)
    assert o["holds"] and not o["active_exceeds_std"] and o["total_exceeds_std"]
    assert "within its seed std" in text.verdict(o)


def test_single_seed_has_no_std():
    df = summary_frame({"dense_active": [1.7], "moe": [1.6], "dense_total": [1.5]})
    o = tables.ordering(df, *MODELS)
    assert o["holds"] and math.isnan(o["active_gap_std"]) and not o["active_exceeds_std"]
    assert "no std" in text.verdict(o)


def test_gap_curves_per_seed_then_mean_std():
    rows = []
    for seed, off in ((1, 0.0), (2, 0.02), (3, -0.01)):
        for step in (10, 20):
            rows.append({"kind": "eval", "model": "a", "seed": seed, "step": step, "tokens": step * 5,
                         "val_loss": 3.0 - step / 100 + off})
            rows.append({"kind": "eval", "model": "b", "seed": seed, "step": step, "tokens": step * 5,
                         "val_loss": 2.9 - step / 100 + 2 * off})
    m = pd.DataFrame(rows)
    gc = tables.gap_curves(m, {"a-b": ("a", "b")})
    assert list(gc["step"]) == [10, 20]
    per_seed = np.array([0.1 - off for off in (0.0, 0.02, -0.01)])
    assert gc["mean"].iloc[0] == pytest.approx(per_seed.mean())
    assert gc["std"].iloc[0] == pytest.approx(np.std(per_seed, ddof=1))
    assert gc["tokens"].iloc[1] == 100 and gc["n"].iloc[0] == 3
    assert len(gc.attrs["per_seed"]) == 6
    with pytest.raises(KeyError):
        tables.gap_curves(m, {"x": ("a", "zzz")})


def test_param_split_sums_to_total():
    from _tiny import tiny_preset
    from studylib.config import count_params

    p = tiny_preset()
    cfgs = [p.model_config(m) for m in ("dense", "moe")]
    split = tables.param_split(cfgs)
    for c in cfgs:
        n = count_params(c)
        assert split.loc[c.name].sum() == n.total
        assert split.loc[c.name, ["embedding", "non_ffn", "ffn_active", "router"]].sum() == n.active
    acct = tables.accounting_frame(cfgs)
    assert acct.loc["moe", "ffn"] == "4x32 top-2"
    n = count_params(cfgs[1])
    assert acct.loc["moe", "display"] == " | ".join(f"{v / 1e3:.1f}k" for v in (
        n.embedding, n.non_ffn, n.ffn_total)) + f" | {n.total / 1e3:.1f}k / {n.active / 1e3:.1f}k"


def test_granularity_table_deltas_against_the_first_model():
    s = pd.DataFrame({"model": ["k1", "k2", "k4", "k2"], "best_val_loss": [2.0, 1.9, 2.1, 1.95]})
    g = tables.granularity_table(s, ["k1", "k2", "k4"])
    assert list(g.index) == ["k1", "k2", "k4"]
    np.testing.assert_allclose(g["delta_vs_k1"], [0.0, -0.075, 0.1])  # k2: mean over its two runs
    assert tables.granularity_table(s, ["k1", "k2"], base="k2").loc["k1", "delta_vs_k2"] == pytest.approx(0.075)


def test_throughput_table_ratio():
    raw = pd.DataFrame({"model": ["d", "m", "m"], "dispatch": ["", "naive", "grouped"], "impl": "studylib",
                        "tok_s": [100.0, 50.0, 80.0], "tok_s_min": [90.0, 40, 70], "tok_s_max": [110.0, 60, 90],
                        "ratio_ref": [1.0, 0.49, 0.81]})
    t = tables.throughput_table(raw, ref="d")
    assert list(t.index) == ["d", "m[naive]", "m[grouped]"]
    assert list(t["ratio_to_d"]) == [1.0, 0.49, 0.81]  # the bench's paired ratios
    t2 = tables.throughput_table(raw, ref="m")
    assert t2["ratio_to_m"].iloc[0] == pytest.approx(2.0)


def test_throughput_table_labels_decode_rows_and_other_implementations():
    raw = pd.DataFrame({"model": ["d", "d", "m"], "cache": [True, False, True], "impl": ["studylib", "studylib", "hf"],
                        "tok_s": [100.0, 20.0, 50.0], "tok_s_min": [90.0, 19, 40], "tok_s_max": [110.0, 21, 60]})
    t = tables.throughput_table(raw)
    assert list(t.index) == ["d (KV cache)", "d (no cache)", "m (KV cache) (hf)"]
    assert list(t["range"]) == ["90-110", "19-21", "40-60"]
    assert not any(c.startswith("ratio_") for c in t.columns)
    with pytest.raises(KeyError):
        tables.throughput_table(raw, ref="zzz")
