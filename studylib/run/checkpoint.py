"""Checkpoints: atomic save, safe load (``weights_only``), RNG capture/restore, resume lookup.

A checkpoint is a ``torch.save``-d dict::

    {"format": "studylib-ckpt", "version": 1, "kind": "full" | "snapshot",
     "step": int, "total_steps": int, "config_hash": str,
     "model": state_dict, "optimizer": state_dict (full only),
     "rng": {...} (full only; this process), "rng_ranks": [rng of each DDP rank] (full only),
     "data_position": {...}, "best": {...}, "clock": {...}, "final": eval record or None}

Only tensors and plain Python types are stored, so :func:`load` uses ``weights_only=True``.

Files in a run's ``checkpoints/``: ``latest.pt`` (full; the resume point), ``prev.pt`` (the
previous ``latest.pt``, kept as a fallback should ``latest.pt`` ever be damaged) and, with
``train.keep_checkpoints``, ``step_<N>.pt`` model-only snapshots for the explorer.

Saving writes a temporary file in the same folder (:func:`studylib.run.files.atomic_open`),
moves the old ``latest.pt`` to ``prev.pt``, renames the new file over ``latest.pt`` and fsyncs
the folder: a crash at any point leaves a complete ``latest.pt`` or ``prev.pt``.
"""
from __future__ import annotations

import os
import random
import re
import warnings
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from studylib.run.files import atomic_open

FORMAT = "studylib-ckpt"
VERSION = 1
LATEST = "latest.pt"
PREV = "prev.pt"


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupt, foreign or from another run config."""


# --------------------------------------------------------------------------------------------
# RNG states as tensors / plain types (weights_only friendly)
# --------------------------------------------------------------------------------------------
def capture_rng() -> dict:
    """Python, NumPy (legacy global), torch CPU and (if any) CUDA RNG states."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    out = {
        "python": {"version": py_version, "state": torch.tensor(py_state, dtype=torch.int64),
                   "gauss": py_gauss},
        "numpy": {"name": str(np_name), "keys": torch.from_numpy(np_keys.astype(np.int64)),
                  "pos": int(np_pos), "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "torch": torch.get_rng_state(),
        "cuda": [s for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }
    return out


def restore_rng(state: dict) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["gauss"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


# --------------------------------------------------------------------------------------------
# save / load
# --------------------------------------------------------------------------------------------
def save(path: str | os.PathLike, state: dict, *, keep_prev: bool = False) -> Path:
    """Atomically write ``state`` (a dict; format/version are added) to ``path``.

    With ``keep_prev`` the file being replaced is first moved to ``prev.pt`` in the same folder.
    """
    path = Path(path)
    state = {"format": FORMAT, "version": VERSION, **state}
    with atomic_open(path, "wb") as f:
        torch.save(state, f)
        if keep_prev and path.exists():
            os.replace(path, path.parent / PREV)
    return path


def load(path: str | os.PathLike, *, map_location: Any = "cpu", expect_hash: Optional[str] = None,
         kind: Optional[str] = None) -> dict:
    """Load and validate a studylib checkpoint; any problem raises :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    try:
        with warnings.catch_warnings():  # foreign pickles make torch warn before it refuses them
            warnings.filterwarnings("ignore", message=".*pickle protocol", category=UserWarning)
            state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated zip, foreign pickle, not a torch file, ...
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: not a readable studylib checkpoint (truncated, corrupt or "
                              f"foreign file): {type(e).__name__}: {reason[:300]}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path}: not a studylib checkpoint (format {got!r}, expected {FORMAT!r})")
    if state.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {state.get('version')!r} is not "
                              f"supported (this studylib reads version {VERSION})")
    for key in ("step", "model", "config_hash"):
        if key not in state:
            raise CheckpointError(f"{path}: incomplete checkpoint (no {key!r})")
    if kind is not None and state.get("kind") != kind:
        raise CheckpointError(f"{path}: a {state.get('kind')!r} checkpoint, expected {kind!r}")
    if expect_hash is not None and state["config_hash"] != expect_hash:
        raise CheckpointError(f"{path}: written by a run with config hash {state['config_hash']}, "
                              f"but this run's config hash is {expect_hash}; refusing to mix runs")
    return state


def snapshot_path(ckpt_dir: str | os.PathLike, step: int) -> Path:
    return Path(ckpt_dir) / f"step_{step:07d}.pt"


def list_snapshots(ckpt_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of the ``step_<N>.pt`` files, by step."""
    out = []
    for p in Path(ckpt_dir).glob("step_*.pt"):
        m = re.fullmatch(r"step_(\d+)\.pt", p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def peek_step(ckpt_dir: str | os.PathLike) -> Optional[int]:
    """The step of ``latest.pt`` (else ``prev.pt``), read without loading the tensors; None if
    neither is readable."""
    for name in (LATEST, PREV):
        p = Path(ckpt_dir) / name
        if p.is_file():
            try:
                state = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
                return int(state["step"])
            except Exception:
                continue
    return None


def load_latest(ckpt_dir: str | os.PathLike, *, map_location: Any = "cpu", kind: Optional[str] = None,
                warn=print) -> Optional[tuple[dict, Path]]:
    """``(state, path)`` of the newest good checkpoint (``latest.pt``, else ``prev.pt``), or None
    if there is none. A damaged candidate is reported through ``warn`` and skipped; if candidates
    exist but none is readable, :class:`CheckpointError` lists them."""
    d = Path(ckpt_dir)
    errors = []
    for p in (d / LATEST, d / PREV):
        if not p.is_file():
            continue
        try:
            return load(p, map_location=map_location, kind=kind), p
        except CheckpointError as e:
            errors.append(str(e))
            warn(f"warning: skipping damaged checkpoint: {e}")
    if errors:
        raise CheckpointError("no usable checkpoint:\n  " + "\n  ".join(errors)
                              + f"\ndelete {d} to restart this run from scratch")
    return None


def load_resume(ckpt_dir: str | os.PathLike, *, expect_hash: Optional[str] = None,
                map_location: Any = "cpu", warn=print) -> Optional[tuple[dict, Path]]:
    """``(state, path)`` of the newest good full checkpoint to resume from (see
    :func:`load_latest`), or None. A config-hash mismatch is always an error."""
    found = load_latest(ckpt_dir, map_location=map_location, kind="full", warn=warn)
    if found is not None and expect_hash is not None and found[0]["config_hash"] != expect_hash:
        raise CheckpointError(f"{found[1]}: written by a run with config hash {found[0]['config_hash']}, "
                              f"but this run's config hash is {expect_hash}; refusing to mix runs")
    return found
