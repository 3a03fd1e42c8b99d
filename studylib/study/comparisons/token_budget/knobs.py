"""Notebook 09's knobs: ``study.token_budget``, one trio per model size (:class:`TrioConfig`,
checked by :func:`parse_trios`), ``study.map_power_target`` and ``study.map_law_boot`` (:class:`TokenBudgetKnobs`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from studylib.config import ConfigError
from studylib.config.checks import is_number, positive
from studylib.study.analysis.shape import paper_shape, paper_vocab_per_d, trio_shape
from studylib.study.analysis.position import ROLES
from studylib.study.comparisons.knobs import SEEDS, Context, Knobs, knob, trio



@dataclass(frozen=True)
class TrioConfig:
    """One model size of the map: [active-match dense, reference MoE, total-match dense], its
    budgets in ``epochs`` of the preset's schedule or ``tokens_per_param`` of the MoE (turned into
    epochs by :func:`~.budgets.budget_trios`), how many of the preset's seeds it trains (default
    all; ``seeds_at``: ``(budget, n)`` pairs, a budget from all the stories trained with its own
    first ``n``) and the budgets trained again (``repeat``) from only the first ``stories``
    fractions of the training stories (the same tokens, fewer unique: the data repeats). The
    budgets of ``repeat`` are ``tokens_per_param`` and those of ``seeds_at`` either unit as
    written; every budget is in epochs after ``budget_trios``."""

    models: tuple[str, str, str]
    epochs: tuple[float, ...]
    seeds: Optional[int] = None
    tokens_per_param: tuple[float, ...] = ()
    repeat: tuple[float, ...] = ()
    stories: tuple[float, ...] = ()
    seeds_at: tuple[tuple[float, int], ...] = ()

    def seeds_of(self, seeds: Sequence[int], cell: Optional[tuple[float, float]] = None) -> list[int]:
        """The seeds the trio's ``cell`` (``(epochs, stories)`` of :meth:`cells`; None: the trio's
        own count) is trained with: the first ``n`` of ``seeds`` (``seeds_at``'s for that budget from
        all the stories, else ``self.seeds``; all if None)."""
        n = dict(self.seeds_at).get(cell[0], self.seeds) if cell is not None and cell[1] == 1.0 else self.seeds
        return list(seeds if n is None else seeds[:n])

    def cells(self) -> list[tuple[float, float]]:
        """``[(epochs, stories)]``: every budget from all the training stories, then each repeated
        budget from each fraction of them (budgets in epochs: after ``budget_trios``)."""
        return [(e, 1.0) for e in self.epochs] + [(e, f) for e in self.repeat for f in self.stories]

    dense_active = property(lambda self: self.models[0])
    moe = property(lambda self: self.models[1])
    dense_total = property(lambda self: self.models[2])
    #: the size's name: its reference MoE
    size = property(lambda self: self.models[1])

    def role(self, model: str) -> str:
        """``dense_active``, ``moe`` or ``dense_total``: what ``model`` is in this trio."""
        return dict(zip(self.models, ROLES))[model]


#: the map's key under ``study`` (written once: the knob, its errors and the budgets' messages read it)
MAP_KNOB = "token_budget"
TOKEN_BUDGET_SHAPE = ("{trios: [{models: [dense_active, moe, dense_total], epochs: [1.0], tokens_per_param: [3.53, 28.9], "
                      "seeds: 3, seeds_at: {28.9: 5}, repeat: {tokens_per_param: [28.9], stories: [0.5, 0.25]}}, ...], "
                      "shape: paper} (epochs and/or tokens_per_param; seeds, seeds_at, repeat and shape optional)")

#: how far a trio may lie from the paper's own (the knob ``shape: paper``): the embedding share of
#: the MoE's and of the active-match dense model's active parameters within ``SHARE_TOL`` of the
#: paper's (Table 5), each dense baseline's FFN hidden / d_model inside ``FFN_RANGE`` (the paper's
#: 3.5 and 4.5, Table 3)
SHARE_TOL = 0.03
FFN_RANGE = (3.0, 5.0)


def check_shape(names, where: str, ctx: Context) -> dict:
    """The trio's shape (:func:`~studylib.study.analysis.shape.trio_shape`); one
    ConfigError line naming the first ratio that leaves the paper's family (see :data:`SHARE_TOL`)."""
    s, paper = trio_shape(*(ctx.config(m) for m in names), 0), paper_shape()
    what = {"emb_share_moe": f"the MoE {names[1]}'s embedding share of its active parameters",
            "emb_share_dense_active": f"the active match {names[0]}'s embedding share of its parameters"}
    for key, label in what.items():
        if abs(s[key] - paper[key]) > SHARE_TOL:
            raise ConfigError(f"{where}: {label} is {s[key]:.3f}, the paper's {paper[key]:.3f} (more than "
                              f"{SHARE_TOL} apart: not a scaled copy of the paper's trio; set the MoE's vocab_size "
                              f"near {paper_vocab_per_d():.1f} x d_model, or shape: any)")
    for key, m in (("ffn_over_d_active", names[0]), ("ffn_over_d_total", names[2])):
        if not FFN_RANGE[0] <= s[key] <= FFN_RANGE[1]:
            raise ConfigError(f"{where}: {m}'s FFN hidden / d_model is {s[key]:.2f}, outside the paper's family "
                              f"{list(FFN_RANGE)} (the paper's {paper['ffn_over_d_active']:.1f} / "
                              f"{paper['ffn_over_d_total']:.1f}: a width-resized baseline; give its derive rule a "
                              f"finer d_multiple, or shape: any)")
    return s


@dataclass(frozen=True)
class TokenBudget:
    """Notebook 09's map: one trio per model size, and whether each must be a scaled copy of the
    paper's trio (``shape: paper``, the default; ``any``: no check, for a preset whose models mean
    nothing, such as ``ci``)."""

    trios: tuple[TrioConfig, ...]
    shape: str = "paper"


def parse_map(tb: Any, key: str, ctx: Context) -> TokenBudget:
    """``study.token_budget`` checked against the preset's models (one ConfigError line naming the field)."""
    if not isinstance(tb, Mapping) or "trios" not in tb or not set(tb) <= {"trios", "shape"}:
        raise ConfigError(f"{key}: expected a mapping with the key 'trios' and optionally 'shape' "
                          f"({TOKEN_BUDGET_SHAPE}), got {tb!r}")
    shape = tb.get("shape", "paper")
    if shape not in ("paper", "any"):
        raise ConfigError(f"{key}.shape: expected 'paper' (every trio a scaled copy of the paper's) or 'any', "
                          f"got {shape!r}")
    trios = parse_trios(tb["trios"], key, ctx)
    if shape == "paper":
        for i, t in enumerate(trios):
            check_shape(t.models, f"{key}.trios[{i}]", ctx)
    return TokenBudget(trios, shape)


def _budgets(t: Mapping, k: str, where: str, what: str) -> tuple[float, ...]:
    v = t.get(k, [])
    if not isinstance(v, (list, tuple)) or not all(is_number(e) and e > 0 for e in v) or len(set(v)) != len(v):
        raise ConfigError(f"{where}.{k}: expected a list of different positive numbers ({what}), got {v!r}")
    return tuple(sorted(float(e) for e in v))


def _repeat(r: Any, where: str, budgets: Sequence[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if not isinstance(r, Mapping) or set(r) != {"tokens_per_param", "stories"}:
        raise ConfigError(f"{where}: expected {{tokens_per_param: [...], stories: [...]}} (budgets of the trio, "
                          f"trained again from fractions of the training stories), got {r!r}")
    x = _budgets(r, "tokens_per_param", where, "budgets of this trio's tokens_per_param")
    for v in x:
        if v not in budgets:
            raise ConfigError(f"{where}.tokens_per_param: {v:g} is not one of the trio's tokens_per_param "
                              f"{list(budgets)}; a repeated budget is a map point drawn from fewer stories")
    f = _budgets(r, "stories", where, "fractions of the training stories")
    if not x or not f or any(v >= 1 for v in f):
        raise ConfigError(f"{where}.stories: expected fractions of the training stories below 1 (e.g. [0.5, 0.25]), "
                          f"got {r.get('stories')!r}")
    return x, tuple(sorted(f, reverse=True))


def _seeds_at(r: Any, where: str, epochs: Sequence[float], tpp: Sequence[float],
              ctx: Context) -> tuple[tuple[float, int], ...]:
    if not isinstance(r, Mapping) or not r:
        raise ConfigError(f"{where}: expected a mapping {{budget: seeds}} (e.g. {{28.9: 5}}: that budget of the trio "
                          f"from all the stories trained with the preset's first 5 seeds), got {r!r}")
    for x in r:
        if not is_number(x) or (float(x) in epochs) == (float(x) in tpp):
            raise ConfigError(f"{where}: {x!r} is not one budget of the trio (epochs {list(epochs)}, tokens_per_param "
                              f"{list(tpp)}; a number in both is ambiguous)")
    return tuple(sorted((float(x), SEEDS(n, f"{where}[{x:g}]", ctx)) for x, n in r.items()))


def parse_trios(raw: Any, key: str, ctx: Context) -> tuple[TrioConfig, ...]:
    """The trios of ``study.token_budget``, checked against the preset's models."""
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{key}.trios: expected a non-empty list of trios ({TOKEN_BUDGET_SHAPE}), got {raw!r}")
    out, seen = [], set()
    for i, t in enumerate(raw):
        where = f"{key}.trios[{i}]"
        keys = {"models", "epochs", "tokens_per_param", "seeds", "seeds_at", "repeat"}
        if not isinstance(t, Mapping) or "models" not in t or not set(t) <= keys or not {"epochs", "tokens_per_param"} & set(t):
            raise ConfigError(f"{where}: expected a mapping with keys 'models' and 'epochs' and/or 'tokens_per_param' "
                              f"(and optionally 'seeds', 'seeds_at', 'repeat'), got {t!r}")
        n_seeds = t.get("seeds")
        if n_seeds is not None:
            SEEDS(n_seeds, f"{where}.seeds", ctx)
        names = t["models"]
        if (not isinstance(names, list) or len(names) != 3 or not all(isinstance(m, str) for m in names)
                or len(set(names)) != 3):
            raise ConfigError(f"{where}.models: expected three different model names "
                              f"[dense_active, moe, dense_total], got {names!r}")
        trio(names, f"{where}.models", ctx)  # the roles by their parameter counts
        if names[1] in seen:
            raise ConfigError(f"{where}.models[1]: the reference MoE {names[1]!r} names a second trio; "
                              "each trio is one model size")
        seen.add(names[1])
        epochs = _budgets(t, "epochs", where, "epochs of the preset's schedule")
        tpp = _budgets(t, "tokens_per_param", where, "target tokens per active parameter of the MoE")
        if not epochs and not tpp:
            raise ConfigError(f"{where}: no budget: 'epochs' and 'tokens_per_param' are both empty "
                              f"({TOKEN_BUDGET_SHAPE})")
        repeat, stories = _repeat(t["repeat"], f"{where}.repeat", tpp) if "repeat" in t else ((), ())
        seeds_at = _seeds_at(t["seeds_at"], f"{where}.seeds_at", epochs, tpp, ctx) if "seeds_at" in t else ()
        out.append(TrioConfig(tuple(names), epochs, n_seeds, tpp, repeat, stories, seeds_at))
    return tuple(out)


def _law_boot(v: Any, where: str, ctx: Context) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 10:
        raise ConfigError(f"{where}: expected the bootstrap replicates of each joint-law interval (an integer >= 10), "
                          f"got {v!r}")
    return v


@dataclass(frozen=True)
class TokenBudgetKnobs(Knobs):
    """The map (``token_budget``: its trios; None: the preset has none), the CI half-width each
    point's power table plans for (``map_power_target``) and the bootstrap replicates of each of
    the joint law's intervals (``map_law_boot``: seeds, map cells, each held-out refit)."""

    map: Optional[TokenBudget] = knob(MAP_KNOB, parse_map)
    power_target: float = knob("map_power_target", lambda v, where, ctx: positive(v, where, "a CI half-width in nats"),
                               0.05)
    law_boot: int = knob("map_law_boot", _law_boot, 200)

    @property
    def trios(self) -> Optional[tuple[TrioConfig, ...]]:
        return None if self.map is None else self.map.trios


__all__ = ["MAP_KNOB", "FFN_RANGE", "SHARE_TOL", "TOKEN_BUDGET_SHAPE", "TokenBudget", "TokenBudgetKnobs", "TrioConfig",
           "check_shape", "parse_map", "parse_trios"]
