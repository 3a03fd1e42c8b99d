"""The token-budget map of notebook 09 (studylib.study.comparisons.token_budget.gaps): the knob, the run plan (which
(model, budget) runs are the preset's own and reused, which are budget runs of their own), the gap
table from hand-written run summaries (no training), budgets in tokens per parameter, the verdicts
over the map's points (against statsmodels) and the sentences worded from them. The fits over the
map: test_budget_fits.py."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from _tiny import tiny_preset, tiny_raw
from studylib.config import ConfigError, run_document
from studylib.run.rundir import RunDir
from studylib.run.spec import RunSpec, cell_overrides, tokens_per_step
from studylib.study.analysis import paper
from studylib.study.comparisons import comparison, study_of, token_budget
from studylib.study.comparisons.token_budget import budgets, gaps as bm, repetition as budget_checks
from studylib.study.comparisons.token_budget.knobs import TrioConfig
from studylib.study.orchestration.plan import plan_runs

T975_2 = 4.302652729911275  # scipy.stats.t.ppf(0.975, 2): the 95% paired-t factor for n = 3

MODELS = {"dense2": {"derive": "matched_total", "from": "moe"}}  # the MoE's total match
TB = {"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [0.5, 1.0, 2.0]}]}


def _study(seeds=(1, 2), **study):
    """The tiny preset's study (its trios are not the paper's shape: ``shape: any``)."""
    if isinstance(study.get("token_budget"), dict) and "trios" in study["token_budget"]:
        study["token_budget"] = {"shape": "any", **study["token_budget"]}
    return study_of(tiny_preset(models=MODELS, study={"headline": ["dense", "moe", "dense2"], **study}, seeds=list(seeds)))


def _trios(study):
    return budgets.budget_trios(study.preset, study["token_budget"])


# --------------------------------------------------------------------------------------------
# the knob
# --------------------------------------------------------------------------------------------
def test_budget_trios_reads_the_knob_in_order():
    (t,) = _trios(_study(token_budget={"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [2, 0.5, 1.0]}]}))
    assert t.models == ("dense", "moe", "dense2") and t.size == "moe"
    assert t.epochs == (0.5, 1.0, 2.0)


@pytest.mark.parametrize("tb, where", [
    (None, "study.token_budget: missing"),
    ({"trio": []}, "study.token_budget: expected a mapping"),
    ({"trios": []}, "study.token_budget.trios: expected a non-empty list"),
    ({"trios": [{"models": ["dense", "moe"], "epochs": [1.0]}]}, "study.token_budget.trios[0].models: expected three"),
    ({"trios": [{"models": ["dense", "mo", "dense2"], "epochs": [1.0]}]},
     "study.token_budget.trios[0].models[1]: no model named 'mo'"),
    ({"trios": [{"models": ["moe", "dense", "dense2"], "epochs": [1.0]}]},
     "study.token_budget.trios[0].models[1]: 'dense' has a dense FFN"),
    ({"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [1.0, -0.5]}]},
     "study.token_budget.trios[0].epochs: expected a list of different positive numbers"),
    ({"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [True]}]}, "study.token_budget.trios[0].epochs"),
    ({"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [1.0]}] * 2},
     "study.token_budget.trios[1].models[1]: the reference MoE 'moe' names a second trio"),
    ({"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [1.0], "seeds": 1}]},
     "study.token_budget.trios[0].seeds: expected how many"),
    ({"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [1.0], "seed": 3}]},
     "study.token_budget.trios[0]: expected a mapping with keys"),
    ({"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [1.0], "seeds": 3}]},
     "study.token_budget.trios[0].seeds: 3 seeds asked for, but the preset has 2"),
    ({"trios": [{"models": ["dense", "moe", "dense2"], "tokens_per_param": [1.0], "seeds_at": {2.0: 2}}]},
     "study.token_budget.trios[0].seeds_at: 2.0 is not one budget of the trio (epochs [], tokens_per_param [1.0]"),
    ({"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [1.0], "tokens_per_param": [1.0], "seeds_at": {1: 2}}]},
     "study.token_budget.trios[0].seeds_at: 1 is not one budget of the trio (epochs [1.0], tokens_per_param [1.0]; "
     "a number in both is ambiguous)"),
    ({"trios": [{"models": ["dense", "moe", "dense2"], "tokens_per_param": [1.0], "seeds_at": {1.0: 5}}]},
     "study.token_budget.trios[0].seeds_at[1]: 5 seeds asked for, but the preset has 2"),
    ({"trios": [{"models": ["dense", "moe", "dense2"], "tokens_per_param": [1.0], "seeds_at": [5]}]},
     "study.token_budget.trios[0].seeds_at: expected a mapping {budget: seeds}"),
])
def test_a_bad_knob_is_one_line_naming_the_key(tb, where):
    with pytest.raises(ConfigError) as e:  # when the study loads the preset (the knob), or when it is read (missing)
        _trios(_study() if tb is None else _study(token_budget=tb))
    assert str(e.value).startswith(where) and "\n" not in str(e.value)


def test_a_trio_may_train_the_first_k_seeds_only(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path))
    study = _study(token_budget={"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [2.0], "seeds": 2}]})
    p, (t,) = study.preset, _trios(study)
    assert t.seeds_of([5, 6, 7]) == [5, 6] and TrioConfig(("a", "b", "c"), (1.0,)).seeds_of([5, 6, 7]) == [5, 6, 7]
    (g,) = token_budget.cell_grids(p, [t], [5, 6, 7], p.train.max_steps)
    assert list(g.seeds) == [5, 6]
    assert (budgets.run_plan(study, [t], _specs(p, [t], [5, 6, 7]))["seeds"] == 2).all()


def test_one_budget_may_train_more_seeds_than_its_trio():
    """``seeds_at: {x: n}``: the budget x (either unit) from all the stories trains the first n
    seeds, the trio's other budgets and the repeated cells the trio's ``seeds``."""
    study = _study(seeds=(5, 6, 7, 8), token_budget={"trios": [{
        "models": ["dense", "moe", "dense2"], "epochs": [2.0], "tokens_per_param": [1.0, 4.0], "seeds": 2,
        "seeds_at": {2.0: 3, 1.0: 4}, "repeat": {"tokens_per_param": [1.0], "stories": [0.5]}}]})
    p, (t,) = study.preset, _trios(study)
    grids = token_budget.cell_grids(p, [t], p.seeds, p.train.max_steps)
    assert [(g.overrides.get("train.max_steps", p.train.max_steps), g.overrides.get("data.train_fraction", 1.0),
             list(g.seeds)) for g in grids] == [(24, 1.0, [5, 6, 7]), (53, 1.0, [5, 6, 7, 8]), (211, 1.0, [5, 6]),
                                                                     (53, 0.5, [5, 6])]


# --------------------------------------------------------------------------------------------
# the run plan: reused vs trained
# --------------------------------------------------------------------------------------------
def _fake_run(preset, model, seed, overrides, loss, train_targets=960.0):
    """A finished run (config + summary, no training) where the plan looks for it."""
    spec = RunSpec.resolve(preset, model, seed, overrides)
    varied, rd = spec.preset, spec.rundir
    rd.path.mkdir(parents=True, exist_ok=True)
    rd.write_config(spec.document())
    steps = varied.train.max_steps
    rd.write_summary({"model": model, "seed": seed, "best_val_loss": loss, "tokens": steps * 16 * 32,
                      "steps": steps, "finished": True, "params": {"total": 5, "active": 4},
                      "data": {"train_targets": train_targets, "val_bytes": 1000, "val_tokens": 250}})
    return rd


def _specs(preset, trios, seeds):
    """The runs the plan resolves for the map's grids (finished and missing), without training."""
    return plan_runs(preset, token_budget.cell_grids(preset, trios, seeds, preset.train.max_steps)).specs


def _budget_map(preset, trios) -> dict:
    """``{epochs: overrides}`` of the trios' cells from all the stories (the tiny preset's vocabulary)."""
    return {e: cell_overrides(preset, t.moe, e, 1.0, preset.train.max_steps) for t in trios for e in t.epochs}


def test_run_plan_reuses_the_presets_own_runs_and_trains_the_other_budgets(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path))
    study = _study(token_budget=TB)  # train.max_steps 12: the "epoch" is 12 steps
    p, trios = study.preset, _trios(study)
    budget_map = _budget_map(p, trios)
    assert budget_map == {0.5: {"train.max_steps": 6}, 1.0: {}, 2.0: {"train.max_steps": 24}}
    _fake_run(p, "moe", 1, {}, 2.0)
    plan = budgets.run_plan(study, trios, _specs(p, trios, [1, 2])).set_index(["epochs", "model"])
    # 1.0 epoch is the preset's own run
    for e in (1.0,):
        assert plan.loc[(e, "moe"), "preset_run"] and plan.loc[(e, "moe"), "also_in"] == "headline"
        assert plan.loc[(e, "moe"), "run_dir"] == str(tmp_path / "tiny/runs/moe/seed*")
        assert plan.loc[(e, "moe"), "finished"] == 1 and plan.loc[(e, "dense"), "finished"] == 0
    for e, steps in ((0.5, 6), (2.0, 24)):
        row = plan.loc[(e, "dense2")]
        assert not row["preset_run"] and row["also_in"] == "" and row["max_steps"] == steps
        assert row["run_dir"] == str(tmp_path / f"tiny/runs/dense2/train.max_steps={steps}/seed*")
    assert list(plan["role"][:3]) == ["dense_active", "moe", "dense_total"]


def test_the_map_reads_finished_runs_without_training_and_builds_the_table(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path))

    def no_data(*a, **k):
        raise AssertionError("every run exists: nothing may train or load data")

    monkeypatch.setattr("studylib.data.pipeline.load_data", no_data)
    study = _study(seeds=(1, 2, 3), token_budget={"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [1.0, 2.0]}]})
    p, trios = study.preset, _trios(study)
    budget_map = _budget_map(p, trios)
    # per seed: active gap 0.01/0.02/0.03 at 1 epoch and 0.10/0.11/0.12 at 2; total gap -0.05 everywhere
    for s, (g1, g2) in zip((1, 2, 3), ((0.01, 0.10), (0.02, 0.11), (0.03, 0.12))):
        for e, g in ((1.0, g1), (2.0, g2)):
            ov = budget_map[e]
            _fake_run(p, "moe", s, ov, 3.0, train_targets=12 * 16 * 32 * 1.5)
            _fake_run(p, "dense", s, ov, 3.0 + g, train_targets=12 * 16 * 32 * 1.5)
            _fake_run(p, "dense2", s, ov, 3.0 - 0.05, train_targets=12 * 16 * 32 * 1.5)
    summ = token_budget.summaries(comparison("token_budget").train(study, jobs=1, progress=False), trios)
    assert len(summ) == 18 and set(summ["epochs"]) == {1.0, 2.0} and set(summ["size"]) == {"moe"}
    active = budgets.active_params(p, trios)
    assert active["moe"] == p.model_config("moe").num_params.active
    per_seed = bm.gap_frame(summ, trios, active)
    table = bm.gap_table(per_seed, active)
    assert list(table["epochs"]) == [1.0, 2.0]
    assert list(table["tokens"]) == [12 * 512, 24 * 512]
    np.testing.assert_allclose(table["tokens_per_param"], [12 * 512 / active["moe"], 24 * 512 / active["moe"]])
    np.testing.assert_allclose(table["data_passes"], [1 / 1.5, 2 / 1.5])
    assert list(table["repeats"]) == [False, True] and list(table["max_views"]) == [1, 2]
    r1, r2 = table.iloc[0], table.iloc[1]
    half = T975_2 * 0.01 / math.sqrt(3)  # std 0.01 of the per-seed gaps, n = 3
    assert r1["active_mean"] == pytest.approx(0.02) and r1["active_std"] == pytest.approx(0.01)
    assert r1["active_n"] == 3
    assert (r1["active_ci_low"], r1["active_ci_high"]) == pytest.approx((0.02 - half, 0.02 + half))
    assert not r1["active_resolved"]  # [-0.0048, +0.0448] includes 0 (and Holm over the 2 points)
    assert r2["active_mean"] == pytest.approx(0.11) and r2["active_resolved"]
    assert r1["total_mean"] == pytest.approx(-0.05) and r1["total_std"] == pytest.approx(0.0, abs=1e-12)
    assert r1["active_fmt"] == "+0.0200 [-0.0048, +0.0448] (n=3)"


# --------------------------------------------------------------------------------------------
# gaps from hand-built summaries
# --------------------------------------------------------------------------------------------
def _summaries(points: dict, trio=("da", "moe", "dt"), size="moe", targets=1000.0) -> pd.DataFrame:
    """``{(epochs, tokens): {"active": [per-seed gap], "total": [...]}}`` -> collect_runs-like rows
    (MoE loss 3.0 per seed, the dense losses 3.0 + gap) with ``size``, ``epochs``, ``train_targets``."""
    rows = []
    for (e, tokens), g in points.items():
        for i, (ga, gt) in enumerate(zip(g["active"], g["total"])):
            for m, loss in zip(trio, (3.0 + ga, 3.0, 3.0 + gt)):
                rows.append({"model": m, "seed": 10 + i, "best_val_loss": loss, "tokens": tokens, "size": size,
                             "epochs": e, "train_targets": targets})
    return pd.DataFrame(rows)


TRIO = TrioConfig(("da", "moe", "dt"), (0.1, 1.0))


def test_gap_frame_refuses_a_trio_whose_runs_saw_different_tokens():
    df = _summaries({(1.0, 1000): {"active": [0.1, 0.2], "total": [0.0, 0.1]}})
    df.loc[df["model"] == "dt", "tokens"] = 999
    with pytest.raises(ValueError, match="different numbers of tokens"):
        bm.gap_frame(df, [TRIO], {"moe": 100})


def test_gap_frame_pairs_by_seed_and_signs_both_gaps_dense_minus_moe():
    df = _summaries({(1.0, 1000): {"active": [0.1, 0.2], "total": [-0.3, -0.1]}})
    df = df[~((df["model"] == "dt") & (df["seed"] == 11))]  # seed 11 lacks its total-matched run
    ps = bm.gap_frame(df, [TRIO], {"moe": 100})
    act, tot = ps[ps["gap"] == "active"], ps[ps["gap"] == "total"]
    assert list(act["seed"]) == [10, 11] and act["value"].tolist() == pytest.approx([0.1, 0.2])
    assert list(tot["seed"]) == [10] and tot["value"].tolist() == pytest.approx([-0.3])
    assert set(ps["tokens_per_param"]) == {10.0} and set(ps["data_passes"]) == {1.0}


# --------------------------------------------------------------------------------------------
# budgets in tokens per parameter (a map in two dimensions)
# --------------------------------------------------------------------------------------------
def test_tokens_per_param_budgets_become_steps_and_the_presets_own_run_is_reused():
    p = _study(token_budget={"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [2.0]}]}).preset
    a, per_step = p.model_config("moe").num_params.active, tokens_per_step(p)
    assert per_step == p.train.batch_size * p.train.grad_accum * (p.data.context - 1)
    s = p.train.max_steps  # the tiny preset's "epoch": 12 steps
    x_own, x_3 = s * per_step / a, 3 * per_step / a  # exactly the preset's own run; 3 steps
    study = _study(token_budget={"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [2.0],
                                            "tokens_per_param": [x_3 * 1.1, x_own]}]})  # 3.3 steps -> 3
    q, (t,) = study.preset, _trios(study)
    assert t.epochs == (3 / s, 1.0, 2.0) and t.tokens_per_param == ()
    assert _budget_map(q, [t]) == {3 / s: {"train.max_steps": 3}, 1.0: {}, 2.0: {"train.max_steps": 24}}


@pytest.mark.parametrize("trio, where", [
    ({"models": ["dense", "moe", "dense2"], "tokens_per_param": [0.0]}, "study.token_budget.trios[0].tokens_per_param"),
    ({"models": ["dense", "moe", "dense2"], "tokens_per_param": [], "epochs": []},
     "study.token_budget.trios[0]: no budget"),
    ({"models": ["dense", "moe", "dense2"]}, "study.token_budget.trios[0]: expected a mapping with keys"),
])
def test_a_bad_tokens_per_param_budget_is_one_line(trio, where):
    with pytest.raises(ConfigError) as e:
        _study(token_budget={"trios": [trio]})
    assert str(e.value).startswith(where) and "\n" not in str(e.value)


@pytest.mark.parametrize("trio, match", [
    # issue #41: queued at 41,709,677,419 steps (a hang)
    ({"tokens_per_param": [1e9]}, r"trios\[0\]\.tokens_per_param: 1e\+09 tokens per active parameter is [\d,]+ "
                                  r"optimizer steps, [\d,]+ times the preset's train\.max_steps = 12; at most 100"),
    ({"epochs": [101.0]}, r"trios\[0\]\.epochs: 101 epochs is 1,212 optimizer steps, 101 times"),
    # issue #41: three budgets silently became one map point of one step
    ({"tokens_per_param": [0.001, 0.002, 0.003]}, r"trios\[0\]\.tokens_per_param: 0\.001 tokens per active parameter "
                                                  r"is [\d.e-]+ optimizer steps, fewer than the preset's warm-up of 1"),
    ({"epochs": [1.0, 1.01]}, r"trios\[0\]\.epochs: 1\.01 epochs rounds to 12 optimizer steps, as 1 epochs does"),
])
def test_a_budget_out_of_range_or_equal_to_another_is_one_line(trio, match):
    study = _study(token_budget={"trios": [{"models": ["dense", "moe", "dense2"], **trio}]})
    with pytest.raises(ConfigError, match=r"^study\.token_budget\." + match):
        _trios(study)


def test_sizes_that_share_a_tokens_per_param_are_found_within_two_percent():
    t = pd.DataFrame({"size": ["s", "s", "m", "m", "l"], "tokens_per_param": [1.0, 3.53, 1.004, 10.0, 3.535]})
    assert bm.shared_budgets(t) == [(1.0, ["s", "m"]), (3.53, ["s", "l"])]


# --------------------------------------------------------------------------------------------
# verdicts over the map's points: Holm and TOST per gap, against statsmodels
# --------------------------------------------------------------------------------------------
def _table(points: dict, active=100, margin=0.03):
    ps = bm.gap_frame(_summaries(points), [TRIO], {"moe": active})
    return bm.gap_table(ps, {"moe": active}, margin=margin), ps


POINTS = {(0.1, 100): {"active": [0.05, 0.06, 0.07], "total": [0.001, -0.002, 0.003]},
          (1.0, 1000): {"active": [0.01, 0.02, 0.045], "total": [-0.08, -0.07, -0.09]},
          (2.0, 2000): {"active": [0.002, -0.001, 0.0005], "total": [0.2, -0.1, 0.05]}}


def test_the_maps_points_are_one_family_per_gap_checked_against_statsmodels():
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    weightstats = pytest.importorskip("statsmodels.stats.weightstats")
    table, ps = _table(POINTS)
    for gap in bm.GAPS:
        assert table[f"{gap}_p_holm"].tolist() == pytest.approx(
            multitest.multipletests(table[f"{gap}_p"], method="holm")[1].tolist())
        p_tost = [weightstats.ttost_paired(g.sort_values("seed")["dense"].to_numpy(),
                                           g.sort_values("seed")["moe"].to_numpy(), -0.03, 0.03)[0]
                  for _, g in ps[ps["gap"] == gap].groupby("epochs")]
        assert table[f"{gap}_p_tost"].tolist() == pytest.approx(p_tost)
        assert (table[f"{gap}_family_size"] == 3).all() and (table[f"{gap}_margin"] == 0.03).all()
    # dense - MoE > 0 resolved: the MoE is better ("B better"); the matched-total gap at 1 epoch
    # is resolved the other way; the tight near-zero gaps are equivalent; the wide one is neither
    assert table["active_verdict"].tolist()[0] == "B better"
    assert table["total_verdict"].tolist() == ["equivalent", "A better", "inconclusive"]
    assert table["active_verdict"].tolist()[2] == "equivalent"


def test_point_sentences_say_equivalent_exactly_where_tost_holds_after_holm():
    table, _ = _table(POINTS)
    s = bm.point_sentences(table, "total")
    assert s.startswith("Matched-total gap (dense_total - MoE) (> 0: the MoE is better), 3 map points, Holm over 3: ")
    assert "dense better at 1: moe at 10 (" in s and "equivalent within ±0.03 nats at 1: moe at 1 (" in s
    assert "inconclusive at 1: moe at 20 (" in s
    wide, _ = _table(POINTS, margin=0.001)  # a margin too narrow for any point: no equivalence
    assert "equivalent" not in bm.point_sentences(wide, "total")


def test_paper_point_and_budgets():
    assert paper.PAPER_TOKENS_PER_PARAM == pytest.approx(28.86, abs=0.01)
    assert bm.PAPER_POINT["active"] == 0.0758 and bm.PAPER_POINT["total"] == -0.0180
    table, _ = _table({(1.0, 1000): {"active": [0.1, 0.2], "total": [0.0, 0.1]},
                       (0.1, 100): {"active": [0.1, 0.2], "total": [0.0, 0.1]}})
    s = bm.paper_sentence(table)
    assert "1-10 tokens per active parameter (1.00 decades)" in s and "is outside it" in s
    assert "40.5M, 150M, 426.3M target tokens" in s and "2.74, 10.2, 28.9 tokens/param" in s


# --------------------------------------------------------------------------------------------
# the paper preset's own points: found when they exist, never trained, no data loaded
# --------------------------------------------------------------------------------------------
def test_paper_preset_points_are_read_from_its_runs_without_data(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))

    def no_data(*a, **k):
        raise AssertionError("the paper preset's data must not be loaded")

    monkeypatch.setattr("studylib.data.pipeline.load_data", no_data)
    raw = tiny_raw(name="paper", models=MODELS, train={"max_steps": None},
                   study={"token_budget": {"shape": "any",
                                           "trios": [{"models": ["dense", "moe", "dense2"], "epochs": [0.5, 1.0]}]}})
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "paper.yaml").write_text(yaml.safe_dump(raw))
    here = _study().preset
    assert budgets.paper_preset_points(tmp_path, here)[0] is None  # no runs yet
    from studylib.config import load_preset

    paper_p = load_preset(tmp_path / "params" / "paper.yaml")
    for s in (1, 2):
        for ov, steps in (({}, 10), ({"train.max_steps": 5}, 5)):
            for m, loss in (("dense", 3.1), ("moe", 3.0), ("dense2", 2.9)):
                spec = RunSpec.resolve(paper_p, m, s, ov)
                rd = spec.rundir
                rd.path.mkdir(parents=True, exist_ok=True)
                rd.write_config(spec.document())
                rd.write_summary({"model": m, "seed": s, "best_val_loss": loss + 0.01 * s, "tokens": steps * 100,
                                  "steps": steps, "finished": True, "data": {"train_targets": 1000}})
    table, note = budgets.paper_preset_points(tmp_path, here)
    assert "12 finished runs" in note
    assert list(table["epochs"]) == [0.5, 1.0] and list(table["tokens"]) == [500, 1000]
    assert table["active_mean"].tolist() == pytest.approx([0.1, 0.1])  # dense 3.1 - MoE 3.0, every seed
    assert table["total_mean"].tolist() == pytest.approx([-0.1, -0.1]) and list(table["active_n"]) == [2, 2]
    assert budgets.paper_preset_points(tmp_path, paper_p)[0] is None  # the paper preset itself


def test_memorisation_table_and_power_frame_from_finished_runs(tmp_path, monkeypatch):
    """val - train from each run's last eval record (written by hand here), and the power of every
    point from its per-seed gaps."""
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path))
    study = _study(seeds=(1, 2, 3),
                   token_budget={"trios": [{"models": ["dense", "moe", "dense2"], "epochs": [0.5, 1.0, 2.0]}]})
    p, trios = study.preset, _trios(study)
    budget_map = _budget_map(p, trios)
    for s in (1, 2, 3):
        for e in (0.5, 1.0, 2.0):
            for m, loss in (("moe", 3.0), ("dense", 3.02 + 0.01 * s), ("dense2", 2.95)):
                rd = _fake_run(p, m, s, budget_map[e], loss, train_targets=12 * 16 * 32)
                memorised = 0.1 * max(0.0, e - 1) * (1 + (m == "dense2"))
                rd.append_metrics({"kind": "eval", "step": 6, "val_loss": loss + 1, "train_loss": loss + 1})
                rd.append_metrics({"kind": "eval", "step": round(12 * e), "val_loss": loss, "train_loss": loss - memorised})
    runs = comparison("token_budget").train(study, jobs=1, progress=False)
    summ = token_budget.summaries(runs, trios)
    rep = budget_checks.memorisation_table(trios, summ, token_budget.cell_metrics(runs, trios)).set_index(["epochs", "model"])
    assert 0.5 not in rep.index.get_level_values("epochs")  # under one pass: nothing about repetition
    assert rep.loc[(1.0, "moe"), "data_passes"] == pytest.approx(1.0) and rep.loc[(2.0, "moe"), "data_passes"] == 2.0
    assert rep.loc[(1.0, "dense2"), "val_minus_train"] == pytest.approx(0.0)
    assert rep.loc[(2.0, "moe"), "val_minus_train"] == pytest.approx(0.1)
    assert rep.loc[(2.0, "dense2"), "val_minus_train"] == pytest.approx(0.2) and rep.loc[(2.0, "dense2"), "n"] == 3
    active = budgets.active_params(p, trios)
    pw = budget_checks.power_frame(bm.gap_frame(summ, trios, active), active, target=0.05).set_index(["epochs", "gap"])
    # active gap per seed 0.03 / 0.04 / 0.05: std 0.01; the paper's 0.0758 with 80% power needs 3 seeds
    assert pw.loc[(1.0, "active"), "std"] == pytest.approx(0.01)
    assert pw.loc[(1.0, "active"), "effect"] == pytest.approx(0.0758) and pw.loc[(1.0, "total"), "effect"] == 0.018
    assert pw.loc[(1.0, "active"), "seeds_effect"] == 3 and pw.loc[(1.0, "active"), "seeds_target"] == 3
