"""The comparisons' registry (studylib.study.comparisons): one comparison per notebook, each
notebook opening its own; the plan names each run once, resolves it once along a study, and
``studylib study`` trains it in one queue before the notebooks execute."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from _tiny import tiny_raw
from studylib.config import ConfigError, load_preset, override, presets, run_document
from studylib.config.presets import override_pairs
from studylib.run.rundir import RunDir
from studylib.run.spec import RunSpec
from studylib.study import comparisons as C
from studylib.study.analysis.frames import runs_frame
from studylib.study.comparisons import router_variants, routing
from studylib.study.runner import notebooks as study
from studylib.study.orchestration import plan
from studylib.study.orchestration.train import train_plan

ROOT = Path(__file__).resolve().parents[3]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
OPENS = re.compile(r"^ctx, \w+ = open_comparison\(\"(\w+)\"", re.M)


def test_every_notebook_opens_its_own_comparison():
    """Each notebook opens the comparison whose notebook it is, and every comparison has one."""
    opened = {p.stem: OPENS.findall(p.read_text()) for p in NOTEBOOKS}
    assert {stem: [C.comparison(n).notebook for n in names] for stem, names in opened.items()} == \
        {stem: [stem] for stem in opened}
    assert set(C.by_notebook()) == set(opened)


def test_the_ci_plan_trains_each_run_once(tmp_path, monkeypatch):
    """params/ci.yaml: every run of every comparison trained exactly once (a run two grids share
    too), into the run directories the plan named, and nothing else."""
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path))
    monkeypatch.chdir(ROOT)
    calls = []
    monkeypatch.setattr("studylib.run.trainer.train_run", _fake_train_run(calls))
    monkeypatch.setattr("studylib.data.pipeline.load_data", lambda *a, **k: None)  # max_steps: no epoch to count
    preset = load_preset("params/ci.yaml")
    _, planned = study.plan_study(preset, NOTEBOOKS)
    train_plan(planned, jobs=1, progress=False)
    grids, specs = planned.grids, planned.specs
    planned = {spec.run_dir for per_grid in specs for spec in per_grid}
    assert len(calls) == len(set(calls)) == len(planned)
    assert {p.parent for p in tmp_path.rglob("summary.json")} == planned
    assert sum(len(runs_frame(s)) for s in specs) > len(calls)  # grids share runs: trained once, read by each
    # each run trains its own grid's budget (the ci preset's 12 steps, its budgets' 6 and the map's 4)
    assert {c[2] for c in calls} == {override(preset, g.overrides).train.max_steps for g in grids}
    assert {c[3] for c in calls} == {1e-3, 3e-3, 1e-2}


def test_a_study_resolves_each_run_once(tmp_path, monkeypatch):
    """Along the ci study (the plan, the reuse of its finished runs, the frames of every grid),
    ``override`` is applied once per run asked for: the sweep resolves it into a RunSpec and the
    frames read that handle."""
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path))
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("studylib.run.trainer.train_run", _fake_train_run([]))
    monkeypatch.setattr("studylib.data.pipeline.load_data", lambda *a, **k: None)
    preset = load_preset("params/ci.yaml")
    train_plan(study.plan_study(preset, NOTEBOOKS)[1], jobs=1, progress=False)  # every run finished
    calls = []
    real = presets.override

    def counting(p, overrides):
        calls.append(overrides)
        return real(p, overrides)

    import sys
    for mod in [m for name, m in sys.modules.items() if name.startswith("studylib") and m is not None]:
        if getattr(mod, "override", None) is real:
            monkeypatch.setattr(mod, "override", counting)
    _, planned = study.plan_study(preset, NOTEBOOKS)
    train_plan(planned, jobs=1, progress=False)  # nothing left to train
    grids = planned.grids
    frames = [runs_frame(s) for s in planned.specs]
    asked = {(m, s, tuple((k, repr(v)) for k, v, _ in override_pairs(g.overrides)))
             for g in grids for m in g.models for s in g.seeds_of(preset)}
    assert len(calls) == len(asked)
    assert sum(map(len, frames)) > len(asked)  # each grid's frame read its runs without resolving them again


def _fake_train_run(calls):
    def train_run(preset, model, seed, run_dir=None, progress=True, data=None):
        calls.append((model, seed, preset.train.max_steps, preset.train.lr, preset.train.data_seed,
                      preset.data.vocab_size, preset.data.train_fraction))
        rd = RunDir(run_dir)
        rd.path.mkdir(parents=True, exist_ok=True)
        rd.write_config(run_document(preset, preset.model_config(model), model, seed))
        rd.write_summary({"model": model, "seed": seed, "best_val_loss": 3.0, "finished": True})
    return train_run


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
    from studylib.study.runner.notebooks import open_comparison
    ctx, runs = open_comparison("headline", params, jobs)
    print("OPENED", list(zip(runs.frame()["model"], runs.frame()["seed"])), ctx.comparison.notebook)
    """)


def test_study_trains_the_plan_before_the_notebooks_which_open_it_finished(tmp_path, monkeypatch):
    monkeypatch.delenv("STUDYLIB_OUTPUTS", raising=False)
    monkeypatch.delenv("STUDYLIB_ROOT", raising=False)
    (tmp_path / "params").mkdir()
    raw = tiny_raw(name="t", models={"dense_t": {"derive": "matched_total", "from": "moe"}}, study={"headline": ["dense", "moe", "dense_t"]})
    (tmp_path / "params" / "t.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "03_headline_sweep.py").write_text(NOTEBOOK)
    calls = []
    monkeypatch.setattr("studylib.run.trainer.train_run", _fake_train_run(calls))
    monkeypatch.setattr("studylib.data.pipeline.load_data", lambda *a, **k: None)
    lines = []
    res = study.run_study("params/t.yaml", root=tmp_path, jobs=1, report=False, progress=False, echo=lines.append)
    assert sorted((m, s) for m, s, *_ in calls) == [(m, s) for m in ("dense", "dense_t", "moe") for s in (1, 2)]
    assert res["runs_s"] > 0 and any(line.startswith("runs ready in") for line in lines)
    executed = (tmp_path / "outputs" / "t" / "notebooks" / "03_headline_sweep.ipynb").read_text()
    assert f"READY {[True] * 6}" in executed
    assert f"OPENED {[(m, s) for m in ('dense', 'moe', 'dense_t') for s in (1, 2)]} 03_headline_sweep" in executed


def test_fewer_seeds_for_the_comparisons_that_ask_for_them():
    p = load_preset(ROOT / "params" / "ci.yaml", ["seeds=[5,6,7,8]", "study.downstream_seeds=2",
                                                   "study.noise_split={seeds: 3}"])
    s = C.study_of(p)
    assert s.leading_seeds(s["downstream"].seeds) == [5, 6] == list(C.comparison("10_downstream").plan(s)[0].seeds)
    assert list(C.comparison("02_routing_ablation").plan(s)[0].seeds) == [5, 6]  # ci: comparison_seeds 2
    full = C.study_of(load_preset(ROOT / "params" / "cpu_full.yaml"))
    assert list(C.comparison("10_downstream").plan(full)[0].seeds) == list(full.preset.seeds)  # absent: every seed
    headline = C.comparison("03_headline_sweep").plan(s)
    # the headline over every seed, then the noise split: init only (3 seeds), order only (one grid per data seed)
    assert list(headline[0].seeds) == [5, 6, 7, 8] and list(headline[2].seeds) == [5, 6, 7]
    assert [g.overrides for g in headline[3:]] == [{"train.data_seed": s} for s in (5, 6, 7)]
    with pytest.raises(ConfigError, match="study.downstream_seeds"):  # refused when the study loads the preset
        C.study_of(load_preset(ROOT / "params" / "ci.yaml", ["study.downstream_seeds=1"]))


def test_notebook_04_reads_any_sparse_moe_where_its_runs_are():
    """The default is the reference MoE's headline runs; a router variant of notebook 12 is read at
    study.router_variants_epochs (12's runs), any other MoE at the preset's budget; a model without
    a sparse router is refused with one line naming the routed models."""
    s = C.study_of(load_preset(ROOT / "params" / "ci.yaml", ["study.router_variants_epochs=0.5"]))
    p, variants = s.preset, router_variants.grid(s, s["router_variants"])
    ref = routing.grid(s)
    assert ref.models == [s.reference_moe] and not ref.overrides
    variant = routing.grid(s, "moe_sigmoid_bias")
    assert variant.models == ["moe_sigmoid_bias"] and variant.overrides == variants.overrides
    paths = [{seed: RunSpec.resolve(p, "moe_sigmoid_bias", seed, g.overrides).run_dir for seed in g.seeds_of(p)}
             for g in (variant, variants)]
    assert paths[0] == paths[1] and all("max_steps=6" in str(d) for d in paths[0].values())
    other = routing.grid(s, "moe_top1")  # an ablation MoE: the preset's budget
    assert other.models == ["moe_top1"] and not other.overrides
    # `studylib study --notebooks 04 -p model X` trains X's runs up front, not the reference's
    assert C.comparison("04_routing_diagnostics").plan(s, {"model": "moe_sigmoid_bias", "seeds": None}) == [variant]
    assert C.comparison("04_routing_diagnostics").plan(s) == [ref]
    with pytest.raises(ConfigError, match=r"'dense_active' is 'dense', not a sparse MoE.*moe_top2_z"):
        routing.grid(s, "dense_active")
    with pytest.raises(ConfigError, match="nope"):
        routing.grid(s, "nope")


def test_each_comparison_owns_its_knobs_and_the_registry_finds_every_package():
    """One answer to "which knobs does notebook NN have": its comparison's knobs type; every
    package of studylib/study/comparisons is a comparison, in notebook order."""
    import pkgutil

    packages = {m.name for m in pkgutil.iter_modules(C.__path__) if m.ispkg}
    assert set(C.registry()) == packages
    assert [c.notebook for c in C.registry().values()] == sorted(c.notebook for c in C.registry().values())
    assert C.comparison("02_routing_ablation").knobs.keys() == ("ablation", "ablation_epochs")


@pytest.mark.parametrize("name, key", [("ablation", "ablation"), ("granularity", "granularity"),
                                       ("iso_width", "iso_width")])
def test_the_shared_plan_of_models_at_a_budget_names_each_comparisons_missing_key(name, key):
    """02, 06 and 07 share one plan (base.models_at_epochs); a preset without the comparison's
    model list is refused naming that comparison's own key."""
    s = C.study_of(load_preset(ROOT / "params" / "ci.yaml", [f"study.{key}=null"]))
    with pytest.raises(ConfigError, match=rf"^study\.{key}: missing from preset 'ci'"):
        C.comparison(name).plan(s)
