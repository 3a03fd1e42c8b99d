"""The shape ratios of notebook 01: the paper preset reproduces the ratios of the paper's own
Table 5, and the default `cpu` preset keeps them (a guard on params/cpu.yaml)."""
from __future__ import annotations

from pathlib import Path

import pytest

from studylib.config import load_preset
from studylib.study.analysis import shape
from studylib.study.analysis.paper import PAPER_TABLE5

PARAMS = Path(__file__).resolve().parents[3] / "params"


def _m(s: str) -> float:
    return float(s.rstrip("M")) * 1e6


def test_paper_preset_gives_the_ratios_of_the_papers_table5():
    s = shape.shape(load_preset(PARAMS / "paper.yaml"))
    emb, _, _, _, act = (_m(v) for v in PAPER_TABLE5["moe_top2_z"])
    d_emb, _, _, _, d_act = (_m(v) for v in PAPER_TABLE5["dense_active"])
    # the published counts have two decimals in millions: ratios agree to ~1e-3
    assert s["emb_share_moe"] == pytest.approx(emb / act, abs=1e-3)
    assert s["emb_share_dense_active"] == pytest.approx(d_emb / d_act, abs=1e-3)
    assert s["nonemb_ratio"] == pytest.approx((act - emb) / (d_act - d_emb), abs=3e-3)
    assert (s["width_active"], s["width_total"]) == (1.25, 1.5)


def test_cpu_preset_keeps_the_papers_shape():
    paper, cpu = (shape.shape(load_preset(PARAMS / f"{n}.yaml")) for n in ("paper", "cpu"))
    for key in ("emb_share_moe", "emb_share_dense_active"):
        assert cpu[key] == pytest.approx(paper[key], abs=0.01), key
    assert cpu["nonemb_ratio"] == pytest.approx(paper["nonemb_ratio"], rel=0.05)
    for key in ("width_active", "width_total", "expert_hidden_over_d", "routing", "n_layers"):
        assert cpu[key] == paper[key], key
    assert cpu["flops_ratio_active"] == pytest.approx(paper["flops_ratio_active"], abs=0.01)


def test_shape_frame_has_one_column_per_preset_in_order():
    ps = {n: load_preset(PARAMS / f"{n}.yaml") for n in ("cpu", "paper")}
    df = shape.shape_frame(ps)
    assert list(df.columns) == ["quantity", "cpu", "paper"] and list(df.index) == list(shape.ROWS)
    assert df.loc["moe_active", "paper"] == ps["paper"].model_config("moe_top2_z").num_params.active
