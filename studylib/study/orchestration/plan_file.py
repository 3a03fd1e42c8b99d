"""A comparison's part of a study's plan on disk: ``outputs/<preset>/plans/<comparison>.json``,
written once by ``studylib study`` after it trained the plan (:func:`write_plan`) and read by the
comparison's notebook kernel (:func:`read_plan`), which then neither resolves, checks nor counts
its runs again, and loads no data to plan them.

The file holds the grids, each run's model, seed and run directory, and each distinct run preset
once (its resolved document, read back with :func:`studylib.config.preset_from_dict`: nothing is
overridden or derived again). It is keyed by what the plan depends on (:func:`plan_key`: the
preset after the notebook parameters, the comparison, its plan parameters); a kernel whose key
differs (the notebook run alone with other seeds, say), or whose runs are not all finished, plans
by itself. JSON, written atomically; nothing in it is executed.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from studylib.config import ConfigError, Preset, config_hash, preset_from_dict, to_dict
from studylib.run.spec import RunSpec
from studylib.storage.files import write_atomic
from studylib.study.orchestration.plan import Grid, check_finished_data

VERSION = 1


def plan_path(out: Path, comparison: str) -> Path:
    """Where comparison ``comparison``'s plan lives under the preset's outputs folder ``out``."""
    return Path(out) / "plans" / f"{comparison}.json"


def _doc(preset: Preset) -> dict:
    doc = to_dict(preset)
    doc.pop("path", None)
    return doc


def plan_key(preset: Preset, comparison: str, parameters: Optional[Mapping[str, Any]] = None) -> str:
    """What a comparison's plan depends on, hashed: the preset (the notebook parameters applied),
    the comparison and its plan parameters (None values left out: a default)."""
    given = {k: v for k, v in (parameters or {}).items() if v is not None}
    return config_hash({"preset": _doc(preset), "comparison": comparison, "parameters": given})


def write_plan(path: Path, key: str, grids: Sequence[Grid], specs: Sequence[Sequence[RunSpec]]) -> Path:
    """Write one comparison's plan (its grids and their resolved runs) to ``path``."""
    presets: list = []
    index: dict = {}

    def preset_index(p: Preset) -> int:
        if id(p) not in index:
            index[id(p)] = len(presets)
            presets.append({"path": p.path, "doc": _doc(p)})
        return index[id(p)]

    doc = {"version": VERSION, "key": key, "presets": presets,
           "grids": [{"models": list(g.models), "seeds": None if g.seeds is None else list(g.seeds),
                      "overrides": g.overrides if not isinstance(g.overrides, tuple) else list(g.overrides),
                      "tag": g.tag,
                      "runs": [[s.model, s.seed, str(s.run_dir), preset_index(s.preset)] for s in row]}
                     for g, row in zip(grids, specs)]}
    write_atomic(Path(path), json.dumps(doc, indent=1, default=str))
    return Path(path)


def read_plan(path: Path, key: str) -> Optional[tuple[list[Grid], list[list[RunSpec]]]]:
    """(grids, their runs) of the plan at ``path`` when it exists, holds ``key`` and every run it
    names is finished; else None (the kernel plans by itself). The finished runs are checked
    against the stories their preset reads now, as ``study`` checks them
    (:func:`~studylib.study.orchestration.plan.check_finished_data`: "finished on other data" is
    one line, never tables from runs of other stories), and a plan file with this key whose
    fields are damaged is one line naming it."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or doc.get("key") != key:
        return None
    try:
        presets = [preset_from_dict(p["doc"], p["path"]) for p in doc["presets"]]
        grids, specs = [], []
        for g in doc["grids"]:
            grids.append(Grid(list(g["models"]), g["seeds"], g["overrides"], g["tag"]))
            specs.append([RunSpec(presets[i], model, int(seed), Path(run_dir)) for model, seed, run_dir, i in g["runs"]])
    except (KeyError, TypeError, ValueError, IndexError) as e:
        what = f"the field {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        raise ConfigError(f"{path}: a damaged plan ({what}); delete it (studylib study writes it again, or the "
                          f"notebook plans by itself)") from None
    if not all(s.rundir.finished() for row in specs for s in row):
        return None
    check_finished_data([s for row in specs for s in row])  # the code they were trained by: flagged by study
    return grids, specs


__all__ = ["plan_key", "plan_path", "read_plan", "write_plan"]
