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

from studylib.config import Preset, override, run_document, with_absolute_paths
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
        varied.model_config(model)  # validates the name (a clear error for a typo)
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


__all__ = ["RunSpec"]
