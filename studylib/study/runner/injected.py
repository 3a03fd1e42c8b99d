"""The parameters papermill injected into the running notebook, read back from the kernel.

``papermill NB OUT -p NAME VALUE`` injects a cell after the notebook's cell tagged ``parameters``
whose source starts with ``# Parameters`` and assigns each NAME, whether the notebook declares it
or not: for an unknown NAME papermill only warns ("Passed unknown parameter"), and the notebook
runs on its defaults (``-p preset params/ci.yaml`` for ``-p params ...`` trained the ``cpu``
preset). :func:`check_injected` refuses such a NAME before anything trains or is written.

Both cells are read from IPython's input history (``In``), in the order the kernel ran them:
the last injected cell, and the nearest cell before it that assigns ``params`` (every study
notebook's parameters cell does; under papermill it is the cell just before). No injected cell
(JupyterLab, a plain ``python`` process): nothing to check. ``studylib study`` injects only the
names a notebook declares (:func:`studylib.study.runner.execute.notebook_parameters`, which reads
the same assignments from the notebook file).
"""
from __future__ import annotations

import ast
import sys
from typing import Any, Optional, Sequence

from studylib.config import ConfigError

#: how papermill's Python translator opens the cell it injects
INJECTED_HEADER = "# Parameters"


def assigned_names(source: str) -> list[str]:
    """The names a cell's top-level assignments (``x = ...``, ``x: T = ...``) bind, in order, each
    once; a cell that does not parse binds none."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return []
    names: list[str] = []
    for node in body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        names += [t.id for t in targets if isinstance(t, ast.Name) and t.id not in names]
    return names


def injected_cells(history: Sequence[str]) -> Optional[tuple[list[str], list[str]]]:
    """(the names the parameters cell declares, the names papermill injected) from the input
    history ``history`` (oldest first); None when no injected cell ran, or no cell assigning
    ``params`` ran before it (cells run out of order by hand: the declaration is not known)."""
    for i in range(len(history) - 1, -1, -1):
        if isinstance(history[i], str) and history[i].lstrip().startswith(INJECTED_HEADER):
            injected = assigned_names(history[i])
            for source in reversed(history[:i]):
                declared = assigned_names(source) if isinstance(source, str) else []
                if "params" in declared:
                    return declared, injected
            return None
    return None


def kernel_namespace() -> Optional[dict]:
    """The running IPython kernel's user namespace, or None outside IPython (IPython is not
    imported here: a plain process never loaded it)."""
    get = getattr(sys.modules.get("IPython"), "get_ipython", None)
    shell = get() if get is not None else None
    return getattr(shell, "user_ns", None)


def check_injected(namespace: Optional[dict] = None) -> dict[str, Any]:
    """``{name: value}`` of the parameters papermill injected into this notebook (``{}`` when none
    was injected), read from ``namespace`` (default: the kernel's, :func:`kernel_namespace`). A
    name the notebook's parameters cell does not declare is a :class:`ConfigError` naming it and
    the declared ones."""
    ns = kernel_namespace() if namespace is None else namespace
    found = injected_cells(list((ns or {}).get("In") or ()))
    if found is None:
        return {}
    declared, injected = found
    unknown = [n for n in injected if n not in declared]
    if unknown:
        raise ConfigError(f"-p {unknown[0]}: not a parameter of this notebook (papermill injected it and only "
                          f"warned); its parameters: {declared}")
    return {n: ns[n] for n in injected if n in ns}


__all__ = ["assigned_names", "injected_cells", "kernel_namespace", "check_injected", "INJECTED_HEADER"]
