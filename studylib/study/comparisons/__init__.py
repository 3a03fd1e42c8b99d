"""The study's comparisons, one module each (its notebook, the runs it reads, its readers), and
the registry built from them: what ``studylib study`` trains up front and what a notebook opens.

Adding a comparison: a module here with a ``COMPARISON`` (:class:`~studylib.study.comparisons.base.Comparison`),
listed in :data:`MODULES`, naming its knobs' section (``section=``, a key of
:data:`studylib.config.SECTIONS`; the section itself in :mod:`studylib.config.sections`); its notebook (``notebooks/NN_name.py``, opening with
:func:`studylib.study.runner.notebooks.open_comparison`); and its preset entries.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from studylib.config import ConfigError, Preset
from studylib.study.comparisons import (ablation, budget_matching, downstream, explorer, granularity, headline,
                                        iso_width, lr_sweep, router_variants, routing, throughput, token_budget)
from studylib.study.comparisons.base import Comparison, Runs, grids_of
from studylib.study.orchestration.sweep import Grid

#: in notebook order
MODULES = (budget_matching, ablation, headline, routing, throughput, granularity, iso_width, explorer,
           token_budget, downstream, lr_sweep, router_variants)
#: ``{name: Comparison}``
COMPARISONS: dict[str, Comparison] = {m.COMPARISON.name: m.COMPARISON for m in MODULES}
#: ``{notebook file stem: Comparison}``
BY_NOTEBOOK: dict[str, Comparison] = {c.notebook: c for c in COMPARISONS.values()}


def comparison(name: str) -> Comparison:
    """The comparison ``name`` (a module name like ``"ablation"``, or its notebook's stem)."""
    found = COMPARISONS.get(name) or BY_NOTEBOOK.get(name)
    if found is None:
        raise ConfigError(f"comparison {name!r}: not a comparison of the study; allowed: {sorted(COMPARISONS)}")
    return found


def study_grids(preset: Preset, notebooks: Sequence[str],
                parameters: Optional[Mapping[str, Mapping[str, Any]]] = None) -> list[Grid]:
    """The grids of the named notebooks (file stems like ``03_headline_sweep``), given each
    notebook's ``-p`` parameters (``{stem: {name: value}}``; e.g. notebook 04's ``model``); a
    notebook without a comparison here adds none."""
    return grids_of([BY_NOTEBOOK[n] for n in notebooks if n in BY_NOTEBOOK], preset, parameters)


__all__ = ["MODULES", "COMPARISONS", "BY_NOTEBOOK", "Comparison", "Runs", "comparison", "study_grids"]
