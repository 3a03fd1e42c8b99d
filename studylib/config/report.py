"""``python -m studylib budget``: the parameter accounting table and the solver's matched widths."""
from __future__ import annotations

import argparse
import json

from studylib.config.accounting import count_params, ffn_label, fmt_m
from studylib.config.derive import TOLERANCE, match_dense
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
    ref_name = preset.study.reference_moe
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
