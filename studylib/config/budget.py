"""Exact parameter accounting from a config, and the budget solvers.

Accounting (SPEC Table 5): ``embedding`` (tied, V*D), ``non_ffn`` (attention projections, the two
RMSNorms of each layer and the final norm), ``ffn_total`` (dense FFNs + every expert),
``router`` (D*E per routed layer, reported separately), ``total`` (everything stored) and
``active`` (embedding + non-FFN + router + the FFN path one token uses: the dense FFN, k of E
experts, or all K soft experts). ``count_params(cfg)`` equals ``sum(p.numel())`` of the built model.

Solvers: :func:`match_dense` finds dense widths (d_model, heads, FFN hidden) whose active (or total)
count matches a reference model; :func:`iso_width_moe` (seed 002) and :func:`soft_fixed_width`
(seed 003) build the by-construction variants. Presets use them through ``derive`` entries.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Optional

from studylib.config.schema import ConfigError, FFNConfig, ModelConfig, Preset, deep_merge, model_from_dict, to_dict

# --------------------------------------------------------------------------------------------
# accounting
# --------------------------------------------------------------------------------------------
FIELDS = ("embedding", "non_ffn", "ffn_total", "router", "total", "active")


@dataclass(frozen=True)
class ParamCount:
    name: str
    embedding: int
    non_ffn: int
    ffn_total: int
    ffn_active: int
    router: int

    @property
    def total(self) -> int:
        return self.embedding + self.non_ffn + self.ffn_total + self.router

    @property
    def active(self) -> int:
        return self.embedding + self.non_ffn + self.ffn_active + self.router

    def as_dict(self) -> dict:
        return {"name": self.name, **{k: int(getattr(self, k)) for k in FIELDS}}


def ffn_params(d_model: int, f: FFNConfig) -> tuple[int, int, int]:
    """(stored FFN/expert params, params one token uses, router params) of one layer."""
    one = 3 * d_model * f.hidden  # SwiGLU: gate, up (D x H each) and down (H x D)
    if f.kind == "dense":
        return one, one, 0
    router = d_model * f.num_experts
    used = f.num_experts if f.kind == "soft" else f.top_k
    return one * f.num_experts, one * used, router


def count_params(cfg: ModelConfig) -> ParamCount:
    D, L = cfg.d_model, cfg.n_layers
    attn = D * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim + cfg.n_heads * cfg.head_dim * D
    non_ffn = L * (attn + 2 * D) + D
    ffn_total = ffn_active = router = 0
    for layer in range(L):
        t, a, r = ffn_params(D, cfg.ffn_for_layer(layer))
        ffn_total, ffn_active, router = ffn_total + t, ffn_active + a, router + r
    return ParamCount(cfg.name, cfg.vocab_size * D, non_ffn, ffn_total, ffn_active, router)


def fmt_m(n: int) -> str:
    """Millions at the paper's displayed precision (two decimals)."""
    return f"{n / 1e6:.2f}M"


def ffn_label(cfg: ModelConfig) -> str:
    """Short description of a model's FFN: ``dense 1120``, ``4x1024 top-2``, ``soft 4x432``."""
    f = cfg.ffn
    if f.kind == "dense":
        return f"dense {f.hidden}"
    return f"{f.num_experts}x{f.hidden} top-{f.top_k}" if f.kind == "moe" else f"soft {f.num_experts}x{f.hidden}"


# --------------------------------------------------------------------------------------------
# solvers
# --------------------------------------------------------------------------------------------
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
    for A in prefs:
        if A >= min_head_dim and A % 2 == 0 and d_model % A == 0 and (d_model // A) % G == 0:
            return d_model // A, G
    return None


def match_dense(
    ref: ModelConfig,
    target: str = "active",
    *,
    name: Optional[str] = None,
    d_multiple: int = 32,
    hidden_multiple: int = 32,
    min_head_dim: int = 32,
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
    """
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


def derive_model(preset: Preset, name: str, raw: dict) -> ModelConfig:
    """Resolve a preset entry ``{derive: <rule>, from: <model>, ...options, set: {...}}``."""
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
    ref = preset.model_config(src)
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
        cfg = model_from_dict(deep_merge(to_dict(cfg), overrides), where)
    return cfg


def _check_keys(raw: dict, allowed: set, where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed | {'derive', 'from', 'set'})}")


# --------------------------------------------------------------------------------------------
# CLI: python -m studylib budget params/paper.yaml [--json]
# --------------------------------------------------------------------------------------------
def add_cli(p: argparse.ArgumentParser) -> None:
    p.add_argument("params", help="preset YAML, e.g. params/paper.yaml")
    p.add_argument("--models", nargs="+", help="model names (default: the preset's headline models)")
    p.add_argument("--all", action="store_true", help="every model of the preset")
    p.add_argument("--json", action="store_true", help="print the accounting as JSON")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset value")


def headline_models(preset: Preset) -> list[str]:
    names = preset.study.get("headline") or preset.model_names()
    missing = [n for n in names if n not in preset.models]
    if missing:
        raise ConfigError(f"study.headline: unknown model(s) {missing}; allowed: {preset.model_names()}")
    return list(names)


def run_cli(args) -> int:
    from studylib.config.schema import load_preset

    preset = load_preset(args.params, args.set)
    names = args.models or (preset.model_names() if args.all else headline_models(preset))
    cfgs = [preset.model_config(n) for n in names]
    counts = [count_params(c) for c in cfgs]
    if args.json:
        print(json.dumps([c.as_dict() for c in counts], indent=2))
        return 0
    print(f"Parameter accounting, preset {preset.name!r} (vocab {preset.data.vocab_size:,})\n")
    head = f"{'model':<22}{'d_model':>8}{'heads':>7}{'FFN':>26}{'embedding':>11}{'non-FFN':>9}" \
           f"{'FFN/expert':>12}{'router':>8}{'total / active':>20}"
    print(head)
    print("-" * len(head))
    for c, n in zip(cfgs, counts):
        ffn = ffn_label(c)
        print(f"{c.name:<22}{c.d_model:>8}{f'{c.n_heads}/{c.n_kv_heads}':>7}{ffn:>26}{fmt_m(n.embedding):>11}"
              f"{fmt_m(n.non_ffn):>9}{fmt_m(n.ffn_total):>12}{n.router:>8,}"
              f"{fmt_m(n.total) + ' / ' + fmt_m(n.active):>20}")
    ref_name = preset.study.get("reference_moe")
    routed = [c for c in cfgs if c.ffn.kind == "moe" and (ref_name is None or c.name == ref_name)]
    for ref in routed:
        print(f"\nBudget solver for {ref.name} (tolerance: active {TOLERANCE['active']:.1%}, "
              f"total {TOLERANCE['total']:.1%}):")
        for target in ("active", "total"):
            m = match_dense(ref, target)
            c = m.config
            print(f"  matched-{target:<6} d_model {c.d_model}, heads {c.n_heads}/{c.n_kv_heads}, "
                  f"hidden {c.ffn.hidden}: {m.params:,} vs {m.target_params:,} ({m.rel_mismatch:+.3%})")
    return 0
