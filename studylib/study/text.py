"""Computed sentences: the headline verdict, the collapse summary and the generations as
readable text (the notebooks print them; the numbers come from :mod:`studylib.study.tables`,
:mod:`studylib.study.routing` and :mod:`studylib.study.probes`)."""
from __future__ import annotations

import math

import pandas as pd

from studylib.study.paper import PAPER_GAPS


def _gap_sentence(label: str, mean: float, std: float, n: int, paper: float) -> str:
    """One gap against the paper's: its sign, and whether it exceeds its seed std."""
    if math.isnan(std):
        return f"The {label} is {mean:+.4f} (one seed: no std; paper {paper:+.4f}). "
    if mean > std:
        how = "positive as in the paper, and larger than its seed std"
    elif mean > 0:
        how = "positive as in the paper, but within its seed std"
    elif -mean > std:
        how = "reversed, by more than its seed std"
    else:
        how = "reversed, but within its seed std"
    return f"The {label} is {mean:+.4f} ± {std:.4f} over {n} seeds (paper {paper:+.4f}): {how}. "


def verdict(o: dict, preset_name: str = "") -> str:
    """One paragraph stating the outcome of :func:`studylib.study.tables.ordering` in words (each
    gap's sign against the paper's, and whether it is larger than its seed std)."""
    names = list(o["means"])
    where = f" in preset {preset_name!r}" if preset_name else ""
    s = (f"The paper's ordering {names[0]} > {names[1]} > {names[2]} (best validation loss) "
         f"{'HOLDS' if o['holds'] else 'does NOT hold'}{where}: "
         + ", ".join(f"{m} {v:.4f}" for m, v in o["means"].items()) + ". ")
    for k, label in (("active", "matched-active gap"), ("total", "matched-total gap")):
        s += _gap_sentence(label, o[f"{k}_gap"], o[f"{k}_gap_std"], o[f"{k}_gap_n"], PAPER_GAPS[k][0])
    return s.strip()


def collapse_sentence(col: pd.DataFrame, threshold: float = 0.9) -> str:
    """Which variants of a :func:`studylib.study.routing.collapse_table` have a layer collapsed
    (busiest share >= threshold) at the end."""
    if col.empty:
        return "No routed layers."
    parts = []
    for m, g in col.groupby("model", sort=False):
        n = int(g["collapsed_at_end"].sum())
        first = g["first_collapse_step"].min()
        parts.append(f"{m}: {n}/{len(g)} layer(s) collapsed at the end"
                     + ("" if math.isnan(first) else f" (first collapse at step {int(first)})")
                     + f", max busiest {g['max_busiest'].max():.2f}")
    return f"Collapse (one expert >= {threshold:.0%} of assignments): " + "; ".join(parts) + "."


def format_generations(gens: pd.DataFrame) -> str:
    """Generations as readable text: each prompt, then each model's continuation."""
    lines = []
    for p, g in gens.groupby("prompt", sort=False):
        lines.append(f"PROMPT: {p}")
        for _, r in g.iterrows():
            lines.append(f"  [{r['model']}] {p}{'' if r['continuation'].startswith(' ') else ' '}"
                         f"{r['continuation'].strip()}")
        lines.append("")
    return "\n".join(lines)
