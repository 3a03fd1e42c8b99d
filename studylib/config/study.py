"""The ``study`` section of a preset, typed: what the notebooks compare, at which budgets, with how
many seeds, and where the runs train. Built and checked once, when the preset loads
(:func:`study_from_dict`, called by :func:`studylib.config.presets.preset_from_dict`): a bad
value is one :class:`ConfigError` naming its field (``study.token_budget.trios[1].epochs``), and
a knob that names a model the preset does not have fails there, not in a notebook an hour later.
Every reader uses these fields; a knob a notebook needs but the preset lacks (``lr_sweep`` for
notebook 11, say) is reported by that notebook's reader. Torch-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional, Sequence

from studylib.config.schema import ConfigError, _coerce

#: the knobs that list model names (each checked against the preset's models)
MODEL_LISTS = ("headline", "ablation", "granularity", "iso_width", "router_variants")


@dataclass(frozen=True)
class TrioConfig:
    """One model size of the token-budget map: [active-match dense, reference MoE, total-match
    dense], the budgets and, optionally, how many of the preset's seeds it trains (default: all).

    A budget is given in ``epochs`` of the preset's schedule (``1.0``: the preset's own run) or in
    ``tokens_per_param``, target tokens per active parameter of the trio's MoE, so that sizes can
    share one (a map in two dimensions); the map turns the latter into epochs once it knows one
    epoch's steps (:func:`studylib.study.analysis.budget_map.budget_trios`), after which
    ``tokens_per_param`` is empty and ``epochs`` holds every budget, ascending."""

    models: tuple[str, str, str]
    epochs: tuple[float, ...]
    seeds: Optional[int] = None
    tokens_per_param: tuple[float, ...] = ()

    def seeds_of(self, seeds: Sequence[int]) -> list[int]:
        """The seeds this trio is trained with: the first ``self.seeds`` of ``seeds`` (all if None)."""
        return list(seeds if self.seeds is None else seeds[: self.seeds])

    @property
    def dense_active(self) -> str:
        return self.models[0]

    @property
    def moe(self) -> str:
        return self.models[1]

    @property
    def dense_total(self) -> str:
        return self.models[2]

    @property
    def size(self) -> str:
        """The size's name: its reference MoE."""
        return self.moe

    def role(self, model: str) -> str:
        """``dense_active``, ``moe`` or ``dense_total``: what ``model`` is in this trio."""
        return dict(zip(self.models, ("dense_active", "moe", "dense_total")))[model]


@dataclass(frozen=True)
class LrSweepConfig:
    """Notebook 11's learning-rate check: the grid (ascending; the notebook checks that the
    preset's ``train.lr`` is among them), how many of the preset's seeds, the budget and the tolerance (nats; None: the
    notebook's default)."""

    lrs: tuple[float, ...]
    seeds: int
    epochs: float
    tolerance: Optional[float] = None


@dataclass(frozen=True)
class TokenBudgetConfig:
    """Notebook 09's token-budget map: one trio per model size."""

    trios: tuple[TrioConfig, ...]


@dataclass(frozen=True)
class NoiseSplitConfig:
    """Notebook 03's noise split around the preset's first ``seeds`` seeds."""

    seeds: int


@dataclass(frozen=True)
class StudyConfig:
    """The ``study`` section (every field optional; see the module docstring)."""

    notebooks: Optional[tuple[str, ...]] = None  # the notebooks `studylib study` runs (None: all)
    headline: Optional[tuple[str, ...]] = None  # [dense_active, moe, dense_total]
    reference_moe: Optional[str] = None  # None: the headline's MoE (its second model)
    ablation: Optional[tuple[str, ...]] = None
    ablation_epochs: float = 1.0
    granularity: Optional[tuple[str, ...]] = None
    granularity_epochs: float = 1.0
    iso_width: Optional[tuple[str, ...]] = None
    iso_width_epochs: float = 1.0
    router_variants: Optional[tuple[str, ...]] = None  # 12: MoEs with other routers (the reference MoE too)
    router_variants_epochs: float = 1.0  # 12: the headline budget (1.0) reuses the headline runs
    comparison_seeds: Optional[int] = None  # 02, 06, 07: the first k seeds (None: all)
    downstream_seeds: Optional[int] = None  # 10: the first k seeds (None: all)
    power_target: float = 0.03  # 03: the CI half-width the power table plans for
    map_power_target: float = 0.05  # 09: the same for each point of the map
    margin: Optional[float] = None  # 02 03 06 07 09 10 12: equivalence margin in nats (None: power_target)
    noise_split: Optional[NoiseSplitConfig] = None  # 03: the first k seeds (None: no noise split)
    lr_sweep: Optional[LrSweepConfig] = None
    token_budget: Optional[TokenBudgetConfig] = None
    jobs: int = 1  # training runs at a time (a local Dask cluster of this many workers)
    scheduler: Optional[str] = None  # a Dask scheduler's address: train there instead
    bench: dict = field(default_factory=dict)  # 05's benchmark knobs
    decode: dict = field(default_factory=dict)  # 07's decoding-benchmark knobs
    prompts: Optional[tuple[str, ...]] = None  # 03's sample prompts (None: the notebook's)
    sample_tokens: int = 40  # 03: tokens per sample
    probe_windows: int = 64  # 06: windows of the probes

    def reference(self) -> Optional[str]:
        """``reference_moe``, else the headline's MoE (its second model)."""
        return self.reference_moe or (self.headline[1] if self.headline and len(self.headline) > 1 else None)


# --------------------------------------------------------------------------------------------
# reading and checking the section
# --------------------------------------------------------------------------------------------
def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _count(v: Any, where: str, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 2:
        raise ConfigError(f"{where}: expected {what} (an integer >= 2), got {v!r}")
    return v


def _models(v: Any, where: str, models: Mapping, n: Optional[int] = None) -> tuple[str, ...]:
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(m, str) for m in v):
        raise ConfigError(f"{where}: expected a non-empty list of model names of the preset, got {v!r}")
    if n is not None and (len(v) != n or len(set(v)) != n):
        raise ConfigError(f"{where}: expected {n} different model names, got {list(v)!r}")
    for i, m in enumerate(v):
        if m not in models:
            raise ConfigError(f"{where}[{i}]: no model named {m!r} in the preset; allowed: {sorted(models)}")
    return tuple(v)


def _epochs(v: Any, where: str) -> float:
    if not _is_number(v) or not v > 0:
        raise ConfigError(f"{where}: expected a number of epochs > 0, got {v!r}")
    return float(v)


def _notebooks(v: Any) -> tuple[str, ...]:
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(x, (str, int)) and not isinstance(x, bool)
                                                             for x in v):
        raise ConfigError(f"study.notebooks: expected a non-empty list of notebook numbers or names "
                          f"(e.g. ['01', '03']), got {v!r}")
    return tuple(f"{x:02d}" if isinstance(x, int) else x for x in v)


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ConfigError(f"{where}: must be a number, got {v!r}")
    try:
        return float(v)
    except ValueError:
        raise ConfigError(f"{where}: must be a number, got {v!r}") from None


def _lr_sweep(raw: Any) -> LrSweepConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"study.lr_sweep: must be a mapping with lrs, seeds, epochs; got {raw!r}")
    allowed = {"lrs", "seeds", "epochs", "tolerance"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"study.lr_sweep: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    for key in ("lrs", "seeds", "epochs"):
        if key not in raw:
            raise ConfigError(f"study.lr_sweep.{key}: missing (lrs: a list of learning rates, seeds: how many "
                              f"of the preset's seeds, epochs: the budget in units of the preset's schedule)")
    lrs_raw = raw["lrs"]
    if not isinstance(lrs_raw, (list, tuple)):
        raise ConfigError(f"study.lr_sweep.lrs: must be a list of learning rates, got {lrs_raw!r}")
    lrs = sorted({_number(v, f"study.lr_sweep.lrs[{i}]") for i, v in enumerate(lrs_raw)})
    if len(lrs) < 3 or lrs[0] <= 0:
        raise ConfigError(f"study.lr_sweep.lrs: need at least 3 distinct positive learning rates (a log grid), "
                          f"got {list(lrs_raw)}")
    n = raw["seeds"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ConfigError(f"study.lr_sweep.seeds: must be an integer >= 2 (a paired interval needs two "
                          f"seeds), got {n!r}")
    epochs = _number(raw["epochs"], "study.lr_sweep.epochs")
    if not epochs > 0:
        raise ConfigError(f"study.lr_sweep.epochs: must be > 0, got {raw['epochs']!r}")
    tol = raw.get("tolerance")
    if tol is not None:
        tol = _number(tol, "study.lr_sweep.tolerance")
        if not tol > 0:
            raise ConfigError(f"study.lr_sweep.tolerance: must be > 0 (nats), got {raw['tolerance']!r}")
    return LrSweepConfig(tuple(lrs), n, epochs, tol)


TOKEN_BUDGET_SHAPE = ("{trios: [{models: [dense_active, moe, dense_total], epochs: [1.0], tokens_per_param: [1.0, 28.9], "
                      "seeds: 5}, ...]} (epochs and/or tokens_per_param)")


def _token_budget(tb: Any, models: Mapping, ffn_kind) -> TokenBudgetConfig:
    key = "study.token_budget"
    if not isinstance(tb, Mapping) or set(tb) != {"trios"}:
        raise ConfigError(f"{key}: expected a mapping with the one key 'trios' ({TOKEN_BUDGET_SHAPE}), got {tb!r}")
    raw = tb["trios"]
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{key}.trios: expected a non-empty list of trios ({TOKEN_BUDGET_SHAPE}), got {raw!r}")
    out, seen = [], set()
    for i, t in enumerate(raw):
        where = f"{key}.trios[{i}]"
        keys = {"models", "epochs", "tokens_per_param", "seeds"}
        if not isinstance(t, Mapping) or "models" not in t or not set(t) <= keys or not {"epochs", "tokens_per_param"} & set(t):
            raise ConfigError(f"{where}: expected a mapping with keys 'models' and 'epochs' and/or 'tokens_per_param' "
                              f"(and optionally 'seeds'), got {t!r}")
        n_seeds = t.get("seeds")
        if n_seeds is not None:
            _count(n_seeds, f"{where}.seeds", "how many of the preset's seeds to train")
        names = t["models"]
        if (not isinstance(names, list) or len(names) != 3 or not all(isinstance(m, str) for m in names)
                or len(set(names)) != 3):
            raise ConfigError(f"{where}.models: expected three different model names "
                              f"[dense_active, moe, dense_total], got {names!r}")
        _models(names, f"{where}.models", models)
        if ffn_kind(names[1]) == "dense":
            raise ConfigError(f"{where}.models[1]: the reference MoE {names[1]!r} has a dense FFN; "
                              "the middle model must be the MoE")
        if names[1] in seen:
            raise ConfigError(f"{where}.models[1]: the reference MoE {names[1]!r} names a second trio; "
                              "each trio is one model size")
        seen.add(names[1])
        lists = {}
        for k, what in (("epochs", "epochs of the preset's schedule"),
                        ("tokens_per_param", "target tokens per active parameter of the MoE")):
            v = t.get(k, [])
            if (not isinstance(v, (list, tuple)) or not all(_is_number(e) and e > 0 for e in v)
                    or len(set(v)) != len(v)):
                raise ConfigError(f"{where}.{k}: expected a list of different positive numbers ({what}), got {v!r}")
            lists[k] = tuple(sorted(float(e) for e in v))
        if not any(lists.values()):
            raise ConfigError(f"{where}: no budget: 'epochs' and 'tokens_per_param' are both empty "
                              f"({TOKEN_BUDGET_SHAPE})")
        out.append(TrioConfig(tuple(names), lists["epochs"], n_seeds, lists["tokens_per_param"]))
    return TokenBudgetConfig(tuple(out))


def study_from_dict(raw: Any, models: Mapping, ffn_kind) -> StudyConfig:
    """The ``study`` section checked, its model names against the preset's ``models``;
    ``ffn_kind(name)`` resolves a model's FFN kind (the token budget's middle model must route).
    What depends on the seeds and the learning rate a run is given (a notebook's ``seeds`` and
    ``overrides`` parameters) is checked by the notebook that reads it: ``lr_sweep`` must include
    ``train.lr`` and ask for no more seeds than there are, ``noise_split`` likewise."""
    if raw is None:
        raw = {}
    if isinstance(raw, StudyConfig):
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"study: must be a mapping of study knobs, got {raw!r}")
    names = [f.name for f in fields(StudyConfig)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ConfigError(f"study: unknown key(s) {unknown}; allowed: {names}")
    kw: dict = {}
    for key, v in raw.items():
        where = f"study.{key}"
        if v is None:
            kw[key] = None if key not in ("bench", "decode") else {}
        elif key == "notebooks":
            kw[key] = _notebooks(v)
        elif key in MODEL_LISTS:
            kw[key] = _models(v, where, models)
        elif key == "reference_moe":
            if not isinstance(v, str) or v not in models:
                raise ConfigError(f"{where}: expected a model name of the preset, got {v!r}; allowed: {sorted(models)}")
            kw[key] = v
        elif key.endswith("_epochs"):
            kw[key] = _epochs(v, where)
        elif key in ("comparison_seeds", "downstream_seeds"):
            kw[key] = _count(v, where, "how many of the preset's seeds to use")
        elif key in ("power_target", "map_power_target"):
            if not _is_number(v) or not v > 0:
                raise ConfigError(f"{where}: expected a CI half-width in nats (a number > 0), got {v!r}")
            kw[key] = float(v)
        elif key == "margin":
            if not _is_number(v) or not v > 0:
                raise ConfigError(f"{where}: expected an equivalence margin in nats (a number > 0), got {v!r}")
            kw[key] = float(v)
        elif key == "noise_split":
            k = v.get("seeds") if isinstance(v, Mapping) and set(v) == {"seeds"} else None
            if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k:
                raise ConfigError(f"{where}: expected {{seeds: k}} with k >= 2 (the first k of the preset's "
                                  f"seeds), got {v!r}")
            kw[key] = NoiseSplitConfig(k)
        elif key == "lr_sweep":
            kw[key] = _lr_sweep(v)
        elif key == "token_budget":
            kw[key] = _token_budget(v, models, ffn_kind)
        elif key == "jobs":
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{where}: must be a positive integer, got {v!r}")
            kw[key] = v
        elif key == "scheduler":
            if not isinstance(v, str) or ":" not in v:
                raise ConfigError(f"{where}: expected a Dask scheduler address like tcp://host:8786, got {v!r}")
            kw[key] = v.strip()
        elif key in ("bench", "decode"):
            kw[key] = dict(_coerce(v, dict, where))
        elif key == "prompts":
            kw[key] = _coerce(v, tuple[str, ...], where)
        else:  # sample_tokens, probe_windows
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{where}: must be a positive integer, got {v!r}")
            kw[key] = v
    if kw.get("margin") is None:  # the default margin: the power target the seeds are planned for
        kw["margin"] = kw.get("power_target", StudyConfig.power_target)
    return StudyConfig(**kw)


__all__ = ["MODEL_LISTS", "StudyConfig", "TrioConfig", "TokenBudgetConfig", "NoiseSplitConfig", "LrSweepConfig",
           "study_from_dict"]
