"""Run directories: the one owner of a run's files.

A run lives where :mod:`studylib.run.layout` puts it. It holds ``config.yaml`` (the run's identity hash, the resolved preset and
model config: :func:`studylib.config.run_document`), ``metrics.jsonl`` (one JSON object per
line, ``kind`` "train" or "eval"), ``summary.json`` (written when the run finished) and
``checkpoints/`` (:mod:`studylib.run.checkpoint`), and ``.lock`` (:meth:`RunDir.lock`: one writer at
a time). Everything that reads or writes those files goes through :class:`RunDir`.
"""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from studylib.config import ConfigError, ModelConfig, Preset, identity_diff, model_from_dict, same_run
from studylib.run import metrics_file, provenance
from studylib.run.dirlock import dir_lock
from studylib.run.layout import (CHECKPOINT_DIR, CONFIG_FILE, LOCK_FILE, METRICS_FILE, SUMMARY_FILE,
                                 run_dir_for)
from studylib.storage.files import write_atomic, write_json_atomic


#: libyaml's safe loader where PyYAML has it (a run's config.yaml in ~1 ms, not ~60 ms: every
#: finished run's config is read when a sweep or a table checks it), else the pure-Python one
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _checkpoint():
    """:mod:`studylib.run.checkpoint`, imported when a method needs it: it imports torch (~2 s), and
    reading summaries, configs and metrics (the analysis, the status line) needs none."""
    from studylib.run import checkpoint

    return checkpoint


class RunDirConflict(ConfigError):
    """The run directory holds a run with a different configuration."""


@dataclass
class LoadedRun:
    """A model rebuilt from a run directory (eval mode) with its tokenizer and where it came from."""

    model: Any  # studylib.nn.model.Decoder
    tokenizer: Any  # sentencepiece.SentencePieceProcessor, or None when it cannot be found
    config: ModelConfig
    step: Optional[int]  # optimizer step the weights were saved at
    checkpoint: Path
    tokenizer_path: Optional[Path] = None  # the verified SentencePiece model file


class RunDir:
    """One run directory (``os.fspath(RunDir(p)) == str(p)``)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @classmethod
    def of(cls, preset: Preset, model: str, seed: int, root: str | os.PathLike | None = None,
           tag: Optional[str] = None) -> "RunDir":
        return cls(run_dir_for(preset, model, seed, root, tag))

    def __fspath__(self) -> str:
        return str(self.path)

    @property
    def preset_folder(self) -> Optional[Path]:
        """``<outputs>/<preset>``: the folder above this run's ``runs`` folder (None when the run
        does not live in the layout above)."""
        return next((p.parent for p in self.path.parents if p.name == "runs"), None)

    @property
    def tag(self) -> Optional[str]:
        """The variant's tag (``runs/<model>/<tag>/seed<N>``), None for a preset's own run."""
        parts = self.path.parts
        return parts[-2] if len(parts) >= 4 and parts[-4] == "runs" else None

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ---- paths ---------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINT_DIR

    @property
    def lock_path(self) -> Path:
        return self.path / LOCK_FILE

    # ---- one writer ------------------------------------------------------------------------
    def lock(self):
        """Context manager: hold this run directory's lock for the block (one writer per run
        directory); :class:`studylib.run.dirlock.RunDirLocked`, naming the holder's PID, if another process holds it.
        See :func:`studylib.run.dirlock.dir_lock`."""
        return dir_lock(self.path, LOCK_FILE)

    # ---- config ----------------------------------------------------------------------------
    def read_config(self) -> Optional[dict]:
        """The stored ``config.yaml`` (None if there is none)."""
        if not self.config_path.is_file():
            return None
        try:
            doc = yaml.load(self.config_path.read_text(encoding="utf-8"), Loader=_SAFE_LOADER)
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise RunDirConflict(f"{self.config_path}: unreadable run config "
                                 f"({' '.join(str(e).split())[:200]})") from None
        if not isinstance(doc, dict):
            raise RunDirConflict(f"{self.config_path}: not a run config (expected a YAML mapping)")
        return doc

    def check(self, doc: dict) -> str:
        """Raise :class:`RunDirConflict` if this folder holds another run than ``doc`` describes.

        Returns the run's config hash: the stored one for an existing run (its checkpoints carry
        it), else ``doc``'s. Identity is compared by :func:`studylib.config.same_run`, so runs
        written before a schema field was added stay valid. A folder that holds a summary or a
        checkpoint but no ``config.yaml``, or whose summary was written under another config
        hash than its ``config.yaml`` holds, is refused too (:meth:`check_files`), and so is a
        finished run whose ``metrics.jsonl`` is damaged (:meth:`read_metrics`).
        """
        old = self.check_files()
        if old is None:
            return doc["run"]["config_hash"]
        if not same_run(old, doc):
            split = (old.get("run") or {}).get("data_split")
            if split != (doc.get("run") or {}).get("data_split"):
                was = split or "the window split of before story/v1"
                raise RunDirConflict(
                    f"{self.path}: holds a run trained on another data split ({was}; now "
                    f"{doc['run'].get('data_split')}): its validation loss is not comparable. "
                    "Delete that folder to retrain, or use another --run-dir.")
            init = (old.get("run") or {}).get("init")
            if init != (doc.get("run") or {}).get("init"):
                raise RunDirConflict(
                    f"{self.path}: holds a run whose initial weights were drawn another way "
                    f"({init or 'in construction order, before keyed draws'}; now {doc['run'].get('init')}): "
                    "its numbers are not this code's. Delete that folder to retrain, or use another --run-dir.")
            diff = identity_diff(old, doc)
            raise RunDirConflict(
                f"{self.path}: holds a run with a different configuration ({'; '.join(diff[:4])}"
                f"{f'; and {len(diff) - 4} more' if len(diff) > 4 else ''}; stored -> this run). "
                f"Use another --run-dir, restore the settings, or delete that folder.")
        if self.finished():  # reused as it is: its records must be whole (a resume restores an unfinished one's)
            self.read_metrics()
        return (old.get("run") or {}).get("config_hash") or doc["run"]["config_hash"]

    def check_files(self) -> Optional[dict]:
        """The stored ``config.yaml`` (None for a folder with no run in it yet), once the folder's
        files are known to be one run's: :class:`RunDirConflict` if it holds ``summary.json`` or a
        checkpoint but no ``config.yaml`` (whose run it is cannot be checked: a run copied in from
        elsewhere, or its config deleted), or if ``summary.json`` records another config hash than
        ``config.yaml`` (the trainer writes both with the hash its checkpoints carry). Reads no
        checkpoint (no torch): a checkpoint's own hash is checked when it is loaded."""
        doc = self.read_config()
        if doc is None:
            found = [name for name, there in ((SUMMARY_FILE, self.summary_path.is_file()),
                                              (f"{CHECKPOINT_DIR}/", any(self.checkpoints.glob("*.pt"))))
                     if there]
            if found:
                raise RunDirConflict(f"{self.path}: holds {' and '.join(found)} but no {CONFIG_FILE}, so whose run "
                                     f"it is cannot be checked (copied in from elsewhere, or its config deleted); "
                                     f"delete that folder to retrain the run")
            return None
        stored = (doc.get("run") or {}).get("config_hash")
        written = (self.summary() or {}).get("config_hash")
        if stored and written and written != stored:
            raise RunDirConflict(f"{self.summary_path}: written by a run with config hash {written}, but "
                                 f"{self.config_path} holds {stored}: the folder mixes two runs; delete it to "
                                 f"retrain the run")
        return doc

    def write_config(self, doc: dict) -> None:
        write_atomic(self.config_path, yaml.safe_dump(doc, sort_keys=False))

    def model_config(self) -> ModelConfig:
        doc = self.read_config()
        if doc is None:
            raise ConfigError(f"{self.path}: not a run directory (no {CONFIG_FILE})")
        if "model" not in doc:
            raise ConfigError(f"{self.config_path}: has no resolved 'model' section")
        return model_from_dict(doc["model"], where=f"{self.config_path}:model")

    # ---- metrics (the file's logic: studylib.run.metrics_file) ----------------------------
    def read_metrics(self, kind: Optional[str] = None) -> list[dict]:
        """The records of ``metrics.jsonl`` (optionally only ``kind`` "train" or "eval"), read
        strictly (:func:`studylib.run.metrics_file.read`): a torn last line, from a crash, is left
        out with a warning; any other damage is a ConfigError naming the file and the line. A
        finished run whose file holds no record (emptied, or lines of ``{}``) is one too: its curve
        would drop out of every frame without a word."""
        recs = metrics_file.read(self.metrics_path)
        if not recs and self.metrics_path.is_file() and self.finished():
            raise metrics_file.MetricsDamaged(
                f"{self.metrics_path}: a finished run's metrics.jsonl holds no record; restore the file or delete "
                f"the run's folder to rerun it")
        return recs if kind is None else [r for r in recs if r.get("kind") == kind]

    def append_metrics(self, rec: dict) -> str:
        """Append ``rec`` as one line; returns the line written (its newline included)."""
        return metrics_file.append(self.metrics_path, rec)

    def resume_metrics(self, step: int, written: Optional[str], expected: dict[str, list[int]]) -> Optional[str]:
        """Make ``metrics.jsonl`` hold exactly the records up to optimizer step ``step``
        (:func:`studylib.run.metrics_file.resume`)."""
        return metrics_file.resume(self.metrics_path, self.path, step, written, expected)

    def metric_lines(self) -> list[str]:
        """The lines of ``metrics.jsonl`` that are JSON objects (no newlines; others are left out:
        :func:`studylib.run.metrics_file.lines`), for a resume and the progress display."""
        return metrics_file.lines(self.metrics_path)

    def forget_unsaved(self) -> None:
        """Remove the config and metrics of an attempt that stopped before its first checkpoint
        (nothing can resume it; a rerun with a corrected config would otherwise be refused)."""
        for p in (self.metrics_path, self.config_path):  # the config last: no metrics without one
            p.unlink(missing_ok=True)

    # ---- summary ---------------------------------------------------------------------------
    def summary(self) -> Optional[dict]:
        if not self.summary_path.is_file():
            return None
        try:
            s = json.loads(self.summary_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        return s if isinstance(s, dict) else None

    def finished(self) -> bool:
        """A finished run: ``summary.json`` says ``finished`` and has its numeric ``best_val_loss``
        (a summary without it, e.g. ``{"finished": true}``, is not a finished run)."""
        return not self.summary_missing(("best_val_loss",))

    def summary_missing(self, keys) -> list[str]:
        """What keeps ``summary.json`` from being a finished run's summary with the numeric
        ``keys``: ["summary.json"] if there is none or it is not finished, else the keys it lacks."""
        s = self.summary()
        if not s or s.get("finished") is not True:
            return [SUMMARY_FILE]
        return [k for k in keys if not (isinstance(s.get(k), (int, float)) and not isinstance(s.get(k), bool))]

    def write_summary(self, summary: dict) -> None:
        write_json_atomic(self.summary_path, summary, default=metrics_file.json_default)

    # ---- checkpoints -----------------------------------------------------------------------
    def latest_step(self) -> Optional[int]:
        """The step of the newest readable full checkpoint (``latest.pt``, else ``prev.pt``)."""
        return _checkpoint().peek_step(self.checkpoints)

    def checkpoint_steps(self) -> list[int]:
        """Steps at which this run can be loaded, ascending: its ``step_<N>.pt`` snapshots and
        the step of ``latest.pt`` (empty if it has no checkpoint)."""
        steps = {s for s, _ in _checkpoint().list_snapshots(self.checkpoints)}
        last = self.latest_step()
        if last is not None:
            steps.add(last)
        return sorted(steps)

    def has_checkpoint(self) -> bool:
        ck = self.checkpoints
        ckpt = _checkpoint()
        return (ck / ckpt.LATEST).is_file() or (ck / ckpt.PREV).is_file() or bool(ckpt.list_snapshots(ck))

    def _checkpoint_state(self, step: Optional[int], path: Optional[os.PathLike]) -> tuple[dict, Path]:
        if path is not None:
            return _checkpoint().load(path), Path(path)
        if step is not None:
            snap = _checkpoint().snapshot_path(self.checkpoints, int(step))
            if snap.is_file():
                return _checkpoint().load(snap), snap
            if self.latest_step() != int(step):
                raise ConfigError(f"{self.path}: no checkpoint at step {step}; saved steps: "
                                  f"{self.checkpoint_steps()} (train with train.keep_checkpoints=true "
                                  f"to keep one per evaluation)")
        found = _checkpoint().load_latest(self.checkpoints, warn=lambda m: warnings.warn(m, UserWarning))
        if found is None:
            raise ConfigError(f"{self.path}: no checkpoint yet ({self.checkpoints / _checkpoint().LATEST} "
                              f"is missing)")
        return found

    def load_model(self, step: Optional[int] = None, checkpoint_path: Optional[os.PathLike] = None,
                   device: Any = "cpu", tokenizer: Optional[os.PathLike] = None) -> LoadedRun:
        """The run's model at ``step`` (None: the latest checkpoint; or the file ``checkpoint_path``),
        loaded through :func:`studylib.run.checkpoint.load` (no pickled code runs), in eval mode,
        with its SentencePiece tokenizer (``tokenizer``: a path to use instead of the run's).

        The checkpoint must be this run's (its config hash, its fingerprints) and the tokenizer the
        one the run was trained with (:mod:`studylib.run.provenance`); else one error naming both."""
        from studylib.nn.model import Decoder

        cfg = self.model_config()
        state, path = self._checkpoint_state(step, checkpoint_path)
        head = _checkpoint().header(state, path)
        _checkpoint().check_hash(head, path, ((self.read_config() or {}).get("run") or {}).get("config_hash"))
        recorded = self.fingerprints()
        provenance.check_checkpoint(self.path, path, head.provenance, recorded)
        prints = head.provenance or recorded
        model = Decoder(cfg)
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as e:
            first = next((ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()), str(e))
            raise _checkpoint().CheckpointError(f"{path}: its weights do not fit the model in {self.config_path} "
                                                f"({first[:200]})") from None
        model.to(device).eval()
        tok_path = self.tokenizer_path(tokenizer, prints)
        return LoadedRun(model=model, tokenizer=self._open_tokenizer(tok_path, tokenizer is not None), config=cfg,
                         step=head.step, checkpoint=path, tokenizer_path=tok_path)

    # ---- tokenizer -------------------------------------------------------------------------
    def fingerprints(self) -> dict:
        """What the run recorded it was trained on (:data:`studylib.run.provenance.KEYS`; ``{}`` for
        an unfinished run or one trained before fingerprints: its checkpoints carry them)."""
        return dict((self.summary() or {}).get("provenance") or {})

    def tokenizer_path(self, path: Optional[os.PathLike] = None, prints: Optional[dict] = None) -> Optional[Path]:
        """The run's SentencePiece model, verified against its fingerprint (``prints``, default the
        summary's): ``path`` when given, else the recorded path, else the cache file with that
        fingerprint (a moved cache). None when it cannot be found."""
        prints = self.fingerprints() if prints is None else prints
        expected = prints.get("tokenizer_sha256")
        if path is not None:
            if not Path(path).is_file():
                raise ConfigError(f"--tokenizer {path}: file not found (a SentencePiece .model file)")
            provenance.check_tokenizer(path, expected, self.path, given=True)
            return Path(path)
        doc = self.read_config() or {}
        recorded = ((self.summary() or {}).get("data") or {}).get("tokenizer")
        found = provenance.find_tokenizer(doc, recorded, expected, self.model_config().vocab_size)
        if found is not None:
            provenance.check_tokenizer(found, expected, self.path, given=False)
        return found

    def load_tokenizer(self, path: Optional[os.PathLike] = None):
        """The run's tokenizer (:meth:`tokenizer_path`) loaded, or None with a warning."""
        return self._open_tokenizer(self.tokenizer_path(path), path is not None)

    def _open_tokenizer(self, found: Optional[Path], given: bool):
        import sentencepiece as spm

        if found is None:
            warnings.warn(f"{self.path}: could not find the run's tokenizer (data cache moved?); "
                          f"pass --tokenizer / load it yourself", UserWarning)
            return None
        try:
            return spm.SentencePieceProcessor(model_file=str(found))
        except (OSError, RuntimeError) as e:
            where = f"--tokenizer {found}" if given else str(found)
            raise ConfigError(f"{where}: not a SentencePiece .model file ({' '.join(str(e).split())[:160]})") from None
