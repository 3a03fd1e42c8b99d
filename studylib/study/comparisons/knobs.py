"""A comparison's knobs, typed: the flat ``study`` keys of a preset that one comparison owns
(``ablation: [...]``, ``ablation_epochs: 0.25``), declared as the fields of a frozen dataclass
(:func:`knob`: the flat key, its checker, the default), parsed and checked once when a study loads
the preset (:func:`studylib.study.comparisons.study_of`), each bad value one
:class:`~studylib.config.ConfigError` line naming its field (``study.ablation_epochs``).

The general knobs every comparison may read (the headline trio, the reference MoE, the margin,
...) are :class:`studylib.config.StudyConfig`'s; :class:`Study` holds both.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

from studylib.config import TOLERANCE, ConfigError, Preset, StudyConfig
from studylib.config import checks


class Context(NamedTuple):
    """What a knob is checked against: the preset's ``models``, ``ffn_kind(name)``,
    ``config(name)`` (a model's resolved config) and ``seeds``."""

    models: Mapping
    ffn_kind: Callable[[str], str]
    config: Optional[Callable] = None
    seeds: Sequence[int] = ()

    @classmethod
    def of(cls, preset: Preset) -> "Context":
        return cls(preset.models, lambda m: preset.model_config(m).ffn.kind, preset.model_config,
                   tuple(preset.seeds))


#: a checker ``(value, where, context) -> typed value`` (one ConfigError line naming ``where``)
Checker = Callable[[Any, str, Context], Any]


def knob(key: str, check: Checker, default: Any = None, *, models: bool = False):
    """A field of a :class:`Knobs` class read from the flat ``study`` key ``key`` by ``check``;
    absent or null: ``default`` (a dict or list default is copied per instance). ``models``: the
    key lists model names of the preset (what :meth:`Knobs.model_lists` gives)."""
    meta = {"key": key, "check": check, "models": models}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


# the checkers of the knobs (studylib.config.checks bound to a knob's signature)
def MODELS(v, where, ctx: Context) -> tuple[str, ...]:
    return checks.model_names(v, where, ctx.models)


def EPOCHS(v, where, ctx) -> float:
    return checks.epochs(v, where)


def SEEDS(v, where, ctx: Context) -> int:
    """How many of the preset's seeds (the first k): at least two, at most as many as it has."""
    k = checks.count(v, where)
    if k > len(ctx.seeds):
        raise ConfigError(f"{where}: {k} seeds asked for, but the preset has {len(ctx.seeds)} "
                          f"({list(ctx.seeds)}); expected at most {len(ctx.seeds)}")
    return k


TRIO_SHAPE = "[dense_active, moe, dense_total]"


def _matched(name: str, moe: str, target: str, ctx: Context) -> Optional[str]:
    """Why model ``name`` is not ``moe``'s ``target`` ("active" or "total") match, or None: a match
    is dense, derived ``matched_<target>`` from the MoE (the budget solver's match, checked when the
    preset loaded) or with its ``target`` parameters within the matching tolerance of the MoE's
    (:data:`studylib.config.TOLERANCE`)."""
    cfg = ctx.config(name)
    if cfg.ffn.kind != "dense":
        return f"{name!r} has a {cfg.ffn.kind} FFN; expected {TRIO_SHAPE} with a dense {target} match here"
    raw = ctx.models[name]
    if isinstance(raw, Mapping) and raw.get("derive") == f"matched_{target}" and raw.get("from") == moe:
        return None
    got, goal = getattr(cfg.num_params, target), getattr(ctx.config(moe).num_params, target)
    off = (got - goal) / goal
    if abs(off) <= TOLERANCE[target]:
        return None
    return (f"{name!r} has {got:,} {target} parameters against the {goal:,} of the MoE {moe!r} ({off:+.2%}): "
            f"not its {target} match (expected {TRIO_SHAPE}, this one within {TOLERANCE[target]:.1%} of the "
            f"MoE's {target} parameters or derived matched_{target} from it)")


def trio(v: Any, where: str, ctx: Context) -> tuple[str, str, str]:
    """A trio ``[dense_active, moe, dense_total]`` checked by its parameter counts: three models of
    the preset, the middle one a routed MoE, the first its active match and the last its total
    match (:func:`_matched`); else one ConfigError line naming the field and both models' counts."""
    names = checks.model_names(v, where, ctx.models)
    if len(names) != 3:
        raise ConfigError(f"{where}: expected {TRIO_SHAPE}, got {list(names)}")
    moe = names[1]
    kind = ctx.config(moe).ffn.kind
    if kind != "moe":
        raise ConfigError(f"{where}[1]: {moe!r} has a {kind} FFN; expected {TRIO_SHAPE} with a routed MoE "
                          f"(ffn.kind: moe) in the middle")
    for i, target in ((0, "active"), (2, "total")):
        why = _matched(names[i], moe, target, ctx)
        if why:
            raise ConfigError(f"{where}[{i}]: {why}")
    return names


def POSITIVE_INT(v, where, ctx) -> int:
    return checks.positive_int(v, where)


def MAPPING(v, where, ctx) -> dict:
    return checks.mapping(v, where)


def STRINGS(v, where, ctx) -> tuple[str, ...]:
    return checks.strings(v, where)


@dataclass(frozen=True)
class Knobs:
    """The knobs of a comparison (this base: none). A subclass declares each as a field made by
    :func:`knob`."""

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The flat ``study`` keys this comparison owns."""
        return tuple(f.metadata["key"] for f in fields(cls))

    @classmethod
    def key(cls, name: str) -> str:
        """The flat ``study`` key of field ``name``."""
        return next(f.metadata["key"] for f in fields(cls) if f.name == name)

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: Context) -> "Knobs":
        """The knobs from the flat ``study`` mapping (only their own keys are read), checked."""
        return cls(**{f.name: f.metadata["check"](raw[f.metadata["key"]], f"study.{f.metadata['key']}", ctx)
                      for f in fields(cls) if raw.get(f.metadata["key"]) is not None})

    def model_lists(self) -> dict[str, tuple[str, ...]]:
        """``{flat key: model names}`` of the knobs that list models (those set)."""
        return {f.metadata["key"]: getattr(self, f.name) for f in fields(self)
                if f.metadata["models"] and getattr(self, f.name)}


def required(value, key: str, preset: Preset, expected: str):
    """``value`` (a knob the reader needs); None or empty: one ConfigError line naming ``study.<key>``."""
    if value is None or (hasattr(value, "__len__") and not len(value)):
        raise ConfigError(f"study.{key}: missing from preset {preset.name!r}; expected {expected}")
    return value


@dataclass(frozen=True)
class Study:
    """A preset's ``study`` section, typed: the general knobs (:attr:`general`, the preset's
    :class:`~studylib.config.StudyConfig`) and each comparison's :class:`Knobs` (``study[name]``,
    by comparison or its name), checked once against the preset's models
    (:func:`studylib.study.comparisons.study_of`)."""

    preset: Preset
    knobs: Mapping[str, Knobs]

    def __getitem__(self, comparison) -> Knobs:
        return self.knobs[getattr(comparison, "name", comparison)]

    @property
    def general(self) -> StudyConfig:
        return self.preset.study

    @property
    def headline(self) -> tuple[str, str, str]:
        """``study.headline`` (dense_active, MoE, dense_total), its roles checked by their parameter
        counts (:func:`trio`); absent or not a trio: one ConfigError line."""
        names = required(self.general.headline, "headline", self.preset, f"a trio {TRIO_SHAPE} of the preset")
        return trio(list(names), "study.headline", Context.of(self.preset))

    @property
    def reference_moe(self) -> str:
        """``study.reference_moe``, else the headline's MoE (its second model)."""
        return self.general.reference_moe or self.headline[1]

    def leading_seeds(self, k: Optional[int]) -> list[int]:
        """The first ``k`` of the preset's seeds (all of them for None)."""
        return list(self.preset.seeds if k is None else self.preset.seeds[:k])

    def lists_naming(self, model: str) -> list[str]:
        """The flat ``study`` keys whose model lists name ``model`` (the headline first)."""
        out = ["headline"] if model in (self.general.headline or ()) else []
        return out + [k for knobs in self.knobs.values() for k, v in knobs.model_lists().items() if model in v]


def default(cls: type, name: str) -> Any:
    """The default of field ``name`` of a knobs class (what an absent key reads as)."""
    f = next(f for f in fields(cls) if f.name == name)
    return f.default if f.default is not MISSING else f.default_factory()


__all__ = ["Checker", "Context", "EPOCHS", "Knobs", "MAPPING", "MODELS", "POSITIVE_INT", "SEEDS", "STRINGS",
           "Study", "TRIO_SHAPE", "default", "knob", "required", "trio"]
