"""The map's part of the answer at a glance (:mod:`studylib.study.comparisons.glance`): the row of
its best-supported point and the joint law's row at the paper's point, and two sentences (where
the MoE starts to win; what the law predicts at the paper's scale), from notebook 09's CSVs."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd

from studylib.study.analysis.paper import PAPER_POSITION, PAPER_TOKENS_PER_PARAM
from studylib.study.analysis.position import position_text
from studylib.study.comparisons.glance import GlanceRow, ci_text, mean_ci
from studylib.study.comparisons.token_budget.knobs import ROLES


def best_point(table: pd.DataFrame) -> Optional[pd.Series]:
    """The map point (all the stories) whose tokens per parameter lie closest to the paper's
    28.9 (in log); among equals the one with more seeds, then the larger size. None without one."""
    t = table[table["active_n"].notna()] if "active_n" in table else table.iloc[0:0]
    if not len(t):
        return None
    key = pd.DataFrame({"d": (np.log(t["tokens_per_param"]) - math.log(PAPER_TOKENS_PER_PARAM)).abs().round(6),
                        "n": -t["active_n"], "size": -t["moe_active"]})
    return t.loc[key.sort_values(["d", "n", "size"]).index[0]]


def _map_row(r: pd.Series, per_seed: Optional[pd.DataFrame]) -> GlanceRow:
    losses = ["–"] * 3
    if per_seed is not None:
        cell = per_seed[(per_seed["size"] == r["size"]) & np.isclose(per_seed["epochs"], r["epochs"])]
        if "stories" in cell:
            cell = cell[cell["stories"] == 1.0]
        act, tot = cell[cell["gap"] == "active"], cell[cell["gap"] == "total"]
        losses = [mean_ci(act["dense"]), mean_ci(act["moe"]), mean_ci(tot["dense"])]
    pos = position_text(r)
    return GlanceRow(f"map: {r['size_label']}, {r['tokens_per_param']:.3g} tokens/param, {int(r['active_n'])} seeds, "
                     f"{r['data_passes']:.2g} passes", "nats (the trio's tokenizer)", *losses,
                     ci_text(r["active_mean"], r["active_ci_low"], r["active_ci_high"], "+.4f"),
                     ci_text(r["total_mean"], r["total_ci_low"], r["total_ci_high"], "+.4f"), pos)


def _law_row(paper: pd.DataFrame) -> GlanceRow:
    t = paper.set_index("quantity")

    def cell(q, fmt):
        r = t.loc[q]
        return ci_text(r["estimate"], r["ci_low"], r["ci_high"], fmt) if r["identified"] else "not identified"

    return GlanceRow(f"joint law at the paper's N and D ({t.loc['decades', 'estimate']:.1f} decades beyond)",
                     "bits per byte", *(cell(f"loss_{r}", ".3f") for r in ROLES), cell("gap_active", "+.4f"),
                     cell("gap_total", "+.4f"), cell("position", ".2f"))


def win_sentence(table: pd.DataFrame) -> str:
    """Where the MoE starts to win: per gap the smallest tokens per parameter at which the map's
    family (Holm, TOST) finds the MoE better, or none up to the largest measured."""
    top = table["tokens_per_param"].max()
    lead = f"On the map (Holm over each gap's {len(table)} points) the MoE beats "
    if not any((table.get(f"{g}_verdict", pd.Series(dtype=object)) == "B better").any() for g in ("active", "total")):
        return lead + f"neither dense match at any point up to {top:.3g} tokens per parameter."
    parts = []
    for gap, who in (("active", "active"), ("total", "total")):
        col = f"{gap}_verdict"
        wins = table[table[col] == "B better"] if col in table else table.iloc[0:0]
        if len(wins):
            w = wins.sort_values("tokens_per_param").iloc[0]
            parts.append(f"its {who} match from {w['tokens_per_param']:.3g} tokens per parameter ({w.get('size_label', w['size'])}, "
                         f"{w['data_passes']:.2g} passes)")
        else:
            parts.append(f"its {who} match at no point up to {top:.3g}")
    return lead + " and ".join(parts) + "."


def law_sentence(paper: pd.DataFrame) -> str:
    """What the joint law says at the paper's point, or why it says nothing."""
    t = paper.set_index("quantity")
    p, d = t.loc["position"], t.loc["decades", "estimate"]
    if not p["identified"]:
        return f"The joint law is not carried to the paper's scale ({d:.1f} decades beyond the map): {p['reason']}."
    inside = ("" if p["ci_low"] != p["ci_low"] else
              f", {'inside' if p['paper_inside'] in (True, 'True') else 'outside'} of which lies the paper's "
              f"{PAPER_POSITION:.2f}")
    return (f"Carried {d:.1f} decades beyond the largest model measured, the joint law puts the MoE at p = "
            f"{ci_text(p['estimate'], p['ci_low'], p['ci_high'], '.2f')} at the paper's scale{inside}.")


def map_glance(table: pd.DataFrame, per_seed: Optional[pd.DataFrame], paper: Optional[pd.DataFrame]
               ) -> tuple[list[GlanceRow], list[str]]:
    """(the best-supported point's row and the law's, the two sentences) from
    ``token_budget_gaps.csv``, ``token_budget_per_seed.csv`` and ``token_budget_law_paper.csv``."""
    rows, lead = [], [win_sentence(table)]
    best = best_point(table)
    if best is not None:
        rows.append(_map_row(best, per_seed))
    if paper is not None and len(paper):
        rows.append(_law_row(paper))
        lead.append(law_sentence(paper))
    return rows, lead


__all__ = ["best_point", "win_sentence", "law_sentence", "map_glance"]
