"""The ``study`` section of a preset: the general knobs, typed here (which notebooks, the headline
trio, the reference MoE, seeds of the comparisons, power target and margin, where the runs train),
and every other key as written: the comparisons' own knobs, which the study layer types and checks
(:func:`studylib.study.comparisons.study_of`: each comparison declares the flat keys it owns, so a
preset is checked against every registered comparison as a study loads it). Built when the preset
loads (:func:`study_from_dict`, called by :func:`studylib.config.presets.preset_from_dict`): a bad
general knob is one :class:`ConfigError` naming its field, and a knob that names a model the
preset does not have fails there, not in a notebook an hour later. Torch-free.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional

from studylib.config.checks import count, model_names, positive, positive_int
from studylib.config.schema import ConfigError


@dataclass(frozen=True)
class StudyConfig:
    """The ``study`` section (every field optional; see the module docstring)."""

    notebooks: Optional[tuple[str, ...]] = None  # the notebooks `studylib study` runs (None: all)
    headline: Optional[tuple[str, ...]] = None  # [dense_active, moe, dense_total]
    reference_moe: Optional[str] = None  # None: the headline's MoE (its second model)
    comparison_seeds: Optional[int] = None  # 02, 06, 07: the first k seeds (None: all)
    power_target: float = 0.03  # 03: the CI half-width the power table plans for
    margin: Optional[float] = None  # equivalence margin in nats of every family (None: power_target)
    jobs: int = 1  # training runs at a time (a local Dask cluster of this many workers)
    scheduler: Optional[str] = None  # a Dask scheduler's address: train there instead
    # every other key as the preset writes it: the comparisons' knobs (studylib.study.comparisons)
    comparisons: Mapping[str, Any] = field(default_factory=dict)

    def to_raw(self) -> dict:  # studylib.config.schema.to_dict: the flat mapping a preset writes
        return {**{k: getattr(self, k) for k in GENERAL_KEYS}, **copy.deepcopy(dict(self.comparisons))}


GENERAL_KEYS = tuple(f.name for f in fields(StudyConfig) if f.name != "comparisons")
#: the general knobs that list model names
GENERAL_MODEL_LISTS = ("headline",)


def _notebooks(v: Any) -> tuple[str, ...]:
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(x, (str, int)) and not isinstance(x, bool)
                                                             for x in v):
        raise ConfigError(f"study.notebooks: expected a non-empty list of notebook numbers or names "
                          f"(e.g. ['01', '03']), got {v!r}")
    return tuple(f"{x:02d}" if isinstance(x, int) else x for x in v)


def _general(key: str, v: Any, models: Mapping) -> Any:
    where = f"study.{key}"
    if key == "notebooks":
        return _notebooks(v)
    if key in GENERAL_MODEL_LISTS:
        return model_names(v, where, models)
    if key == "reference_moe":
        if not isinstance(v, str) or v not in models:
            raise ConfigError(f"{where}: expected a model name of the preset, got {v!r}; allowed: {sorted(models)}")
        return v
    if key == "comparison_seeds":
        return count(v, where)
    if key == "power_target":
        return positive(v, where, "a CI half-width in nats")
    if key == "margin":
        return positive(v, where, "an equivalence margin in nats")
    if key == "jobs":
        return positive_int(v, where)
    assert key == "scheduler", key
    if not isinstance(v, str) or ":" not in v:
        raise ConfigError(f"{where}: expected a Dask scheduler address like tcp://host:8786, got {v!r}")
    return v.strip()


def study_from_dict(raw: Any, models: Mapping) -> StudyConfig:
    """The ``study`` section: its general knobs checked (model names against the preset's
    ``models``), every other key kept as written for the comparisons to type
    (:func:`studylib.study.comparisons.study_of`)."""
    if raw is None:
        raw = {}
    if isinstance(raw, StudyConfig):
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"study: must be a mapping of study knobs, got {raw!r}")
    kw: dict = {key: None if v is None else _general(key, v, models)
                for key, v in raw.items() if key in GENERAL_KEYS}
    if kw.get("margin") is None:  # the default margin: the power target the seeds are planned for
        kw["margin"] = kw.get("power_target") or StudyConfig.power_target
    for key in ("power_target", "jobs"):  # null: the default
        if key in kw and kw[key] is None:
            del kw[key]
    rest = {str(k): copy.deepcopy(v) for k, v in raw.items() if k not in GENERAL_KEYS}
    return StudyConfig(**kw, comparisons=rest)


__all__ = ["GENERAL_KEYS", "GENERAL_MODEL_LISTS", "StudyConfig", "study_from_dict"]
