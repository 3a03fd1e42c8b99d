"""The map's part of the answer at a glance (:mod:`studylib.study.comparisons.glance`): the row of
its best-supported point and the joint law's row at the paper's point, and two plain sentences (where
the MoE starts to win; what the law puts at the paper's scale), from notebook 09's CSVs."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd

from studylib.study.analysis.paper import PAPER_POSITION, PAPER_TOKENS_PER_PARAM
from studylib.study.analysis.position import p_text, position_text
from studylib.study.analysis.text import ci_text
from studylib.study.comparisons.glance import GlanceRow, mean_ci, missing_row
from studylib.study.analysis.position import ROLES
from studylib.study.analysis.law.checks import ON_BOUND
from studylib.study.analysis.law.size import FORMS, clipped


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


def _on_bound(r) -> bool:
    """A prediction of :func:`~studylib.study.analysis.law.checks.paper_point` resting on a bound: a parameter held on its
    bound, or the size form's lambda(N) clipped at the paper's N."""
    return isinstance(r["reason"], str) and r["reason"].endswith(ON_BOUND)


def _law_row(paper: pd.DataFrame) -> GlanceRow:
    t = paper.set_index("quantity")

    def cell(q, fmt):
        r = t.loc[q]
        if not r["identified"]:
            return "not identified"
        said = p_text(r["estimate"], r["ci_low"], r["ci_high"]) if q == "position" else \
            ci_text(r["estimate"], r["ci_low"], r["ci_high"], fmt)
        return said + (" (on the bound)" if _on_bound(r) else "")

    return GlanceRow(f"joint law at the paper's N and D ({t.loc['decades', 'estimate']:.1f} decades beyond)",
                     "bits per byte", *(cell(f"loss_{r}", ".3f") for r in ROLES), cell("gap_active", "+.4f"),
                     cell("gap_total", "+.4f"), cell("position", ""))


def win_clause(table: pd.DataFrame) -> str:
    """Where the MoE starts to win, in one plain sentence: per gap the smallest tokens per parameter
    at which the map's family (Holm, TOST) finds the MoE better, or none up to the largest measured."""
    top = table["tokens_per_param"].max()
    if not any((table.get(f"{g}_verdict", pd.Series(dtype=object)) == "B better").any() for g in ("active", "total")):
        return f"Up to {top:.3g} tokens per parameter, the MoE beats neither dense model on the map."
    parts = []
    for gap in ("active", "total"):
        col = f"{gap}_verdict"
        wins = table[table[col] == "B better"] if col in table else table.iloc[0:0]
        if len(wins):
            w = wins.sort_values("tokens_per_param").iloc[0]
            parts.append(f"its {gap} match from {w['tokens_per_param']:.3g} tokens per parameter")
        else:
            parts.append(f"its {gap} match nowhere up to {top:.3g}")
    return "On the map, the MoE beats " + " and ".join(parts) + "."


def law_clause(paper: pd.DataFrame, other: str = "", form: str = "") -> str:
    """What the joint law puts at the paper's point (``token_budget_law_paper.csv``), or that it
    identifies nothing there; ``form``: the chosen form's name, ``other``: what another form says,
    both in parentheses (the folded detail's words; the first screen's: :func:`law_sentence`)."""
    t = paper.set_index("quantity")
    p, d = t.loc["position"], t.loc["decades", "estimate"]
    if not p["identified"]:
        return (f"{f'the joint law ({form})' if form else 'the joint law'} does not identify p at the paper's scale, "
                f"{d:.1f} decades beyond the map"
                + (f" ({other})" if other else ""))
    law = f"the joint law ({form})" if form else "the joint law"
    said = (f"carried {d:.1f} decades, {law} puts the MoE at p = "
            f"{p_text(p['estimate'], p['ci_low'], p['ci_high'])} at the paper's scale")
    if _on_bound(p):
        return said + f" (on the bound, no interval{'; ' + other if other else ''})"
    if p["ci_low"] == p["ci_low"]:
        said += f", {'which holds' if p['paper_inside'] in (True, 'True') else 'excluding'} the paper's {PAPER_POSITION:.2f}"
    return said + (f" ({other})" if other else "")


def law_sentence(paper: pd.DataFrame) -> str:
    """The first screen's plain sentence on the law at the paper's point (the form's name and the
    other forms stay in the folded detail: :func:`map_sentence`)."""
    t = paper.set_index("quantity")
    p, d = t.loc["position"], t.loc["decades", "estimate"]
    if not p["identified"]:
        return f"The law fitted to the map does not pin down p at the paper's size, {d:.1f} decades beyond it."
    said = f"Carried {d:.1f} decades to the paper's size, the law fitted to the map puts p at " + \
        p_text(p["estimate"], p["ci_low"], p["ci_high"])
    if _on_bound(p):
        return said + " (on a bound, no interval)."
    if p["ci_low"] == p["ci_low"]:
        return said + f"; {'that holds' if p['paper_inside'] in (True, 'True') else 'that excludes'} the paper's " \
                      f"{PAPER_POSITION:.2f}."
    return said + "."


#: the law forms the answer names (``token_budget_law_forms_paper.csv``'s ``form`` and the choice's),
#: as it names them
FORM_NAMES = {"lambda": "one λ", "multiplier": "λ as a multiplier", "lambda_size": "λ varying with size"}


def _other_form(forms: Optional[pd.DataFrame]) -> str:
    """``λ varying with size: p = ...``: the position at the paper's point of each named form the
    choice did not take (or "not identified"; "(on the bound)" where its lambda(N) is clipped
    there); "" without the forms' table."""
    if forms is None or not len(forms):
        return ""
    out = []
    for form, t in forms[forms["form"].isin(FORMS)].groupby("form", sort=False):
        t = t.set_index("quantity")
        if bool(t["chosen"].iloc[0]) or "position" not in t.index:
            continue
        p = t.loc["position"]
        said = (("p = " + p_text(p["estimate"], p["ci_low"], p["ci_high"]) + " (on the bound)" * clipped(t))
                if p["identified"] else "not identified")
        out.append(f"{FORM_NAMES[form]}: {said}")
    return "; ".join(out)


def chosen_form(choice: Optional[pd.DataFrame]) -> str:
    """The form leaving cells out chose (``token_budget_law_choice.csv``), named, "" without one."""
    if choice is None or "chosen" not in choice or not choice["chosen"].astype(bool).any():
        return ""
    form = choice[choice["chosen"].astype(bool)].iloc[0]["form"]
    return FORM_NAMES.get(form, form) + ", chosen"


def map_sentence(table: pd.DataFrame, paper: Optional[pd.DataFrame], forms: Optional[pd.DataFrame] = None,
                 choice: Optional[pd.DataFrame] = None) -> str:
    """The map's summary above its folded detail: where the MoE starts to win (:func:`win_clause`)
    and what the chosen law form (``choice``: ``token_budget_law_choice.csv``) puts at the paper's
    point (:func:`law_clause`), with the other named forms' positions there (``forms``:
    ``token_budget_law_forms_paper.csv``)."""
    if paper is None or not len(paper):
        return (win_clause(table) + " The joint law's answer is missing: no tables/token_budget_law_paper.csv "
                "(run notebook 09 again).")
    said = law_clause(paper, _other_form(forms), chosen_form(choice))
    return win_clause(table) + " " + said[0].upper() + said[1:] + "."


def map_glance(table: pd.DataFrame, per_seed: Optional[pd.DataFrame], paper: Optional[pd.DataFrame]
               ) -> tuple[list[GlanceRow], list[str]]:
    """(the best-supported point's row and the law's, the map's two plain sentences: where the MoE
    wins, and what the law puts at the paper's point) from ``token_budget_gaps.csv``,
    ``token_budget_per_seed.csv`` and ``token_budget_law_paper.csv``."""
    rows = []
    best = best_point(table)
    if best is not None:
        rows.append(_map_row(best, per_seed))
    if paper is not None and len(paper):
        rows.append(_law_row(paper))
    else:  # notebook 09 always writes it: missing is said, not a row dropped
        rows.append(missing_row("joint law at the paper's N and D", "tables/token_budget_law_paper.csv"))
    return rows, [win_clause(table), law_sentence(paper) if paper is not None and len(paper) else
                  "The joint law's answer is missing: no tables/token_budget_law_paper.csv (run notebook 09 again)."]


__all__ = ["FORM_NAMES", "best_point", "win_clause", "law_clause", "law_sentence", "chosen_form", "map_sentence", "map_glance"]
