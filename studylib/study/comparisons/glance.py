"""The answer at a glance: the report's first screen and the README's answer (issue #40).

One table of the three models' losses, the two gaps and the MoE's position between its matches,
each with its 95% CI, the paper's values beside them (:class:`GlanceRow`, one per point: the
headline, the paper, the map's best-supported point, the joint law at the paper's point), at most
short sentences of :data:`MAX_WORDS` words together (:class:`~.base.Answer`'s ``lead``), and the
key figure. Each comparison fills its own rows and sentences from its tables
(:mod:`.headline`, :mod:`.token_budget`); the runner lays them out (:func:`glance_markdown`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from studylib.config import ConfigError
from studylib.study.analysis.text import ci_text

#: the sentences of the first screen: short ones (each at most :data:`MAX_SENTENCE_WORDS` words, one
#: claim each, in plain words: the methods' names stay in the folded detail), at most
#: :data:`MAX_SENTENCES` of them and :data:`MAX_WORDS` words together
MAX_SENTENCES, MAX_SENTENCE_WORDS, MAX_WORDS = 8, 30, 145
#: the README's answer: the same sentences and a pointer, at most this many words
README_WORDS = 150


def mean_ci(values: Sequence[float], fmt: str = ".3f") -> str:
    """A sample's mean with its t 95% CI (:func:`studylib.study.analysis.stats.paired` of the values)."""
    from studylib.study.analysis.stats import paired

    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if not len(v):
        return "–"
    if len(v) < 2:
        return f"{v[0]:{fmt}}"
    p = paired(v)
    return ci_text(p.mean, p.ci_low, p.ci_high, fmt)


def read_table(out_dir: Path, name: str, columns: Sequence[str] = (), **read_csv) -> Optional[pd.DataFrame]:
    """``tables/<name>.csv`` under the preset's outputs ``out_dir`` as its notebook wrote it, for the
    answer: None when it is not there (the answer says what is missing); a file that is not a
    table, was cut mid-row (its last line unfinished: a notebook's table ends in a newline) or lacks
    one of ``columns`` is one ConfigError line naming it (a table of another version, cut short, or
    edited by hand), never a KeyError or an answer that drops its row."""
    path = Path(out_dir) / "tables" / f"{name}.csv"
    if not path.is_file():
        return None
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        raise ConfigError(f"{path}: cut mid-row (its last line is unfinished; a table its notebook writes ends in a "
                          f"newline); run the notebook again or delete the file")
    try:
        t = pd.read_csv(path, **read_csv)
    except (ValueError, UnicodeDecodeError) as e:  # pandas' ParserError and EmptyDataError are ValueErrors
        raise ConfigError(f"{path}: not a table its notebook writes ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:160]}); run the notebook again or delete the file") from None
    lacking = [c for c in columns if c not in t.columns]
    if lacking:
        raise ConfigError(f"{path}: lacks the column(s) {lacking} its notebook writes (its header: "
                          f"{list(t.columns)[:8]}{' ...' if len(t.columns) > 8 else ''}); run the notebook again or "
                          f"delete the file")
    return t


@dataclass(frozen=True)
class GlanceRow:
    """One point of the first screen's table, every cell already worded (mean [95% CI])."""

    point: str
    unit: str
    dense_active: str = "–"
    moe: str = "–"
    dense_total: str = "–"
    gap_active: str = "–"
    gap_total: str = "–"
    position: str = "–"


def missing_row(point: str, path: str) -> GlanceRow:
    """The first screen's row of a point whose table is missing: it says so in place of the numbers."""
    return GlanceRow(f"{point}: not computed (no {path})", "–")


HEADER = ("point", "unit", "dense, active match", "MoE", "dense, total match", "gap active", "gap total",
          "position p")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """``rows`` under ``header`` as one markdown table (a missing value: an empty cell)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join("" if v is None or v != v else str(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def table_markdown(rows: Sequence[GlanceRow]) -> str:
    """The rows as one markdown table (gaps > 0: the MoE better; p: 0 at the active match, 1 at
    the total match)."""
    return markdown_table(HEADER, [[getattr(r, f.name) for f in fields(GlanceRow)] for r in rows])


def words(text: str) -> int:
    """Words as a reader counts them: runs of letters or digits (a number with its sign and
    decimals is one word), markdown punctuation not counted."""
    return len(re.findall(r"[\w][\w.,'’/±+-]*", text))


def check_lead(sentences: Sequence[str]) -> None:
    """The first screen's sentences within :data:`MAX_SENTENCES`, :data:`MAX_WORDS` together and
    :data:`MAX_SENTENCE_WORDS` each."""
    n = sum(words(s) for s in sentences)
    if len(sentences) > MAX_SENTENCES or n > MAX_WORDS:
        raise ValueError(f"the answer at a glance: {len(sentences)} sentences of {n} words; at most "
                         f"{MAX_SENTENCES} of {MAX_WORDS} words together")
    long = [s for s in sentences if words(s) > MAX_SENTENCE_WORDS]
    if long:
        raise ValueError(f"the answer at a glance: a sentence of {words(long[0])} words, at most "
                         f"{MAX_SENTENCE_WORDS} each: {long[0]!r}")


def glance_markdown(question: str, rows: Sequence[GlanceRow], lead: Sequence[str]) -> str:
    """The first screen above the key figure: the question, the table, the sentences."""
    check_lead(lead)
    legend = ("Losses, gaps (dense − MoE, > 0: the MoE better) and p (0: the MoE at its active match, 1: at its "
              "total match): mean [95% CI].")
    parts = [f"**The question.** {question}"] + ([table_markdown(rows), f"*{legend}*"] if rows else [])
    return "\n\n".join(parts + [" ".join(lead)])


def readme_answer(lead: Sequence[str], report: str = "outputs/cpu/report.html") -> str:
    """The README's answer: the same sentences and where the rest is, within :data:`README_WORDS`."""
    check_lead(lead)
    text = " ".join(lead) + f" Intervals and limits: `{report}`."
    if words(text) > README_WORDS:
        raise ValueError(f"the README's answer: {words(text)} words, at most {README_WORDS}")
    return text


__all__ = ["MAX_SENTENCES", "MAX_SENTENCE_WORDS", "MAX_WORDS", "README_WORDS", "GlanceRow", "HEADER", "mean_ci",
           "missing_row", "read_table", "markdown_table", "table_markdown", "words", "check_lead", "glance_markdown", "readme_answer"]
