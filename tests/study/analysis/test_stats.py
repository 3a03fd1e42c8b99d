"""The paired statistics every comparison uses, on known numbers."""
import math

import numpy as np
import pytest

from studylib.study.analysis import stats as S

from studylib.study.analysis.paper import PAPER_GAPS, PAPER_TABLE6
from studylib.study.analysis.stats import paired


def test_reproduces_the_papers_table6_gaps():
    """seed 000, Table 6: per-seed full-data validation losses (studylib.study.analysis.paper.PAPER_TABLE6)
    give the gaps the paper prints (PAPER_GAPS)."""
    assert PAPER_TABLE6.loc[1338].tolist() == [1.6532, 1.5779, 1.5580]  # as typed from the paper
    dense_active, moe, dense_total = (PAPER_TABLE6[c].tolist() for c in ("dense_active", "moe_top2_z", "dense_total"))
    active = paired(dense_active, moe)  # positive: the MoE is better than its active-match
    total = paired(moe, dense_total)  # positive: the total-match dense model is better
    assert round(active.mean, 4) == PAPER_GAPS["active"][0] and round(total.mean, 4) == PAPER_GAPS["total"][0]
    # the paper prints 0.0021 / 0.0020, computed from its unrounded losses
    assert round(active.std, 4) == 0.0020 and round(total.std, 4) == 0.0020
    assert active.n == total.n == 3


def test_confidence_interval_checked_by_hand():
    d = [0.0780, 0.0753, 0.0740]
    mean = sum(d) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    t_975_2 = 4.302652729911275  # Student t, 97.5th percentile, 2 degrees of freedom (tables)
    s = paired(d)
    assert s.ci_low == pytest.approx(mean - t_975_2 * std / math.sqrt(3), rel=1e-9)
    assert s.ci_high == pytest.approx(mean + t_975_2 * std / math.sqrt(3), rel=1e-9)
    assert s.resolved and s.p < 0.001


def test_one_sigma_is_not_resolved():
    """The old rule ('gap above one seed std') called this resolved; its 95% CI spans zero."""
    s = paired([0.07, 0.01, 0.03])  # mean 0.037, std 0.031
    assert s.mean > s.std > 0 and s.ci_low < 0 < s.ci_high and not s.resolved
    assert 0.05 < s.p < 1


def test_pairs_by_position_and_rejects_bad_input():
    assert paired([3.0, 1.0], [1.0, 0.0]).mean == pytest.approx(1.5)
    one = paired([0.5])
    assert one.n == 1 and math.isnan(one.ci_low) and not one.resolved and "no interval" in one.fmt()
    with pytest.raises(ValueError, match="differ in length"):
        paired([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="non-empty"):
        paired([])
    assert paired([1.0, 1.0, 1.0]).resolved  # identical non-zero gaps: zero width, excludes 0


# --------------------------------------------------------------------------------------------
# power
# --------------------------------------------------------------------------------------------
def test_half_width_at_is_the_interval_paired_gives():
    d = np.array([0.11, 0.02, 0.07, -0.01, 0.05])
    p = S.paired(d)
    assert S.half_width_at(p.std, p.n) == pytest.approx(p.ci_high - p.mean, rel=1e-12)
    assert math.isnan(S.half_width_at(0.1, 1))


def test_power_matches_a_simulation_of_paired_t():
    rng = np.random.default_rng(0)
    std, effect, n, trials = 0.05, 0.04, 6, 4000
    hits = sum(S.paired(rng.normal(effect, std, n)).resolved for _ in range(trials))
    assert S.power_at(std, effect, n) == pytest.approx(hits / trials, abs=0.025)
    # with no effect, "resolved" happens at the test's level
    assert S.power_at(std, 0.0, n) == pytest.approx(0.05, abs=1e-9)


def test_seeds_for_a_textbook_case():
    # one-sample t, d = 0.5, two-sided 5%, power 80%: n = 34 (Cohen 1988; G*Power)
    pw = S.power_of(np.array([0.5, -0.5, 1.5, 0.5]) * 0.1, target=0.01, effect=0.05)
    assert pw.std == pytest.approx(0.1 * np.std([0.5, -0.5, 1.5, 0.5], ddof=1))
    assert S.seeds_needed(lambda n: S.power_at(1.0, 0.5, n) >= 0.8) == 34
    n = pw.seeds_target
    assert S.half_width_at(pw.std, n) <= 0.01 < S.half_width_at(pw.std, n - 1)
    n = pw.seeds_effect
    assert S.power_at(pw.std, 0.05, n) >= 0.8 > S.power_at(pw.std, 0.05, n - 1)
    # the std's 95% upper bound asks for more seeds, never fewer
    assert pw.std_high > pw.std and pw.seeds_effect_high >= pw.seeds_effect
    assert S.seeds_needed(lambda n: False, n_max=5) is None


def test_power_fallback_integral_agrees_with_the_noncentral_t(monkeypatch):
    """Where scipy's noncentral t gives nan, power_at integrates; both agree where both work."""
    cases = [(0.05, 0.04, 6), (0.03, 0.0758, 3), (1.0, 0.5, 34), (0.02, 0.01, 12)]
    direct = [S.power_at(*c) for c in cases]
    monkeypatch.setattr(S._st.nct, "sf", lambda *a, **k: float("nan"))
    assert [S.power_at(*c) for c in cases] == pytest.approx(direct, abs=1e-6)


# --------------------------------------------------------------------------------------------
# a family: Holm, equivalence (TOST), verdicts
# --------------------------------------------------------------------------------------------
from scipy import stats as st  # noqa: E402
from statsmodels.stats.multitest import multipletests  # noqa: E402
from statsmodels.stats.weightstats import ttost_paired  # noqa: E402


def _with_ci(lo, hi, n=5, seed=0):
    """n per-seed gaps whose paired-t 95% CI is exactly [lo, hi]."""
    z = np.random.default_rng(seed).normal(size=n)
    z = (z - z.mean()) / z.std(ddof=1)
    return (lo + hi) / 2 + z * (hi - lo) / 2 / st.t.ppf(0.975, n - 1) * math.sqrt(n)


def test_holm_equals_statsmodels_and_the_issues_families():
    rng = np.random.default_rng(1)
    for m in (2, 12):  # (multipletests runs gc.collect() on each call: slow)
        p = rng.uniform(0, 0.2, m) ** 2
        assert S.holm(p) == pytest.approx(multipletests(p, method="holm")[1], abs=1e-15)
    # notebook 10's family of 8: three raw p < 0.05, none after Holm
    p10 = [0.0099, 0.031, 0.034, 0.21, 0.35, 0.48, 0.62, 0.91]
    assert (S.holm(p10) >= 0.05).all() and S.holm(p10)[0] == pytest.approx(8 * 0.0099)
    # 6 variant-vs-reference comparisons: p = 0.015 and 0.022 are not resolved (Holm needs < 0.05/6)
    assert not (S.holm([0.015, 0.022, 0.2, 0.3, 0.5, 0.7]) < 0.05).any()
    assert S.holm([0.008, 0.022, 0.2, 0.3, 0.5, 0.7])[0] < 0.05
    # NaN (one seed) stays NaN and is not counted; rows are families
    assert S.holm([0.01, np.nan, 0.04]) == pytest.approx([0.02, np.nan, 0.04], nan_ok=True)
    two = S.holm(np.array([[0.01, 0.04], [0.5, 0.001]]))
    assert np.allclose(two, [[0.02, 0.04], [0.5, 0.002]])


def test_tost_equals_statsmodels_and_the_90_percent_interval():
    rng = np.random.default_rng(2)
    for n, mean, margin in ((3, 0.01, 0.03), (5, -0.02, 0.03), (5, 0.001, 0.03), (8, 0.05, 0.03), (12, 0.0, 0.01)):
        d = rng.normal(mean, 0.02, n)
        assert S.tost(d, margin) == pytest.approx(ttost_paired(d, np.zeros(n), -margin, margin)[0], rel=1e-10)
        # duality: TOST at 5% <=> the 90% paired-t interval lies inside the margin
        p90 = S.paired(d, level=0.90)
        assert (S.tost(d, margin) < 0.05) == (-margin < p90.ci_low and p90.ci_high < margin)
    batch = rng.normal(0, 0.02, (4, 6, 5))
    assert S.tost(batch)[2, 3] == pytest.approx(S.tost(batch[2, 3]), rel=1e-12)
    assert math.isnan(S.tost([0.01])) and S.tost([0.01, 0.01]) == 0.0 and S.tost([0.04, 0.04]) == 1.0
    with pytest.raises(ValueError, match="margin must be a positive"):
        S.tost([0.1, 0.2], margin=0)


def test_family_tells_equivalence_from_no_evidence():
    """The issue's two headline gaps: +0.001 [-0.025, +0.028] is equivalence within 0.03 nats,
    +0.276 [-0.059, +0.611] is evidence of nothing; the old rule called both 'not resolved'."""
    act, tot = _with_ci(-0.025, 0.028), _with_ci(-0.059, 0.611, seed=1)
    f = S.family({"active": act, "total": tot})
    assert f.loc["active", "ci_low"] == pytest.approx(-0.025) and f.loc["total", "ci_high"] == pytest.approx(0.611)
    assert not S.paired(act).resolved and not S.paired(tot).resolved
    assert f["verdict"].tolist() == [S.EQUIVALENT, S.INCONCLUSIVE]
    assert f.loc["active", "p_tost_holm"] == pytest.approx(2 * f.loc["active", "p_tost"])  # the smaller of 2
    words = S.verdict_words(f.loc["active"], "dense_active", "moe")
    assert words.startswith("dense_active and moe equivalent within ±0.03 nats")
    assert S.verdict_words(f.loc["total"], "moe", "dense_total").startswith("inconclusive: moe − dense_total = +0.2760 [-0.0590, +0.6110]")


def test_family_columns_come_from_paired_and_the_verdict_from_holm():
    d = {"x": [0.020, 0.031, 0.025, 0.028, 0.022], "y": (np.array([1.5, 1.6, 1.55]), np.array([1.6, 1.72, 1.64])),
         "z": [0.03, -0.02, 0.01, 0.0, 0.02], "one": [0.4]}
    f = S.family(d)
    for k in ("x", "z"):
        p = S.paired(d[k])
        assert (f.loc[k, "mean"], f.loc[k, "ci_low"], f.loc[k, "p"]) == (p.mean, p.ci_low, p.p)
    assert f.loc["y", "mean"] == pytest.approx(-0.1033333, abs=1e-6)
    assert f.loc["x", "verdict"] == S.B_BETTER  # a loss gap a - b > 0: b is better
    assert f.loc["y", "verdict"] == S.A_BETTER
    assert S.family({"x": d["x"]}, higher_is_better=True).loc["x", "verdict"] == S.A_BETTER
    assert f.loc["one", "verdict"] == S.INCONCLUSIVE and math.isnan(f.loc["one", "p_holm"])
    assert (f["family_size"] == 3).all()  # the one-seed comparison has no test
    assert f.loc["x", "p_holm"] == pytest.approx(multipletests(f["p"].dropna(), method="holm")[1][0])
    assert "better than" in S.verdict_words(f.loc["y"], "a", "b") and "one seed" in S.verdict_words(f.loc["one"], "a", "b")
    with pytest.raises(ValueError, match="family: comparison 'bad': a and b differ in length"):
        S.family({"bad": ([1.0, 2.0], [1.0])})
    with pytest.raises(ValueError, match="family: margin"):
        S.family(d, margin=-1)


def test_family_wise_error_rate_under_the_null_is_at_most_alpha():
    """2,000 families of 6 paired comparisons, n = 5 seeds, no true difference: the share of
    families where any comparison is called "A/B better" stays at 5% with Holm (Monte Carlo
    allowance 2 standard errors) and is ~26% without. Every gap at the margin: the share of
    families where any is called "equivalent" stays at 5%."""
    rng = np.random.default_rng(31)
    F, K, n, sd = 2000, 6, 5, 0.02
    allowance = 2 * math.sqrt(0.05 * 0.95 / F)

    def rates(d, margin=S.MARGIN):
        p = st.ttest_1samp(d, 0.0, axis=-1).pvalue  # the test paired() makes, batched
        v = S.verdicts(d.mean(-1), S.holm(p), S.holm(S.tost(d, margin)))
        return np.isin(v, [S.A_BETTER, S.B_BETTER]).any(-1).mean(), (v == S.EQUIVALENT).any(-1).mean(), p

    diff, _, p = rates(rng.normal(0, sd, (F, K, n)))
    assert diff <= 0.05 + allowance
    assert (p < 0.05).any(-1).mean() > 0.2  # uncorrected: the family-wise rate is ~1 - 0.95^6
    for at in (+S.MARGIN, -S.MARGIN):
        _, equiv, _ = rates(rng.normal(at, sd, (F, K, n)))
        assert equiv <= 0.05 + allowance
    one = S.family({k: rng.normal(0, sd, n) for k in range(K)})  # family() decides as verdicts() does
    assert (one["verdict"] == S.verdicts(one["mean"], one["p_holm"], one["p_tost_holm"])).all()
