"""Where runs live (the run layout), in one place: ``<outputs>/<preset>/runs/<model>/seed<seed>/``
for a preset's own runs and ``.../runs/<model>/<tag>/seed<seed>/`` for a variant's (other budgets,
learning rates, data seeds), where ``<outputs>`` is ``$STUDYLIB_OUTPUTS``, else the ``outputs/``
folder next to the preset's ``params/`` folder, else ``./outputs``; and the names of the files a
run directory holds. What is in those files is :class:`studylib.run.rundir.RunDir`'s. Torch-free.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from studylib.config import ConfigError, Preset, run_identity, variant_tag

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"
LOCK_FILE = ".lock"
LOG_FILE = "train.log"  # a run trained by a sweep's worker: everything it printed


def outputs_root(preset: Optional[Preset] = None) -> Path:
    if os.environ.get("STUDYLIB_OUTPUTS"):
        return Path(os.environ["STUDYLIB_OUTPUTS"])
    if preset is not None and preset.path:
        params_dir = Path(preset.path).resolve().parent
        if params_dir.name == "params":
            return params_dir.parent / "outputs"
    return Path("outputs")


def link_shared_runs(preset: Preset, root: str | os.PathLike | None = None) -> None:
    """Where ``preset`` shares another preset's runs (``runs:``), ``<root>/<name>/runs`` becomes a link
    to ``<root>/<runs>/runs``, so whatever reads a preset's runs under its own folder (the report's
    facts, TensorBoard, the run watcher) finds them. Nothing is done where the name is its own or
    the folder already holds something (a link or a folder of its own)."""
    if preset.runs == preset.name:
        return
    root = Path(root) if root is not None else outputs_root(preset)
    link = root / preset.name / "runs"
    if link.is_symlink() or link.exists():
        return
    link.parent.mkdir(parents=True, exist_ok=True)
    (root / preset.runs / "runs").mkdir(parents=True, exist_ok=True)
    link.symlink_to(Path("..") / preset.runs / "runs", target_is_directory=True)


def run_dir_for(preset: Preset, model: str, seed: int, root: str | os.PathLike | None = None,
                tag: Optional[str] = None) -> Path:
    """``<root>/<preset.runs>/runs/<model>/seed<seed>``; a variant (``tag``) lives one level deeper,
    ``.../runs/<model>/<tag>/seed<seed>``."""
    root = Path(root) if root is not None else outputs_root(preset)
    base = root / preset.runs / "runs" / model
    if tag is not None:
        if not tag or "/" in tag or tag.startswith(".") or tag.startswith("seed"):
            raise ConfigError(f"run variant tag {tag!r}: must be non-empty, without '/', not start "
                              "with '.' or 'seed'")
        base = base / tag
    return base / f"seed{seed}"


def run_dirs(root: str | os.PathLike) -> list[Path]:
    """Every run directory at or below ``root``, sorted: ``root`` may be an outputs folder
    (``<outputs>/<preset>/runs/...``), one preset's folder, its ``runs`` folder or a run directory
    itself. A preset's own runs (``runs/<model>/seed<N>``) and its variants'
    (``runs/<model>/<tag>/seed<N>``) both count."""
    root = Path(root)
    if (root / CONFIG_FILE).is_file():
        return [root]
    found = set()
    for prefix in ("", "runs/", "*/runs/"):
        for pattern in ("*/seed*", "*/*/seed*"):
            found.update(p for p in root.glob(prefix + pattern) if p.is_dir() and p.name[4:].isdigit())
    return sorted(found)


def variant_dir(preset: Preset, varied: Preset, model: str, seed: int, overrides=None, tag: Optional[str] = None,
                root: str | os.PathLike | None = None) -> Path:
    """The run directory of ``model`` x ``seed`` of ``varied`` (``preset`` + ``overrides``): the
    base run's own directory when the overrides leave that run's identity unchanged, else
    ``runs/<model>/<tag>/seed<seed>`` (``tag`` defaults to :func:`studylib.config.variant_tag`)."""
    if overrides and run_identity(varied, varied.model_config(model), model, seed) != \
            run_identity(preset, preset.model_config(model), model, seed):
        return run_dir_for(preset, model, seed, root, tag or variant_tag(overrides, varied))
    return run_dir_for(preset, model, seed, root)


__all__ = ["CONFIG_FILE", "METRICS_FILE", "SUMMARY_FILE", "CHECKPOINT_DIR", "LOCK_FILE", "LOG_FILE", "outputs_root",
           "run_dir_for", "run_dirs", "variant_dir"]
