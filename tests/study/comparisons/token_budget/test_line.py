"""The map on the paper's line (issue #39): every trio a scaled copy of the paper's (refused when it
leaves the family), each trio's runs on its MoE's vocabulary, the repetition cells (the same budget
from fewer stories), the MoE's position between its matches, and what repetition does to each gap."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import yaml

from studylib.config import ConfigError, load_preset, preset_from_dict
from studylib.run.spec import RunSpec, cell_overrides
from studylib.study.analysis.paper import PAPER_POSITION
from studylib.study.analysis.position import position_row
from studylib.study.comparisons import study_of
from studylib.study.analysis.shape import paper_shape, shape
from studylib.study.comparisons.token_budget import budgets, gaps, repetition as checks
from studylib.study.comparisons.token_budget.knobs import FFN_RANGE, SHARE_TOL

ROOT = Path(__file__).resolve().parents[4]


def _cpu_raw() -> dict:
    from studylib.config.presets import read_preset_file

    return read_preset_file(ROOT / "params" / "cpu.yaml")


@pytest.mark.parametrize("name", ["cpu", "cpu_full"])
def test_every_trio_of_the_shipped_presets_is_a_scaled_copy_of_the_papers(name):
    p = load_preset(ROOT / "params" / f"{name}.yaml")
    trios = study_of(p)["token_budget"].trios
    paper = paper_shape()
    assert len(trios) >= 2
    for t in trios:
        s = shape(p, t.models)
        assert abs(s["emb_share_moe"] - paper["emb_share_moe"]) <= SHARE_TOL, t.models
        assert abs(s["emb_share_dense_active"] - paper["emb_share_dense_active"]) <= SHARE_TOL, t.models
        assert FFN_RANGE[0] <= s["ffn_over_d_active"] <= FFN_RANGE[1] and FFN_RANGE[0] <= s["ffn_over_d_total"] <= FFN_RANGE[1]
        assert s["width_active"] == pytest.approx(1.25, abs=0.01) and s["width_total"] == pytest.approx(1.5, abs=0.01)
        assert s["vocab_over_d"] == pytest.approx(3750 / 32, rel=0.01)  # the paper's 117.2 per unit of width
        assert s["expert_hidden_over_d"] == 4 and s["n_layers"] == 4


@pytest.mark.parametrize("model, change, match", [
    # the d-16 trio as it was: the preset's vocabulary (3,750 at d 16) and the solver's default grid
    ("moe_s", {"vocab_size": None}, r"trios\[1\]: the MoE moe_s's embedding share of its active parameters is "
                                   r"0\.674, the paper's 0\.520"),
    ("dense_active_s", {"d_multiple": None}, r"trios\[1\]: the active match dense_active_s's embedding share of its "
                                            r"parameters is 0\.510, the paper's 0\.645"),
    # the d-24 trio as it was (cpu_full's): the preset's vocabulary, d 24 dense baselines of FFN 8x / 16x
    ("moe_m", {"vocab_size": None}, r"trios\[2\]: the MoE moe_m's embedding share of its active parameters is "
                                   r"0\.589, the paper's 0\.520"),
])
def test_a_trio_off_the_papers_line_is_refused_when_the_study_loads(model, change, match):
    raw = _cpu_raw()
    if model.endswith("_m"):  # cpu's map has no d-24 trio: add it
        raw["study"]["token_budget"]["trios"].append({"models": ["dense_active_m", "moe_m", "dense_total_m"],
                                                      "tokens_per_param": [3.53]})
    for k, v in change.items():
        if v is None:
            raw["models"][model].pop(k)
        else:
            raw["models"][model][k] = v
    p = preset_from_dict(raw, str(ROOT / "params" / "cpu.yaml"))
    with pytest.raises(ConfigError, match=r"^study\.token_budget\." + match):
        study_of(p)
    raw["study"]["token_budget"]["shape"] = "any"  # a preset whose models mean nothing may say so
    assert study_of(preset_from_dict(raw, str(ROOT / "params" / "cpu.yaml")))["token_budget"].map.shape == "any"


def test_a_trios_runs_use_its_moes_vocabulary_and_a_repeated_cell_fewer_stories():
    p = load_preset(ROOT / "params" / "cpu.yaml")
    s = study_of(p)
    (head, small) = s["token_budget"].trios
    assert cell_overrides(p, head.moe, 1.0, 1.0, 805) == {}  # the headline runs, reused
    ov = cell_overrides(p, small.moe, 1.0, 1.0, 805)
    assert ov == {"data.vocab_size": 1875, "train.max_steps": 805}  # other data: its steps always set
    rep = cell_overrides(p, small.moe, 2.0, 0.25, 805)
    assert rep == {"train.max_steps": 1610, "data.vocab_size": 1875, "data.train_fraction": 0.25}
    spec = RunSpec.resolve(p, "dense_active_s", 1337, rep)
    assert spec.preset.data.vocab_size == spec.preset.model_config("dense_active_s").vocab_size == 1875
    assert "data.train_fraction=0.25" in str(spec.run_dir)
    with pytest.raises(ConfigError, match=r"^models\.moe_s\.vocab_size=1875: its runs need a tokenizer of that size, "
                                          r"the run's is data\.vocab_size=3750"):
        RunSpec.resolve(p, "moe_s", 1337)


def test_the_position_is_where_the_moe_sits_between_its_matches():
    # L_active - L_MoE = 0.08, L_active - L_total = 0.10 per seed (+ noise): p = 0.8
    g_active = np.array([0.079, 0.081, 0.080, 0.082, 0.078])
    g_total = g_active - np.array([0.099, 0.101, 0.100, 0.102, 0.098])  # L_total - L_MoE
    r = position_row(g_active, g_total, n_boot=500)
    assert r["position"] == pytest.approx(0.080 / 0.100) and r["position_defined"]
    assert r["position_low"] < 0.8 < r["position_high"] < 0.85
    # the two dense models not resolved apart: nothing to sit between
    flat = position_row(np.array([0.01, -0.01, 0.02]), np.array([0.02, -0.02, 0.0]))
    assert not flat["position_defined"] and math.isnan(flat["position"])
    assert PAPER_POSITION == pytest.approx(0.0758 / (0.0758 + 0.0180))


def _per_seed(slope_active: float, slope_total: float, seeds=4, noise=0.002, seed=0) -> pd.DataFrame:
    """Per-seed gaps of two repeated budgets (one size each), each from 1, 1/2 and 1/4 of the stories."""
    rng = np.random.default_rng(seed)
    rows = []
    for size, base_passes in (("s", 1.5), ("m", 0.8)):
        for f in (1.0, 0.5, 0.25):
            passes = base_passes / f
            for sd in range(seeds):
                for gap, b in (("active", slope_active), ("total", slope_total)):
                    v = 0.02 + b * math.log10(passes) + rng.normal(0, noise)
                    rows.append({"size": size, "epochs": 3.0, "stories": f, "seed": sd, "gap": gap, "dense": 3.0 + v,
                                 "moe": 3.0, "value": v, "tokens": 1e6, "tokens_per_param": 10.0,
                                 "data_passes": passes, "unique": 1e6 / max(passes, 1)})
    return pd.DataFrame(rows)


def test_repetition_moves_a_gap_by_its_slope_in_log_passes():
    fit = checks.repetition_fit(_per_seed(0.03, 0.0), n_boot=500).set_index("what")
    assert fit.loc["active", "estimate"] == pytest.approx(0.03, abs=0.004)
    assert fit.loc["active", "verdict"] == "the MoE gains with repetition"
    assert fit.loc["total", "estimate"] == pytest.approx(0.0, abs=0.004)
    gaps_ = fit[fit["family"] == "gap"]
    assert gaps_["p_holm"].tolist() == pytest.approx(
        pytest.importorskip("statsmodels.stats.multitest").multipletests(gaps_["p_boot"], method="holm")[1].tolist())
    table = checks.repetition_table(_per_seed(0.03, 0.0), {"s": 1000, "m": 2000})
    assert len(table) == 6 and set(table["stories"]) == {1.0, 0.5, 0.25}
    words = checks.repetition_sentences(fit.reset_index(), table)[0]
    assert "matched-active gap moves +0.03" in words and "the MoE gains with repetition" in words


def test_a_gap_repetition_does_not_move_is_resolved_about_as_often_as_the_level_says():
    hits = [checks.repetition_fit(_per_seed(0.03, 0.0, seed=s), n_boot=200).set_index("what").loc["total", "ci_low"] > 0
            or checks.repetition_fit(_per_seed(0.03, 0.0, seed=s), n_boot=200).set_index("what").loc["total", "ci_high"] < 0
            for s in range(30)]
    assert sum(hits) / len(hits) <= 0.2, f"{sum(hits)} of {len(hits)} null slopes resolved at 95%"


def test_no_repeated_budget_measures_nothing_and_one_seed_carries_no_interval():
    one = _per_seed(0.03, 0.0)
    assert checks.repetition_fit(one[one["stories"] == 1.0]).empty
    lonely = checks.repetition_fit(_per_seed(0.03, 0.0, seeds=1), n_boot=50)
    assert set(lonely["verdict"]) == {"no interval"} and lonely["ci_low"].isna().all()


@pytest.mark.parametrize("name", ["cpu", "cpu_full"])
def test_the_budget_command_shows_each_trios_vocabulary_and_widths(name, capsys):
    from studylib.cli import main

    p = load_preset(ROOT / "params" / f"{name}.yaml")
    trios = study_of(p)["token_budget"].trios
    assert main(["budget", str(ROOT / "params" / f"{name}.yaml"), "--all"]) == 0
    out = capsys.readouterr().out
    for t in trios:
        vocab = p.model_config(t.moe).vocab_size
        assert f"Budget solver for {t.moe} (vocab {vocab:,}" in out
        for dense, ratio in ((t.dense_active, "1.25x"), (t.dense_total, "1.50x")):
            line = next(ln for ln in out.splitlines() if ln.strip().startswith(dense + " ") and "matched-" in ln)
            assert f"({ratio})" in line, line
