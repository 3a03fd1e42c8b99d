"""Notebook 03, the headline sweep: the headline trio at the preset's budget, every seed, and,
with ``study.noise_split: {seeds: k}``, the noise-split design around the first seed (grids 1..:
both, init only, then order only, one grid per data seed; :mod:`.noise`). What it adds to the
report's answer: the two gaps' verdicts and numbers (``headline_gaps.csv``) and the figure."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import pandas as pd

from studylib.config import ConfigError
from studylib.study.analysis.frames import model_summaries
from studylib.study.comparisons.base import Answer, Comparison, Runs
from studylib.study.comparisons.glance import read_table
from studylib.study.comparisons.headline.glance import headline_glance
from studylib.study.comparisons.knobs import POSITIVE_INT, STRINGS, Knobs, Study, knob
from studylib.study.orchestration.plan import Grid

#: the table (and figure) notebook 03 writes for the report's answer, and the columns the answer reads
HEADLINE = "headline_gaps"
GAP_COLUMNS = ("comparison", "a", "b", "mean", "ci_low", "ci_high", "n", "p", "resolved", "paper_mean", "paper_std")


@dataclass(frozen=True)
class NoiseSplit:
    """The noise split around the preset's first ``seeds`` seeds (``noise_split: {seeds: k}``)."""

    seeds: int

    def draws(self, seeds: Sequence[int]) -> tuple[int, ...]:
        """The first ``self.seeds`` of ``seeds`` (the run's seeds): the k draws, the first being the
        fixed seed; more than there are: one ConfigError line."""
        if self.seeds > len(seeds):
            raise ConfigError(f"study.noise_split: {{seeds: {self.seeds}}} asks for more seeds than the preset has "
                              f"({list(seeds)})")
        return tuple(seeds[: self.seeds])


def _noise_split(v: Any, where: str, ctx) -> NoiseSplit:
    k = v.get("seeds") if isinstance(v, Mapping) and set(v) == {"seeds"} else None
    if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k:
        raise ConfigError(f"{where}: expected {{seeds: k}} with k >= 2 (the first k of the preset's seeds), got {v!r}")
    return NoiseSplit(k)


@dataclass(frozen=True)
class HeadlineKnobs(Knobs):
    """Besides the headline trio and the power target (general knobs): the noise split, the sample
    prompts (None: the notebook's) and tokens per sample."""

    noise_split: Optional[NoiseSplit] = knob("noise_split", _noise_split)
    prompts: Optional[tuple[str, ...]] = knob("prompts", STRINGS)
    sample_tokens: int = knob("sample_tokens", POSITIVE_INT, 40)

    def noise_seeds(self, seeds: Sequence[int]) -> Optional[tuple[int, ...]]:
        """The noise split's draws among ``seeds`` (the first is the fixed seed), or None without one."""
        return None if self.noise_split is None else self.noise_split.draws(seeds)


def headline_grid(study: Study) -> Grid:
    """The headline trio at the preset's budget, every seed (notebooks 03, 04, 10 and 12 share its runs)."""
    return Grid(list(study.headline), list(study.preset.seeds))


def noise_grids(models: Sequence[str], seeds: Sequence[int]) -> list[Grid]:
    """The runs of the design over the draws ``seeds`` (the first is the fixed seed): [both, init
    only, order only (one grid per data seed)]."""
    s0 = seeds[0]
    return [Grid(list(models), list(seeds)),
            Grid(list(models), list(seeds), {"train.data_seed": s0}),
            *[Grid(list(models), [s0], {"train.data_seed": s}) for s in seeds]]


def grids(study: Study, knobs: HeadlineKnobs) -> list[Grid]:
    seeds = knobs.noise_seeds(study.preset.seeds)
    return [headline_grid(study), *([] if seeds is None else noise_grids(study.headline, seeds))]


def noise_frame(runs: Runs, seeds: Sequence[int]) -> pd.DataFrame:
    """The summaries of the design (grids 1.. of :func:`grids`), with ``factor`` (one of
    :data:`.noise.FACTORS`) and ``draw`` (the varied seed: the run seed, or the data seed)."""
    both, init, *order = [runs.frame(i) for i in range(1, len(runs.specs))]
    parts = [both.assign(factor="both", draw=both["seed"]), init.assign(factor="init only", draw=init["seed"])]
    parts += [f.assign(factor="order only", draw=s) for f, s in zip(order, seeds)]
    return pd.concat(parts, ignore_index=True)


def answer(out_dir: Path) -> Answer:
    """The headline verdict and what it does not show, the two gaps' numbers and verdicts as
    ``headline_gaps.csv`` holds them (the words of
    :func:`studylib.study.analysis.text.headline_verdict`, as notebook 03 prints them), and the figure."""
    from studylib.study.analysis import text

    gaps = read_table(out_dir, HEADLINE, GAP_COLUMNS)
    if gaps is None:
        return Answer(f"**Headline.** Not computed: no `tables/{HEADLINE}.csv` (notebook 03 did not run in this study).")
    if len(gaps) != 2:
        raise ConfigError(f"{out_dir / 'tables' / f'{HEADLINE}.csv'}: {len(gaps)} rows; notebook 03 writes two (the "
                          f"matched-active gap, then the matched-total one): run it again or delete the file")
    g = gaps.copy()
    g.index = ["active", "total"]  # notebook 03 writes the matched-active row, then the matched-total one
    dense_active, moe, dense_total = g.loc["active", "a"], g.loc["active", "b"], g.loc["total", "b"]
    summaries = model_summaries(out_dir, moe)
    tokens = summaries[0].get("tokens") if summaries else None
    preset = summaries[0].get("preset", "") if summaries else ""
    verdict, _, limit = text.headline_verdict(g, dense_active, moe, dense_total, preset, tokens).partition(
        "What this does not show: ")
    judged = "verdict" in gaps and "p_tost" in gaps  # older tables: no TOST, no verdict
    md = [f"**Headline (notebook 03).** {verdict.strip()}", "",
          "| gap | mean | 95% CI | n | p | resolved |" + (" TOST p | verdict |" if judged else "") + " paper |",
          "|---|---|---|---|---|---|" + ("---|---|" if judged else "") + "---|"]
    md += [f"| {r.comparison} | {r.mean:+.4f} | [{r.ci_low:+.4f}, {r.ci_high:+.4f}] | {int(r.n)} | {r.p:.2g} "
           f"| {'yes' if r.resolved else 'no'} |"
           + (f" {r.p_tost:.2g} | {text.verdict_label(r._asdict(), r.a, r.b)} |" if judged else "")
           + f" {r.paper_mean:+.4f} ± {r.paper_std:.4f} |" for r in gaps.itertuples()]
    figure = out_dir / "figures" / f"{HEADLINE}.png"
    rows, lead = headline_glance(out_dir, g, summaries[0] if summaries else None)
    return Answer("\n".join(md), (figure,) if figure.is_file() else (), (limit.strip(),), moe=moe,
                  glance=tuple(rows), lead=tuple(lead))


COMPARISON = Comparison("headline", "03_headline_sweep", HeadlineKnobs, grids, answer=answer)
