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
