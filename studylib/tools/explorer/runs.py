"""Which runs the explorer offers: run directories below an outputs folder, with their labels.

Everything about one run directory (its config, checkpoints, steps, loading a model) is
:class:`studylib.run.rundir.RunDir`; this module only finds run directories and names them.
"""
from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pandas as pd

from studylib.config import ConfigError
from studylib.run.layout import run_dirs
from studylib.run.rundir import RunDir


@dataclass(frozen=True)
class RunInfo:
    """One run directory and its labels (usable wherever a path is: ``os.fspath(info)``)."""

    path: Path
    preset: str
    model: str
    seed: Optional[int]
    kind: str = "?"  # the model's FFN kind: dense | moe | soft
    finished: bool = False
    tag: Optional[str] = None  # a variant's (runs/<model>/<tag>/seed<N>: budget map, lr sweep, ...)

    @property
    def label(self) -> str:
        seed = f"seed{self.seed}" if self.seed is not None else self.path.name
        model = f"{self.model} [{self.tag}]" if self.tag else self.model
        return f"{self.preset} / {model} / {seed} ({self.kind}{'' if self.finished else ', unfinished'})"

    @property
    def short_label(self) -> str:
        """``<model> seed<N>`` (or the model alone), for figure titles."""
        return f"{self.model} seed{self.seed}" if self.seed is not None else self.model

    def __fspath__(self) -> str:
        return str(self.path)

    @property
    def preset_folder(self) -> Path:
        """``<outputs>/<preset>`` (every run of this run's preset; the run itself outside that layout)."""
        return RunDir(self.path).preset_folder or self.path

    def steps(self) -> list[int]:
        """The optimizer steps with a saved model (the checkpoint slider's values)."""
        return RunDir(self.path).checkpoint_steps()

    def load(self, step: Optional[int] = None):
        """The model at ``step`` (default: the latest), with its tokenizer and config
        (:meth:`studylib.run.rundir.RunDir.load_model`)."""
        return RunDir(self.path).load_model(step=step)


def run_info(run_dir: str | os.PathLike) -> RunInfo:
    """The labels of one run directory (from its ``config.yaml``, else its path); a folder without
    a ``config.yaml`` is a ConfigError naming it."""
    rd = RunDir(run_dir)
    if not rd.config_path.is_file():
        raise ConfigError(f"{rd.path}: not a run directory (no {rd.config_path.name})")
    doc = rd.read_config() or {}
    r = doc.get("run") or {}
    ffn = ((doc.get("model") or {}).get("ffn") or {})
    seed = r.get("seed")
    if seed is None:
        m = re.fullmatch(r"seed(\d+)", rd.path.name)
        seed = int(m.group(1)) if m else None
    folder = rd.preset_folder
    preset = r.get("preset") or (folder.name if folder is not None else "?")
    tag = rd.tag
    model = r.get("model") or (rd.path.parents[1].name if tag else rd.path.parent.name)
    return RunInfo(path=rd.path, preset=str(preset), model=str(model), seed=seed, kind=str(ffn.get("kind", "?")),
                   finished=rd.finished(), tag=tag)


def runs_table(runs: list[RunInfo]) -> pd.DataFrame:
    """One row per run: model, variant tag, seed, FFN kind, finished, saved checkpoints."""
    return pd.DataFrame([{"model": r.model, "tag": r.tag or "", "seed": r.seed, "kind": r.kind,
                          "finished": r.finished, "checkpoints": len(r.steps())} for r in runs])


def list_runs(outputs_root: str | os.PathLike, finished_only: bool = False) -> list[RunInfo]:
    """Run directories (holding ``config.yaml`` and a checkpoint) below ``outputs_root``.

    ``outputs_root`` may be the outputs folder, one preset's folder or a run directory itself
    (:func:`studylib.run.layout.run_dirs`: variants' runs included). A run whose ``config.yaml``
    cannot be read is left out with a warning naming it. Sorted by preset, model, tag, seed.
    """
    root = Path(outputs_root)
    if not root.is_dir():
        return []
    found = []
    for path in run_dirs(root):
        rd = RunDir(path)
        if not rd.config_path.is_file() or not rd.has_checkpoint():
            continue
        try:
            info = run_info(path)
        except Exception as e:  # an unreadable config: say so, then go on
            warnings.warn(f"{rd.config_path}: cannot be read ({type(e).__name__}: {' '.join(str(e).split())[:160]}); "
                          "this run is not offered", stacklevel=2)
            continue
        if finished_only and not info.finished:
            continue
        found.append(info)
    found.sort(key=lambda i: (i.preset, i.model, i.tag or "", -1 if i.seed is None else i.seed, str(i.path)))
    return found
