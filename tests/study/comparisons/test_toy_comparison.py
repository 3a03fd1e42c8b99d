"""Adding a comparison is its package, its notebook and its preset entries: a toy comparison kept
in a temporary folder and declared as an entry point of ``studylib.comparisons`` by a distribution
there (knobs, plan, one family table) runs through the registry, the study's plan and training,
its notebook kernel and the report, with no other module touched. A comparison is never found by
walking ``sys.path``: a package ``studylib/study/comparisons/<name>`` elsewhere on it is not
imported; one named with ``--comparison-module`` is; a broken one is one line naming it. And a
notebook kernel that finds the study's plan loads the data at most once."""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from _tiny import TOY_COMPARISON as TOY, add_toy_comparison, installed_comparison, on_the_path, tiny_raw
from studylib.run.rundir import RunDir
from studylib.study import comparisons as C
from studylib.study.runner import notebooks as study
from studylib.study.runner.report import answer_cells

NOTEBOOK = textwrap.dedent('''\
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
    seeds = None
    overrides = None

    # %%
    from studylib.study.analysis import plots, tables
    from studylib.study.runner.notebooks import open_comparison

    ctx, runs = open_comparison("toy", params, jobs, seeds, overrides)
    a, b = ctx.knobs.models
    t = tables.comparison_table(runs.frame(), {f"{a} - {b}": (a, b)}, margin=ctx.study.general.margin,
                                family="13 toy: dense - moe")
    plots.save_table(t, "toy_gaps", ctx.out)
    print("STEPS", sorted(set(runs.frame()["steps"])))
    ''')


def _fake_train_run(calls):
    def train_run(preset, model, seed, run_dir=None, progress=True, data=None):
        calls.append((model, seed, preset.train.max_steps))
        rd = RunDir(run_dir)
        rd.path.mkdir(parents=True, exist_ok=True)
        from studylib.config import run_document

        rd.write_config(run_document(preset, preset.model_config(model), model, seed))
        rd.write_summary({"model": model, "seed": seed, "finished": True, "steps": preset.train.max_steps,
                          "best_val_loss": 3.0 + 0.1 * (model == "dense") + 0.01 * seed})
    return train_run


def test_a_toy_comparison_in_its_own_folder_runs_through_the_registry_the_study_and_the_report(tmp_path, monkeypatch):
    monkeypatch.delenv("STUDYLIB_OUTPUTS", raising=False)
    monkeypatch.delenv("STUDYLIB_ROOT", raising=False)
    monkeypatch.delenv(C.MODULES_ENV, raising=False)
    add_toy_comparison(tmp_path / "plugins", monkeypatch)
    root = tmp_path / "repo"
    (root / "params").mkdir(parents=True)
    (root / "notebooks").mkdir()
    raw = tiny_raw(name="t", study={"headline": ["dense", "moe"], "toy_models": ["dense", "moe"], "toy_epochs": 0.5})
    (root / "params" / "t.yaml").write_text(yaml.safe_dump(raw))
    (root / "notebooks" / "15_toy.py").write_text(NOTEBOOK)
    assert "toy" in C.registry() and C.comparison("15_toy").knobs.keys() == ("toy_models", "toy_epochs")
    calls = []
    monkeypatch.setattr("studylib.run.trainer.train_run", _fake_train_run(calls))
    monkeypatch.setattr("studylib.data.pipeline.load_data", lambda *a, **k: None)  # nothing trains for real
    res = study.run_study("params/t.yaml", root=root, jobs=1, report=True, progress=False, echo=lambda m: None)
    half = raw["train"]["max_steps"] // 2
    assert sorted(calls) == [(m, s, half) for m in ("dense", "moe") for s in (1, 2)]  # the toy's own budget
    out = root / "outputs" / "t"
    assert json.loads((out / "plans" / "toy.json").read_text())["grids"][0]["models"] == ["dense", "moe"]
    executed = (out / "notebooks" / "15_toy.ipynb").read_text()
    assert f"STEPS [{half}]" in executed
    assert (out / "tables" / "toy_gaps.csv").is_file()
    html = Path(res["report"]).read_text()
    assert "Notebook 15: " in html and "13 toy: dense - moe" in html
    md = "\n".join(c.source for c in answer_cells(out) if c.cell_type == "markdown")
    assert "Notebook 15: " in md


WRITES = textwrap.dedent('''\
    import pathlib
    pathlib.Path(__file__).with_name("RAN").write_text("imported")
    ''')


def test_a_package_on_the_path_under_studylib_study_comparisons_is_not_imported(tmp_path, monkeypatch):
    """A folder ``studylib/study/comparisons/<name>`` under another entry of ``sys.path`` (a working
    directory, PYTHONPATH) is no comparison: its code does not run."""
    monkeypatch.delenv(C.MODULES_ENV, raising=False)
    pkg = tmp_path / "elsewhere" / "studylib" / "study" / "comparisons" / "stray"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(WRITES + "COMPARISON = None\n")
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    found = C.registry()
    assert "stray" not in found and "headline" in found
    assert not (pkg / "RAN").exists()


def test_a_module_named_with_comparison_module_joins_the_registry(tmp_path, monkeypatch, request):
    monkeypatch.setenv(C.MODULES_ENV, "")  # name_modules sets it for this process: undone after the test
    on_the_path(monkeypatch, installed_comparison(tmp_path / "named", "toy_named", TOY))
    assert "toy" not in C.registry()
    request.addfinalizer(lambda: sys.modules.pop("toy_named", None))  # later tests cannot import it
    C.name_modules(["toy_named"])
    assert os.environ[C.MODULES_ENV] == "toy_named"  # what the kernels inherit
    assert C.comparison("15_toy").knobs.keys() == ("toy_models", "toy_epochs")


@pytest.mark.parametrize("module, source, expected", [
    ("broken_import", "raise ImportError('no module named torchish')",
     "cannot be loaded (ImportError: no module named torchish)"),
    ("broken_type", "COMPARISON = 3", "expected a studylib Comparison, got int"),
    ("broken_gone", None, "cannot be loaded (ModuleNotFoundError"),
])
def test_a_broken_external_comparison_is_one_line_naming_it(tmp_path, monkeypatch, capsys, module, source, expected):
    from studylib.cli import main

    monkeypatch.delenv(C.MODULES_ENV, raising=False)
    folder = tmp_path / "broken"
    if source is not None:
        installed_comparison(folder, module, source, entry="broken")
    else:  # an entry point whose module is not there
        info = folder / "gone-0.1.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gone\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[{C.ENTRY_POINT_GROUP}]\nbroken = {module}\n")
    monkeypatch.syspath_prepend(str(folder))
    with pytest.raises(C.ConfigError, match=f"comparison '{module}' \\(entry point 'broken'") as e:
        C.registry()
    assert expected in str(e.value) and "\n" not in str(e.value)
    repo = Path(__file__).resolve().parents[3]
    assert main(["study", "--params", str(repo / "params" / "ci.yaml"), "--notebooks", "03"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: comparison '{module}'"), err


def test_comparison_module_that_is_not_a_module_name_is_refused(capsys):
    from studylib.cli import main

    assert main(["study", "--params", "params/ci.yaml", "--comparison-module", "../x.py"]) == 2
    assert "--comparison-module '../x.py': expected a module name" in capsys.readouterr().err


STARTUP = textwrap.dedent('''\
    import os
    from studylib.data import pipeline

    _load = pipeline.load_data


    def load_data(cfg, progress=True):
        with open(os.environ["STUDYLIB_TEST_LOADS"], "a") as f:
            f.write(f"{os.getpid()}\\n")
        return _load(cfg, progress)


    pipeline.load_data = load_data
    ''')


@pytest.mark.slow
def test_a_kernel_that_finds_the_studys_plan_loads_the_data_at_most_once(scratch, monkeypatch, subset):
    """Notebook 09 of the ci preset (its budgets in tokens per parameter need one epoch's steps)
    and 03: each kernel counts its loads of the data (an IPython startup file wraps load_data)."""
    monkeypatch.setenv("STUDYLIB_DATA_DIR", str(subset))
    monkeypatch.delenv("STUDYLIB_SCHEDULER", raising=False)
    ipython = scratch / "ipython"
    (ipython / "profile_default" / "startup").mkdir(parents=True)
    (ipython / "profile_default" / "startup" / "00-count.py").write_text(STARTUP)
    monkeypatch.setenv("IPYTHONDIR", str(ipython))
    loads = scratch / "loads.txt"
    monkeypatch.setenv("STUDYLIB_TEST_LOADS", str(loads))
    ci = Path(__file__).resolve().parents[3] / "params" / "ci.yaml"
    study.run_study(str(ci), notebooks=["03", "09"], jobs=1, report=False, progress=False, notebook_jobs=1,
                    echo=lambda m: None)
    assert (scratch / "out" / "ci" / "plans" / "token_budget.json").is_file()
    per_kernel = {}
    for pid in (loads.read_text().split() if loads.exists() else []):
        per_kernel[pid] = per_kernel.get(pid, 0) + 1
    assert all(n <= 1 for n in per_kernel.values()), per_kernel
