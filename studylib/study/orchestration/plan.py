"""What the comparisons ask of a preset: its ``study`` lists and budgets read with one clear
error each, the seeds a comparison takes, the reference MoE, and one run's budget.

The runs of each notebook are planned by its comparison (:mod:`studylib.study.comparisons`);
``studylib study`` trains the plans of the selected notebooks in ONE queue
(:func:`studylib.study.orchestration.sweep.ensure_grids`, longest runs first) before it executes
them; each notebook then finds its runs finished and reads them. Run alone (JupyterLab, plain
papermill), a notebook trains its own runs as before.

Why: notebook by notebook, a job slot sat idle at the end of every sweep whose run count is odd
(9 headline runs, 3 iso-width runs, ...). Measured on the 2-core AVX2 machine, ``cpu`` preset: the
notebooks' training cells took about 1,590 s for 1,455 s of runs per slot; in one queue, 1,685 s for
1,674 s (a slower hour of the same machine).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from studylib.config import ConfigError, Preset
from studylib.data.pipeline import load_data
from studylib.run.optim import total_steps_for


def study_list(preset: Preset, key: str) -> list:
    """``study.<key>``: a list of model names of the preset (checked when it loaded); absent: a
    ConfigError naming the knob."""
    v = preset.study.knob(key)
    if not v:
        raise ConfigError(f"study.{key}: missing from preset {preset.name!r}; expected a non-empty list of "
                          f"model names of the preset")
    return list(v)


def study_epochs(preset: Preset, key: str) -> float:
    """``study.<key>`` (a budget in units of the preset's schedule; default 1.0)."""
    return preset.study.knob(key)


@dataclass(frozen=True)
class RunBudget:
    """What one run of the preset's own schedule trains on (notebook 01): the data split
    (``split``: stories, tokens, windows and target tokens per side), its optimizer steps, the
    windows per step and the target tokens it reads."""

    split: pd.DataFrame
    steps: int
    per_step: int
    tokens: int


def run_budget(preset: Preset) -> RunBudget:
    """The preset's data (built or read from the cache) and one run's budget: one epoch of the
    training windows (the last step partial), or ``train.max_steps`` full steps when set."""
    data = load_data(preset.data, progress=False)
    summ = data.summary()
    split = pd.DataFrame({side: {"stories": summ[f"{side}_stories"], "tokens": summ[f"{side}_tokens"],
                                 "windows": summ[f"{side}_windows"], "target tokens": summ[f"{side}_targets"]}
                          for side in ("train", "val")}).T
    steps = total_steps_for(preset.train, len(data.train_idx))
    per_step = preset.train.batch_size * preset.train.grad_accum
    windows = len(data.train_idx) if preset.train.max_steps is None else steps * per_step
    return RunBudget(split, steps, per_step, windows * (data.context - 1))


def first_seeds(preset: Preset, key: str) -> list[int]:
    """The first ``study.<key>`` of the preset's seeds (all of them when the knob is absent): the
    comparisons that get fewer seeds than the headline."""
    k = preset.study.knob(key)
    return list(preset.seeds) if k is None else list(preset.seeds[:k])


def reference_moe(preset: Preset) -> str:
    """``study.reference_moe``, else the headline's MoE (its second model)."""
    return preset.study.reference() or study_list(preset, "headline")[1]


__all__ = ["RunBudget", "run_budget", "first_seeds", "reference_moe", "study_epochs", "study_list"]
