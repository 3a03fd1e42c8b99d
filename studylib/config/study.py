"""The ``study`` section of a preset, typed: the general knobs (which notebooks, the headline trio,
the reference MoE, seeds of the comparisons, power target and margin, where the runs train) plus
one typed section per comparison (:mod:`studylib.config.sections`: ``study.ablation`` is
:class:`~studylib.config.sections.AblationSection`, ``study.lr_sweep`` the
:class:`~studylib.config.sections.LrSweepSection` or None, ...; each comparison module names the
one it reads, ``Comparison.section``). Built and checked once, when the preset loads
(:func:`study_from_dict`, called by :func:`studylib.config.presets.preset_from_dict`): a bad value
is one :class:`ConfigError` naming its field (``study.token_budget.trios[1].epochs``), and a knob
that names a model the preset does not have fails there, not in a notebook an hour later.

The YAML stays flat (``ablation: [...]``, ``ablation_epochs: 0.25``): each section declares its
flat keys; :meth:`StudyConfig.flat` (and so ``to_dict``, a run's ``config.yaml``, ``override``)
gives them back, :meth:`StudyConfig.knob` reads one, and each key that is not itself a section
attribute reads as an attribute too (``study.ablation_epochs`` is ``study.ablation.epochs``).
:data:`MODEL_LISTS`, the knobs that name models, is derived from the sections. What a knob needs
beyond the preset (a notebook's seeds and learning rate) is resolved by its section's method; a
knob a notebook needs but the preset lacks (``lr_sweep`` for notebook 11, say) is reported by that
notebook's reader. Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional

from studylib.config.schema import ConfigError
from studylib.config.sections import (SECTIONS, AblationSection, Context, DownstreamSection, GranularitySection,
                                      HeadlineSection, IsoWidthSection, LrSweepSection, NoiseSplitSection,
                                      RouterVariantsSection, ThroughputSection, count, is_number, model_keys,
                                      model_names, positive_int, section_keys)
from studylib.config.token_budget import TOKEN_BUDGET_SHAPE, TokenBudgetConfig, TrioConfig

#: the general knobs that list model names
GENERAL_MODEL_LISTS = ("headline",)
#: the knobs that list model names (each checked against the preset's models): the general ones,
#: then each section's ``MODELS``
MODEL_LISTS = GENERAL_MODEL_LISTS + model_keys()
#: the earlier names of two sections (one object each)
LrSweepConfig, NoiseSplitConfig = LrSweepSection, NoiseSplitSection


@dataclass(frozen=True)
class StudyConfig:
    """The ``study`` section (every field optional; see the module docstring)."""

    notebooks: Optional[tuple[str, ...]] = None  # the notebooks `studylib study` runs (None: all)
    headline: Optional[tuple[str, ...]] = None  # [dense_active, moe, dense_total]
    reference_moe: Optional[str] = None  # None: the headline's MoE (its second model)
    comparison_seeds: Optional[int] = None  # 02, 06, 07: the first k seeds (None: all)
    power_target: float = 0.03  # 03: the CI half-width the power table plans for
    map_power_target: float = 0.05  # 09: the same for each point of the map
    margin: Optional[float] = None  # 02 03 06 07 09 10 12: equivalence margin in nats (None: power_target)
    jobs: int = 1  # training runs at a time (a local Dask cluster of this many workers)
    scheduler: Optional[str] = None  # a Dask scheduler's address: train there instead
    # --- one section per comparison (studylib.config.sections.SECTIONS) ---
    ablation: AblationSection = field(default_factory=AblationSection)  # 02
    headline_sweep: HeadlineSection = field(default_factory=HeadlineSection)  # 03
    throughput: ThroughputSection = field(default_factory=ThroughputSection)  # 05
    granularity: GranularitySection = field(default_factory=GranularitySection)  # 06
    iso_width: IsoWidthSection = field(default_factory=IsoWidthSection)  # 07
    token_budget: Optional[TokenBudgetConfig] = None  # 09
    downstream: DownstreamSection = field(default_factory=DownstreamSection)  # 10
    lr_sweep: Optional[LrSweepSection] = None  # 11
    router_variants: RouterVariantsSection = field(default_factory=RouterVariantsSection)  # 12

    def reference(self) -> Optional[str]:
        """``reference_moe``, else the headline's MoE (its second model)."""
        return self.reference_moe or (self.headline[1] if self.headline and len(self.headline) > 1 else None)

    def flat(self) -> dict:
        """``{study key: value}`` as a preset writes it (what ``to_dict`` gives and
        :func:`study_from_dict` reads back): the general knobs, then each section's keys."""
        out = {k: getattr(self, k) for k in GENERAL_KEYS}
        for attr, cls in SECTIONS.items():
            s = getattr(self, attr)
            out.update({cls.WHOLE: s} if cls.WHOLE else s.flat())
        return out

    def knob(self, key: str) -> Any:
        """The value of one flat ``study`` key (``"ablation"``: the ablation's model names)."""
        if key in GENERAL_KEYS:
            return getattr(self, key)
        if key not in SECTION_KEYS:
            raise KeyError(f"study.{key}: not a study knob")
        attr, f = SECTION_KEYS[key]
        return getattr(self, attr) if f is None else getattr(getattr(self, attr), f)

    def to_raw(self) -> dict:  # studylib.config.schema.to_dict
        return self.flat()


GENERAL_KEYS = tuple(f.name for f in fields(StudyConfig) if f.name not in SECTIONS)
SECTION_KEYS = section_keys()
assert [f.name for f in fields(StudyConfig) if f.name in SECTIONS] == list(SECTIONS), "one field per section"


def _alias(key: str):
    return property(lambda self: self.knob(key), doc=f"``study.{key}`` (its section's field)")


for _key in SECTION_KEYS:  # study.ablation_epochs, study.noise_split, study.bench, ...
    if not hasattr(StudyConfig, _key) and _key not in {f.name for f in fields(StudyConfig)}:
        setattr(StudyConfig, _key, _alias(_key))


# --------------------------------------------------------------------------------------------
# reading and checking the section
# --------------------------------------------------------------------------------------------
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
    if key in ("power_target", "map_power_target"):
        if not is_number(v) or not v > 0:
            raise ConfigError(f"{where}: expected a CI half-width in nats (a number > 0), got {v!r}")
        return float(v)
    if key == "margin":
        if not is_number(v) or not v > 0:
            raise ConfigError(f"{where}: expected an equivalence margin in nats (a number > 0), got {v!r}")
        return float(v)
    if key == "jobs":
        return positive_int(v, where)
    assert key == "scheduler", key
    if not isinstance(v, str) or ":" not in v:
        raise ConfigError(f"{where}: expected a Dask scheduler address like tcp://host:8786, got {v!r}")
    return v.strip()


def study_from_dict(raw: Any, models: Mapping, ffn_kind) -> StudyConfig:
    """The ``study`` section checked, its model names against the preset's ``models``;
    ``ffn_kind(name)`` resolves a model's FFN kind (the token budget's middle model must route).
    The general knobs are read here, each section by its own parser (``Section.parse``). What
    depends on the seeds and the learning rate a run is given (a notebook's ``seeds`` and
    ``overrides`` parameters) is resolved by the section when a notebook reads it:
    :meth:`~studylib.config.sections.LrSweepSection.resolve` (``train.lr`` in the grid, no more
    seeds than there are), :meth:`~studylib.config.sections.NoiseSplitSection.draws`."""
    if raw is None:
        raw = {}
    if isinstance(raw, StudyConfig):
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"study: must be a mapping of study knobs, got {raw!r}")
    names = [*GENERAL_KEYS, *SECTION_KEYS]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ConfigError(f"study: unknown key(s) {unknown}; allowed: {names}")
    kw: dict = {key: None if v is None else _general(key, v, models)
                for key, v in raw.items() if key in GENERAL_KEYS}
    ctx = Context(models, ffn_kind)
    kw.update({attr: cls.parse(raw, ctx) for attr, cls in SECTIONS.items()})
    if kw.get("margin") is None:  # the default margin: the power target the seeds are planned for
        kw["margin"] = kw.get("power_target") or StudyConfig.power_target
    for key in ("power_target", "map_power_target", "jobs"):  # null: the default
        if key in kw and kw[key] is None:
            del kw[key]
    return StudyConfig(**kw)


__all__ = ["GENERAL_KEYS", "MODEL_LISTS", "StudyConfig", "TrioConfig", "TokenBudgetConfig", "NoiseSplitConfig",
           "LrSweepConfig", "TOKEN_BUDGET_SHAPE", "study_from_dict"]
