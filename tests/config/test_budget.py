"""Parameter accounting (SPEC Table 5), the budget solvers and the by-construction variants."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from studylib.config import count_params, fmt_m, iso_width_moe, match_dense, soft_fixed_width
from studylib.config import ConfigError, load_preset

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "params" / "paper.yaml"

# SPEC.md Table 5 (seed 000), vocab 30,008, at the displayed precision
TABLE5 = {
    "dense_active": ("9.60M", "0.99M", "4.30M", "14.89M", "14.89M"),
    "moe_top2_z": ("7.68M", "0.79M", "12.58M", "21.06M", "14.77M"),
    "dense_total": ("11.52M", "1.58M", "7.96M", "21.06M", "21.06M"),
}


@pytest.fixture(scope="module")
def paper():
    return load_preset(PAPER)


def test_table5_reproduced(paper):
    assert paper.data.vocab_size == 30008
    for name, expect in TABLE5.items():
        c = count_params(paper.model_config(name))
        got = tuple(fmt_m(v) for v in (c.embedding, c.non_ffn, c.ffn_total, c.total, c.active))
        assert got == expect, name


def test_budget_cli_json_is_table5():
    out = subprocess.run([sys.executable, "-m", "studylib", "budget", str(PAPER), "--json"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    rows = json.loads(out)
    assert [r["name"] for r in rows] == list(TABLE5)
    for r in rows:
        assert all(isinstance(r[k], int) for k in ("embedding", "non_ffn", "ffn_total", "router", "total", "active"))
        e = TABLE5[r["name"]]
        assert (fmt_m(r["embedding"]), fmt_m(r["non_ffn"]), fmt_m(r["ffn_total"]),
                fmt_m(r["total"]), fmt_m(r["active"])) == e
    moe = rows[1]
    assert moe["router"] == 4 * 256 * 4 and moe["total"] == 21_057_792 and moe["active"] == 14_766_336


def test_paper_widths_are_within_the_paper_tolerances(paper):
    moe = count_params(paper.model_config("moe_top2_z"))
    da = count_params(paper.model_config("dense_active"))
    dt = count_params(paper.model_config("dense_total"))
    assert abs(da.active - moe.active) / moe.active < 0.01
    assert abs(dt.total - moe.total) / moe.total < 0.001


@pytest.mark.parametrize("target,tol", [("active", 0.01), ("total", 0.001)])
def test_solver_meets_tolerance_for_paper_moe(paper, target, tol):
    ref = paper.model_config("moe_top2_z")
    m = match_dense(ref, target)
    cfg = m.config
    assert cfg.ffn.kind == "dense" and cfg.n_layers == ref.n_layers and cfg.vocab_size == ref.vocab_size
    assert m.params == getattr(count_params(cfg), target)
    assert abs(m.rel_mismatch) <= tol
    assert cfg.d_model % cfg.n_heads == 0 and cfg.n_heads % cfg.n_kv_heads == 0 and cfg.ffn.hidden % 32 == 0
    assert cfg.d_model != ref.d_model or target == "active"  # a real width resize for total


def test_solver_lands_on_paper_widths(paper):
    """With the paper's rules (kv heads kept, head dim 64 or 32) the solver picks the paper's
    d_model for both budgets and the paper's exact total-match FFN width."""
    ref = paper.model_config("moe_top2_z")
    act, tot = match_dense(ref, "active").config, match_dense(ref, "total").config
    assert (act.d_model, act.n_heads, act.n_kv_heads) == (320, 10, 2)
    assert (tot.d_model, tot.n_heads, tot.n_kv_heads, tot.ffn.hidden) == (384, 6, 2, 1728)


@pytest.mark.parametrize("E,K,H,D", [(8, 2, 512, 192), (4, 1, 768, 256), (16, 4, 256, 384)])
def test_solver_general_moe(paper, E, K, H, D):
    import dataclasses
    from studylib.config import FFNConfig
    ref = dataclasses.replace(paper.model_config("moe_top2_z"), d_model=D, n_heads=D // 64,
                              ffn=FFNConfig(kind="moe", hidden=H, num_experts=E, top_k=K))
    for target, tol in (("active", 0.01), ("total", 0.001)):
        assert abs(match_dense(ref, target).rel_mismatch) <= tol


def test_iso_width_construction(paper):
    dense = paper.model_config("dense_active")
    moe = iso_width_moe(dense)
    assert moe.d_model == dense.d_model and moe.ffn.hidden * 2 == dense.ffn.hidden
    assert (moe.ffn.num_experts, moe.ffn.top_k) == (4, 2)
    a, b = count_params(dense), count_params(moe)
    assert b.active - b.router == a.active and b.total > a.total
    assert paper.model_config("moe_iso").ffn.z_coef == 0.001  # `set:` overrides applied


@pytest.mark.parametrize("K", [1, 2, 4, 6])
def test_soft_fixed_width(paper, K):
    dense = paper.model_config("dense_total")
    soft = soft_fixed_width(dense, K)
    assert soft.ffn.hidden * K == dense.ffn.hidden
    a, b = count_params(dense), count_params(soft)
    assert b.ffn_total == a.ffn_total and b.router == K * dense.d_model * dense.n_layers


def test_soft_fixed_width_needs_divisible_width(paper):
    with pytest.raises(ConfigError, match="num_experts must divide hidden=1120"):
        soft_fixed_width(paper.model_config("dense_active"), 3)


@pytest.mark.parametrize("name", ["paper", "cpu", "cpu_full", "ci"])
def test_no_preset_solves_a_dense_model_without_an_ffn(name):
    """Where no width is within the tolerance the solver falls back to the closest count, and at a
    small width the closest count can be a wide model with almost no FFN (cpu's d-24 total match
    was d 48 with an FFN of 8 until its tolerance was set to 0.5%). Every dense model of every
    preset keeps an FFN at least as wide as its residual stream (the matched baselines of the
    paper are 2.7x and 4.5x)."""
    preset = load_preset(ROOT / "params" / f"{name}.yaml")
    narrow = {m: (c.d_model, c.ffn.hidden) for m in preset.models
              for c in [preset.model_config(m)] if c.ffn.kind == "dense" and c.ffn.hidden < c.d_model}
    assert not narrow, f"{name}: dense models with an FFN narrower than d_model (d_model, hidden): {narrow}"


@pytest.mark.parametrize("name, target, sets, off", [
    ("dense_total", "total", "{ffn: {hidden: 760}}", "+4.008%"),  # budget showed it, nothing refused it
    ("dense_active", "active", "{d_model: 48, n_heads: 6}", "+"),
])
def test_a_matched_model_moved_off_its_match_by_its_set_is_refused(name, target, sets, off):
    """The match is checked on the model as resolved (after ``set:``), with the tolerance the rule
    states: 0.1% total, 1% active (issue #49: a total match 2.7% off passed)."""
    ci = ROOT / "params" / "ci.yaml"
    with pytest.raises(ConfigError, match=rf"models\.{name}: [\d,]+ {target} parameters after its set:, \{off}") as e:
        load_preset(ci, [f"models.{name}.set={sets}"]).model_config(name)
    assert "moves the model off its match" in str(e.value)
    assert f"tolerance {'0.1%' if target == 'total' else '1.0%'}" in str(e.value)
    # the count in the line is the solver's width with the set: applied, counted independently
    import yaml

    from studylib.config.schema import deep_merge, model_from_dict, to_dict

    ref = load_preset(ci).model_config("moe_top2_z")
    moved = model_from_dict(deep_merge(to_dict(match_dense(ref, target, name=name).config), yaml.safe_load(sets)), name)
    assert f"{getattr(count_params(moved), target):,} {target} parameters" in str(e.value)


def test_a_set_that_keeps_the_count_passes():
    """Also where the solver's closest width lies outside the tolerance (ci's dense_total_s, -0.125%
    total): the solver's documented fallback, which a set: that changes no count leaves as it is."""
    ci = ROOT / "params" / "ci.yaml"
    assert load_preset(ci, ["models.dense_total.set={dropout: 0.1}"]).model_config("dense_total").dropout == 0.1
    assert load_preset(ci, ["models.dense_total_s.set={dropout: 0.1}"]).model_config("dense_total_s").dropout == 0.1


def test_the_budget_command_refuses_a_match_off_its_tolerance_in_one_line(tmp_path):
    text = (ROOT / "params" / "ci.yaml").read_text().replace(
        "dense_total: {derive: matched_total, from: moe_top2_z}",
        "dense_total: {derive: matched_total, from: moe_top2_z, set: {ffn: {hidden: 760}}}")
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "off.yaml").write_text(text)
    r = subprocess.run([sys.executable, "-m", "studylib", "budget", str(tmp_path / "params" / "off.yaml")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: models.dense_total: 121,848 total parameters after its set:, +4.008% from moe_top2_z's"), r.stderr
