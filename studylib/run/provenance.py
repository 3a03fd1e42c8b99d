"""What a run was trained on and with, proven by fingerprints rather than paths.

A run records the sha256 of its corpus (the story texts, in order: :func:`studylib.data.stories.fingerprint`)
and of its SentencePiece model file (:data:`KEYS`), and the code that trained it (:data:`CODE_KEYS`:
the sha256 of the ``studylib`` package's ``.py`` files, :func:`code_sha256`, and torch's version)
with its torch thread count (:data:`THREADS`; fp32 results differ by ~1e-7 between thread
counts). The trainer puts them in every checkpoint and in ``summary.json`` (``provenance``,
:func:`of_data`); the checkpoint also carries the run's config hash, which covers the preset, the
model, the seed and the data split (:mod:`studylib.config.identity`). Then:

* **resume** refuses data whose fingerprints differ from the checkpoint's (another corpus behind
  ``STUDYLIB_DATA_DIR``, another tokenizer), and code or torch that differ from what trained the
  checkpoint, with one line naming both (:func:`check_resume`); another thread count is not
  refused (a sweep gives each run ``cores // runs in flight`` threads, so a run stopped beside
  others may finish alone), and the run records the threads it finished with;
* **loading a trained run** (``generate``, ``export``, ``evaluate``, the explorer, the notebooks'
  probes: :meth:`studylib.run.rundir.RunDir.load_model`) refuses a checkpoint of another run
  (its config hash), a checkpoint whose fingerprints differ from the run's summary, and a
  tokenizer that is not the run's (:func:`check_tokenizer`);
* **reusing a finished run** (``studylib study`` and every notebook, through
  :func:`studylib.study.orchestration.plan.plan_runs` or the study's plan file, and ``train`` on a
  finished run) refuses one whose corpus fingerprint
  differs from the stories the preset reads now, when they are local files (:func:`check_reuse`;
  a hub corpus is not re-read for it: that needs the network); one reused although *other code*
  trained it, or trained before code fingerprints existed, is only flagged, in one line for the
  whole sweep naming them (:func:`flag_reused`): every commit changes the code's fingerprint, and
  refusing would retrain every run after every edit (retrain one by deleting its folder);
* **a Dask worker** reports its code, torch and threads before it gets work, and one whose code or
  torch differs from the study's process is refused (:mod:`studylib.study.orchestration.worker`);
* **moving a data cache** still works: the run's tokenizer is found by its fingerprint in the data
  cache (``STUDYLIB_CACHE_DIR``, else the preset's ``data.cache_dir``) when the recorded path is gone
  (:func:`find_tokenizer`).

Runs trained before fingerprints existed have none: they load as before (the tokenizer found by
vocab size in the cache), with a warning that it could not be verified.
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys
import warnings
from importlib import metadata
from pathlib import Path
from typing import Mapping, Optional

from studylib.config import ConfigError
from studylib.storage.files import sha256_file

KEYS = ("corpus_sha256", "tokenizer_sha256")  # the data
CODE_KEYS = ("code_sha256", "torch_version")  # the code
THREADS = "torch_threads"
WHAT = {"corpus_sha256": "corpus (story texts) sha256", "tokenizer_sha256": "tokenizer sha256",
        "code_sha256": "studylib code sha256", "torch_version": "torch", THREADS: "torch threads"}
PACKAGE = Path(__file__).resolve().parents[1]  # the studylib package this process imported


class ProvenanceError(ConfigError):
    """Weights, tokenizer or data that do not belong together."""


def short(sha) -> str:
    return "none recorded" if not sha else str(sha)[:12]


@functools.lru_cache(maxsize=None)
def code_sha256(package: os.PathLike = PACKAGE) -> str:
    """The fingerprint of a ``studylib`` source tree (default: the one this process imported):
    sha256 over its ``.py`` files sorted by their path inside the package, each as ``path NUL
    sha256(bytes)``; the same tree anywhere on disk gives the same fingerprint, one changed
    character another. Computed once per process (~150 files, a few ms)."""
    root = Path(package)
    files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*.py"))
    h = hashlib.sha256()
    for rel, p in files:
        h.update(f"{rel}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


def of_code() -> dict:
    """The code this process trains with (:data:`CODE_KEYS`): its ``studylib`` source and the
    installed torch (its distribution's version: read without importing torch)."""
    return {"code_sha256": code_sha256(), "torch_version": _torch_version()}


@functools.lru_cache(maxsize=None)
def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:  # pragma: no cover - a torch without package metadata
        import torch

        return torch.__version__


def of_data(data) -> dict:
    """What a run trains on and with: the fingerprints of its data (:class:`studylib.data.windows.TokenData`;
    none for a look-alike without them, in tests), this process's code (:func:`of_code`) and its
    torch threads now (the trainer asks after setting the run's threads)."""
    import torch

    build = getattr(data, "build", None) or {}
    return {**{k: build[k] for k in KEYS if build.get(k)}, **of_code(), THREADS: torch.get_num_threads()}


def mismatches(recorded: Optional[Mapping], now: Optional[Mapping], keys: tuple = KEYS) -> list[str]:
    """``"<what> <recorded> -> <now>"`` for each of ``keys`` (default: the data's) both sides have
    and that differs."""
    recorded, now = recorded or {}, now or {}
    return [f"{WHAT[k]} {short(recorded[k])} -> {short(now[k])}" for k in keys
            if recorded.get(k) and now.get(k) and recorded[k] != now[k]]


def check_resume(run: os.PathLike, head, finished: bool, now: Mapping) -> dict:
    """Refuse to resume a run from its checkpoint (``head``: its
    :class:`studylib.run.checkpoint.Header`, at ``head.step`` with fingerprints ``head.provenance``)
    on other data, or under other code or torch when steps are left to train (``finished``: the
    checkpoint holds its ``final`` record, the run's last: only the summary is rewritten).
    The fingerprints the run goes on with: ``now``, or for the last checkpoint the code and threads
    that trained it (a rebuilt summary records the training's, not the rebuilding process's)."""
    step, saved = head.step, head.provenance or {}
    diff = mismatches(saved, now)
    if diff:
        raise ProvenanceError(
            f"{run}: its checkpoint (step {step}) was trained on other data than this attempt reads "
            f"({'; '.join(diff)}; checkpoint -> now): STUDYLIB_DATA_DIR / data.data_dir / "
            f"data.max_stories point elsewhere? Resume with the run's data, or delete the folder to retrain")
    if finished:
        return {**{k: v for k, v in now.items() if k in KEYS},
                **{k: saved[k] for k in (*CODE_KEYS, THREADS) if k in saved}}
    diff = mismatches(saved, now, CODE_KEYS)
    if diff:
        raise ProvenanceError(
            f"{run}: its checkpoint (step {step}) was trained by other code than this attempt runs "
            f"({'; '.join(diff)}; checkpoint -> now): its remaining steps would train under other code. "
            f"Resume it from the studylib checkout and torch that trained it, or delete the folder to retrain")
    return dict(now)


def check_reuse(run: os.PathLike, recorded: Optional[Mapping], now: Mapping) -> None:
    """Refuse to reuse a finished run (summary fingerprints ``recorded``) where other data is read
    now (a study, a notebook on the study's plan, ``train`` on the finished run)."""
    diff = mismatches(recorded, now)
    if diff:
        raise ProvenanceError(
            f"{run}: finished on other data than the stories read now ({'; '.join(diff)}; the run -> now): "
            f"STUDYLIB_DATA_DIR / data.data_dir point elsewhere? Point them back, or delete the run "
            f"folders trained on the other data (or the preset's whole runs/ folder) to retrain")


def check_finished_corpus(run: os.PathLike, recorded: Optional[Mapping], data, cfg) -> None:
    """``train`` on a finished run (summary fingerprints ``recorded``): :func:`check_reuse` against
    ``data``'s corpus fingerprint, else the stories ``cfg`` reads when they are local files (a hub
    corpus is not re-read: that needs the network)."""
    if not (recorded or {}).get("corpus_sha256"):
        return
    from studylib.data.split import fingerprint_now

    now = (getattr(data, "build", None) or {}).get("corpus_sha256") if data is not None else fingerprint_now(cfg)
    check_reuse(run, recorded, {"corpus_sha256": now})


def code_differs(recorded: Optional[Mapping], now: Optional[Mapping] = None) -> bool:
    """Whether a run's recorded code (:data:`CODE_KEYS`) is not ``now``'s (default: this
    process's), or was never recorded (a run trained before code fingerprints existed)."""
    recorded, now = recorded or {}, now or of_code()
    return not recorded.get("code_sha256") or bool(mismatches(recorded, now, CODE_KEYS))


def flag_reused(runs: Mapping[os.PathLike, Optional[Mapping]]) -> Optional[str]:
    """One line on stderr naming the finished runs (``{run dir: recorded fingerprints}``) that are
    reused although other code trained them, or none was recorded; the line, or None if there are
    none. A flag, not a refusal: any commit changes the code's fingerprint (a comment, a notebook
    helper), and refusing would retrain every run after every edit. Their numbers may differ from a
    retrain by this code; delete a run's folder to retrain it."""
    now = of_code()
    other = [str(r) for r, rec in runs.items() if (rec or {}).get("code_sha256") and code_differs(rec, now)]
    unknown = [str(r) for r, rec in runs.items() if not (rec or {}).get("code_sha256")]
    if not other and not unknown:
        return None
    base = os.path.commonpath(other + unknown) if len(other + unknown) > 1 else ""

    def rel(rs: list) -> str:
        return ", ".join(os.path.relpath(r, base) if base else r for r in rs)

    parts = ([f"{len(other)} trained by other studylib code or torch ({rel(other)})"] if other else []) + \
            ([f"{len(unknown)} trained before code fingerprints were recorded ({rel(unknown)})"] if unknown else [])
    line = (f"warning: {len(other) + len(unknown)} finished run(s) reused{' in ' + base if base else ''} "
            f"that this code did not train: {'; '.join(parts)}; their results may differ from a retrain "
            f"here (delete a run's folder to retrain it)")
    print(line, file=sys.stderr)
    return line


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


__all__ = ["KEYS", "CODE_KEYS", "THREADS", "ProvenanceError", "code_sha256", "of_code", "of_data", "mismatches",
           "check_resume", "check_reuse", "check_finished_corpus", "code_differs", "flag_reused", "check_checkpoint", "check_tokenizer",
           "find_tokenizer", "anchored"]
