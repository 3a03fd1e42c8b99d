"""The one-way import rule of studylib: a module imports its own package and the packages below it
(config, storage < nn, data < run < study < tools < the CLI), never one above, and no modules import
each other in a circle (inside a package either). Every import counts, the function-local ones too, so
an upward edge or a circle cannot hide inside a function."""
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


#: issue #30: no module over this many lines (split one along a seam instead)
MAX_MODULE_LINES = 400


def test_no_module_is_longer_than_the_limit():
    long = {str(p.relative_to(PKG)): n for p in SOURCES if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


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
    src.write_text("from studylib.study.orchestration import train\n")  # a part of study/ above
    assert _upward(src, "studylib.study.analysis.probe") != []
    assert _upward(src, "studylib.study.runner.probe") == []


COMPARISONS = PKG / "study" / "comparisons"


def _comparison_of(module: str) -> str | None:
    """The comparison package a dotted module lies in (``studylib.study.comparisons.controls.clark``
    -> ``controls``); None for the registry and the modules every comparison shares (``knobs``...)."""
    parts = module.split(".")
    return parts[3] if parts[:3] == ["studylib", "study", "comparisons"] and len(parts) > 3 \
        and (COMPARISONS / parts[3]).is_dir() else None


def _builds_on(own: str | None) -> tuple:
    """The comparison packages ``own``'s Comparison declares it builds on (``builds_on``)."""
    if own is None:
        return ()
    import importlib

    found = getattr(importlib.import_module(f"studylib.study.comparisons.{own}"), "COMPARISON", None)
    return tuple(getattr(found, "builds_on", ()))


def _crossing(path: Path, me: str) -> list[str]:
    own = _comparison_of(me)
    return [f"line {ln}: {mod}" for ln, mod in _imports(path, me)
            if own is not None and _comparison_of(mod) not in (None, own, *_builds_on(own))]


@pytest.mark.parametrize("path", [p for p in SOURCES if p.is_relative_to(COMPARISONS)],
                         ids=lambda p: str(p.relative_to(PKG)))
def test_no_comparison_imports_another(path):
    """What two comparisons share lives below them (study/analysis: the law, the position, the paper);
    a comparison that builds on another's plan and tables declares it (``Comparison.builds_on``)."""
    me = _module_name(path)
    assert not _crossing(path, me), f"{me} imports another comparison: " + "; ".join(_crossing(path, me))


def test_the_checker_finds_one_comparison_importing_another(tmp_path):
    src = tmp_path / "probe.py"
    src.write_text("def f():\n    from studylib.study.comparisons.token_budget import MAP\n    return MAP\n"
                   "from studylib.study.comparisons.controls import clark\nfrom studylib.study.comparisons import knobs\n")
    assert [c.split(":")[0] for c in _crossing(src, "studylib.study.comparisons.controls.probe")] == ["line 2"]
    assert _crossing(src, "studylib.study.comparisons.glance") == []


def _edges(pkg: Path) -> dict[str, set[str]]:
    """``{module: modules it imports}`` of the package at ``pkg``; ``from a.b import c`` is an edge
    to the module ``a.b.c`` when it is one, else to ``a.b``."""
    files = {_module_name_in(pkg, p): p for p in sorted(pkg.rglob("*.py"))}
    out = {}
    for me, path in files.items():
        out[me] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            for mod in _targets(node, me, path):
                if mod in files and mod != me:
                    out[me].add(mod)
    return out


def _runtime_nodes(tree):
    """Every node but those under ``if TYPE_CHECKING:`` (annotations only: never imported)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
            continue
        todo += ast.iter_child_nodes(node)


def _module_name_in(pkg: Path, path: Path) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node, me: str, path: Path) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    return [f"{mod}.{a.name}" for a in node.names] + [mod]  # the submodule if it is one, and the module


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle ``[a, b, ..., a]`` per strongly connected group of modules (iterative Tarjan)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    found.append(_path_through(sorted(group), edges))

    for m in sorted(edges):
        if m not in index:
            visit(m)
    return found


def _path_through(group: list[str], edges: dict) -> list[str]:
    """A shortest circle from ``group[0]`` back to itself inside the group (breadth first)."""
    start, members = group[0], set(group)
    paths, queue = {start: [start]}, [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v] & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return group  # pragma: no cover - a strongly connected group always has a circle


def test_no_modules_import_each_other_in_a_circle():
    circles = _circles(_edges(PKG))
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_checker_finds_a_circle_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "studylib"
    (pkg / "study" / "orchestration").mkdir(parents=True)
    for init in (pkg, pkg / "study", pkg / "study" / "orchestration"):
        (init / "__init__.py").write_text("")
    orch = pkg / "study" / "orchestration"
    (orch / "a.py").write_text("from studylib.study.orchestration.b import X\n")
    (orch / "b.py").write_text("from studylib.study.orchestration.c import Y\nX = 1\n")
    (orch / "c.py").write_text("def f():\n    from . import a\n    return a\nY = 2\n")
    names = ["studylib.study.orchestration." + n for n in "abc"]
    assert _circles(_edges(pkg)) == [names + names[:1]]
    (orch / "c.py").write_text("Y = 2\n")  # the function-local import gone: no circle
    assert _circles(_edges(pkg)) == []


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
