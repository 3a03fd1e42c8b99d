"""The result tables (studylib.study.analysis.tables) and the sentences worded from them (studylib.study.analysis.text),
on synthetic frames and the paper's Table 6 (no training). Every comparison goes through
stats.paired; a gap is resolved only when its 95% CI excludes 0."""
from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

from studylib.study.analysis import stats, tables, text
from studylib.study.analysis.paper import PAPER_GRANULARITY, PAPER_TABLE6
from studylib.study.analysis.stats import paired

MODELS = ("dense_active", "moe", "dense_total")
HEADLINE = ("dense_active", "moe_top2_z", "dense_total")  # the paper's Table 6 columns


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


def table6_frame() -> pd.DataFrame:
    """The paper's Table 6 as a collect_runs-like frame."""
    return summary_frame({m: list(PAPER_TABLE6[m]) for m in HEADLINE}).assign(
        seed=lambda d: d["seed"].map(dict(enumerate(PAPER_TABLE6.index, 1))))


def test_seed_table_rows_and_gap_statistics_are_stats_paired(df):
    t = tables.seed_table(df, *MODELS)
    w = df.pivot(index="seed", columns="model", values="best_val_loss")
    active = (w["dense_active"] - w["moe"]).to_numpy()
    total = (w["moe"] - w["dense_total"]).to_numpy()
    assert list(t.index) == [1, 2, 3, "mean", "std", "ci_low", "ci_high"]
    np.testing.assert_allclose(t.loc[[1, 2, 3], "active_gap"].astype(float), active)
    for col, d in (("active_gap", active), ("total_gap", total)):
        p = paired(d)
        assert [t.loc[r, col] for r in ("mean", "std", "ci_low", "ci_high")] == \
            pytest.approx([p.mean, p.std, p.ci_low, p.ci_high], rel=1e-12)
    assert t.loc["std", "moe"] == pytest.approx(np.std([1.58, 1.577, 1.579], ddof=1))
    assert np.isnan(t.loc["ci_low", "moe"])  # intervals are for the paired gaps only


def test_headline_gaps_reproduce_the_papers_table6():
    g = tables.headline_gaps(table6_frame(), *HEADLINE)
    assert list(g.index) == ["active", "total"]
    assert round(g.loc["active", "mean"], 4) == 0.0758 and round(g.loc["total", "mean"], 4) == 0.0180
    assert g.loc["active", "ci_low"] == pytest.approx(0.0706980, abs=1e-6)  # t(0.975, 2) = 4.3027 by hand
    assert g.loc["active", "ci_high"] == pytest.approx(0.0808354, abs=1e-6)
    assert g["resolved"].all() and (g["n"] == 3).all()
    assert list(g["paper_mean"]) == [0.0758, 0.0180] and list(g["paper_std"]) == [0.0021, 0.0020]
    assert g.loc["active", "gap"] == "+0.0758 [+0.0707, +0.0808] (n=3)"
    ps = g.attrs["per_seed"]
    assert list(ps[ps.comparison == "active"]["seed"]) == [1337, 1338, 1339]


def test_gap_phrase_follows_the_confidence_interval():
    resolved = paired([1.6554, 1.6532, 1.6551], [1.5774, 1.5779, 1.5811])
    assert text.gap_phrase(resolved, "dense", "moe") == (
        "moe ahead of dense by 0.0758 [0.0707, 0.0808], resolved (95% CI excludes 0; n=3 seeds, p=0.00024)")
    # the winner's advantage: a negative gap names the first model, with its interval flipped
    assert text.gap_phrase(paired([-0.07, -0.075, -0.072]), "dense", "moe").startswith(
        "dense ahead of moe by 0.0723 [0.0661, 0.0786], resolved")
    # mean above one seed std (the old rule's "larger than its seed std"), but the CI spans 0
    loose = paired([0.07, 0.01, 0.03])
    assert loose.mean > loose.std
    assert text.gap_phrase(loose, "dense", "moe") == (
        "dense − moe = +0.0367, not resolved: the 95% CI [-0.0392, +0.1126] includes 0 (n=3 seeds)")
    assert "not resolved" in text.gap_phrase(paired([0.5]), "dense", "moe")
    assert "no interval" in text.gap_phrase(paired([0.5]), "dense", "moe")


def test_headline_verdict_resolved_case_reproduces_the_ordering():
    g = tables.headline_gaps(table6_frame(), *HEADLINE)
    v = text.headline_verdict(g, *HEADLINE, preset_name="paper", tokens=426_300_000)
    assert "moe_top2_z better than dense_active by 0.0758 [0.0707, 0.0808] (95% CI; p=0.00024; n=3 seeds)" in v
    assert "dense_total better than moe_top2_z by 0.0180 [0.0130, 0.0230]" in v
    assert "Holm" not in v  # the two pre-registered gaps are not corrected for each other
    assert "is reproduced: both gaps are resolved in the paper's direction" in v
    assert "in preset 'paper'" in v and "n=3 seeds" in v and "426,300,000 target tokens" in v
    assert "What this does not show" in v


def test_headline_verdict_unresolved_and_contradicted_cases():
    # active gaps 0.07, 0.01, 0.03 (above one std, CI spans 0); total gaps clearly positive
    loose = summary_frame({"dense_active": [1.65, 1.59, 1.61], "moe": [1.58, 1.58, 1.58],
                           "dense_total": [1.56, 1.561, 1.559]})
    v = text.headline_verdict(tables.headline_gaps(loose, *MODELS), *MODELS)
    assert "inconclusive: dense_active − moe = +0.0367 [-0.0392, +0.1126] shows neither a difference" in v
    assert "better than dense_active" not in v  # an unresolved gap names no winner
    assert "is not established here: the matched-active gap is not resolved" in v
    # the dense active-match better on every seed: the paper's ordering is contradicted
    reversed_ = summary_frame({"dense_active": [1.50, 1.51, 1.505], "moe": [1.60, 1.62, 1.61],
                               "dense_total": [1.40, 1.41, 1.40]})
    v = text.headline_verdict(tables.headline_gaps(reversed_, *MODELS), *MODELS)
    assert "dense_active better than moe by" in v
    assert "is contradicted: the matched-active gap is resolved in the opposite" in v
    one = summary_frame({"dense_active": [1.7], "moe": [1.6], "dense_total": [1.5]})
    v = text.headline_verdict(tables.headline_gaps(one, *MODELS), *MODELS)
    assert "from one seed, so no test" in v and "not established" in v and "with one seed there is no interval" in v


def test_comparison_table_pairs_by_seed_and_sentences():
    df = summary_frame({"a": [2.0, 2.1, 2.2], "b": [1.9, 2.05, 2.08]})
    t = tables.comparison_table(df, {"a vs b": ("a", "b")})
    p = paired([2.0, 2.1, 2.2], [1.9, 2.05, 2.08])
    r = t.loc["a vs b"]
    assert (r["a"], r["b"], r["n"]) == ("a", "b", 3)
    assert [r["mean"], r["std"], r["ci_low"], r["ci_high"], r["p"]] == pytest.approx(
        [p.mean, p.std, p.ci_low, p.ci_high, p.p], rel=1e-12)
    assert r["resolved"] == p.resolved and r["gap"] == p.fmt()  # a family of one: Holm changes nothing
    assert (r["p_holm"], r["family_size"], r["margin"]) == (r["p"], 1, 0.03)
    assert text.comparison_sentences(t) == f"{stats.verdict_words(r, 'a', 'b')}."
    assert text.comparison_sentences(t) == "b better than a by 0.0900 [0.0004, 0.1796] (95% CI; p=0.05; n=3 seeds)."
    assert text.gap_phrase(p, "a", "b").startswith("b ahead of a by 0.0900")  # a Paired alone: its CI's words
    relabelled = tables.relabel(t, {"a vs b": "A"})
    assert list(relabelled.index) == ["A"] and set(relabelled.attrs["per_seed"]["comparison"]) == {"A"}
    assert set(t.attrs["per_seed"]["comparison"]) == {"a vs b"}  # the original is left alone


def test_gap_curves_use_the_subset_and_paired_intervals():
    rows = []
    for seed, off in ((1, 0.0), (2, 0.02), (3, -0.01)):
        for step in (10, 20):
            last = step == 20  # the final record is the full split, with the subset's loss beside it
            for model, base, scale in (("a", 3.0, 1), ("b", 2.9, 2)):
                sub = base - step / 100 + scale * off
                rows.append({"kind": "eval", "model": model, "seed": seed, "step": step, "tokens": step * 5,
                             "val_loss": sub + (0.5 if last and model == "a" else 0.0), "full": last,
                             **({"subset_val_loss": sub} if last else {})})
    gc = tables.gap_curves(pd.DataFrame(rows), {"a-b": ("a", "b")})
    assert list(gc["step"]) == [10, 20]
    per_seed = np.array([0.1 - off for off in (0.0, 0.02, -0.01)])
    p = paired(per_seed)
    for i in (0, 1):  # the last step's gap is the subset's (the +0.5 of a's full pass is not on the curve)
        assert [gc["mean"].iloc[i], gc["std"].iloc[i], gc["ci_low"].iloc[i], gc["ci_high"].iloc[i]] == \
            pytest.approx([p.mean, p.std, p.ci_low, p.ci_high], rel=1e-9)
    assert gc["tokens"].iloc[1] == 100 and gc["n"].iloc[0] == 3 and gc["resolved"].all()
    assert len(gc.attrs["per_seed"]) == 6
    with pytest.raises(KeyError):
        tables.gap_curves(pd.DataFrame(rows), {"x": ("a", "zzz")})


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


def test_granularity_table_pairs_each_K_with_K1_by_seed():
    s = pd.DataFrame({"model": ["k1", "k2", "k4"] * 3, "seed": [1] * 3 + [2] * 3 + [3] * 3,
                      "best_val_loss": [2.0, 1.9, 2.1, 2.2, 2.15, 2.3, 2.1, 1.99, 2.2]})
    g = tables.granularity_table(s, ["k1", "k2", "k4"], K={"k1": 1, "k2": 2, "k4": 4}, paper=PAPER_GRANULARITY)
    assert list(g.index) == ["k1", "k2", "k4"] and list(g["K"]) == [1, 2, 4]
    p2 = paired([1.9, 2.15, 1.99], [2.0, 2.2, 2.1])
    assert g.loc["k2", "delta_vs_k1"] == pytest.approx(p2.mean)
    assert [g.loc["k2", "ci_low"], g.loc["k2", "ci_high"]] == pytest.approx([p2.ci_low, p2.ci_high])
    assert g.loc["k4", "delta_vs_k1"] == pytest.approx(0.1) and g.loc["k4", "resolved"]  # +0.1 on every seed
    assert g.loc["k1", "delta_vs_k1"] == 0.0 and np.isnan(g.loc["k1", "ci_low"])
    assert list(g["paper_delta"]) == [0.0, -0.0048, 0.0053]
    assert g.loc["k2", "best_val_loss_std"] == pytest.approx(np.std([1.9, 2.15, 1.99], ddof=1))
    assert list(g.attrs["comparisons"].index) == ["k2", "k4"]


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


def test_power_table_on_the_papers_table6():
    """The paper's own seeds (std 0.0020 per gap) resolve its gaps with 3 seeds; the table's
    numbers are the stats functions' at that std, and the sentence names them."""
    g = tables.headline_gaps(table6_frame(), *HEADLINE)
    pw = tables.power_table(g, g["paper_mean"], target=0.03)
    assert list(pw.index) == ["active", "total"]
    assert pw.loc["active", "std"] == pytest.approx(g.loc["active", "std"])
    assert pw.loc["active", "half_width"] == pytest.approx(g.loc["active", "ci_high"] - g.loc["active", "mean"])
    assert pw.loc["active", "seeds_target"] == 2 and pw.loc["total", "seeds_effect"] == 3  # 2 seeds: power 0.68
    assert pw.loc["active", "hw@10"] < pw.loc["active", "hw@5"] < pw.loc["active", "hw@3"]
    s = text.power_sentences(pw)
    assert "±0.03 takes 2 seeds" in s and "0.0758" in s


def test_power_table_noisy_gap_needs_more_seeds_than_ten():
    df = summary_frame({"dense_active": [4.00, 4.09, 3.99], "moe": [4.04, 4.01, 4.04],
                        "dense_total": [3.85, 3.87, 3.89]})
    g = tables.headline_gaps(df, "dense_active", "moe", "dense_total")
    pw = tables.power_table(g, {"active": 0.0758})
    assert pw.loc["active", "seeds_target"] > 10
    assert pd.isna(pw.loc["total", "seeds_effect"]) and pd.isna(pw.loc["total", "effect"])
    with pytest.raises(KeyError, match="per_seed"):
        tables.power_table(pd.DataFrame(g.to_dict()), {})  # a frame without the per-seed gaps


def test_seed_spread_names_the_runs_that_stayed_behind():
    df = summary_frame({"dense_active": [3.70, 3.72, 3.71, 3.95], "moe": [3.70, 3.70, 3.71, 3.72]})
    t = tables.seed_spread(df, ["dense_active", "moe"])
    assert t.loc["dense_active", "failed"] == "4" and t.loc["moe", "failed"] == "none"
    assert t.loc["dense_active", "worst_seed"] == 4
    assert t.loc["dense_active", "worst_minus_median"] == pytest.approx(3.95 - 3.715)


def test_the_verdict_says_where_the_papers_gap_lies():
    # active gaps 0.010, 0.020, 0.015, 0.012, 0.018: CI about [0.009, 0.021], the paper's 0.0758 above it
    df = summary_frame({"dense_active": [1.610, 1.620, 1.615, 1.612, 1.618], "moe": [1.60] * 5,
                        "dense_total": [1.58, 1.59, 1.585, 1.57, 1.583]})
    g = tables.headline_gaps(df, *MODELS)
    v = text.headline_verdict(g, *MODELS)
    assert "the paper's +0.0758 lies above this interval, so a gap as large as the paper's is ruled out here" in v
    assert "the paper's +0.0180 lies inside this interval" in v
    assert text.paper_clause(paired([0.5]), 0.0758) == ""
    wide = paired([0.1, 0.12, 0.11])
    assert text.paper_clause(wide, 0.0758) == "; the paper's +0.0758 lies below this interval, so the gap here is larger than the paper's"
