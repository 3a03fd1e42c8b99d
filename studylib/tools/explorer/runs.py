"""Which runs the explorer offers: run directories below an outputs folder, with their labels.

Everything about one run directory (its config, checkpoints, steps, loading a model) is
:class:`studylib.run.rundir.RunDir`; this module only finds run directories and names them.
"""
from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from studylib.run.rundir import CONFIG_FILE, RunDir


@dataclass(frozen=True)
class RunInfo:
    """One run directory and its labels (usable wherever a path is: ``os.fspath(info)``)."""

    path: Path
    preset: str
    model: str
    seed: Optional[int]
    kind: str = "?"  # the model's FFN kind: dense | moe | soft
    finished: bool = False

    @property
    def label(self) -> str:
        seed = f"seed{self.seed}" if self.seed is not None else self.path.name
        return f"{self.preset} / {self.model} / {seed} ({self.kind}{'' if self.finished else ', unfinished'})"

    @property
    def short_label(self) -> str:
        """``<model> seed<N>`` (or the model alone), for figure titles."""
        return f"{self.model} seed{self.seed}" if self.seed is not None else self.model

    def __fspath__(self) -> str:
        return str(self.path)


def run_info(run_dir: str | os.PathLike) -> RunInfo:
    """The labels of one run directory (from its ``config.yaml``, else its path)."""
    rd = RunDir(run_dir)
    doc = rd.read_config() or {}
    r = doc.get("run") or {}
    ffn = ((doc.get("model") or {}).get("ffn") or {})
    seed = r.get("seed")
    if seed is None:
        m = re.fullmatch(r"seed(\d+)", rd.path.name)
        seed = int(m.group(1)) if m else None
    preset = r.get("preset") or (rd.path.parents[2].name if len(rd.path.parents) > 2 else "?")
    return RunInfo(path=rd.path, preset=str(preset), model=str(r.get("model") or rd.path.parent.name),
                   seed=seed, kind=str(ffn.get("kind", "?")), finished=rd.finished())


def _config_files(root: Path):
    """The ``config.yaml`` files of the run directories at or below ``root``."""
    if (root / CONFIG_FILE).is_file():
        return [root / CONFIG_FILE]
    return itertools.chain(root.glob(f"runs/*/*/{CONFIG_FILE}"), root.glob(f"*/runs/*/*/{CONFIG_FILE}"))


def list_runs(outputs_root: str | os.PathLike, finished_only: bool = False) -> list[RunInfo]:
    """Run directories (holding ``config.yaml`` and a checkpoint) below ``outputs_root``.

    ``outputs_root`` may be the outputs folder (``<root>/<preset>/runs/...``), one preset's
    folder (``<root>/<preset>/runs/...``) or a run directory itself. Sorted by preset, model, seed.
    """
    root = Path(outputs_root)
    if not root.is_dir():
        return []
    found = []
    for cfg in _config_files(root):
        if not RunDir(cfg.parent).has_checkpoint():
            continue
        try:
            info = run_info(cfg.parent)
        except Exception:  # an unreadable config: not a run we can show
            continue
        if finished_only and not info.finished:
            continue
        found.append(info)
    found.sort(key=lambda i: (i.preset, i.model, -1 if i.seed is None else i.seed, str(i.path)))
    return found
