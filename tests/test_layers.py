"""The one-way import rule of studylib: a module imports its own package and the packages below it
(config, storage < nn, data < run < study < tools < the CLI), never one above. Every import counts, the
function-local ones too, so an upward edge cannot hide inside a function."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "studylib"
LAYERS = {"config": 0, "storage": 0, "nn": 1, "data": 1, "run": 2, "study": 3, "tools": 4, "cli": 5, "__main__": 5}


# Inside study/, its parts import one way too: analysis < orchestration < comparisons < runner.
STUDY_PARTS = {"analysis": 0, "orchestration": 1, "comparisons": 2, "runner": 3}


def _layer(module: str) -> tuple[int, int]:
    """The (layer, part) of a dotted studylib module name (``studylib.run.rundir`` -> (2, 0),
    ``studylib.study.runner.execute`` -> (3, 3)); the part counts inside study/ only."""
    parts = module.split(".")
    assert parts[0] == "studylib", module
    if len(parts) == 1:
        return (5, 0)
    part = STUDY_PARTS.get(parts[2], 0) if parts[1] == "study" and len(parts) > 2 else 0
    return (LAYERS[parts[1]], part)


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, me: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every studylib import in the file of module ``me``, relative
    ones resolved."""
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "studylib"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "studylib":
                continue
            if mod == "studylib":  # from studylib import run -> the sub-package itself
                out += [(node.lineno, f"studylib.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, mod))
    return out


SOURCES = sorted(p for p in PKG.rglob("*.py"))


def test_every_module_belongs_to_a_layer():
    for path in SOURCES:
        name = _module_name(path)
        if name == "studylib":
            continue
        assert name.split(".")[1] in LAYERS, f"{path}: not in a layer package {sorted(LAYERS)}"
        if name.split(".")[1] == "study" and name != "studylib.study":
            assert name.split(".")[2] in STUDY_PARTS, f"{path}: not in a part of study/ {sorted(STUDY_PARTS)}"


def _upward(path: Path, me: str) -> list[str]:
    return [f"line {ln}: {mod} (layer {_layer(mod)})" for ln, mod in _imports(path, me)
            if _layer(mod) > _layer(me)]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_down(path):
    me = _module_name(path)
    if me == "studylib":
        return
    upward = _upward(path, me)
    assert not upward, f"{me} (layer {_layer(me)}) imports upward: " + "; ".join(upward)


def test_the_checker_finds_hidden_and_relative_upward_edges(tmp_path):
    src = tmp_path / "probe.py"
    src.write_text("from studylib.nn import router\n"
                   "def f():\n    from studylib.run.rundir import RunDir\n    return RunDir\n"
                   "def g():\n    from ..study import frames\n    return frames\n")
    assert [u.split(":")[0] for u in _upward(src, "studylib.nn.probe")] == ["line 3", "line 6"]
    assert _upward(src, "studylib.tools.probe") == []
    src.write_text("from studylib.study.orchestration import sweep\n")  # a part of study/ above
    assert _upward(src, "studylib.study.analysis.probe") != []
    assert _upward(src, "studylib.study.runner.probe") == []


def test_run_storage_and_the_analysis_import_without_torch():
    """RunDir and the analysis modules (frames, tables, the status line, run specs) read files
    only: importing them must not pay for torch (~2 s); only loading a checkpoint does."""
    import subprocess
    import sys

    code = ("import sys, studylib.run.rundir, studylib.run.spec, studylib.study.analysis.frames, studylib.study.analysis.tables, "
            "studylib.study.orchestration.watch; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", "importing them imported torch"


@pytest.mark.parametrize("path", sorted((PKG.parent / "notebooks").glob("[0-9][0-9]_*.py")), ids=lambda p: p.name)
def test_notebooks_call_the_study_and_tools_layers_not_the_ones_below(path):
    """A notebook is a view: it calls studylib.study and studylib.tools (and reads configs), never
    the model or a run's storage directly (those go through study / tools functions)."""
    me = "studylib.tools.notebook"  # the layer a notebook sits on
    below = [f"line {ln}: {mod}" for ln, mod in _imports(path, me) if mod.split(".")[1] in ("nn", "data", "run")]
    assert not below, f"{path.name} imports " + "; ".join(below)
