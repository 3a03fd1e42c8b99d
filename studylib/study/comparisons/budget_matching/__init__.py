"""Notebook 01, budget matching: the preset's models counted, their shape against the paper's
(:mod:`studylib.study.analysis.shape`) and one run's budget laid out (:func:`run_budget`); it trains nothing."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from studylib.config import Preset
from studylib.data.pipeline import shared_data
from studylib.run.optim import total_steps_for
from studylib.study.comparisons.base import Comparison


@dataclass(frozen=True)
class RunBudget:
    """What one run of the preset's own schedule trains on: the data split (``split``: stories,
    tokens, windows and target tokens per side), its optimizer steps, the windows per step and the
    target tokens it reads."""

    split: pd.DataFrame
    steps: int
    per_step: int
    tokens: int


def run_budget(preset: Preset) -> RunBudget:
    """The preset's data (built or read from the cache, once per process) and one run's budget:
    one epoch of the training windows (the last step partial), or ``train.max_steps`` full steps
    when set."""
    data = shared_data(preset.data)
    summ = data.summary()
    split = pd.DataFrame({side: {"stories": summ[f"{side}_stories"], "tokens": summ[f"{side}_tokens"],
                                 "windows": summ[f"{side}_windows"], "target tokens": summ[f"{side}_targets"]}
                          for side in ("train", "val")}).T
    steps = total_steps_for(preset.train, len(data.train_idx))
    per_step = preset.train.batch_size * preset.train.grad_accum
    windows = len(data.train_idx) if preset.train.max_steps is None else steps * per_step
    return RunBudget(split, steps, per_step, windows * (data.context - 1))


COMPARISON = Comparison("budget_matching", "01_budget_matching")
