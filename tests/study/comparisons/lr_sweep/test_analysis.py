"""The learning-rate check (studylib.study.comparisons.lr_sweep) on synthetic frames with hand-checked numbers,
the preset knob's errors, and the sweep over fake finished runs (the preset's lr reuses its runs)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from _tiny import tiny_preset
from studylib.config import ConfigError, run_document
from studylib.run.rundir import RunDir
from studylib.run.spec import RunSpec
from studylib.study.comparisons import comparison, study_of
from studylib.study.comparisons import lr_sweep as LS
from studylib.study.comparisons.lr_sweep import analysis as L
from studylib.study.comparisons.lr_sweep.knobs import DEFAULT_TOLERANCE
from studylib.study.orchestration.plan import plan_runs

LRS = (1e-3, 3e-3, 1e-2)
T1 = 12.706204736174707  # t(0.975, 1 dof): the 95% half-width factor for 2 seeds


def frame(losses: dict) -> pd.DataFrame:
    """``{model: {lr: [loss of seed 1, seed 2, ...]}}`` -> the sweep's long frame."""
    rows = [{"model": m, "lr": lr, "seed": i + 1, "best_val_loss": v}
            for m, by_lr in losses.items() for lr, vals in by_lr.items() for i, v in enumerate(vals)]
    return pd.DataFrame(rows)


# A: best at 3e-3; 1e-2 costs 0.007 (paired: +0.006, +0.008), 1e-3 costs 0.05
# B: best at 1e-2; the preset's 3e-3 costs 0.005 (+0.006, +0.004); 1e-3 costs 0.085
# C: best at 3e-3; 1e-2 costs 0.002, 1e-3 0.035
SHARED = {
    "A": {1e-3: [3.04, 3.16], 3e-3: [3.00, 3.10], 1e-2: [3.006, 3.108]},
    "B": {1e-3: [2.97, 3.10], 3e-3: [2.906, 3.004], 1e-2: [2.90, 3.00]},
    "C": {1e-3: [3.22, 3.36], 3e-3: [3.20, 3.31], 1e-2: [3.201, 3.313]},
}


def test_loss_table_mean_std_and_t_interval():
    t = L.loss_table(frame(SHARED))
    r = t.loc[("A", 3e-3)]
    assert (r["n"], r["mean"]) == (2, pytest.approx(3.05))
    assert r["std"] == pytest.approx(0.1 / math.sqrt(2))  # sample std of two values: |3.10 - 3.00| / sqrt(2)
    # half-width t * std / sqrt(n) = 12.706 * 0.05
    assert r["ci_low"] == pytest.approx(3.05 - T1 * 0.05) and r["ci_high"] == pytest.approx(3.05 + T1 * 0.05)
    assert list(t.index.get_level_values("model").unique()) == ["A", "B", "C"]


def test_costs_are_paired_by_seed_and_the_preset_lr_is_shared():
    df = frame(SHARED)
    best = L.best_lrs(df)
    assert best["best_lr"].to_dict() == {"A": 3e-3, "B": 1e-2, "C": 3e-3}
    assert best["at_edge"].to_dict() == {"A": False, "B": True, "C": False}
    costs = L.lr_costs(df, tolerance=0.01)
    b = costs.loc[("B", 3e-3)]  # per-seed costs +0.006, +0.004
    assert b["mean"] == pytest.approx(0.005) and b["std"] == pytest.approx(0.002 / math.sqrt(2))
    assert b["ci_low"] == pytest.approx(0.005 - T1 * 0.001) and b["ci_high"] == pytest.approx(0.005 + T1 * 0.001)
    assert b["within"] and not b["shown"] and not b["resolved"]
    assert costs.loc[("A", 1e-3), "mean"] == pytest.approx(0.05) and not costs.loc[("A", 1e-3), "within"]
    assert costs.loc[("A", 3e-3), "mean"] == 0 and costs.loc[("A", 3e-3), "shown"]  # the best lr itself
    rule = L.decide(costs, preset_lr=3e-3, tolerance=0.01)
    assert rule.kind == "preset_shared" and rule.lr_of == {"A": 3e-3, "B": 3e-3, "C": 3e-3}
    assert rule.shared_lrs[0] == 3e-3  # lowest worst-case cost first (0.005 against 1e-2's 0.007)
    assert set(rule.shared_lrs) == {3e-3, 1e-2}
    text = L.verdict(costs, rule, L.ranking_check(df, 3e-3, rule.best))
    assert "Rule: one shared lr, the preset's 0.003" in text and "an end of the grid" in text
    # a tighter tolerance leaves no lr flat for both A and B: each at its own best
    strict = L.decide(L.lr_costs(df, tolerance=0.004), preset_lr=3e-3, tolerance=0.004)
    assert strict.kind == "per_model" and strict.lr_of == {"A": 3e-3, "B": 1e-2, "C": 3e-3}


def test_another_grid_lr_can_be_the_shared_one():
    df = frame(SHARED)
    rule = L.decide(L.lr_costs(df, tolerance=0.01), preset_lr=1e-3, tolerance=0.01)
    assert rule.kind == "other_shared" and rule.lr_of["A"] == rule.lr_of["B"] == 3e-3
    text = L.verdict(L.lr_costs(df, tolerance=0.01), rule, L.ranking_check(df, 1e-3, rule.best))
    assert "not for A, B, C" in text and "Train all at 0.003" in text


def test_ranking_check_finds_a_resolved_reversal():
    """At the shared lr 3e-3, X beats Y by 0.05 (resolved over 3 seeds); at its own best lr (1e-2)
    Y beats X by 0.05: the order changes and the resolved gap flips sign."""
    df = frame({
        "X": {3e-3: [3.00, 3.01, 3.02], 1e-2: [3.20, 3.21, 3.22]},
        "Y": {3e-3: [3.05, 3.06, 3.07], 1e-2: [2.95, 2.96, 2.97]},
    })
    best = L.best_lrs(df)["best_lr"].to_dict()
    assert best == {"X": 3e-3, "Y": 1e-2}
    r = L.ranking_check(df, 3e-3, best)
    assert r["shared_order"] == ["X", "Y"] and r["best_order"] == ["Y", "X"] and r["changed"]
    pairs = r["pairs"].set_index("setting")
    assert pairs.loc["shared", "mean"] == pytest.approx(-0.05) and pairs.loc["best", "mean"] == pytest.approx(0.05)
    assert pairs.loc["shared", "resolved"] and pairs.loc["best", "resolved"]  # zero spread: exact intervals
    assert r["flips"] == [("X", "Y")]
    same = L.ranking_check(df, 3e-3, {"X": 3e-3, "Y": 3e-3})
    assert not same["changed"] and same["flips"] == []


def test_frame_errors():
    with pytest.raises(KeyError, match="missing column"):
        L.loss_table(pd.DataFrame({"model": ["A"], "seed": [1], "best_val_loss": [3.0]}))
    df = frame({"A": {1e-3: [3.0, 3.1]}})
    with pytest.raises(ValueError, match="duplicate"):
        L.loss_table(pd.concat([df, df]))


# --------------------------------------------------------------------------------------------
# the preset knob
# --------------------------------------------------------------------------------------------
def _study(block, lr=3e-3, **train):
    study = {"headline": ["dense", "moe", "dense_t"]}
    if block is not None:
        study["lr_sweep"] = block
    return study_of(tiny_preset(models={"dense_t": {"derive": "matched_total", "from": "moe"}}, study=study, train={"lr": lr, "min_lr": lr / 10, **train},
                                seeds=[1, 2, 3]))


def _spec(block, **kw):
    study = _study(block, **kw)
    return LS.sweep_spec(study, study["lr_sweep"])


def test_sweep_spec_reads_and_checks_the_knob():
    spec = _spec({"lrs": [1.0e-2, "3e-3", 1.0e-3], "seeds": 2, "epochs": 1})
    assert spec.lrs == LRS and spec.seeds == (1, 2) and spec.epochs == 1.0
    assert spec.tolerance == DEFAULT_TOLERANCE and spec.preset_lr == 3e-3
    cases = [
        (None, r"study\.lr_sweep: missing; add e\.g\."),
        ({"lrs": [1e-3, 3e-3], "seeds": 2, "epochs": 1}, r"study\.lr_sweep\.lrs: need at least 3"),
        ({"lrs": [1e-4, 1e-3, 1e-2], "seeds": 2, "epochs": 1}, r"must include the preset's train\.lr=0\.003"),
        ({"lrs": list(LRS), "seeds": 1, "epochs": 1}, r"study\.lr_sweep\.seeds: must be an integer >= 2"),
        ({"lrs": list(LRS), "seeds": 4, "epochs": 1}, r"study\.lr_sweep\.seeds: 4 seeds asked, the preset has 3"),
        ({"lrs": list(LRS), "seeds": 2, "epochs": 0}, r"study\.lr_sweep\.epochs: must be > 0"),
        ({"lrs": list(LRS), "seeds": 2}, r"study\.lr_sweep\.epochs: missing"),
        ({"lrs": list(LRS), "seeds": 2, "epochs": 1, "lr": 3}, r"unknown key\(s\) \['lr'\]"),
        ({"lrs": [1e-3, "fast", 1e-2], "seeds": 2, "epochs": 1}, r"study\.lr_sweep\.lrs\[1\]: must be a number"),
    ]
    for block, match in cases:
        with pytest.raises(ConfigError, match=match):
            _spec(block)


def test_lr_overrides_keep_the_min_lr_ratio_and_the_preset_values_exactly():
    p = _study({"lrs": list(LRS), "seeds": 2, "epochs": 1}).preset
    assert L.lr_overrides(p, p.train.lr) == {}
    ov = L.lr_overrides(p, 1e-2)
    assert ov["train.lr"] == 1e-2 and ov["train.min_lr"] == pytest.approx(1e-3)


def test_the_sweep_reuses_the_preset_runs_at_its_own_lr(tmp_path, monkeypatch):
    """With fake finished runs in place nothing trains; the runs at the preset's lr are the preset's
    own run directories (the headline runs), the others live in variant directories."""
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    study = _study({"lrs": list(LRS), "seeds": 2, "epochs": 1.0})
    p, spec, c = study.preset, LS.sweep_spec(study, study["lr_sweep"]), comparison("lr_sweep")
    monkeypatch.setattr("studylib.data.pipeline.load_data", lambda *a, **k: pytest.fail("nothing should train"))
    planned = plan_runs(p, c.plan(study))
    dirs = {s.run_dir for row in planned.specs for s in row}
    for lr, row in zip(spec.lrs, planned.specs):
        for s in row:
            s.rundir.path.mkdir(parents=True, exist_ok=True)
            s.rundir.write_config(s.document())
            s.rundir.write_summary({"model": s.model, "seed": s.seed, "best_val_loss": 3.0 + lr, "finished": True})
    models = len(study.headline)
    assert len(dirs) == len(LRS) * models * 2
    df = LS.sweep_frame(c.train(study, jobs=1, progress=False), spec)
    assert len(df) == len(LRS) * models * 2 and set(df["lr"]) == set(LRS)
    assert (df["reused"] == (df["lr"] == p.train.lr)).all()
    assert (df["best_val_loss"] == 3.0 + df["lr"]).all()
    base = RunDir.of(p, "dense", 1).path
    assert base in dirs and base.parent.name == "dense"


def test_a_shorter_sweep_shares_the_preset_lr_runs_with_other_grids_of_its_budget(tmp_path, monkeypatch):
    """At a quarter budget the sweep's runs at the preset's lr are the same directories as any
    other grid's at that budget (e.g. the routing ablation's reference MoE): trained once."""
    from studylib.run.spec import budget_overrides

    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    study = _study({"lrs": list(LRS), "seeds": 2, "epochs": 0.25}, max_steps=40)
    p = study.preset
    quarter = budget_overrides(p, 0.25)
    assert quarter == {"train.max_steps": 10}
    grids = comparison("lr_sweep").plan(study)
    at = {lr: g for lr, g in zip(LS.sweep_spec(study, study["lr_sweep"]).lrs, grids)}
    for m in ("dense", "moe"):
        own = RunSpec.resolve(p, m, 1, at[p.train.lr].overrides).run_dir
        assert own == RunSpec.resolve(p, m, 1, quarter).run_dir != RunDir.of(p, m, 1).path
        other = RunSpec.resolve(p, m, 1, at[1e-2].overrides).run_dir
        assert other not in (own, RunDir.of(p, m, 1).path)


def test_budget_caveat_only_away_from_the_headline_budget():
    full = _spec({"lrs": list(LRS), "seeds": 2, "epochs": 1})
    quarter = _spec({"lrs": list(LRS), "seeds": 2, "epochs": 0.25})
    assert L.budget_caveat(full) == ""
    note = L.budget_caveat(quarter)
    assert "0.25 × the headline budget" in note and "headline budget is 4 times this one" in note and "may be lower" in note
    double = L.budget_caveat(_spec({"lrs": list(LRS), "seeds": 2, "epochs": 2}))
    assert "is 0.5 times this one" in double and "may be higher" in double


def test_reuse_sentence_names_the_headline_runs_only_at_the_headline_budget():
    full = _spec({"lrs": list(LRS), "seeds": 2, "epochs": 1})
    quarter = _spec({"lrs": list(LRS), "seeds": 2, "epochs": 0.25})
    assert L.reuse_sentence(full, 4) == "4 of them are the preset's own runs, reused."
    assert "shared with any other notebook's runs of that budget" in L.reuse_sentence(quarter, 0)
