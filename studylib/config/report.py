"""``python -m studylib budget``: the parameter accounting table and the solver's matched widths."""
from __future__ import annotations

import argparse
import json

from studylib.config.accounting import count_params, ffn_label, fmt_m
from studylib.config.derive import TOLERANCE
from studylib.config.presets import Preset, load_preset


def add_cli(p: argparse.ArgumentParser) -> None:
    p.add_argument("params", help="preset YAML, e.g. params/paper.yaml")
    p.add_argument("--models", nargs="+", help="model names (default: the preset's headline models)")
    p.add_argument("--all", action="store_true", help="every model of the preset")
    p.add_argument("--json", action="store_true", help="print the accounting as JSON")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset value")


def headline_models(preset: Preset) -> list[str]:
    return list(preset.study.headline or preset.model_names())  # names checked when the preset loaded


def run_cli(args) -> int:
    preset = load_preset(args.params, args.set)
    names = args.models or (preset.model_names() if args.all else headline_models(preset))
    cfgs = [preset.model_config(n) for n in names]
    counts = [count_params(c) for c in cfgs]
    if args.json:
        print(json.dumps([c.as_dict() for c in counts], indent=2))
        return 0
    print(f"Parameter accounting, preset {preset.name!r} (data.vocab_size {preset.data.vocab_size:,}; a model "
          f"with a vocabulary of its own trains on a tokenizer of that size)\n")
    head = f"{'model':<22}{'vocab':>7}{'d_model':>8}{'heads':>7}{'FFN':>26}{'FFN/d':>7}{'embedding':>11}{'emb/act':>8}" \
           f"{'non-FFN':>9}{'FFN/expert':>12}{'router':>8}{'total / active':>20}"
    print(head)
    print("-" * len(head))
    for c, n in zip(cfgs, counts):
        ffn = ffn_label(c)
        print(f"{c.name:<22}{c.vocab_size:>7,}{c.d_model:>8}{f'{c.n_heads}/{c.n_kv_heads}':>7}{ffn:>26}"
              f"{c.ffn.hidden / c.d_model:>7.2f}{fmt_m(n.embedding):>11}{n.embedding / n.active:>8.3f}"
              f"{fmt_m(n.non_ffn):>9}{fmt_m(n.ffn_total):>12}{n.router:>8,}"
              f"{fmt_m(n.total) + ' / ' + fmt_m(n.active):>20}")
    for ref, matches in solved_matches(preset, names).items():
        r = preset.model_config(ref)
        print(f"\nBudget solver for {ref} (vocab {r.vocab_size:,}, d_model {r.d_model}; tolerance: active "
              f"{TOLERANCE['active']:.1%}, total {TOLERANCE['total']:.1%}, unless the rule sets one):")
        for name, target in matches:
            c, n = preset.model_config(name), getattr(count_params(preset.model_config(name)), target)
            goal = getattr(count_params(r), target)
            print(f"  {name:<16} matched-{target:<6} d_model {c.d_model} ({c.d_model / r.d_model:.2f}x), heads "
                  f"{c.n_heads}/{c.n_kv_heads}, hidden {c.ffn.hidden} (FFN/d {c.ffn.hidden / c.d_model:.2f}): "
                  f"{n:,} vs {goal:,} ({(n - goal) / goal:+.3%})")
    return 0


def solved_matches(preset: Preset, names) -> dict:
    """``{MoE: [(dense model, "active" | "total")]}``: the preset's dense models solved by a
    ``matched_active`` / ``matched_total`` rule from a model among ``names`` (or that are among them)."""
    out: dict = {}
    for m, raw in preset.models.items():
        rule = raw.get("derive") if isinstance(raw, dict) else None
        if rule in ("matched_active", "matched_total") and (raw.get("from") in names or m in names):
            out.setdefault(raw["from"], []).append((m, rule.split("_")[1]))
    return out
