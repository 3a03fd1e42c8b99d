"""One typed, frozen section per comparison: the knobs its notebook reads, parsed and checked when
the preset loads (:func:`studylib.config.study.study_from_dict`), each bad value one
:class:`ConfigError` line naming its field (``study.ablation_epochs``, ``study.lr_sweep.seeds``).

The preset's YAML stays flat (``ablation: [...]``, ``ablation_epochs: 0.25``, ``lr_sweep: {...}``):
a section declares which flat keys of ``study`` are its own (:attr:`Section.KEYS`: key -> field
and checker) and which of them name models of the preset (:attr:`Section.MODELS`, from which
:data:`studylib.config.study.MODEL_LISTS` is derived). :data:`SECTIONS` maps each section's
attribute of :class:`~studylib.config.study.StudyConfig` to its class; each comparison module
(:mod:`studylib.study.comparisons`) names the one it reads (``Comparison.section``). A section
whose key is one whole mapping (``lr_sweep``, ``token_budget``) is that mapping typed, or None when
the preset lacks it (:attr:`Section.WHOLE`). Torch-free.

What a knob's value depends on beyond the preset (the seeds and learning rate a notebook is run
with) is resolved by a method of the section: :meth:`NoiseSplitSection.draws`,
:meth:`LrSweepSection.resolve` (its :class:`SweepSpec` is the section bound to them, not a second
copy of the knobs), :meth:`TrioConfig.seeds_of`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, NamedTuple, Optional, Sequence

from studylib.config.schema import ConfigError, _coerce
from studylib.config.token_budget import TOKEN_BUDGET_SHAPE, TokenBudgetConfig, TrioConfig, token_budget_from

DEFAULT_TOLERANCE = 0.01  # nats: notebook 11's largest mean cost of an lr that still counts as "flat"


class Context(NamedTuple):
    """What a section is checked against: the preset's ``models`` and ``ffn_kind(name)``."""

    models: Mapping
    ffn_kind: Callable[[str], str]


# --------------------------------------------------------------------------------------------
# checkers: (value, where, context) -> the typed value, or one ConfigError naming ``where``
# --------------------------------------------------------------------------------------------
def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def count(v: Any, where: str, what: str = "how many of the preset's seeds to use") -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 2:
        raise ConfigError(f"{where}: expected {what} (an integer >= 2), got {v!r}")
    return v


def model_names(v: Any, where: str, models: Mapping) -> tuple[str, ...]:
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(m, str) for m in v):
        raise ConfigError(f"{where}: expected a non-empty list of model names of the preset, got {v!r}")
    for i, m in enumerate(v):
        if m not in models:
            raise ConfigError(f"{where}[{i}]: no model named {m!r} in the preset; allowed: {sorted(models)}")
    return tuple(v)


def _epochs(v: Any, where: str, ctx: Context = None) -> float:
    if not is_number(v) or not v > 0:
        raise ConfigError(f"{where}: expected a number of epochs > 0, got {v!r}")
    return float(v)


def positive_int(v: Any, where: str, ctx: Context = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{where}: must be a positive integer, got {v!r}")
    return v


def number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ConfigError(f"{where}: must be a number, got {v!r}")
    try:
        return float(v)
    except ValueError:
        raise ConfigError(f"{where}: must be a number, got {v!r}") from None


def _models(v, where, ctx):
    return model_names(v, where, ctx.models)


def _seeds(v, where, ctx):
    return count(v, where)


def _mapping(v, where, ctx):
    return dict(_coerce(v, dict, where))


def _prompts(v, where, ctx):
    return _coerce(v, tuple[str, ...], where)


# --------------------------------------------------------------------------------------------
# the sections
# --------------------------------------------------------------------------------------------
class Section:
    """A comparison's knobs. ``KEYS``: ``{flat study key: (field, checker)}``; ``MODELS``: the keys
    whose values name models; ``WHOLE``: the one key whose whole mapping the section is (then the
    section is None when the preset lacks it). A null value is the field's default."""

    KEYS: ClassVar[Mapping[str, tuple[str, Callable]]] = {}
    MODELS: ClassVar[tuple[str, ...]] = ()
    WHOLE: ClassVar[Optional[str]] = None

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return (cls.WHOLE,) if cls.WHOLE else tuple(cls.KEYS)

    @classmethod
    def parse(cls, raw: Mapping[str, Any], ctx: Context):
        """The section from the flat ``study`` mapping (only its own keys are read), checked."""
        if cls.WHOLE:
            v = raw.get(cls.WHOLE)
            return None if v is None else cls.from_raw(v, f"study.{cls.WHOLE}", ctx)
        kw = {f: check(raw[k], f"study.{k}", ctx) for k, (f, check) in cls.KEYS.items() if raw.get(k) is not None}
        return cls(**kw)

    @classmethod
    def from_raw(cls, v: Any, where: str, ctx: Context):  # WHOLE sections only
        raise NotImplementedError

    def flat(self) -> dict:
        """``{flat study key: value}``: the section as the preset writes it."""
        return {k: getattr(self, f) for k, (f, _) in self.KEYS.items()}

    def __iter__(self):
        """The models this section names (its ``MODELS`` keys, in order), e.g. ``m in study.ablation``."""
        for k in self.MODELS:
            yield from getattr(self, self.KEYS[k][0]) or ()


@dataclass(frozen=True)
class AblationSection(Section):
    """Notebook 02: the routed variants (``ablation``) at ``ablation_epochs``."""

    models: Optional[tuple[str, ...]] = None
    epochs: float = 1.0
    KEYS: ClassVar = {"ablation": ("models", _models), "ablation_epochs": ("epochs", _epochs)}
    MODELS: ClassVar = ("ablation",)


@dataclass(frozen=True)
class NoiseSplitSection:
    """Notebook 03's noise split around the preset's first ``seeds`` seeds (``noise_split: {seeds: k}``)."""

    seeds: int

    def draws(self, seeds: Sequence[int]) -> tuple[int, ...]:
        """The first ``self.seeds`` of ``seeds`` (the run's seeds): the k draws, the first being the
        fixed seed; more than there are: one ConfigError line."""
        if self.seeds > len(seeds):
            raise ConfigError(f"study.noise_split: {{seeds: {self.seeds}}} asks for more seeds than the preset has "
                              f"({list(seeds)})")
        return tuple(seeds[: self.seeds])


def _noise_split(v, where, ctx):
    k = v.get("seeds") if isinstance(v, Mapping) and set(v) == {"seeds"} else None
    if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k:
        raise ConfigError(f"{where}: expected {{seeds: k}} with k >= 2 (the first k of the preset's seeds), got {v!r}")
    return NoiseSplitSection(k)


@dataclass(frozen=True)
class HeadlineSection(Section):
    """Notebook 03 (besides the headline trio and the power target, general knobs): the noise
    split, the sample prompts (None: the notebook's) and tokens per sample."""

    noise_split: Optional[NoiseSplitSection] = None
    prompts: Optional[tuple[str, ...]] = None
    sample_tokens: int = 40
    KEYS: ClassVar = {"noise_split": ("noise_split", _noise_split), "prompts": ("prompts", _prompts),
                      "sample_tokens": ("sample_tokens", positive_int)}


@dataclass(frozen=True)
class ThroughputSection(Section):
    """Notebook 05: the benchmark's knobs (``bench``: batch, context, rounds, dtype)."""

    bench: dict = field(default_factory=dict)
    KEYS: ClassVar = {"bench": ("bench", _mapping)}


@dataclass(frozen=True)
class GranularitySection(Section):
    """Notebook 06: the soft-MoE K sweep (``granularity``) at ``granularity_epochs``, and the
    windows of its probes (``probe_windows``)."""

    models: Optional[tuple[str, ...]] = None
    epochs: float = 1.0
    probe_windows: int = 64
    KEYS: ClassVar = {"granularity": ("models", _models), "granularity_epochs": ("epochs", _epochs),
                      "probe_windows": ("probe_windows", positive_int)}
    MODELS: ClassVar = ("granularity",)


@dataclass(frozen=True)
class IsoWidthSection(Section):
    """Notebook 07: the pair (``iso_width``) at ``iso_width_epochs``, and the decoding benchmark's
    knobs (``decode``)."""

    models: Optional[tuple[str, ...]] = None
    epochs: float = 1.0
    decode: dict = field(default_factory=dict)
    KEYS: ClassVar = {"iso_width": ("models", _models), "iso_width_epochs": ("epochs", _epochs),
                      "decode": ("decode", _mapping)}
    MODELS: ClassVar = ("iso_width",)


class TokenBudgetSection(Section):
    """Notebook 09: ``token_budget`` is :class:`TokenBudgetConfig` (one trio per model size)."""

    WHOLE: ClassVar = "token_budget"

    @classmethod
    def from_raw(cls, v, where, ctx):
        return token_budget_from(v, ctx.models, ctx.ffn_kind, model_names)


@dataclass(frozen=True)
class DownstreamSection(Section):
    """Notebook 10: the first ``downstream_seeds`` seeds (None: all)."""

    seeds: Optional[int] = None
    KEYS: ClassVar = {"downstream_seeds": ("seeds", _seeds)}


@dataclass(frozen=True)
class SweepSpec:
    """:class:`LrSweepSection` resolved against a preset's ``train.lr`` and seeds
    (:meth:`LrSweepSection.resolve`): the grid with the preset's own rate exactly, the seeds, and
    the knobs' budget and tolerance (default :data:`DEFAULT_TOLERANCE`)."""

    knobs: "LrSweepSection"
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    preset_lr: float

    @property
    def epochs(self) -> float:
        return self.knobs.epochs

    @property
    def tolerance(self) -> float:
        return DEFAULT_TOLERANCE if self.knobs.tolerance is None else self.knobs.tolerance


@dataclass(frozen=True)
class LrSweepSection(Section):
    """Notebook 11's learning-rate check (``lr_sweep: {lrs, seeds, epochs, tolerance}``): the grid
    (ascending), how many of the preset's seeds, the budget and the tolerance (nats; None: the
    default)."""

    lrs: tuple[float, ...]
    seeds: int
    epochs: float
    tolerance: Optional[float] = None
    WHOLE: ClassVar = "lr_sweep"

    @classmethod
    def from_raw(cls, raw, where, ctx=None) -> "LrSweepSection":
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where}: must be a mapping with lrs, seeds, epochs; got {raw!r}")
        allowed = {"lrs", "seeds", "epochs", "tolerance"}
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        for key in ("lrs", "seeds", "epochs"):
            if key not in raw:
                raise ConfigError(f"{where}.{key}: missing (lrs: a list of learning rates, seeds: how many "
                                  f"of the preset's seeds, epochs: the budget in units of the preset's schedule)")
        lrs_raw = raw["lrs"]
        if not isinstance(lrs_raw, (list, tuple)):
            raise ConfigError(f"{where}.lrs: must be a list of learning rates, got {lrs_raw!r}")
        lrs = sorted({number(v, f"{where}.lrs[{i}]") for i, v in enumerate(lrs_raw)})
        if len(lrs) < 3 or lrs[0] <= 0:
            raise ConfigError(f"{where}.lrs: need at least 3 distinct positive learning rates (a log grid), "
                              f"got {list(lrs_raw)}")
        n = raw["seeds"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ConfigError(f"{where}.seeds: must be an integer >= 2 (a paired interval needs two "
                              f"seeds), got {n!r}")
        budget = number(raw["epochs"], f"{where}.epochs")
        if not budget > 0:
            raise ConfigError(f"{where}.epochs: must be > 0, got {raw['epochs']!r}")
        tol = raw.get("tolerance")
        if tol is not None:
            tol = number(tol, f"{where}.tolerance")
            if not tol > 0:
                raise ConfigError(f"{where}.tolerance: must be > 0 (nats), got {raw['tolerance']!r}")
        return cls(tuple(lrs), n, budget, tol)

    def resolve(self, train_lr: float, seeds: Sequence[int]) -> SweepSpec:
        """This sweep against the ``train.lr`` and seeds a notebook runs with: ``train_lr`` must be
        one of the grid's rates (it replaces its near-equal), and ``self.seeds`` at most
        ``len(seeds)``; else one ConfigError line naming the field."""
        if not any(math.isclose(lr, train_lr, rel_tol=1e-9) for lr in self.lrs):
            raise ConfigError(f"study.lr_sweep.lrs: must include the preset's train.lr={train_lr:g} (the lr under "
                              f"test), got {list(self.lrs)}")
        if self.seeds > len(seeds):
            raise ConfigError(f"study.lr_sweep.seeds: {self.seeds} seeds asked, the preset has {len(seeds)} "
                              f"({list(seeds)})")
        lrs = tuple(train_lr if math.isclose(lr, train_lr, rel_tol=1e-9) else lr for lr in self.lrs)
        return SweepSpec(self, lrs, tuple(seeds[: self.seeds]), train_lr)


@dataclass(frozen=True)
class RouterVariantsSection(Section):
    """Notebook 12: the MoEs with other routers (``router_variants``, the reference MoE too) at
    ``router_variants_epochs`` (1.0: the headline budget, whose runs notebook 03 shares)."""

    models: Optional[tuple[str, ...]] = None
    epochs: float = 1.0
    KEYS: ClassVar = {"router_variants": ("models", _models), "router_variants_epochs": ("epochs", _epochs)}
    MODELS: ClassVar = ("router_variants",)


#: ``{StudyConfig attribute: section class}``, in notebook order (each comparison names one)
SECTIONS: dict[str, type] = {
    "ablation": AblationSection, "headline_sweep": HeadlineSection, "throughput": ThroughputSection,
    "granularity": GranularitySection, "iso_width": IsoWidthSection, "token_budget": TokenBudgetSection,
    "downstream": DownstreamSection, "lr_sweep": LrSweepSection, "router_variants": RouterVariantsSection,
}


def section_keys() -> dict[str, tuple[str, Optional[str]]]:
    """``{flat study key: (section attribute, field, or None for a WHOLE section)}``."""
    out = {}
    for attr, cls in SECTIONS.items():
        for k in cls.keys():
            out[k] = (attr, None if cls.WHOLE else cls.KEYS[k][0])
    return out


def model_keys() -> tuple[str, ...]:
    """The flat keys of the sections that list model names (``MODELS`` of each, in order)."""
    return tuple(k for cls in SECTIONS.values() for k in cls.MODELS)


__all__ = ["AblationSection", "Context", "DEFAULT_TOLERANCE", "DownstreamSection", "GranularitySection",
           "HeadlineSection", "IsoWidthSection", "LrSweepSection", "NoiseSplitSection", "RouterVariantsSection",
           "SECTIONS", "Section", "SweepSpec", "ThroughputSection", "TokenBudgetConfig", "TokenBudgetSection",
           "TOKEN_BUDGET_SHAPE", "TrioConfig", "model_keys", "section_keys"]
