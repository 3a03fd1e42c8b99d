"""Notebook 13's knobs: ``study.controls``, one cell per row (:class:`ControlCell`: the reference
trio, the control models by role, the budget), and ``study.controls_seeds`` (how many of the
preset's seeds)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from studylib.config import ConfigError
from studylib.config.checks import positive
from studylib.study.comparisons.knobs import Context, Knobs, SEEDS, knob, trio

#: the control roles a cell may name, in the tables' order
CONTROL_ROLES = ("hash", "frozen", "one_expert", "dense_twin")
#: what each role's model must be (checked on its resolved config)
ROLE_WORDS = {"hash": "a routed MoE with ffn.router: hash", "frozen": "a routed MoE with ffn.router: frozen",
              "one_expert": "a routed MoE with num_experts 1, top_k 1 and no shared expert",
              "dense_twin": "a dense model"}
#: what a dense twin shares with its one-expert MoE besides the FFN's hidden size
TWIN_SHAPE = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "context")
CONTROLS_SHAPE = ("[{trio: [dense_active, moe, dense_total], hash: m, frozen: m, one_expert: m, dense_twin: m, "
                  "epochs: 1.0 | tokens_per_param: 10.0}, ...] (each role optional, at least one)")


@dataclass(frozen=True)
class ControlCell:
    """One cell of the controls: the reference trio (active match, reference MoE, total match),
    the control models by role (:data:`CONTROL_ROLES`; absent ones None) and the budget: ``epochs`` of the
    preset's schedule (1.0: the preset's own runs, shared with the headline) or
    ``tokens_per_param`` (target tokens per active parameter of the trio's MoE, the map's unit)."""

    trio: tuple[str, str, str]
    controls: tuple[tuple[str, str], ...]  # (role, model) in CONTROL_ROLES order
    epochs: Optional[float] = None
    tokens_per_param: Optional[float] = None

    @property
    def moe(self) -> str:
        return self.trio[1]

    @property
    def models(self) -> list[str]:
        """The trio, then the controls (each once)."""
        return list(dict.fromkeys([*self.trio, *(m for _, m in self.controls)]))

    def role(self, role: str) -> Optional[str]:
        return dict(self.controls).get(role)

    @property
    def budget(self) -> str:
        return f"{self.epochs:g} epochs" if self.epochs is not None else f"{self.tokens_per_param:g} tokens/param"

    @property
    def name(self) -> str:
        """The cell's label: its MoE and budget."""
        return f"{self.moe} @ {self.budget}"


def _model(v: Any, where: str, ctx: Context) -> str:
    if not isinstance(v, str) or v not in ctx.models:
        raise ConfigError(f"{where}: expected a model name of the preset, got {v!r}; allowed: {sorted(ctx.models)}")
    return v


def _role_ok(role: str, cfg) -> bool:
    f = cfg.ffn
    if role in ("hash", "frozen"):
        return f.kind == "moe" and f.router == role
    if role == "one_expert":
        return f.kind == "moe" and f.num_experts == 1 and f.top_k == 1 and f.n_shared == 0
    return f.kind == "dense"


def twin_mismatch(twin, one) -> Optional[str]:
    """How dense config ``twin`` differs from one-expert MoE config ``one``'s twin (the same
    :data:`TWIN_SHAPE`, a dense FFN of the expert's hidden size, so the same parameters but the
    router's), or None."""
    diff = [f"{k} {getattr(twin, k)} against {getattr(one, k)}" for k in TWIN_SHAPE
            if getattr(twin, k) != getattr(one, k)]
    if twin.ffn.hidden != one.ffn.hidden:
        diff.append(f"ffn.hidden {twin.ffn.hidden} against {one.ffn.hidden}")
    t, o = twin.num_params, one.num_params
    if t.active != o.active - o.router:
        diff.append(f"{t.active:,} active parameters against {o.active - o.router:,} (the one expert's "
                    f"{o.active:,} less its router's {o.router:,})")
    return "; ".join(diff) or None


def parse_cells(raw: Any, where: str, ctx: Context) -> tuple[ControlCell, ...]:
    """``study.controls`` checked: a non-empty list of cells of :data:`CONTROLS_SHAPE`; the trio
    matched by parameter counts (:func:`studylib.study.comparisons.knobs.trio`) around a learned
    router; every control a model of the preset and of its role (:data:`ROLE_WORDS`), not the
    trio's MoE; the dense twin the one expert's (:func:`twin_mismatch`); exactly one budget; else
    one ConfigError line naming the field."""
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ConfigError(f"{where}: expected {CONTROLS_SHAPE}, got {raw!r}")
    out = []
    for i, c in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(c, dict):
            raise ConfigError(f"{w}: expected a mapping {{trio: [...], hash: ..., epochs: ...}}, got {c!r}")
        unknown = sorted(set(c) - {"trio", "epochs", "tokens_per_param", *CONTROL_ROLES})
        if unknown:
            raise ConfigError(f"{w}: unknown key(s) {unknown}; allowed: trio, {', '.join(CONTROL_ROLES)}, epochs, tokens_per_param")
        t = c.get("trio")
        moe = t[1] if isinstance(t, (list, tuple)) and len(t) == 3 and isinstance(t[1], str) else None
        router = ctx.config(moe).ffn.router if moe in ctx.models else "learned"
        if router != "learned":  # before the counts: a hash router has none of its own
            raise ConfigError(f"{w}.trio[1]: the reference MoE {moe!r} has ffn.router: {router}; expected a "
                              f"learned router (the controls are measured against it)")
        names = trio(t, f"{w}.trio", ctx)
        controls = tuple((r, _model(c[r], f"{w}.{r}", ctx)) for r in CONTROL_ROLES if c.get(r) is not None)
        if not controls:
            raise ConfigError(f"{w}: names no control; expected at least one of {', '.join(CONTROL_ROLES)}")
        for r, m in controls:
            if m == names[1]:
                raise ConfigError(f"{w}.{r}: {m!r} is the trio's MoE, the reference; expected another model, "
                                  f"{ROLE_WORDS[r]}")
            if not _role_ok(r, ctx.config(m)):
                raise ConfigError(f"{w}.{r}: {m!r} must be {ROLE_WORDS[r]}")
        one, twin = dict(controls).get("one_expert"), dict(controls).get("dense_twin")
        why = one and twin and twin_mismatch(ctx.config(twin), ctx.config(one))
        if why:
            raise ConfigError(f"{w}.dense_twin: {twin!r} is not the dense twin of the one-expert MoE {one!r}: {why}")
        budgets = [k for k in ("epochs", "tokens_per_param") if c.get(k) is not None]
        if len(budgets) != 1:
            raise ConfigError(f"{w}: give exactly one budget, epochs or tokens_per_param; got {budgets or 'none'}")
        value = positive(c[budgets[0]], f"{w}.{budgets[0]}", "a positive number")
        out.append(ControlCell(names, controls, **{budgets[0]: float(value)}))
    return tuple(out)


def CELLS(v, where, ctx: Context) -> tuple[ControlCell, ...]:
    return parse_cells(v, where, ctx)


@dataclass(frozen=True)
class Recipe:
    """The MoE's recipe at one cell (``cell``: its index in ``study.controls``): the same tokens
    in ``batch_scale`` x fewer, ``batch_scale`` x larger steps, each model of the cell's trio at
    every lr of ``lrs`` (min_lr keeps the preset's min_lr / lr), the MoE's routers at
    ``router_lr_scale`` x the lr."""

    cell: int
    lrs: tuple[float, ...]
    batch_scale: int = 4
    router_lr_scale: float = 0.1


RECIPE_SHAPE = "{cell: 1, lrs: [1.0e-2, 2.0e-2, 4.0e-2], batch_scale: 4, router_lr_scale: 0.1}"


def RECIPE(v, where, ctx: Context) -> Recipe:
    if not isinstance(v, dict):
        raise ConfigError(f"{where}: expected {RECIPE_SHAPE}, got {v!r}")
    unknown = sorted(set(v) - {"cell", "lrs", "batch_scale", "router_lr_scale"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; expected {RECIPE_SHAPE}")
    cell = v.get("cell")
    if isinstance(cell, bool) or not isinstance(cell, int) or cell < 0:
        raise ConfigError(f"{where}.cell: expected the index of a cell of study.controls (0, 1, ...), got {cell!r}")
    lrs = v.get("lrs")
    if not isinstance(lrs, (list, tuple)) or len(lrs) < 2:
        raise ConfigError(f"{where}.lrs: expected at least two learning rates, got {lrs!r}")
    lrs = tuple(positive(x, f"{where}.lrs[{i}]", "a learning rate") for i, x in enumerate(lrs))
    if len(set(lrs)) != len(lrs):
        raise ConfigError(f"{where}.lrs: each learning rate once, got {list(lrs)}")
    scale = v.get("batch_scale", 4)
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ConfigError(f"{where}.batch_scale: expected a positive integer, got {scale!r}")
    router = positive(v.get("router_lr_scale", 0.1), f"{where}.router_lr_scale", "the routers' lr / the lr")
    return Recipe(cell, lrs, scale, router)


@dataclass(frozen=True)
class ControlsKnobs(Knobs):
    """The cells (``controls``) and how many of the preset's seeds each trains (``controls_seeds``;
    None: all of them)."""

    cells: Optional[tuple[ControlCell, ...]] = knob("controls", CELLS)
    seeds: Optional[int] = knob("controls_seeds", SEEDS)
    recipe: Optional[Recipe] = knob("controls_recipe", RECIPE)

    def model_lists(self) -> dict[str, tuple[str, ...]]:
        """``{"controls": every model the cells name}`` (for the lists naming a model)."""
        names = tuple(dict.fromkeys(m for c in self.cells or () for m in c.models))
        return {"controls": names} if names else {}
