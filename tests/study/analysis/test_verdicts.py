"""Issue #31: the notebooks' comparison tables are families: their Holm-adjusted p values are
statsmodels' ``multipletests(method="holm")`` of the same p values, their TOST p values are
``ttost_paired``'s, and the sentences say "equivalent within" exactly when the adjusted TOST does."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from studylib.study.analysis import stats, tables, text
from studylib.study.comparisons.downstream import evaluate as downstream
from studylib.study.comparisons.router_variants import variants as V

multipletests = pytest.importorskip("statsmodels.stats.multitest").multipletests
ttost_paired = pytest.importorskip("statsmodels.stats.weightstats").ttost_paired


def _losses(values: dict) -> pd.DataFrame:
    return pd.DataFrame([{"model": m, "seed": s + 1, "best_val_loss": v} for m, vals in values.items()
                         for s, v in enumerate(vals)])


def _downstream_frame(rng, n=5):
    """Notebook 10's per-run frame: three models x n seeds x the four metrics."""
    rows = []
    for s in range(n):
        for m, shift in (("dense_active", 0.0), ("moe", -0.01), ("dense_total", -0.04)):
            rows.append({"model": m, "seed": s, "lastword_acc": 0.12 - shift + rng.normal(0, 0.01),
                         "lastword_ppl": 800 * (1 + shift) + rng.normal(0, 20), "word_ppl": 170 * (1 + shift) + rng.normal(0, 4),
                         "bits_per_byte": 1.45 * (1 + shift) + rng.normal(0, 0.01)})
    return pd.DataFrame(rows)


def test_notebook_10s_family_is_holm_over_its_8_comparisons_as_statsmodels_computes_it():
    df = _downstream_frame(np.random.default_rng(10))
    g = downstream.metric_gaps(df, "moe", ["dense_active", "dense_total"], margin=0.03)
    assert len(g) == 8 and (g["family_size"] == 8).all() and (g["margin"] == 0.03).all()
    np.testing.assert_allclose(g["p_holm"], multipletests(g["p"], method="holm")[1], rtol=1e-12)
    np.testing.assert_allclose(g["p_tost_holm"], multipletests(g["p_tost"], method="holm")[1], rtol=1e-12)
    assert (g["resolved"] == (g["p_holm"] < 0.05)).all() and (g["equivalent"] == (g["p_tost_holm"] < 0.05)).all()
    w = {c: df.pivot(index="seed", columns="model", values=c) for c, *_ in downstream.METRICS}
    for r in g.itertuples():
        a, b = w[r.metric]["moe"].to_numpy(), w[r.metric][r.b].to_numpy()
        if r.margin_scale == "log ratio":  # the perplexities and bits per byte: a relative margin
            a, b = np.log(a), np.log(b)
        assert r.p_tost == pytest.approx(ttost_paired(a, b, -0.03, 0.03)[0], rel=1e-9)
    # a verdict names a model by the metric's direction: higher accuracy, lower perplexity is better
    for r in g.itertuples():
        if r.verdict in (stats.A_BETTER, stats.B_BETTER):
            a_wins = (r.gap > 0) == r.higher_is_better
            assert r.verdict == (stats.A_BETTER if a_wins else stats.B_BETTER)
            assert r.verdict_label == f"{'moe' if a_wins else r.b} better"


def test_notebook_10s_earlier_resolved_claims_do_not_survive_holm_over_8():
    """docs/statistics.md, "Claims that changed": the three comparisons resolved one at a time
    (raw p 0.0099, 0.031, 0.034; the other five above 0.05) are none resolved over the family."""
    p = [0.0099, 0.031, 0.034, 0.08, 0.2, 0.35, 0.5, 0.9]
    adj = stats.holm(p)
    np.testing.assert_allclose(adj, multipletests(p, method="holm")[1])
    assert (adj >= 0.05).all() and adj[:3] == pytest.approx([0.0792, 0.217, 0.217], abs=1e-3)
    # notebook 12: 0.015 and 0.022 over the six variants
    assert (stats.holm([0.015, 0.022, 0.3, 0.4, 0.6, 0.8])[:2] == pytest.approx([0.09, 0.11]))


def test_a_comparison_table_is_one_family_as_statsmodels_computes_it():
    rng = np.random.default_rng(3)
    base = 3.6 + rng.normal(0, 0.02, 5)
    losses = {"ref": base, **{f"v{i}": base + shift + rng.normal(0, 0.01, 5)
                              for i, shift in enumerate((0.0, 0.005, 0.02, 0.05))}}
    t = tables.comparison_table(_losses(losses), {f"v{i} − ref": (f"v{i}", "ref") for i in range(4)}, margin=0.03,
                                family="toy")
    np.testing.assert_allclose(t["p_holm"], multipletests(t["p"], method="holm")[1], rtol=1e-12)
    np.testing.assert_allclose(t["p_tost_holm"], multipletests(t["p_tost"], method="holm")[1], rtol=1e-12)
    for label, (a, b) in {f"v{i} − ref": (f"v{i}", "ref") for i in range(4)}.items():
        assert t.loc[label, "p_tost"] == pytest.approx(ttost_paired(np.asarray(losses[a]), np.asarray(losses[b]),
                                                                    -0.03, 0.03)[0], rel=1e-9)
    assert (t["family_size"] == 4).all() and (t["family"] == "toy").all()
    assert set(tables.FAMILY_COLUMNS) <= set(t.columns) and set(tables.COMPARISON_COLUMNS) <= set(t.columns)
    assert (t["resolved"] == (t["p_holm"] < 0.05)).all()


def test_the_text_says_equivalent_within_exactly_when_the_adjusted_tost_does():
    rng = np.random.default_rng(31)
    seen = set()
    for k in range(40):
        base = 3.6 + rng.normal(0, 0.02, 5)
        losses = {"ref": base, **{f"v{i}": base + rng.uniform(-0.05, 0.05) + rng.normal(0, rng.uniform(0.003, 0.03), 5)
                                  for i in range(4)}}
        t = tables.comparison_table(_losses(losses), {f"v{i}": (f"v{i}", "ref") for i in range(4)}, family=f"f{k}")
        for label, r in t.iterrows():
            s = text.comparison_sentences(t.loc[[label]], lead=False)
            eq = bool(r["p_tost_holm"] < 0.05)
            better = bool(r["p_holm"] < 0.05)
            assert ("equivalent within ±0.03 nats" in s) == (eq and not better), s
            if better:  # a resolved gap inside the margin says so too
                assert ("the gap also lies within ±0.03 nats" in s) == eq, s
            assert ("better than" in s) == better and s.startswith("inconclusive") == (not eq and not better), s
            assert ("Holm-adjusted" in s) and "over 4 comparisons" in s or s.startswith("inconclusive")
            if not better:  # a CI that excludes 0 on its own says so: the claim Holm took away
                assert ("survives Holm's correction" in s) == (r["ci_low"] > 0 or r["ci_high"] < 0) \
                    or eq, s
            seen.add(r["verdict"])
    assert seen == {stats.A_BETTER, stats.B_BETTER, stats.EQUIVALENT, stats.INCONCLUSIVE}


def test_the_headline_gaps_are_uncorrected_and_say_equivalent_within_the_margin():
    """Hand-checked: a matched-active gap of +0.001 over 5 seeds with per-seed gaps
    +0.02, -0.015, +0.01, -0.02, +0.01 (std 0.01746): 95% CI +0.001 +- 2.776 x 0.00781 =
    [-0.0207, +0.0227] includes 0, so not resolved; 90% CI +0.001 +- 2.132 x 0.00781 = [-0.0156,
    +0.0176] lies inside +-0.03, so the TOST resolves equivalence. The total gap +0.08 on every
    seed (+- 0.005) is resolved; neither is Holm-corrected for the other."""
    moe = np.array([3.60, 3.62, 3.61, 3.63, 3.60])
    d_active = np.array([0.02, -0.015, 0.01, -0.02, 0.01])
    df = _losses({"dense_active": moe + d_active, "moe": moe, "dense_total": moe - [0.08, 0.085, 0.075, 0.08, 0.082]})
    g = tables.headline_gaps(df, "dense_active", "moe", "dense_total", margin=0.03)
    act = g.loc["active"]
    assert (act["ci_low"], act["ci_high"]) == pytest.approx((-0.0207, 0.0227), abs=2e-4)
    assert (g["family_size"] == 1).all() and (g["p_holm"] == g["p"]).all() and (g["p_tost_holm"] == g["p_tost"]).all()
    assert act["p_tost"] == pytest.approx(ttost_paired(moe + d_active, moe, -0.03, 0.03)[0], rel=1e-9)
    assert act["verdict"] == stats.EQUIVALENT and g.loc["total", "verdict"] == stats.B_BETTER
    v = text.headline_verdict(g, "dense_active", "moe", "dense_total")
    assert "dense_active and moe equivalent within ±0.03 nats: dense_active − moe = +0.0010 [-0.0207, +0.0227]" in v
    assert "the matched-active gap is not resolved (matched-active gap: the models are equivalent within ±0.03" in v
    assert "Holm" not in v
    # a wider margin's knob is used as given
    assert tables.headline_gaps(df, "dense_active", "moe", "dense_total", margin=0.01).loc["active", "verdict"] \
        == stats.INCONCLUSIVE


def test_notebook_12s_three_families_are_corrected_each_over_its_own_size():
    rng = np.random.default_rng(12)
    base = 3.6 + rng.normal(0, 0.02, 4)
    losses = {"dense_active": base + 0.002 + rng.normal(0, 0.01, 4), "moe": base,
              "moe_a": base + 0.012 + rng.normal(0, 0.004, 4), "moe_b": base + 0.001 + rng.normal(0, 0.01, 4),
              "moe_c": base + 0.03 + rng.normal(0, 0.02, 4), "dense_total": base - 0.08 + rng.normal(0, 0.005, 4)}
    t = V.variant_table(_losses(losses), ["moe", "moe_a", "moe_b", "moe_c"], "moe", "dense_active", "dense_total",
                        margin=0.03)
    cmp = t.attrs["comparisons"]
    sizes = cmp.groupby("family", sort=False)["family_size"].agg(["max", "size"])
    assert list(sizes.index) == [name for _, name in V.FAMILIES]
    assert list(sizes["max"]) == [3, 4, 4] and list(sizes["size"]) == [3, 4, 4]
    for _, g in cmp.groupby("family"):
        np.testing.assert_allclose(g["p_holm"], multipletests(g["p"], method="holm")[1], rtol=1e-12)
    assert t.loc["moe_a", "vs_ref_p_holm"] == cmp.loc["moe_a − moe", "p_holm"]
    assert t.loc["moe_a", "vs_ref_verdict"] == cmp.loc["moe_a − moe", "verdict"]
    assert t.loc["moe", "vs_ref_verdict"] == "" and (t["vs_total_verdict"] == stats.B_BETTER).all()
    lead = text.family_lead(cmp)
    assert 'Family "12 router variants: each variant − the reference MoE" (3 comparisons; Holm-corrected over 3' in lead
