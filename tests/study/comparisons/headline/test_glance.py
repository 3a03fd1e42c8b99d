"""The headline's part of the answer at a glance: how the MoE stands against each match, from the
family's verdict, and the paper's row from its Table 6."""
import pytest

from studylib.study.analysis.paper import PAPER_POSITION
from studylib.study.comparisons.headline.glance import _phrase, _within, paper_row


def test_the_headline_phrase_follows_the_familys_verdict():
    row = {"verdict": "equivalent", "margin": 0.03, "resolved": False, "mean": 0.001}
    assert _phrase(row, moe_is_b=True) == "as good as" and _within(row) == " (within ±0.03 nats)"
    assert _phrase({"verdict": "B better"}, moe_is_b=True) == "ahead of"  # dense_active - MoE: B is the MoE
    assert _phrase({"verdict": "B better"}, moe_is_b=False) == "behind"  # MoE - dense_total: B is the dense
    assert _phrase({"verdict": float("nan"), "resolved": True, "mean": 0.07}, moe_is_b=False) == "ahead of"
    assert _phrase({"verdict": "inconclusive"}, moe_is_b=True) == "not told apart from"
    assert _within({"verdict": "B better"}) == ""


def test_the_papers_row_comes_from_its_per_seed_losses():
    r = paper_row()
    assert r.moe.startswith("1.579 [") and r.gap_active == "+0.0758 ± 0.0021 sd"
    assert float(r.position.split()[0]) == pytest.approx(PAPER_POSITION, abs=0.01)
