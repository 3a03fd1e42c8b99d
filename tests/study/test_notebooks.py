"""The study runner: Jupytext -> papermill (parameters injected, cwd = root) -> report; failures
name the notebook and the cell; notebook_context resolves everything from the root without
changing the working directory. Uses trivial notebooks written to a temporary repository."""
from __future__ import annotations

import os
import subprocess
import sys
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


def test_notebook_context_resolves_from_the_root_and_keeps_the_cwd(repo, monkeypatch, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(elsewhere)  # e.g. nbval runs a notebook from its own folder
    monkeypatch.setenv("STUDYLIB_ROOT", str(repo))
    ctx = study.notebook_context("params/t.yaml", jobs=2)
    assert os.getcwd() == str(elsewhere)
    assert ctx.root == repo.resolve() and ctx.params == str(repo.resolve() / "params" / "t.yaml")
    assert ctx.out == repo.resolve() / "outputs" / "t" and ctx.out.is_dir()
    assert ctx.preset.name == "t" and ctx.jobs == 2 and ctx.first_seed == ctx.seeds[0]
    assert not (elsewhere / "outputs").exists()
    # a relative $STUDYLIB_OUTPUTS is taken from the root as well
    monkeypatch.setenv("STUDYLIB_OUTPUTS", "elsewhere_out")
    assert study.notebook_context("params/t.yaml").out == repo.resolve() / "elsewhere_out" / "t"


def test_repo_root_falls_back_to_the_checkout_of_the_package(tmp_path, monkeypatch):
    monkeypatch.delenv("STUDYLIB_ROOT", raising=False)
    root = study.repo_root(tmp_path)  # nothing above tmp_path holds params/ and notebooks/
    assert (root / "params").is_dir() and (root / "notebooks").is_dir() and (root / "studylib").is_dir()


def test_importing_plots_leaves_matplotlib_alone():
    code = ("import matplotlib; import studylib.study.plots; "
            "assert matplotlib.rcParams._get_backend_or_none() is None, matplotlib.rcParams['backend']")
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
