"""The headline's part of the answer at a glance (:mod:`studylib.study.comparisons.glance`): its
row and the paper's (each model's loss, both gaps, the position, 95% CIs) and one sentence, from
``headline_gaps.csv`` and ``table6_per_seed.csv`` as notebook 03 writes them."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd

from studylib.study.analysis.paper import (PAPER_GAPS, PAPER_HEADLINE_TOKENS, PAPER_POSITION, PAPER_TABLE6,
                                           PAPER_TOKENS_PER_PARAM)
from studylib.study.analysis.position import position_row, position_text
from studylib.study.comparisons.glance import GlanceRow, ci_text, mean_ci, read_table

#: notebook 03's per-seed losses (seed index; the trio's three models; active_gap, total_gap)
PER_SEED = "table6_per_seed"


def paper_row() -> GlanceRow:
    """The paper's Tables 2 and 6: three seeds at 28.9 tokens per active parameter."""
    t = PAPER_TABLE6
    da, moe, dt = (t.iloc[:, i] for i in range(3))
    return GlanceRow(f"paper: 14.77M active, {PAPER_TOKENS_PER_PARAM:.1f} tokens/param "
                     f"({PAPER_HEADLINE_TOKENS / 1e6:.1f}M), {len(t)} seeds", "nats (vocabulary 30,008)",
                     mean_ci(da), mean_ci(moe), mean_ci(dt),
                     f"{PAPER_GAPS['active'][0]:+.4f} ± {PAPER_GAPS['active'][1]:.4f} sd",
                     f"{-PAPER_GAPS['total'][0]:+.4f} ± {PAPER_GAPS['total'][1]:.4f} sd",
                     position_text(position_row(da - moe, dt - moe)))


def _verdict(row) -> str:
    """A family row's verdict; without one (an older table), from resolved and the sign."""
    v = row.get("verdict")
    if not isinstance(v, str):
        v = "inconclusive" if not bool(row["resolved"]) else ("A better" if row["mean"] > 0 else "B better")
    return v


def _within(row) -> str:
    """`` (within ±m nats)`` where the row's verdict is equivalence, else ""."""
    return f" (within ±{float(row['margin']):g} nats)" if _verdict(row) == "equivalent" else ""


def _phrase(row, moe_is_b: bool) -> str:
    """How the MoE stands against one match, in plain words: a family row's verdict ("A better",
    "B better", "equivalent", "inconclusive"; without one, resolved and the sign)."""
    v = _verdict(row)
    if v == "equivalent":
        return "as good as"
    if v == "inconclusive":
        return "not told apart from"
    return "ahead of" if (v == "B better") == moe_is_b else "behind"


def headline_glance(out_dir: Path, gaps: pd.DataFrame, summary: Optional[dict]) -> tuple[list[GlanceRow], list[str]]:
    """(the headline's row and the paper's, its two sentences) from notebook 03's tables (``gaps``:
    ``headline_gaps.csv`` indexed active, total); ``summary``: one headline MoE run's summary
    (tokens, active parameters, vocabulary)."""
    act, tot = gaps.loc["active"], gaps.loc["total"]
    tpp = (summary["tokens"] / summary["params"]["active"]) if summary and "params" in summary else float("nan")
    vocab = (summary or {}).get("data", {}).get("vocab_size")
    n = int(min(act["n"], tot["n"]))
    budget = f"{tpp:.3g} tokens/param, " if tpp == tpp else ""
    point = f"headline: {act['b']}, {budget}{n} seeds"
    t = read_table(out_dir, PER_SEED, (act["a"], act["b"], tot["b"]), index_col=0)
    pos = "–"
    if t is not None:
        t = t[pd.to_numeric(t.index, errors="coerce").notna()]  # the seeds' rows (then mean, std, ci_low, ci_high)
        da, moe, dt = (t[c] for c in (act["a"], act["b"], tot["b"]))
        pos = position_text(position_row(da - moe, dt - moe))
        rows = [GlanceRow(point, f"nats (vocabulary {vocab:,})" if vocab else "nats", mean_ci(da), mean_ci(moe),
                          mean_ci(dt), ci_text(act["mean"], act["ci_low"], act["ci_high"], "+.4f"),
                          ci_text(-tot["mean"], -tot["ci_high"], -tot["ci_low"], "+.4f"), pos)]
    else:  # the gaps are there, the per-seed losses not: the row says so (its gaps from the gaps' table)
        rows = [GlanceRow(f"{point} (no tables/{PER_SEED}.csv: losses and p not computed)", "nats",
                          gap_active=ci_text(act["mean"], act["ci_low"], act["ci_high"], "+.4f"),
                          gap_total=ci_text(-tot["mean"], -tot["ci_high"], -tot["ci_low"], "+.4f"))]
    rows.append(paper_row())
    at = f"p = {pos}" if pos[0].isdigit() or pos[0] == "-" else "p not computed"
    where = f"{tpp:.3g} training tokens per parameter" if tpp == tpp else "the headline's budget"
    lead = [f"At {where} ({n} seeds), the MoE is {_phrase(act, moe_is_b=True)} the dense model with its active "
            f"parameters{_within(act)}.",
            f"It is {_phrase(tot, moe_is_b=False)} the dense model with its total parameters{_within(tot)}: {at}, "
            f"where the paper found {PAPER_POSITION:.2f} at {PAPER_TOKENS_PER_PARAM:.1f}."]
    return rows, lead


__all__ = ["PER_SEED", "paper_row", "headline_glance"]
