"""The study's run plan (studylib.study.orchestration.plan): it covers every notebook that trains, names each run
once, and ``studylib study`` trains it in one queue before the notebooks execute."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from _tiny import tiny_raw
from studylib.config import ConfigError, load_preset, run_document
from studylib.run.rundir import RunDir
from studylib.study.runner import notebooks as study
from studylib.study.orchestration import plan, sweep

ROOT = Path(__file__).resolve().parents[3]
TRAINS = re.compile(r"\b(ensure_runs|ensure_grid|ensure_grids|train_budgets|ensure_sweep)\(")


def test_every_notebook_that_trains_is_in_the_plan():
    trains = {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.py") if TRAINS.search(p.read_text())}
    # 08 re-reads the first headline MoE run with per-step snapshots: trained by 03 (or by itself alone)
    assert trains - {"08_routing_explorer"} == set(plan.NOTEBOOK_GRIDS)


def _fake_train_run(calls):
    def train_run(preset, model, seed, run_dir=None, progress=True, data=None):
        calls.append((model, seed, preset.train.max_steps, preset.train.lr, preset.train.data_seed))
        rd = RunDir(run_dir)
        rd.path.mkdir(parents=True, exist_ok=True)
        rd.write_config(run_document(preset, preset.model_config(model), model, seed))
        rd.write_summary({"model": model, "seed": seed, "best_val_loss": 3.0, "finished": True})
    return train_run


def test_the_ci_plan_trains_each_run_once(tmp_path, monkeypatch):
    """params/ci.yaml, 2 seeds, max_steps 12. Per seed: headline 3 (12 steps); ablation 5 at 6
    steps; K sweep 4 at 6 steps; iso-width at 6 steps +2 (moe_iso, dense_active); token budget: the
    headline trio at 6 steps +1 (dense_total; the others are the ablation's and iso-width's) and at
    12 steps +0, the small trio at 6 and 12 steps +6; lr sweep at 6 steps: the preset's lr +0 (the
    6-step runs above), 3 models x 2 other lrs +6. 27 runs per seed. The noise split (seeds: 2)
    adds seed 1338 with data seed 1337 and seed 1337 with data seed 1338: +6. The router variants
    (12) at 12 steps: the reference and both dense baselines are the headline's runs, the 7 other
    routers +14."""
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path))
    monkeypatch.chdir(ROOT)
    calls = []
    monkeypatch.setattr("studylib.run.trainer.train_run", _fake_train_run(calls))
    monkeypatch.setattr("studylib.data.pipeline.load_data", lambda *a, **k: None)  # max_steps: no epoch to count
    monkeypatch.setattr(sweep, "_steps", lambda spec, datas: 1)
    preset = load_preset("params/ci.yaml")
    grids = plan.study_grids(preset, [p.stem for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))])
    frames = sweep.ensure_grids(preset, grids, jobs=1, progress=False)
    assert len(calls) == 27 * 2 + 6 + 7 * 2 and len(set(calls)) == len(calls)
    assert sum(len(f) for f in frames) > len(calls)  # grids share runs: trained once, read by each
    assert {c[2] for c in calls} == {6, 12}
    assert {c[3] for c in calls} == {1e-3, 3e-3, 1e-2}


NOTEBOOK = textwrap.dedent("""\
    # ---
    # jupyter:
    #   jupytext:
    #     formats: py:percent
    #     text_representation:
    #       extension: .py
    #       format_name: percent
    #   kernelspec:
    #     display_name: Python 3
    #     language: python
    #     name: python3
    # ---

    # %% tags=["parameters"]
    params = "params/t.yaml"
    jobs = None

    # %%
    from studylib.run.rundir import RunDir
    from studylib.study.runner.notebooks import notebook_context
    ctx = notebook_context(params, jobs)
    ready = [RunDir.of(ctx.preset, m, s).finished() for m in ctx.study.headline for s in ctx.seeds]
    print("READY", ready)
    assert all(ready), "the study trains the plan before the notebooks run"
    """)


def test_study_trains_the_plan_before_the_notebooks(tmp_path, monkeypatch):
    monkeypatch.delenv("STUDYLIB_OUTPUTS", raising=False)
    monkeypatch.delenv("STUDYLIB_ROOT", raising=False)
    (tmp_path / "params").mkdir()
    raw = tiny_raw(name="t", study={"headline": ["dense", "moe"]})
    (tmp_path / "params" / "t.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "03_headline_sweep.py").write_text(NOTEBOOK)
    calls = []
    monkeypatch.setattr("studylib.run.trainer.train_run", _fake_train_run(calls))
    monkeypatch.setattr("studylib.data.pipeline.load_data", lambda *a, **k: None)
    monkeypatch.setattr(sweep, "_steps", lambda spec, datas: 1)
    lines = []
    res = study.run_study("params/t.yaml", root=tmp_path, jobs=1, report=False, progress=False, echo=lines.append)
    assert sorted((m, s) for m, s, *_ in calls) == [("dense", 1), ("dense", 2), ("moe", 1), ("moe", 2)]
    assert res["runs_s"] > 0 and any(line.startswith("runs ready in") for line in lines)
    assert "READY [True, True, True, True]" in (tmp_path / "outputs" / "t" / "notebooks" /
                                                  "03_headline_sweep.ipynb").read_text()


def test_fewer_seeds_for_the_comparisons_that_ask_for_them():
    p = load_preset(ROOT / "params" / "ci.yaml", ["seeds=[5,6,7,8]", "study.downstream_seeds=2",
                                                   "study.noise_split={seeds: 3}"])
    assert plan.first_seeds(p, "downstream_seeds") == [5, 6] == list(plan.downstream_grid(p).seeds)
    assert plan.first_seeds(p, "comparison_seeds") == [5, 6]  # ci: 2
    assert plan.first_seeds(load_preset(ROOT / "params" / "cpu_full.yaml"), "downstream_seeds") == \
        list(load_preset(ROOT / "params" / "cpu_full.yaml").seeds)  # absent: every seed
    headline = plan.study_grids(p, ["03_headline_sweep"])
    # the headline over every seed, then the noise split: init only (3 seeds), order only (one grid per data seed)
    assert list(headline[0].seeds) == [5, 6, 7, 8] and list(headline[2].seeds) == [5, 6, 7]
    assert [g.overrides for g in headline[3:]] == [{"train.data_seed": s} for s in (5, 6, 7)]
    with pytest.raises(ConfigError, match="study.downstream_seeds"):  # refused when the preset loads
        load_preset(ROOT / "params" / "ci.yaml", ["study.downstream_seeds=1"])


def test_notebook_04_reads_any_sparse_moe_where_its_runs_are():
    """The default is the reference MoE's headline runs; a router variant of notebook 12 is read at
    study.router_variants_epochs (12's runs), any other MoE at the preset's budget; a model without
    a sparse router is refused with one line naming the routed models."""
    p = load_preset(ROOT / "params" / "ci.yaml", ["study.router_variants_epochs=0.5"])
    ref = plan.routing_grid(p)
    assert ref.models == [plan.reference_moe(p)] and not ref.overrides
    variant = plan.routing_grid(p, "moe_sigmoid_bias")
    assert variant.models == ["moe_sigmoid_bias"] and variant.overrides == plan.router_variants_grid(p).overrides
    paths = [{s: rd.path for s, rd in sweep.grid_run_dirs(p, g)["moe_sigmoid_bias"].items()}
             for g in (variant, plan.router_variants_grid(p))]
    assert paths[0] == paths[1] and all("max_steps=6" in str(d) for d in paths[0].values())
    other = plan.routing_grid(p, "moe_top1")  # an ablation MoE: the preset's budget
    assert other.models == ["moe_top1"] and not other.overrides
    # `studylib study --notebooks 04 -p model X` trains X's runs up front, not the reference's
    assert plan.study_grids(p, ["04_routing_diagnostics"], {"04_routing_diagnostics": {"model": "moe_sigmoid_bias"}}) \
        == [variant]
    assert plan.study_grids(p, ["04_routing_diagnostics"]) == [ref]
    with pytest.raises(ConfigError, match=r"'dense_active' is 'dense', not a sparse MoE.*moe_top2_z"):
        plan.routing_grid(p, "dense_active")
    with pytest.raises(ConfigError, match="nope"):
        plan.routing_grid(p, "nope")
