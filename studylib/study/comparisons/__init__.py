"""The study's comparisons, one package each (its knobs, its plan, its tables, figures and words),
and the registry built from them: what types a preset's ``study`` section (:func:`study_of`), what
``studylib study`` plans and trains up front, what each notebook opens and what the report words.

Adding a comparison: a package in this folder whose ``__init__`` defines ``COMPARISON``
(:class:`~studylib.study.comparisons.base.Comparison`: its notebook, its
:class:`~studylib.study.comparisons.knobs.Knobs` type, its plan, its family tables and what it adds
to the report's answer), found by :func:`registry`; its notebook (``notebooks/NN_name.py``, opening
with :func:`studylib.study.runner.notebooks.open_comparison`); its preset entries. Nothing else
lists it. A folder ``studylib/study/comparisons/`` under another entry of ``sys.path`` (e.g. on
``PYTHONPATH``, after the repository's own folder) adds its packages too
(:func:`_folders_on_the_path`): a comparison kept outside this repository.
"""
from __future__ import annotations

import functools
import importlib
import os
import pkgutil
import sys
from typing import Mapping, Optional, Sequence

from studylib.config import ConfigError, Preset
from studylib.config.study import GENERAL_KEYS
from studylib.study.comparisons.base import Comparison, Runs
from studylib.study.comparisons.knobs import Context, Study

def _folders_on_the_path() -> list[str]:
    """Folders ``studylib/study/comparisons`` under other entries of ``sys.path`` than this one."""
    rel = os.path.join(*__name__.split("."))
    mine = {os.path.realpath(p) for p in __path__}
    found = [os.path.join(e or ".", rel) for e in sys.path if isinstance(e, str)]
    return list(dict.fromkeys(d for d in found if os.path.isdir(d) and os.path.realpath(d) not in mine))


__path__ = [*__path__, *_folders_on_the_path()]


def registry() -> dict[str, Comparison]:
    """``{name: Comparison}`` of every package of this folder (every folder of its ``__path__``), in
    notebook order; a study key two comparisons claim is an error."""
    return _registry(tuple(__path__))


@functools.cache
def _registry(paths: tuple) -> dict[str, Comparison]:
    found = [importlib.import_module(f"{__name__}.{m.name}").COMPARISON
             for m in pkgutil.iter_modules(list(paths)) if m.ispkg]
    check_owners(found)
    return {c.name: c for c in sorted(found, key=lambda c: c.notebook)}


def check_owners(comparisons: Sequence[Comparison]) -> None:
    """Each flat ``study`` key belongs to one comparison (or to the general knobs); a name or a
    notebook two comparisons share is refused too."""
    owner: dict[str, str] = {}
    for c in comparisons:
        for key in c.knobs.keys():
            if key in owner or key in GENERAL_KEYS:
                raise ConfigError(f"comparison {c.name!r}: the study key {key!r} belongs to "
                                  f"{owner.get(key, 'the general knobs')!r} already")
            owner[key] = c.name
    for attr in ("name", "notebook"):
        values = [getattr(c, attr) for c in comparisons]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ConfigError(f"comparisons: the {attr} {twice[0]!r} names two comparisons")


def by_notebook() -> dict[str, Comparison]:
    """``{notebook file stem: Comparison}``."""
    return {c.notebook: c for c in registry().values()}


def comparison(name: str) -> Comparison:
    """The comparison ``name`` (a package name like ``"ablation"``, or its notebook's stem)."""
    found = registry().get(name) or by_notebook().get(name)
    if found is None:
        raise ConfigError(f"comparison {name!r}: not a comparison of the study; allowed: {sorted(registry())}")
    return found


def study_of(preset: Preset, comparisons: Optional[Mapping[str, Comparison]] = None) -> Study:
    """The preset's ``study`` section typed: its general knobs and every comparison's knobs, each
    checked against the preset's models (one ConfigError line naming the field); a key no
    comparison owns is refused, naming the allowed ones."""
    comparisons = registry() if comparisons is None else comparisons
    raw = preset.study.comparisons
    owned = [k for c in comparisons.values() for k in c.knobs.keys()]
    unknown = sorted(set(raw) - set(owned))
    if unknown:
        raise ConfigError(f"study: unknown key(s) {unknown}; allowed: {[*GENERAL_KEYS, *owned]}")
    ctx = Context.of(preset)
    return Study(preset, {c.name: c.knobs.parse(raw, ctx) for c in comparisons.values()})


__all__ = ["Comparison", "Context", "Runs", "Study", "by_notebook", "check_owners", "comparison", "registry",
           "study_of"]
