"""Notebook 09's knobs: ``study.token_budget``, one trio per model size (:class:`TrioConfig`,
checked by :func:`parse_trios`), and ``study.map_power_target`` (:class:`TokenBudgetKnobs`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from studylib.config import ConfigError
from studylib.config.checks import count, is_number, model_names, positive
from studylib.study.comparisons.knobs import Context, Knobs, knob


@dataclass(frozen=True)
class TrioConfig:
    """One model size of the token-budget map: [active-match dense, reference MoE, total-match
    dense], the budgets and, optionally, how many of the preset's seeds it trains (default: all).

    A budget is given in ``epochs`` of the preset's schedule (``1.0``: the preset's own run) or in
    ``tokens_per_param``, target tokens per active parameter of the trio's MoE, so that sizes can
    share one (a map in two dimensions); the map turns the latter into epochs once it knows one
    epoch's steps (:func:`studylib.study.comparisons.token_budget.gaps.budget_trios`), after which
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


TOKEN_BUDGET_SHAPE = ("{trios: [{models: [dense_active, moe, dense_total], epochs: [1.0], tokens_per_param: [1.0, 28.9], "
                      "seeds: 5}, ...]} (epochs and/or tokens_per_param)")


def parse_trios(tb: Any, key: str, ctx: Context) -> tuple[TrioConfig, ...]:
    """``study.token_budget`` checked against the preset's models (one ConfigError line naming the field)."""
    models, ffn_kind = ctx.models, ctx.ffn_kind
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
            count(n_seeds, f"{where}.seeds", "how many of the preset's seeds to train")
        names = t["models"]
        if (not isinstance(names, list) or len(names) != 3 or not all(isinstance(m, str) for m in names)
                or len(set(names)) != 3):
            raise ConfigError(f"{where}.models: expected three different model names "
                              f"[dense_active, moe, dense_total], got {names!r}")
        model_names(names, f"{where}.models", models)
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
            if (not isinstance(v, (list, tuple)) or not all(is_number(e) and e > 0 for e in v)
                    or len(set(v)) != len(v)):
                raise ConfigError(f"{where}.{k}: expected a list of different positive numbers ({what}), got {v!r}")
            lists[k] = tuple(sorted(float(e) for e in v))
        if not any(lists.values()):
            raise ConfigError(f"{where}: no budget: 'epochs' and 'tokens_per_param' are both empty "
                              f"({TOKEN_BUDGET_SHAPE})")
        out.append(TrioConfig(tuple(names), lists["epochs"], n_seeds, lists["tokens_per_param"]))
    return tuple(out)


def _power_target(v: Any, where: str, ctx: Context) -> float:
    return positive(v, where, "a CI half-width in nats")


@dataclass(frozen=True)
class TokenBudgetKnobs(Knobs):
    """The trios (``token_budget``; None: the preset has none) and the CI half-width each point's
    power table plans for (``map_power_target``)."""

    trios: Optional[tuple[TrioConfig, ...]] = knob("token_budget", parse_trios)
    power_target: float = knob("map_power_target", _power_target, 0.05)


__all__ = ["TOKEN_BUDGET_SHAPE", "TokenBudgetKnobs", "TrioConfig", "parse_trios"]
