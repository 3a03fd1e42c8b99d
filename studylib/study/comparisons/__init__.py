"""The study's comparisons, one package each (its knobs, its plan, its tables, figures and words),
and the registry built from them: what types a preset's ``study`` section (:func:`study_of`), what
``studylib study`` plans and trains up front, what each notebook opens and what the report words.

Adding a comparison: a package in this folder whose ``__init__`` defines ``COMPARISON``
(:class:`~studylib.study.comparisons.base.Comparison`: its notebook, its
:class:`~studylib.study.comparisons.knobs.Knobs` type, its plan, its family tables and what it adds
to the report's answer), found by :func:`registry`; its notebook (``notebooks/NN_name.py``, opening
with :func:`studylib.study.runner.notebooks.open_comparison`); its preset entries. Nothing else
lists it.

A comparison kept outside this package comes only from where a user installs or names it, never
from walking ``sys.path`` (:func:`external_names`): an entry point of the group
:data:`ENTRY_POINT_GROUP` that an installed distribution declares (its value a module whose
``COMPARISON`` is the comparison, or ``module:attribute``), or a module named in
:data:`MODULES_ENV` (comma-separated; ``studylib study --comparison-module`` sets it, so the notebook
kernels see it too). One that cannot be imported, or is not a ``Comparison``, is one ConfigError
line naming it.
"""
from __future__ import annotations

import functools
import importlib
import os
import pkgutil
from importlib import metadata
from typing import Mapping, Optional, Sequence

from studylib.config import ConfigError, Preset
from studylib.config.study import GENERAL_KEYS
from studylib.study.comparisons.base import Comparison, Runs
from studylib.study.comparisons.knobs import Context, Study

#: the entry-point group an installed distribution declares its comparisons under
ENTRY_POINT_GROUP = "studylib.comparisons"
#: comma-separated modules that each define ``COMPARISON`` (``studylib study --comparison-module``)
MODULES_ENV = "STUDYLIB_COMPARISONS"
#: this package's own folder(s), the only ones walked for comparison packages
_OWN = tuple(__path__)


def external_names() -> tuple[tuple[str, str], ...]:
    """``(where, "module[:attribute]")`` of each comparison from outside this package: the entry
    points of :data:`ENTRY_POINT_GROUP`, then the modules named in ``$STUDYLIB_COMPARISONS``."""
    eps = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value))
    found = [(f"entry point {e.name!r} ({ENTRY_POINT_GROUP})", e.value.replace(" ", "")) for e in eps]
    named = [m.strip() for m in os.environ.get(MODULES_ENV, "").split(",") if m.strip()]
    return tuple(found + [(f"{MODULES_ENV}={os.environ[MODULES_ENV]}", m) for m in named])


def registry() -> dict[str, Comparison]:
    """``{name: Comparison}`` of every package of this folder and every external comparison
    (:func:`external_names`), in notebook order; a study key two comparisons claim is an error."""
    return _registry(_OWN, external_names())


def name_modules(modules: Sequence[str], label: str = MODULES_ENV) -> None:
    """Name comparison modules for this process and the processes it starts (the notebook kernels
    inherit :data:`MODULES_ENV`): ``studylib study --comparison-module``. Each is loaded here
    first, so one that cannot be is one line before anything trains."""
    for m in modules:
        if not m or not all(part.isidentifier() for part in m.replace(":", ".").split(".")):
            raise ConfigError(f"{label} {m!r}: expected a module name (e.g. mypkg.mycomparison)")
    before = [m for m in os.environ.get(MODULES_ENV, "").split(",") if m.strip()]
    os.environ[MODULES_ENV] = ",".join(dict.fromkeys([*before, *modules]))
    registry()


def load_external(where: str, value: str) -> Comparison:
    """The :class:`Comparison` at ``value`` (``module`` with a ``COMPARISON``, or
    ``module:attribute``); one ConfigError line naming it when it cannot be had."""
    module, _, attr = value.partition(":")
    what = f"comparison {value!r} ({where})"
    try:
        found = importlib.import_module(module)
        for part in (attr or "COMPARISON").split("."):
            found = getattr(found, part)
    except Exception as e:  # noqa: BLE001 - any failure of a module a user named is one line naming it
        raise ConfigError(f"{what}: cannot be loaded ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
                          f"fix or uninstall it, or leave it out of ${MODULES_ENV}") from None
    if not isinstance(found, Comparison):
        raise ConfigError(f"{what}: expected a studylib Comparison, got {type(found).__name__}")
    return found


@functools.cache
def _registry(paths: tuple, external: tuple) -> dict[str, Comparison]:
    found = [importlib.import_module(f"{__name__}.{m.name}").COMPARISON
             for m in pkgutil.iter_modules(list(paths)) if m.ispkg]
    named = {}
    for where, value in external:  # one module named twice (an entry point and $STUDYLIB_COMPARISONS) is one
        named.setdefault(value, where)
    found += [load_external(where, value) for value, where in named.items()]
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


__all__ = ["ENTRY_POINT_GROUP", "MODULES_ENV", "Comparison", "Context", "Runs", "Study", "by_notebook", "check_owners",
           "comparison", "external_names", "load_external", "name_modules", "registry", "study_of"]
