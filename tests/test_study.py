"""The study runner: Jupytext -> papermill (parameters injected, cwd = root) -> report; failures
name the notebook and the cell. Uses trivial notebooks written to a temporary repository."""
from __future__ import annotations

import textwrap

import nbformat
import pytest
import yaml

from _tiny import tiny_raw
from studylib.study import notebooks as study
from studylib.cli import main

HEADER = textwrap.dedent("""\
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
    """)

OK = HEADER + textwrap.dedent("""\

    # %% [markdown]
    # # A trivial notebook

    # %% tags=["parameters"]
    params = "params/other.yaml"
    jobs = None

    # %%
    import os
    from studylib.study.notebooks import notebook_context
    ctx = notebook_context(params, jobs)
    print("PARAMS", params, "JOBS", jobs, "PRESET", ctx.preset.name)
    print("CWD", os.getcwd())
    assert ctx.jobs == 3
    """)

FAIL = HEADER + textwrap.dedent("""\

    # %% tags=["parameters"]
    params = "params/other.yaml"
    jobs = None

    # %%
    x = 1

    # %%
    raise ValueError("boom: the invariant broke")
    """)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.delenv("STUDYLIB_OUTPUTS", raising=False)
    monkeypatch.delenv("STUDYLIB_ROOT", raising=False)
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "t.yaml").write_text(yaml.safe_dump(tiny_raw(name="t")))
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    (nbs / "01_ok.py").write_text(OK)
    (nbs / "02_fail.py").write_text(FAIL)
    (nbs / "helper.py").write_text("# not a study notebook\n")
    return tmp_path


def _stream_text(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")


def test_find_notebooks(repo):
    nbs = study.find_notebooks(repo / "notebooks")
    assert [p.name for p in nbs] == ["01_ok.py", "02_fail.py"]
    assert [p.name for p in study.find_notebooks(repo / "notebooks", ["2"])] == ["02_fail.py"]
    assert [p.name for p in study.find_notebooks(repo / "notebooks", ["01_ok"])] == ["01_ok.py"]
    with pytest.raises(study.ConfigError, match="no notebook '07'"):
        study.find_notebooks(repo / "notebooks", ["07"])


def test_runs_notebook_with_parameters_and_writes_report(repo, monkeypatch, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(elsewhere)  # the runner resolves the params path and runs the kernel in the root
    res = study.run_study(str(repo / "params" / "t.yaml"), notebooks=["01"], jobs=3, root=repo,
                          progress=False, echo=lambda m: None)
    out = repo / "outputs" / "t" / "notebooks" / "01_ok.ipynb"
    assert out.is_file()
    nb = nbformat.read(str(out), as_version=4)
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    assert ["injected-parameters"] in tags
    text = _stream_text(nb)
    assert "PARAMS params/t.yaml JOBS 3 PRESET t" in text
    assert f"CWD {repo}" in text
    assert set(res["notebooks"]) == {"01_ok"}
    report = repo / "outputs" / "t" / "report.html"
    assert res["report"] == report and report.is_file()
    html = report.read_text()
    assert "A trivial notebook" in html and "PARAMS params/t.yaml" in html
    assert "notebook_context(params" not in html  # code cells are hidden in the report


def test_failing_cell_is_named(repo):
    with pytest.raises(study.StudyError) as ei:
        study.run_study(str(repo / "params" / "t.yaml"), notebooks=["01", "02"], jobs=3, root=repo, report=True,
                        progress=False, echo=lambda m: None)
    msg = str(ei.value)
    assert "notebook 02_fail.py failed in cell" in msg
    assert "ValueError: boom: the invariant broke" in msg
    assert 'raise ValueError("boom' in msg  # the failing cell's source
    assert "02_fail.ipynb" in msg
    # the first notebook ran; the failed one is kept (with its traceback); no report after a failure
    outdir = repo / "outputs" / "t"
    assert (outdir / "notebooks" / "01_ok.ipynb").is_file()
    failed = nbformat.read(str(outdir / "notebooks" / "02_fail.ipynb"), as_version=4)
    assert any(o.get("output_type") == "error" for c in failed.cells if c.cell_type == "code"
               for o in c.get("outputs", []))
    assert not (outdir / "report.html").exists()


def test_cli_reports_failure(repo, monkeypatch, capsys):
    monkeypatch.chdir(repo)
    rc = main(["study", "--params", "params/t.yaml", "--notebooks", "02", "--no-report", "--no-progress"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "error: notebook 02_fail.py failed in cell" in err and "ValueError" in err


def test_merge_notebooks_drops_parameters_and_stderr(repo):
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    nb = new_notebook(cells=[
        new_code_cell("params = 1", metadata={"tags": ["parameters"]}),
        new_code_cell("print(1)", outputs=[new_output("stream", name="stdout", text="1\n"),
                                           new_output("stream", name="stderr", text="progress\n")]),
    ])
    p = repo / "x.ipynb"
    nbformat.write(nb, str(p))
    merged = study.merge_notebooks([p, p], title="T")
    code = [c for c in merged.cells if c.cell_type == "code"]
    assert len(code) == 2 and all(len(c.outputs) == 1 for c in code)
    assert len({c["id"] for c in merged.cells}) == len(merged.cells)


# --------------------------------------------------------------------------------------------
# the sweep the notebooks call (studylib.study.sweep.ensure_runs)
# --------------------------------------------------------------------------------------------
def _fake_finished_run(preset, model, seed, loss):
    from studylib.run import rundir as runs

    rd = runs.run_dir_for(preset, model, seed)
    runs.write_config(rd, runs.config_document(preset, preset.model_config(model), model, seed))
    runs.write_json_atomic(rd / runs.SUMMARY_FILE, {"model": model, "seed": seed, "best_val_loss": loss,
                                                    "final_val_loss": loss, "tokens": 10, "finished": True,
                                                    "params": {"total": 5}})
    return rd


def test_ensure_runs_reuses_finished_runs_without_training(tmp_path, monkeypatch):
    from _tiny import tiny_preset
    from studylib.study import sweep

    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    p = tiny_preset()
    for s, loss in ((1, 2.0), (2, 2.5)):
        _fake_finished_run(p, "dense", s, loss)

    def no_data(*a, **k):
        raise AssertionError("nothing to train: the data must not be loaded")

    monkeypatch.setattr("studylib.run.data.load_data", no_data)
    df = sweep.ensure_runs(p, ["dense", "dense"], [1, 2], jobs=2, progress=False)
    assert list(df["seed"]) == [1, 2] and list(df["best_val_loss"]) == [2.0, 2.5]
    assert df.loc[0, "params_total"] == 5


def test_ensure_runs_refuses_a_run_dir_with_another_config(tmp_path, monkeypatch):
    from _tiny import tiny_preset
    from studylib.run import rundir as runs
    from studylib.study import sweep

    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    p = tiny_preset()
    _fake_finished_run(p, "dense", 1, 2.0)
    with pytest.raises(runs.RunDirConflict):
        sweep.ensure_runs(p, ["dense"], [1], overrides={"train.lr": 1e-3}, progress=False)


def test_parallel_failure_names_model_seed_and_log(tmp_path, monkeypatch):
    import os
    import sys

    from _tiny import synthetic_data, tiny_preset
    from studylib.study import sweep

    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.setattr("studylib.run.data.load_data", lambda *a, **k: synthetic_data())
    seen = []

    def fake_command(params_file, model, seed, run_dir, threads):
        seen.append((params_file, model, seed, threads))
        doc = yaml.safe_load(open(params_file))
        assert os.path.isabs(doc["data"]["cache_dir"])  # resolved as the parent resolves it
        code = "import sys; print('child says: out of cheese'); sys.exit(3)" if model == "moe" else "pass"
        return [sys.executable, "-c", code]

    monkeypatch.setattr(sweep, "train_command", fake_command)
    p = tiny_preset()  # no file behind it: the children get a resolved copy of the preset
    with pytest.raises(sweep.SweepError) as ei:
        sweep.ensure_runs(p, ["moe"], [1], jobs=4, progress=False)
    msg = str(ei.value)
    log = tmp_path / "out" / "tiny" / "runs" / "moe" / "seed1" / "train.log"
    assert "training moe seed 1 failed (exit code 3)" in msg
    assert str(log) in msg and "out of cheese" in msg
    assert "out of cheese" in log.read_text()
    params_file, _, _, threads = seen[0]
    assert threads == sweep.available_cores()  # one missing run: it gets every core
    assert not tmp_path.joinpath(params_file).exists()  # the temporary preset copy is cleaned up
