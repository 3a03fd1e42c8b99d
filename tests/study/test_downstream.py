"""Notebook 10's paired gaps: the verdict follows the CI and each metric's direction."""
from __future__ import annotations

import pandas as pd
import pytest

from studylib.study import downstream
from studylib.study.stats import paired


def _frame():
    rows = []
    # moe: higher accuracy on every seed by ~0.05 (resolved); word ppl noisy (not resolved);
    # bits per byte lower by ~0.02 on every seed (lower is better: resolved for the MoE)
    for seed, acc_d, acc_m, ppl_d, ppl_m, bpb_d, bpb_m in [(1, 0.30, 0.35, 10.0, 9.0, 1.20, 1.18),
                                                              (2, 0.31, 0.36, 10.0, 11.5, 1.21, 1.19),
                                                              (3, 0.29, 0.35, 10.0, 10.2, 1.19, 1.17)]:
        for model, acc, ppl, bpb in (("dense", acc_d, ppl_d, bpb_d), ("moe", acc_m, ppl_m, bpb_m)):
            rows.append({"model": model, "seed": seed, "lastword_acc": acc, "lastword_ppl": ppl,
                         "word_ppl": ppl, "bits_per_byte": bpb})
    return pd.DataFrame(rows)


def test_verdicts_are_worded_from_the_ci_and_the_metric_direction():
    g = downstream.paired_gaps(_frame(), "moe", ["dense"]).set_index("metric")
    want = paired([0.35, 0.36, 0.35], [0.30, 0.31, 0.29])
    assert g.loc["lastword_acc", "gap"] == pytest.approx(want.mean)
    assert (g.loc["lastword_acc", "ci_low"], g.loc["lastword_acc", "ci_high"]) == pytest.approx((want.ci_low, want.ci_high))
    assert g.loc["lastword_acc", "verdict"] == "moe better" and g.loc["lastword_acc", "resolved"]
    assert g.loc["bits_per_byte", "verdict"] == "moe better"  # lower is better, resolved
    assert g.loc["word_ppl", "verdict"] == "not resolved" and not g.loc["word_ppl", "resolved"]
