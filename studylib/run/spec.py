"""One training run, resolved once.

A :class:`RunSpec` is what a sweep hands to whoever trains a run (this process, or a Dask worker
on another machine): the run's own preset (the study's preset with the run's overrides applied),
its model, its seed and its absolute run directory. The plan builds it once from
``(preset, model, seed, overrides, tag)``; the sweep, the workers and the trainer take it as it
is, and nothing on the way applies the overrides again.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from studylib.config import ConfigError, Preset, override, run_document, with_absolute_paths
from studylib.run.layout import variant_dir
from studylib.run.rundir import RunDir


@dataclass(frozen=True)
class RunSpec:
    preset: Preset  # the run's own preset: the overrides applied
    model: str
    seed: int
    run_dir: Path  # absolute

    @classmethod
    def resolve(cls, preset: Preset, model: str, seed: int, overrides=None, tag: Optional[str] = None,
                root: str | os.PathLike | None = None) -> "RunSpec":
        """The run ``model`` x ``seed`` of ``preset`` + ``overrides``, in the preset's own run
        directory when the overrides leave its identity unchanged, else in the variant's
        (:func:`studylib.run.layout.variant_dir`). An unknown model is a ConfigError."""
        varied = override(preset, overrides)
        vocab = varied.model_config(model).vocab_size  # validates the name (a clear error for a typo)
        if vocab != varied.data.vocab_size:
            raise ConfigError(f"models.{model}.vocab_size={vocab}: its runs need a tokenizer of that size, the run's "
                              f"is data.vocab_size={varied.data.vocab_size}; train it with --set "
                              f"data.vocab_size={vocab} (the token-budget map gives each trio its MoE's)")
        path = variant_dir(preset, varied, model, seed, overrides, tag, root)
        return cls(varied, model, int(seed), Path(os.path.abspath(path)))

    @property
    def label(self) -> str:
        """``<model> seed <seed>``, as errors and progress lines name a run."""
        return f"{self.model} seed {self.seed}"

    @property
    def rundir(self) -> RunDir:
        return RunDir(self.run_dir)

    def portable(self) -> "RunSpec":
        """This run for a process with another working directory (a worker on another machine):
        the data paths made absolute (:func:`studylib.config.with_absolute_paths`)."""
        return dataclasses.replace(self, preset=with_absolute_paths(self.preset))

    def document(self) -> dict:
        """The run's ``config.yaml`` document (its identity included)."""
        return run_document(self.preset, self.preset.model_config(self.model), self.model, self.seed)


def epoch_steps(preset: Preset) -> int:
    """Optimizer steps of the preset's own schedule: ``train.max_steps`` when set, else one epoch
    of its training windows (builds or loads the data cache to count them, once per process:
    :func:`studylib.data.pipeline.shared_data`)."""
    if preset.train.max_steps is not None:
        return preset.train.max_steps
    from studylib.data.pipeline import shared_data
    from studylib.run.optim import total_steps_for

    return total_steps_for(preset.train, len(shared_data(preset.data).train_idx))


def tokens_per_step(preset: Preset) -> int:
    """Target tokens of one optimizer step: windows per step times ``data.context - 1`` targets (the
    unit budgets in tokens per parameter become steps with)."""
    return preset.train.batch_size * preset.train.grad_accum * (preset.data.context - 1)


def budget_overrides(preset: Preset, epochs: float, epoch: Optional[int] = None) -> dict:
    """Overrides that train ``epochs`` times the preset's own schedule (``epoch`` steps; default
    :func:`epoch_steps`) as a run of its own (its own warmup and cosine to its own end):
    ``{"train.max_steps": N}``, or ``{}`` for ``epochs == 1`` (the preset's runs themselves, reused)."""
    if not epochs > 0:
        raise ConfigError(f"budget: epochs must be > 0, got {epochs!r}")
    if epochs == 1:
        return {}
    return {"train.max_steps": max(1, round(epochs * (epoch_steps(preset) if epoch is None else epoch)))}


def tokens_per_param_epochs(preset: Preset, tokens_per_param: float, active: int, epoch: Optional[int] = None) -> float:
    """A budget of ``tokens_per_param`` target tokens per ``active`` parameter in epochs of the
    preset's schedule (``epoch`` steps; default :func:`epoch_steps`): ``round(x * active /
    tokens_per_step)`` steps (at least 1), exactly 1.0 when that is one epoch (the preset's own runs)."""
    s = epoch_steps(preset) if epoch is None else epoch
    n = max(1, round(tokens_per_param * active / tokens_per_step(preset)))
    return 1.0 if n == s else n / s


def cell_overrides(preset: Preset, moe: str, epochs: float, stories: float = 1.0, epoch: Optional[int] = None) -> dict:
    """The overrides of the runs of one cell (a trio at one budget): its budget
    (:func:`budget_overrides`), the vocabulary of its reference MoE ``moe`` where it has its own,
    the fraction of the training stories when below 1; a cell on other data always sets its steps."""
    ov = dict(budget_overrides(preset, epochs, epoch))
    vocab = preset.model_config(moe).vocab_size
    if vocab != preset.data.vocab_size:
        ov["data.vocab_size"] = vocab
    if stories < 1:
        ov["data.train_fraction"] = stories
    if ov and "train.max_steps" not in ov:
        ov["train.max_steps"] = epoch_steps(preset) if epoch is None else epoch
    return ov


__all__ = ["RunSpec", "epoch_steps", "tokens_per_step", "budget_overrides", "tokens_per_param_epochs",
           "cell_overrides"]
