"""One notebook by hand with plain papermill (docs/running.md, "One notebook by hand"): the
documented commands run as written, and a name the notebook does not declare (papermill only
warns about it and runs the notebook on its defaults, issue #41) or a value of the wrong type is
refused in the notebook's first code cell, before anything trains or is written. The injected-cell
reading and the value checks are also tested without a kernel."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from conftest import require_subset
from studylib.config import ConfigError
from studylib.study.runner import injected
from studylib.study.runner.parameters import check_notebook, check_parameter

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
DOC = ROOT / "docs" / "running.md"
PARAMETERS = 'params = "params/cpu.yaml"\njobs = None\nseeds = None  # e.g. [1, 2]\noverrides = None\n'


def documented_commands(tmp: Path) -> list[list[str]]:
    """The commands of docs/running.md's "One notebook by hand" section, as argument lists, with
    ``.venv/bin/`` this interpreter's folder and ``/tmp/`` ``tmp``."""
    section = DOC.read_text().split("## One notebook by hand", 1)[1].split("\n## ", 1)[0]
    lines = [ln.strip() for ln in section.splitlines() if ln.startswith("    .venv/bin/")]
    assert [ln.split()[0] for ln in lines] == [".venv/bin/jupytext", ".venv/bin/papermill"], lines
    return [[str(BIN / a[len(".venv/bin/"):]) if a.startswith(".venv/bin/") else
             f"{tmp}/{a[len('/tmp/'):]}" if a.startswith("/tmp/") else a for a in shlex.split(ln)] for ln in lines]


def _run(argv: list[str], tmp: Path) -> subprocess.CompletedProcess:
    """``argv`` from the repository root, outputs and caches inside ``tmp``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), STUDYLIB_OUTPUTS=str(tmp / "out"),
               STUDYLIB_CACHE_DIR=str(tmp / "cache"), STUDYLIB_DATA_DIR=str(require_subset()))
    env.pop("STUDYLIB_SCHEDULER", None)
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_documented_papermill_recipe_runs_notebook_01_on_ci(tmp_path):
    convert, execute = documented_commands(tmp_path)
    assert _run(convert, tmp_path).returncode == 0
    r = _run(execute, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    nb = nbformat.read(str(tmp_path / "01_ci.ipynb"), as_version=4)
    assert nb.metadata.papermill.parameters == {"params": "params/ci.yaml"}
    assert (tmp_path / "out" / "ci" / "tables").is_dir() and not (tmp_path / "out" / "cpu").exists()


@pytest.fixture(scope="module")
def notebook_09(tmp_path_factory) -> Path:
    """Notebook 09 (its default preset, cpu, trains for hours) as the documented conversion makes it."""
    tmp = tmp_path_factory.mktemp("nb")
    convert = [a.replace("01_budget_matching", "09_token_budget").replace("01.ipynb", "09.ipynb")
               for a in documented_commands(tmp)[0]]
    assert _run(convert, tmp).returncode == 0
    return tmp / "09.ipynb"


@pytest.mark.parametrize("argv, message", [
    (["-p", "preset", "params/ci.yaml"],
     r"ConfigError: -p preset: not a parameter of this notebook \(papermill injected it and only warned\); "
     r"its parameters: \['params', 'jobs', 'seeds', 'overrides'\]"),
    pytest.param(["-p", "params", "5"], r"ConfigError: params: expected the path of a preset file, e\.g\. "
                                        r"'params/ci\.yaml'; got 5", marks=pytest.mark.slow),
    pytest.param(["-p", "params", "params/ci.yaml", "-p", "jobs", "0"],
                 r"ConfigError: jobs: expected a positive integer or None, got 0", marks=pytest.mark.slow),
])
def test_papermill_with_a_wrong_parameter_is_refused_before_anything_trains(notebook_09, tmp_path, argv, message):
    """It warned "Passed unknown parameter: preset" and trained the cpu preset's token-budget map."""
    r = _run([str(BIN / "papermill"), str(notebook_09), str(tmp_path / "09_out.ipynb"), "--cwd", ".",
              "--execution-timeout", "120", *argv], tmp_path)
    assert r.returncode == 1 and re.search(message, r.stderr), r.stderr[-3000:]
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()  # no run, marker, data or table


# ---- without a kernel --------------------------------------------------------------------------------
def test_the_injected_cell_is_read_from_the_history_against_the_cell_before_it():
    history = ["", PARAMETERS, "# Parameters\nparams = 'params/ci.yaml'\nseeds = [1, 2]\n", "import os"]
    assert injected.injected_cells(history) == (["params", "jobs", "seeds", "overrides"], ["params", "seeds"])
    ns = {"In": history, "params": "params/ci.yaml", "seeds": [1, 2]}
    assert injected.check_injected(ns) == {"params": "params/ci.yaml", "seeds": [1, 2]}
    ns["In"] = history[:2] + ["# Parameters\nparams = 'params/ci.yaml'\npreset = 'params/ci.yaml'\n"]
    with pytest.raises(ConfigError, match=r"^-p preset: not a parameter of this notebook"):
        injected.check_injected(ns)
    # JupyterLab: no injected cell, nothing to check; cells run by hand out of order: not known
    assert injected.check_injected({"In": ["", PARAMETERS, "x = 1"]}) == {}
    assert injected.injected_cells(["", "import os", "# Parameters\npreset = 1\n"]) is None
    assert injected.check_injected({}) == {}


def test_outside_a_kernel_only_the_values_are_checked(tmp_path):
    (tmp_path / "p.yaml").write_text("name: p\n")
    check_notebook(tmp_path, "p.yaml", 2, "1-3", None)
    with pytest.raises(ConfigError, match=r"^params: 'nope.yaml' is not a preset file"):
        check_notebook(tmp_path, "nope.yaml")


@pytest.mark.parametrize("name, value, message", [
    ("params", 5, r"params: expected the path of a preset file, e\.g\. 'params/ci\.yaml'; got 5"),
    ("params", None, r"params: expected the path of a preset file"),
    ("jobs", 0, r"jobs: expected a positive integer or None, got 0"),
    ("jobs", True, r"jobs: expected a positive integer or None, got True"),
    ("jobs", "2", r"jobs: expected a positive integer or None, got '2'"),
    ("seeds", "x-y", r"seeds: expected a list of integer seeds"),
    ("overrides", 5, r"overrides: expected a mapping"),
    ("model", 5, r"model: expected a string or None, got 5"),
    ("run", ["a"], r"run: expected a string or None, got \['a'\]"),
    ("prompt", 1.5, r"prompt: expected a string or None, got 1\.5"),
])
def test_each_parameter_value_is_checked_naming_it(name, value, message):
    with pytest.raises(ConfigError, match=rf"^{message}"):
        check_parameter(name, value)
    for ok in ({"params": "params/ci.yaml", "jobs": 2, "seeds": [1, 2], "overrides": {"train.lr": 0.1},
                "model": "moe_top1"}.get(name, None), None):
        if not (name == "params" and ok is None):
            check_parameter(name, ok)
