"""Computed sentences: every comparison between models in words, the headline outcome, the
collapse summary and the generations as readable text (the notebooks print them; the numbers
come from :mod:`studylib.study.analysis.tables`, :mod:`studylib.study.analysis.routing` and :mod:`studylib.study.analysis.probes`).

One rule for every comparison: a notebook's comparisons are judged together as a *family*
(:func:`studylib.study.analysis.stats.family`, built by
:func:`studylib.study.analysis.tables.comparison_table`), and each sentence is worded from the
family's adjusted statistics by :func:`studylib.study.analysis.stats.verdict_words`: a difference is
*resolved* only when its Holm-adjusted p is below 0.05 ("B better than A by ..."), else the two
models are "equivalent within ±margin" when the Holm-adjusted TOST says so, else the comparison is
"inconclusive". A row without the family's columns (a :class:`~studylib.study.analysis.stats.Paired`,
an older table) is worded from its 95% CI alone (:func:`gap_phrase`). Where it is natural, a
sentence says what the result does not show (:func:`limits`).
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

import pandas as pd

from studylib.study.analysis.paper import PAPER_GAPS
from studylib.study.analysis.stats import A_BETTER, B_BETTER, EQUIVALENT, VERDICTS, Paired, verdict_words


def _paired_of(row) -> Paired:
    """A :class:`Paired` from a comparison row (:func:`studylib.study.analysis.tables.comparison_table`) or
    a :func:`studylib.study.analysis.frames.paired_gaps` dict, or the Paired itself."""
    if isinstance(row, Paired):
        return row
    get = row.get if isinstance(row, Mapping) else row.__getitem__
    return Paired(float(get("mean")), float(get("std")), int(get("n")), float(get("ci_low")),
                  float(get("ci_high")), float(get("p")))


def _has_verdict(row) -> bool:
    """Whether a row carries its family's verdict (:func:`studylib.study.analysis.stats.family`)."""
    if isinstance(row, Paired):
        return False
    keys = row.keys() if isinstance(row, Mapping) else row.index
    return "verdict" in keys and row["verdict"] in VERDICTS and "p_holm" in keys


def gap_phrase(gap, a: str, b: str, digits: int = 4) -> str:
    """The paired gap ``a - b`` of a loss (lower is better) in words. A row of a family
    (:func:`studylib.study.analysis.tables.comparison_table`, with ``verdict``, ``p_holm``,
    ``p_tost_holm``) is worded from its verdict by :func:`studylib.study.analysis.stats.verdict_words`
    ("B better than A by ...", "A and B equivalent within ±0.03 nats: ...", "inconclusive: ...").
    Anything else (a :class:`Paired`, a ``paired_gaps`` dict, a row without the family's columns)
    is worded from its 95% CI alone:

    * resolved: "``b`` ahead of ``a`` by 0.0120 [0.0040, 0.0200], resolved (95% CI excludes 0; n=3
      seeds, p=0.01)" (the interval is the winner's advantage);
    * not resolved: "``a`` − ``b`` = +0.0050, not resolved: the 95% CI [-0.0100, +0.0200] includes 0 (n=3 seeds)";
    * one seed: no interval, so not resolved.

    ``gap``: a :class:`Paired`, a comparison-table row or a ``paired_gaps`` dict."""
    if _has_verdict(gap):
        return verdict_words(gap, a, b, digits)
    p = _paired_of(gap)
    f = f"{{:.{digits}f}}"
    sf = f"{{:+.{digits}f}}"
    seeds = f"n={p.n} seed{'s' if p.n != 1 else ''}"
    if p.n < 2:
        return (f"{a} − {b} = {sf.format(p.mean)} from one seed: no interval, so not resolved")
    if p.resolved:
        lo, hi, winner, loser = (p.ci_low, p.ci_high, b, a) if p.mean > 0 else (-p.ci_high, -p.ci_low, a, b)
        return (f"{winner} ahead of {loser} by {f.format(abs(p.mean))} [{f.format(lo)}, {f.format(hi)}], "
                f"resolved (95% CI excludes 0; {seeds}, p={p.p:.2g})")
    return (f"{a} − {b} = {sf.format(p.mean)}, not resolved: the 95% CI [{sf.format(p.ci_low)}, "
            f"{sf.format(p.ci_high)}] includes 0 ({seeds})")


def verdict_label(row, a: str, b: str, unit: str = "nats") -> str:
    """A family row's verdict in a few words: "<a> better", "<b> better", "equivalent within
    ±0.03 nats" or "inconclusive" (:func:`studylib.study.analysis.stats.family`)."""
    v = row["verdict"]
    if v == A_BETTER:
        return f"{a} better"
    if v == B_BETTER:
        return f"{b} better"
    if v == EQUIVALENT:
        return f"equivalent within ±{float(row['margin']):g}{' ' + unit if unit else ''}"
    return "inconclusive"


def family_lead(table: pd.DataFrame) -> str:
    """What a family's sentences rest on, one clause per family in ``table`` (its ``family``
    column): 'Family "02 routing ablation: ..." (4 comparisons; Holm-corrected over 4; equivalence:
    TOST within ±0.03 nats): 2 second model better, 1 equivalent, 1 inconclusive.' Empty for a table without
    the family's columns."""
    if "verdict" not in table or "family" not in table or table.empty:
        return ""
    out = []
    for name, g in table.groupby("family", sort=False):
        if not isinstance(name, str) or not name:  # an unnamed family: its sentences say the rest
            continue
        m = int(g["family_size"].max())
        adj = "judged on its own, no correction" if m <= 1 else f"Holm-corrected over {m}"
        words = {A_BETTER: "first model better", B_BETTER: "second model better"}
        counts = ", ".join(f"{(g['verdict'] == v).sum()} {words.get(v, v)}" for v in VERDICTS
                           if (g["verdict"] == v).any())
        out.append(f'Family "{name}" ({len(g)} comparison{"s" if len(g) != 1 else ""}; {adj}; equivalence: '
                   f"TOST within ±{float(g['margin'].iloc[0]):g} nats): {counts}.")
    return " ".join(out)


def comparison_sentences(table: pd.DataFrame, digits: int = 4, lead: bool = True) -> str:
    """One sentence per row of a :func:`studylib.study.analysis.tables.comparison_table` (the row's ``a``
    against its ``b``, by :func:`gap_phrase`: from the family's verdict where the table has one),
    after the family's :func:`family_lead` (``lead=False``: without it)."""
    head = family_lead(table) if lead else ""
    body = " ".join(f"{gap_phrase(r, r['a'], r['b'], digits)}." for _, r in table.iterrows())
    return f"{head} {body}" if head else body


def limits(n_seeds: int, tokens: Optional[float] = None, what: str = "") -> str:
    """What a comparison over ``n_seeds`` seeds at one budget (``tokens`` target tokens per run)
    does not show. ``what`` adds a study-specific sentence."""
    if n_seeds < 2:
        s = "with one seed there is no interval: nothing here is resolved, and seed-to-seed noise is unmeasured"
    elif n_seeds < 5:
        s = (f"with n={n_seeds} seeds the paired t interval has {n_seeds - 1} degree"
             f"{'s' if n_seeds > 2 else ''} of freedom, so only large, consistent gaps resolve; an "
             "inconclusive gap is not evidence of no difference")
    else:
        s = (f"with n={n_seeds} seeds an inconclusive gap is not evidence of no difference, only that any "
             "difference is smaller than the interval's far end (only \"equivalent\" says the models are "
             "within the margin)")
    if tokens is not None:
        s += (f". Every run saw one budget ({int(tokens):,} target tokens) at one model size: nothing "
              "here says how the gaps move with more data or larger models")
    return f"What this does not show: {s}." + (f" {what}" if what else "")


def paper_clause(gap, paper: float) -> str:
    """Where the paper's value of a gap lies against this gap's 95% CI (same sign convention):
    inside it, or above / below it (then the interval rules the paper's value out). Empty without
    an interval."""
    p = _paired_of(gap)
    if p.n < 2 or math.isnan(p.ci_low):
        return ""
    if p.ci_low <= paper <= p.ci_high:
        return f"; the paper's {paper:+.4f} lies inside this interval"
    if paper > p.ci_high:
        what = "a gap as large as the paper's is ruled out here" if paper > 0 else "the paper's value is ruled out here"
        return f"; the paper's {paper:+.4f} lies above this interval, so {what}"
    what = "the gap here is larger than the paper's" if paper >= 0 else "the paper's value is ruled out here"
    return f"; the paper's {paper:+.4f} lies below this interval, so {what}"


def headline_verdict(gaps: pd.DataFrame, dense_active: str, moe: str, dense_total: str,
                     preset_name: str = "", tokens: Optional[float] = None) -> str:
    """The headline outcome from :func:`studylib.study.analysis.tables.headline_gaps`: each gap in words
    (:func:`gap_phrase`: its verdict, judged on its own, the two gaps being pre-registered; "equivalent
    within ±margin" where the TOST says so) next to the paper's, whether the paper's ordering
    dense_active > moe > dense_total (in loss) is reproduced (both gaps resolved in the paper's
    direction), contradicted (a gap resolved in the opposite direction) or not established, and
    what it does not show."""
    where = f" in preset {preset_name!r}" if preset_name else ""
    act, tot = gaps.loc["active"], gaps.loc["total"]
    pa, pt = PAPER_GAPS["active"], PAPER_GAPS["total"]
    s = (f"Matched-active gap ({dense_active} − {moe}){where}: {gap_phrase(act, dense_active, moe)}; "
         f"paper: the MoE ahead by {pa[0]:.4f} ± {pa[1]:.4f} (3 seeds){paper_clause(act, pa[0])}. "
         f"Matched-total gap ({moe} − {dense_total}): {gap_phrase(tot, moe, dense_total)}; "
         f"paper: the dense total-match ahead by {pt[0]:.4f} ± {pt[1]:.4f}{paper_clause(tot, pt[0])}. ")
    agree = [bool(r["resolved"]) and r["mean"] > 0 for r in (act, tot)]
    against = [k for k, r in (("matched-active", act), ("matched-total", tot)) if bool(r["resolved"]) and r["mean"] < 0]
    order = f"{dense_active} > {moe} > {dense_total} (in loss)"
    if all(agree):
        s += f"The paper's ordering {order} is reproduced: both gaps are resolved in the paper's direction. "
    elif against:
        s += (f"The paper's ordering {order} is contradicted: the {' and the '.join(against)} gap"
              f"{'s are' if len(against) > 1 else ' is'} resolved in the opposite direction. ")
    else:
        open_ = [(k, r) for k, r, ok in (("matched-active", act, agree[0]), ("matched-total", tot, agree[1]))
                 if not ok]
        s += (f"The paper's ordering {order} is not established here: the {' and the '.join(k for k, _ in open_)} "
              f"gap{'s are' if len(open_) > 1 else ' is'} not resolved")
        equiv = [k for k, r in open_ if _has_verdict(r) and r["verdict"] == EQUIVALENT]
        if equiv:
            m = float((act if equiv[0] == "matched-active" else tot)["margin"])
            s += (f" ({' and the '.join(equiv)} gap{'s' if len(equiv) > 1 else ''}: the models are equivalent "
                  f"within ±{m:g} nats, by the TOST)")
        s += ". "
    return s + limits(int(min(act["n"], tot["n"])), tokens,
                      "The paper's own curves span 40.5M to 426.3M tokens per run.")


def _count(n) -> str:
    return "more than 1,000" if n is None or pd.isna(n) else f"{int(n)}"


def power_sentences(power: pd.DataFrame) -> str:
    """One sentence per row of a :func:`studylib.study.analysis.tables.power_table`: the measured per-seed
    std of the gap, the CI half-width it gives now, the seeds a half-width of ``target`` needs and
    the seeds that resolve the paper's effect with 80% power (at the measured std, and at the
    std's 95% upper bound, since a std from few seeds is itself uncertain)."""
    out = []
    for label, r in power.iterrows():
        if r["n"] < 2 or pd.isna(r["std"]):
            out.append(f"{label}: one seed, so its noise is unmeasured and nothing can be planned from it.")
            continue
        s = (f"{label}: per-seed std of the gap {r['std']:.4f} (95% upper bound {r['std_high']:.4f}, "
             f"n={int(r['n'])}), so {int(r['n'])} seeds give a 95% CI of ±{r['half_width']:.4f}; "
             f"±{r['target']:.2f} takes {_count(r['seeds_target'])} seeds "
             f"({_count(r['seeds_target_high'])} at the upper bound)")
        if not pd.isna(r["effect"]):
            s += (f", and resolving a true gap of {r['effect']:.4f} (the paper's) with 80% power takes "
                  f"{_count(r['seeds_effect'])} ({_count(r['seeds_effect_high'])})")
        out.append(s + ".")
    return " ".join(out)


def collapse_sentence(col: pd.DataFrame, threshold: float = 0.9) -> str:
    """Which variants of a :func:`studylib.study.analysis.routing.collapse_table` have a layer collapsed
    (busiest share >= threshold) at the end (with a ``seed`` column: layers of all seeds' runs)."""
    if col.empty:
        return "No routed layers."
    parts = []
    for m, g in col.groupby("model", sort=False):
        n = int(g["collapsed_at_end"].sum())
        first = g["first_collapse_step"].min()
        runs = f" over {g['seed'].nunique()} seeds" if "seed" in g else ""
        parts.append(f"{m}: {n}/{len(g)} layer(s){runs} collapsed at the end"
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


def ci_text(mean: float, low: float = math.nan, high: float = math.nan, fmt: str = "+.3f") -> str:
    """``+0.003 [-0.016, +0.021]``; the mean alone without an interval; "–" without a number."""
    if mean is None or mean != mean:
        return "–"
    s = f"{mean:{fmt}}"
    return s if low is None or low != low else f"{s} [{low:{fmt}}, {high:{fmt}}]"


