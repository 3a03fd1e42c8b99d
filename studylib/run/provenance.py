"""What a run was trained on, proven by fingerprints rather than paths.

A run records the sha256 of its corpus (the story texts, in order: :func:`studylib.data.stories.fingerprint`)
and of its SentencePiece model file (:data:`KEYS`). The trainer puts them in every checkpoint and in
``summary.json`` (``provenance``); the checkpoint also carries the run's config hash, which covers
the preset, the model, the seed and the data split (:mod:`studylib.config.identity`). Then:

* **resume** refuses data whose fingerprints differ from the checkpoint's (another corpus behind
  ``STUDYLIB_DATA_DIR``, another tokenizer) with one line naming both (:func:`check_resume`);
* **loading a trained run** (``generate``, ``export``, ``evaluate``, the explorer, the notebooks'
  probes: :meth:`studylib.run.rundir.RunDir.load_model`) refuses a checkpoint of another run
  (its config hash), a checkpoint whose fingerprints differ from the run's summary, and a
  tokenizer that is not the run's (:func:`check_tokenizer`);
* **reusing a finished run** (``studylib study`` and every notebook, through
  :func:`studylib.study.orchestration.sweep.ensure_grids`) refuses one whose corpus fingerprint
  differs from the stories the preset reads now, when they are local files (:func:`check_reuse`;
  a hub corpus is not re-read for it: that needs the network);
* **moving a data cache** still works: the run's tokenizer is found by its fingerprint in the data
  cache (``STUDYLIB_CACHE_DIR``, else the preset's ``data.cache_dir``) when the recorded path is gone
  (:func:`find_tokenizer`).

Runs trained before fingerprints existed have none: they load as before (the tokenizer found by
vocab size in the cache), with a warning that it could not be verified.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Mapping, Optional

from studylib.config import ConfigError
from studylib.storage.files import sha256_file

KEYS = ("corpus_sha256", "tokenizer_sha256")
WHAT = {"corpus_sha256": "corpus (story texts)", "tokenizer_sha256": "tokenizer"}


class ProvenanceError(ConfigError):
    """Weights, tokenizer or data that do not belong together."""


def short(sha: Optional[str]) -> str:
    return "none recorded" if not sha else sha[:12]


def of_data(data) -> dict:
    """The fingerprints of the data a run trains on (:class:`studylib.data.windows.TokenData`);
    ``{}`` for a look-alike without them (tests)."""
    build = getattr(data, "build", None) or {}
    return {k: build[k] for k in KEYS if build.get(k)}


def mismatches(recorded: Optional[Mapping], now: Optional[Mapping]) -> list[str]:
    """``"<what> <recorded> -> <now>"`` for each fingerprint both sides have and that differs."""
    recorded, now = recorded or {}, now or {}
    return [f"{WHAT[k]} sha256 {short(recorded[k])} -> {short(now[k])}" for k in KEYS
            if recorded.get(k) and now.get(k) and recorded[k] != now[k]]


def check_resume(run: os.PathLike, step: int, saved: Optional[Mapping], now: Mapping) -> None:
    """Refuse to resume a run (checkpoint at ``step`` with fingerprints ``saved``) on other data."""
    diff = mismatches(saved, now)
    if diff:
        raise ProvenanceError(
            f"{run}: its checkpoint (step {step}) was trained on other data than this attempt reads "
            f"({'; '.join(diff)}; checkpoint -> now): STUDYLIB_DATA_DIR / data.data_dir / "
            f"data.max_stories point elsewhere? Resume with the run's data, or delete the folder to retrain")


def check_reuse(run: os.PathLike, recorded: Optional[Mapping], now: Mapping) -> None:
    """Refuse to reuse a finished run (summary fingerprints ``recorded``) for a study that reads
    other data now."""
    diff = mismatches(recorded, now)
    if diff:
        raise ProvenanceError(
            f"{run}: finished on other data than this study reads ({'; '.join(diff)}; the run -> now): "
            f"STUDYLIB_DATA_DIR / data.data_dir point elsewhere? Point them back, or delete the run "
            f"folders trained on the other data (or the preset's whole runs/ folder) to retrain")


def check_checkpoint(run: os.PathLike, path: os.PathLike, state_prints: Optional[Mapping],
                     summary_prints: Optional[Mapping]) -> None:
    """A checkpoint whose fingerprints differ from the run's summary came from another run."""
    diff = mismatches(summary_prints, state_prints)
    if diff:
        raise ProvenanceError(f"{path}: not this run's checkpoint: {'; '.join(diff)} (the run's summary -> "
                              f"the checkpoint). Restore the run's own checkpoint or retrain {run}")


def check_tokenizer(path: os.PathLike, expected: Optional[str], run: os.PathLike, given: bool) -> None:
    """Refuse a tokenizer file whose sha256 is not the one the run recorded."""
    if not expected:
        return
    got = sha256_file(path)
    if got != expected:
        where = f"--tokenizer {path}" if given else str(path)
        raise ProvenanceError(f"{where}: not the tokenizer {run} was trained with (sha256 {short(got)}, "
                              f"the run's {short(expected)}); pass the run's SentencePiece model with --tokenizer")


def anchored(path: os.PathLike, doc: Mapping) -> Path:
    """A path a run recorded: relative ones (older runs kept the default ``outputs/cache``) are
    relative to the repository of the preset the run was made from, not to today's working
    directory (a notebook under nbval runs in its own folder)."""
    p = Path(path)
    preset_path = (doc.get("run") or {}).get("preset_path")
    if p.is_absolute() or not preset_path:
        return p
    return Path(preset_path).resolve().parent.parent / p


def _cache_dir(doc: Mapping) -> Optional[Path]:
    cache = os.environ.get("STUDYLIB_CACHE_DIR") or ((doc.get("preset") or {}).get("data") or {}).get("cache_dir")
    if not cache:
        return None
    cache = anchored(cache, doc)
    return cache if cache.is_dir() else None


def find_tokenizer(doc: Mapping, recorded: Optional[str], expected: Optional[str], vocab_size: int) -> Optional[Path]:
    """The run's SentencePiece model: the ``recorded`` path when it is there (verified later), else
    the cache file with the ``expected`` sha256; for a run without fingerprints, the one cache
    file of its vocab size (the data rebuilt when several corpora share the cache)."""
    if recorded and anchored(recorded, doc).is_file():
        return anchored(recorded, doc)
    cache = _cache_dir(doc)
    if cache is None:
        return None
    candidates = sorted(cache.glob("tokenizer-*.model"))
    if expected:
        return next((p for p in candidates if sha256_file(p) == expected), None)
    found = _by_vocab_size(candidates, doc, vocab_size)
    if found is not None:
        warnings.warn(f"{found}: taken as the run's tokenizer by its vocab size (the run was trained before "
                      f"fingerprints were recorded, so it cannot be verified)", UserWarning)
    return found


def _by_vocab_size(candidates: list, doc: Mapping, vocab_size: int) -> Optional[Path]:
    import sentencepiece as spm

    pdata = ((doc.get("preset") or {}).get("data") or {})
    want = pdata.get("vocab_size")
    found = []
    for p in candidates:
        try:
            n = spm.SentencePieceProcessor(model_file=str(p)).get_piece_size()
        except (OSError, RuntimeError):
            continue
        if n <= vocab_size and (want is None or n == want):
            found.append(p)
    if len(found) == 1:
        return found[0]
    if len(found) > 1:  # several corpora share the cache: recompute the exact key from the data
        from studylib.config import DataConfig, dataclass_from_dict
        from studylib.data.pipeline import load_data

        keys = {f for f in DataConfig.__dataclass_fields__}
        dcfg = dataclass_from_dict(DataConfig, {k: v for k, v in pdata.items() if k in keys}, "data")
        return Path(load_data(dcfg, progress=False).tokenizer_path)
    return None


__all__ = ["KEYS", "ProvenanceError", "of_data", "mismatches", "check_resume", "check_reuse", "check_checkpoint",
           "check_tokenizer", "find_tokenizer", "anchored"]
