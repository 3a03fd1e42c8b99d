"""Checkpoints: atomic save, SHA-256-verified safe load (``weights_only``), RNG capture/restore,
resume lookup.

A checkpoint is a ``torch.save``-d dict: ``{"format": "studylib-ckpt", "version": 2, **state}``,
where ``state`` is what :class:`studylib.run.train_state.TrainState` writes and reads (its
docstring lists the keys). Every checkpoint opens with the same header, :class:`Header` (``kind``
"full" or "snapshot", ``step``, ``total_steps``, ``config_hash``, ``provenance``): TrainState writes
it with :meth:`Header.as_dict`, and :func:`header` is its one reader (this module, to pick and check
a file; :meth:`studylib.run.rundir.RunDir.load_model`; TrainState on a resume). The rest of a full
checkpoint is TrainState's; :meth:`~studylib.run.rundir.RunDir.load_model` reads ``model`` too.

The dict is followed by a trailer line ``studylib-sha256:<64 hex>`` (newline before and after):
the SHA-256 of every byte before it (torch ignores bytes after its zip archive, and does not
check the archive's CRCs itself). :func:`load` checks the digest before unpickling, so a flipped byte
anywhere in the file, a torn file, or a version-2 file whose trailer is missing or damaged is a
:class:`CheckpointError`.
Version-1 checkpoints (written before the digest; no trailer) still load, unverified.

Only tensors and plain Python types are stored, so :func:`load` uses ``weights_only=True``.

Files in a run's ``checkpoints/``: ``latest.pt`` (full; the resume point), ``prev.pt`` (the
previous ``latest.pt``, kept as a fallback should ``latest.pt`` ever be damaged) and, with
``train.keep_checkpoints``, ``step_<N>.pt`` model-only snapshots for the explorer.

Saving writes a temporary file in the same folder (:func:`studylib.storage.files.atomic_open`),
moves the old ``latest.pt`` to ``prev.pt`` (unless it is unreadable or its digest is bad: a
damaged file never replaces a good ``prev.pt``), renames the new file over ``latest.pt`` and
fsyncs the folder: a crash at any point leaves a complete ``latest.pt`` or ``prev.pt``. A full
disk is one :class:`CheckpointError` naming the file and the space needed; the old files stay
intact.
"""
from __future__ import annotations

import hashlib
import os
import random
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from studylib.storage.files import DiskFullError, atomic_open, move_into_place

FORMAT = "studylib-ckpt"
VERSION = 2  # written; version 1 (no digest trailer) is still read
READS = (1, 2)
LATEST = "latest.pt"
PREV = "prev.pt"
DIGEST_TAG = b"\nstudylib-sha256:"
TRAILER_LEN = len(DIGEST_TAG) + 64 + 1
_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupt, foreign or from another run config."""


@dataclass(frozen=True)
class Header:
    """What every checkpoint opens with: its ``kind`` ("full", "snapshot"; None in files older than
    it), the optimizer ``step`` it was saved after, the run's ``total_steps`` and ``config_hash``,
    and the ``provenance`` fingerprints the run trains with (``{}`` in files older than them)."""

    kind: Optional[str]
    step: int
    config_hash: Optional[str]
    total_steps: Optional[int] = None
    provenance: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The header's keys as a checkpoint stores them."""
        return {"kind": self.kind, "step": self.step, "total_steps": self.total_steps,
                "config_hash": self.config_hash, "provenance": self.provenance}


def header(state: dict, path: os.PathLike) -> Header:
    """The :class:`Header` of the checkpoint ``state`` read from ``path``: the one reader of the
    header's keys. A state without ``step`` or ``config_hash`` is a :class:`CheckpointError`."""
    for key in ("step", "config_hash"):
        if key not in state:
            raise CheckpointError(f"{path}: incomplete checkpoint (no {key!r})")
    try:
        step = int(state["step"])
    except (TypeError, ValueError):
        raise CheckpointError(f"{path}: its step {state['step']!r} is not an integer") from None
    return Header(kind=state.get("kind"), step=step, config_hash=state["config_hash"],
                  total_steps=state.get("total_steps"), provenance=dict(state.get("provenance") or {}))


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
class _HashingWriter:
    """A write-only file wrapper that hashes what passes through it: no ``seek``/``tell``, so
    torch writes it as a stream, and the digest is that of the bytes in the file."""

    def __init__(self, f):
        self.f, self.sha = f, hashlib.sha256()

    def write(self, data) -> int:
        self.sha.update(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()

    def fileno(self) -> int:
        return self.f.fileno()


def _tensor_bytes(obj) -> int:
    """Bytes of the tensors in ``obj`` (nested dicts/lists): about the size of its checkpoint."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def save(path: str | os.PathLike, state: dict, *, keep_prev: bool = False) -> Path:
    """Atomically write ``state`` (a dict; format/version are added) and its SHA-256 trailer to
    ``path``.

    With ``keep_prev`` the file being replaced is first moved to ``prev.pt`` in the same folder
    (only if it is readable and passes its digest check: a damaged file never replaces a good
    ``prev.pt``).
    """
    path = Path(path)
    state = {"format": FORMAT, "version": VERSION, **state}
    try:
        with atomic_open(path, "wb", needed=_tensor_bytes(state) + (1 << 16)) as f:
            w = _HashingWriter(f)
            torch.save(state, w)
            f.write(DIGEST_TAG + w.sha.hexdigest().encode("ascii") + b"\n")
            if keep_prev and path.exists() and _readable(path):
                move_into_place(path, path.parent / PREV)
    except DiskFullError as e:
        raise CheckpointError(str(e)) from None
    return path


def _stored_digest(path: Path) -> Optional[str]:
    """The hex digest of ``path``'s trailer, or None if it has none."""
    size = path.stat().st_size
    if size < TRAILER_LEN:
        return None
    with open(path, "rb") as f:
        f.seek(size - TRAILER_LEN)
        tail = f.read(TRAILER_LEN)
    m = re.fullmatch(re.escape(DIGEST_TAG) + rb"([0-9a-f]{64})\n", tail)
    return m.group(1).decode("ascii") if m else None


def _file_digest(path: Path, length: int) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while length > 0:
            chunk = f.read(min(_CHUNK, length))
            if not chunk:
                break
            sha.update(chunk)
            length -= len(chunk)
    return sha.hexdigest()


def _check_digest(path: Path) -> bool:
    """False if ``path`` has no digest trailer; True if it matches; :class:`CheckpointError` if not."""
    stored = _stored_digest(path)
    if stored is None:
        return False
    actual = _file_digest(path, path.stat().st_size - TRAILER_LEN)
    if actual != stored:
        raise CheckpointError(f"{path}: SHA-256 mismatch, the file is damaged (it hashes to "
                              f"{actual[:16]}..., its digest says {stored[:16]}...)")
    return True


def _readable(path: Path) -> bool:
    """``path`` passes :func:`_read` (digest, zip, format; tensors memory-mapped, not loaded)."""
    try:
        _read(path, "cpu", mmap=True)
        return True
    except CheckpointError:
        return False


def _read(path: Path, map_location: Any, mmap: bool = False) -> dict:
    """The verified, validated state of ``path`` (any problem: :class:`CheckpointError`)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    verified = _check_digest(path)
    try:
        with warnings.catch_warnings():  # foreign pickles make torch warn before it refuses them
            warnings.filterwarnings("ignore", message=".*pickle protocol", category=UserWarning)
            state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # truncated zip, foreign pickle, not a torch file, ...
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "Weights only load failed" in str(e):  # torch's text advises the unsafe weights_only=False
            named = re.search(r"GLOBAL ([\w.]+)", str(e))
            if named:
                raise CheckpointError(f"{path}: refused to execute code from this file: it names the Python "
                                      f"global {named.group(1)}, and a studylib checkpoint holds only tensors and "
                                      "plain values; not loaded (a foreign or tampered file)") from None
            found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\.\s|\n\n|$)", str(e), re.S)
            reason = "the safe loader refused it" + (f" ({' '.join(found.group(1).split())})" if found else "")
        raise CheckpointError(f"{path}: not a readable studylib checkpoint (truncated, corrupt or "
                              f"foreign file): {type(e).__name__}: {reason[:300]}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path}: not a studylib checkpoint (format {got!r}, expected {FORMAT!r})")
    if state.get("version") not in READS:
        raise CheckpointError(f"{path}: checkpoint format version {state.get('version')!r} is not "
                              f"supported (this studylib reads versions {READS})")
    if state["version"] >= 2 and not verified:
        raise CheckpointError(f"{path}: its SHA-256 digest trailer is missing or unreadable, the "
                              f"file is damaged (a version-2 checkpoint ends with one)")
    return state


def load(path: str | os.PathLike, *, map_location: Any = "cpu", expect_hash: Optional[str] = None,
         kind: Optional[str] = None) -> dict:
    """Load, verify (SHA-256) and validate a studylib checkpoint; any problem raises
    :class:`CheckpointError`."""
    path = Path(path)
    state = _read(path, map_location)
    head = header(state, path)
    if "model" not in state:
        raise CheckpointError(f"{path}: incomplete checkpoint (no 'model')")
    if kind is not None and head.kind != kind:
        raise CheckpointError(f"{path}: a {head.kind!r} checkpoint, expected {kind!r}")
    check_hash(head, path, expect_hash)
    return state


def check_hash(head: Header, path: os.PathLike, expect_hash: Optional[str]) -> None:
    """A checkpoint written by another run (its config hash is not ``expect_hash``) is an error."""
    if expect_hash is not None and head.config_hash != expect_hash:
        raise CheckpointError(f"{path}: written by a run with config hash {head.config_hash}, but this "
                              f"run's config hash is {expect_hash}: a checkpoint of another run (another "
                              f"seed, model or preset?); refusing to mix runs")


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
    """The step of ``latest.pt`` (else ``prev.pt``), digest-checked but read without loading the
    tensors; None if neither is good."""
    for name in (LATEST, PREV):
        p = Path(ckpt_dir) / name
        if p.is_file():
            try:
                return header(_read(p, "cpu", mmap=True), p).step
            except CheckpointError:
                continue
    return None


def load_latest(ckpt_dir: str | os.PathLike, *, map_location: Any = "cpu", kind: Optional[str] = None,
                warn=print) -> Optional[tuple[dict, Path]]:
    """``(state, path)`` of the newest good checkpoint (``latest.pt``, else ``prev.pt``), or None
    if there is none. Falling back past a damaged ``latest.pt`` is one line through ``warn``
    naming both files; if candidates exist but none is good, :class:`CheckpointError` lists them."""
    d = Path(ckpt_dir)
    errors = []
    for p in (d / LATEST, d / PREV):
        if not p.is_file():
            continue
        try:
            state = load(p, map_location=map_location, kind=kind)
        except CheckpointError as e:
            errors.append(str(e))
            continue
        if errors:
            warn(f"warning: skipping damaged checkpoint {errors[0]}; using {p} (step {header(state, p).step}) "
                 f"instead")
        return state, p
    if errors:
        raise CheckpointError("no usable checkpoint:\n  " + "\n  ".join(errors)
                              + f"\ndelete {d} to restart this run from scratch")
    return None


def load_resume(ckpt_dir: str | os.PathLike, *, expect_hash: Optional[str] = None,
                map_location: Any = "cpu", warn=print) -> Optional[tuple[dict, Path]]:
    """``(state, path)`` of the newest good full checkpoint to resume from (see
    :func:`load_latest`), or None. A config-hash mismatch is always an error."""
    found = load_latest(ckpt_dir, map_location=map_location, kind="full", warn=warn)
    if found is not None:
        check_hash(header(*found), found[1], expect_hash)
    return found
