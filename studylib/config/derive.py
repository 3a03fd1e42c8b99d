"""Budget solvers: dense widths matched to a reference model's active or total parameters
(:func:`match_dense`), and the by-construction variants of seed 002 (:func:`iso_width_moe`) and
seed 003 (:func:`soft_fixed_width`). Presets use them through ``derive`` entries
(:func:`derive_model`). Torch-free.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Optional

from studylib.config.accounting import count_params
from studylib.config.schema import ConfigError, FFNConfig, ModelConfig, deep_merge, model_from_dict, to_dict

@dataclass(frozen=True)
class Match:
    config: ModelConfig
    target: str  # "active" or "total"
    target_params: int
    params: int

    @property
    def rel_mismatch(self) -> float:
        return (self.params - self.target_params) / self.target_params

    def as_dict(self) -> dict:
        c = self.config
        return {"name": c.name, "target": self.target, "target_params": self.target_params,
                "params": self.params, "rel_mismatch": self.rel_mismatch, "d_model": c.d_model,
                "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads, "hidden": c.ffn.hidden}


TOLERANCE = {"active": 0.01, "total": 0.001}  # the paper's matching tolerances


def _heads_for(d_model: int, ref: ModelConfig, min_head_dim: int) -> Optional[tuple[int, int]]:
    """(q heads, kv heads) for a width: keep the reference's kv heads, prefer its head dim,
    then halves / doubles of it; q heads must be a multiple of the kv heads."""
    G = ref.n_kv_heads
    prefs = [ref.head_dim]
    for i in range(1, 4):
        prefs += [ref.head_dim // 2 ** i, ref.head_dim * 2 ** i]
    # then any other even head dim that divides the width, the nearest to the reference's first
    prefs += sorted((A for A in range(2, d_model + 1, 2) if d_model % A == 0 and A not in prefs),
                    key=lambda A: (abs(math.log(A / ref.head_dim)), A))
    for A in prefs:
        if A >= min_head_dim and A % 2 == 0 and d_model % A == 0 and (d_model // A) % G == 0:
            return d_model // A, G
    return None


def match_dense(
    ref: ModelConfig,
    target: str = "active",
    *,
    name: Optional[str] = None,
    d_multiple: Optional[int] = None,
    hidden_multiple: int = 32,
    min_head_dim: Optional[int] = None,
    ffn_ratio: Optional[float] = None,
    tolerance: Optional[float] = None,
) -> Match:
    """Dense widths matching ``ref``'s active or total parameter count.

    For each d_model (multiples of ``d_multiple`` from d/2 to 2d) with valid heads, the FFN hidden
    size is solved in closed form and rounded to ``hidden_multiple`` (or half / a quarter of it, so
    that tiny models can still meet the tolerance). Among the candidates within the tolerance (1%
    active, 0.1% total), the one whose hidden/d_model ratio is closest (in log) to ``ffn_ratio``
    (default: the reference's per-expert ratio) wins, a modest width resize with a conventional FFN
    shape, preferring the coarsest rounding; if none is within tolerance, the closest count wins.

    The search grid scales with the reference: ``d_multiple`` defaults to d/8 (at least 8) and
    ``min_head_dim`` to half the reference's head dim (8 to 32). At the paper's d 256 (head dim 64)
    that is 32 and 32, and the solver finds the paper's own baselines (d 320 with 10 heads of 32,
    d 384 with 6 heads of 64); at d 32 it is 8 and 8, so a width 1.25x the MoE's is reachable there
    too (a fixed grid of 32 allowed only 1x, 1.5x or 2x at small widths).
    """
    if d_multiple is None:
        d_multiple = max(8, ref.d_model // 8)
    if min_head_dim is None:
        min_head_dim = min(32, max(8, ref.head_dim // 2))
    if target not in TOLERANCE:
        raise ConfigError(f"derive target must be 'active' or 'total', got {target!r}")
    goal = getattr(count_params(ref), target)
    tol = TOLERANCE[target] if tolerance is None else tolerance
    ratio = ffn_ratio or ref.ffn.hidden / ref.d_model
    cands = []
    lo = max(d_multiple, (ref.d_model // 2) // d_multiple * d_multiple)
    mults = [m for m in (hidden_multiple, hidden_multiple // 2, hidden_multiple // 4) if m >= 8] or [hidden_multiple]
    for D in range(lo, 2 * ref.d_model + 1, d_multiple):
        heads = _heads_for(D, ref, min_head_dim)
        if heads is None:
            continue
        base = dataclasses.replace(ref, name=name or f"dense_{target}", d_model=D, n_heads=heads[0],
                                   n_kv_heads=heads[1], ffn=FFNConfig(kind="dense", hidden=hidden_multiple))
        fixed = count_params(base)
        per_unit = 3 * D * ref.n_layers  # params per unit of FFN hidden
        h_exact = (goal - fixed.embedding - fixed.non_ffn) / per_unit
        for mult in mults:
            for h in {math.floor(h_exact / mult) * mult, math.ceil(h_exact / mult) * mult}:
                if h <= 0:
                    continue
                cfg = dataclasses.replace(base, ffn=FFNConfig(kind="dense", hidden=h))
                n = getattr(count_params(cfg), target)
                # rank: FFN shape closest to the reference's, then the coarsest rounding, then count
                cands.append(((round(abs(math.log(h / D / ratio)), 2), -mult, abs(n - goal) / goal), cfg, n))
    if not cands:
        raise ConfigError(f"budget: no dense width can match {ref.name} ({target}); check its heads")
    inside = [c for c in cands if c[0][2] <= tol]
    best = min(inside, key=lambda c: c[0]) if inside else min(cands, key=lambda c: c[0][2])
    return Match(best[1], target, goal, best[2])


def iso_width_moe(dense: ModelConfig, num_experts: int = 4, top_k: int = 2, name: Optional[str] = None,
                  **ffn_overrides) -> ModelConfig:
    """Seed 002: same d_model, ``num_experts`` experts of hidden/top_k each, top-k routing, so the
    active FFN parameters equal the dense FFN's."""
    if dense.ffn.kind != "dense":
        raise ConfigError(f"iso_width: {dense.name} must be a dense model")
    if dense.ffn.hidden % top_k:
        raise ConfigError(f"iso_width: dense hidden {dense.ffn.hidden} must be divisible by top_k={top_k}")
    ffn = FFNConfig(kind="moe", hidden=dense.ffn.hidden // top_k, num_experts=num_experts, top_k=top_k,
                    **ffn_overrides)
    cfg = dataclasses.replace(dense, name=name or f"{dense.name}_iso_moe", ffn=ffn)
    cfg.validate()
    return cfg


def soft_fixed_width(dense: ModelConfig, num_experts: int, name: Optional[str] = None,
                     **ffn_overrides) -> ModelConfig:
    """Seed 003: K always-active experts of width H/K (total FFN width fixed); K=1 is the dense model."""
    if dense.ffn.kind != "dense":
        raise ConfigError(f"soft_fixed_width: {dense.name} must be a dense model")
    H = dense.ffn.hidden
    if H % num_experts:
        raise ConfigError(f"soft_fixed_width: num_experts must divide hidden={H}; allowed: "
                          f"{[k for k in range(1, 13) if H % k == 0]}, got {num_experts}")
    ffn = FFNConfig(kind="soft", hidden=H // num_experts, num_experts=num_experts, **ffn_overrides)
    cfg = dataclasses.replace(dense, name=name or f"{dense.name}_soft{num_experts}", ffn=ffn)
    cfg.validate()
    return cfg


DERIVE_RULES = ("matched_active", "matched_total", "iso_width", "soft_fixed_width")


def derive_model(preset, name: str, raw: dict, resolve: Callable[[str], ModelConfig]) -> ModelConfig:
    """Resolve a preset entry ``{derive: <rule>, from: <model>, ...options, set: {...}}``;
    ``resolve(name)`` gives the config of the model it derives from."""
    where = f"models.{name}"
    raw = dict(raw)
    rule, src = raw.pop("derive"), raw.pop("from", None)
    overrides = raw.pop("set", None) or {}
    if rule not in DERIVE_RULES:
        raise ConfigError(f"{where}.derive: must be one of {list(DERIVE_RULES)}, got {rule!r}")
    if src is None:
        raise ConfigError(f"{where}.from: name the model to derive from; allowed: "
                          f"{[m for m in preset.models if m != name]}")
    if src == name:
        raise ConfigError(f"{where}.from: a model cannot derive from itself")
    ref = resolve(src)
    try:
        if rule in ("matched_active", "matched_total"):
            allowed = {"d_multiple", "hidden_multiple", "min_head_dim", "ffn_ratio", "tolerance"}
            _check_keys(raw, allowed, where)
            cfg = match_dense(ref, rule.split("_")[1], name=name, **raw).config
        elif rule == "iso_width":
            _check_keys(raw, {"num_experts", "top_k"}, where)
            cfg = iso_width_moe(ref, name=name, **raw)
        else:
            _check_keys(raw, {"num_experts"}, where)
            if "num_experts" not in raw:
                raise ConfigError(f"{where}.num_experts: soft_fixed_width needs the number of experts K")
            cfg = soft_fixed_width(ref, raw["num_experts"], name=name)
    except TypeError as e:  # pragma: no cover - defensive
        raise ConfigError(f"{where}: {e}") from None
    if overrides:
        solved = cfg
        cfg = model_from_dict(deep_merge(to_dict(cfg), overrides), where)
        if rule in ("matched_active", "matched_total"):
            check_match(cfg, solved, ref, rule.split("_")[1], raw.get("tolerance"), where)
    return cfg


def check_match(cfg: ModelConfig, solved: ModelConfig, ref: ModelConfig, target: str, tolerance: Optional[float],
                where: str) -> None:
    """A matched model as resolved (its ``set:`` applied, ``cfg``) within the tolerance its rule
    states (:data:`TOLERANCE`, or its own ``tolerance``) of ``ref``'s active or total parameters,
    unless its ``set:`` left the solver's count (``solved``'s) as it was (the solver's closest width
    stands when none is inside, as :func:`match_dense` says): one ConfigError line otherwise."""
    tol = TOLERANCE[target] if tolerance is None else tolerance
    got, goal = getattr(count_params(cfg), target), getattr(count_params(ref), target)
    off = (got - goal) / goal
    if abs(off) > tol and got != getattr(count_params(solved), target):
        raise ConfigError(f"{where}: {got:,} {target} parameters after its set:, {off:+.3%} from {ref.name}'s "
                          f"{goal:,}: outside the matched-{target} tolerance {tol:.1%} (a set: that changes the "
                          f"parameter count moves the model off its match; or state a wider tolerance: in the rule)")


def _check_keys(raw: dict, allowed: set, where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed | {'derive', 'from', 'set'})}")
