"""Stage 3: the SentencePiece BPE tokenizer, trained on the training stories only and cached by
a key over the corpus fingerprint, the split, the vocab size and the trainer options."""
from __future__ import annotations

import io
import os
import re
import time
import warnings
from pathlib import Path
from typing import Callable, Iterable

import sentencepiece as spm

from studylib.config import DataConfig
from studylib.data.cache import CacheWarning, cache_key, log
from studylib.data.split import split_key
from studylib.data.stories import DataError
from studylib.storage.files import sha256_file, write_atomic

SPM_OPTIONS = dict(  # everything that changes the trained model (part of the cache key)
    model_type="bpe", byte_fallback=True, character_coverage=0.9995,
    unk_id=0, bos_id=1, eos_id=2, pad_id=-1, max_sentence_length=65536,
    input_sentence_size=2_000_000, shuffle_input_sentence=True,
)


def load_tokenizer(path: str | os.PathLike) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(path))


def train_tokenizer(stories: Iterable[str], vocab_size: int, path: Path, threads: int) -> None:
    """Train the BPE model on ``stories`` and write it (atomically) to ``path``."""
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(stories), model_writer=model,
                                       vocab_size=vocab_size, num_threads=threads, minloglevel=2,
                                       **SPM_OPTIONS)
    except RuntimeError as e:
        msg = str(e)
        m = re.search(r"value <= (\d+)", msg)
        if m:
            raise DataError(f"data.vocab_size={vocab_size} is too large for this corpus: SentencePiece "
                            f"supports at most {int(m.group(1)):,} pieces here; lower data.vocab_size "
                            f"or use more stories") from None
        m = re.search(r"smaller than required_chars\. \d+ vs (\d+)", msg)
        if m:
            raise DataError(f"data.vocab_size={vocab_size} is too small: this corpus needs at least "
                            f"{m.group(1)} pieces (characters + byte fallback + special)") from None
        raise DataError(f"data.vocab_size={vocab_size}: SentencePiece could not train: {msg}") from None
    write_atomic(path, model.getvalue())


def tokenizer_for(cfg: DataConfig, corpus: str, train_stories: Callable[[], Iterable[str]],
                  n_train: int, cache: Path, threads: int, progress: bool,
                  build: dict) -> tuple[spm.SentencePieceProcessor, Path, str]:
    """(tokenizer, its path, its cache key): loaded from ``cache``, else trained on
    ``train_stories()`` (``n_train`` of them) and written there."""
    tok_key = cache_key("tokenizer", corpus, split_key(cfg), cfg.vocab_size, SPM_OPTIONS)
    tok_path = cache / f"tokenizer-{tok_key}.model"
    sp, sha = None, None
    if tok_path.exists():
        sha = check_tokenizer_file(tok_path)
        try:
            sp = load_tokenizer(tok_path)
        except (OSError, RuntimeError) as e:
            warnings.warn(f"{tok_path}: unreadable tokenizer ({e}); retraining", CacheWarning)
    build["tokenizer_trained"] = sp is None
    if sp is None:
        log(progress, f"training SentencePiece BPE (vocab {cfg.vocab_size}) on the {n_train:,} "
                       f"training stories ...")
        t0 = time.perf_counter()
        train_tokenizer(train_stories(), cfg.vocab_size, tok_path, threads)
        build["tokenizer_seconds"] = time.perf_counter() - t0
        log(progress, f"tokenizer trained in {build['tokenizer_seconds']:.1f} s -> {tok_path}")
        sp, sha = load_tokenizer(tok_path), sha256_file(tok_path)
        write_atomic(sha_path(tok_path), sha + "\n")
    build["tokenizer_sha256"] = sha  # the run's fingerprint of it (studylib.run.provenance)
    return sp, tok_path, tok_key


def sha_path(tok_path: Path) -> Path:
    """Where the sha256 of a cached tokenizer is recorded when it is trained: beside it, under its name."""
    return tok_path.with_name(tok_path.name + ".sha256")


def check_tokenizer_file(tok_path: Path) -> str:
    """The sha256 of the cached tokenizer ``tok_path``, checked against the one recorded when it was
    trained under this name (its cache key: corpus, split, vocabulary, options): a file replaced or
    swapped with another cache entry is a :class:`DataError` naming it, never a run trained (and
    recorded) with another tokenizer. A cache from before the record was kept gets it now."""
    got, record = sha256_file(tok_path), sha_path(tok_path)
    try:
        want = record.read_text().strip()
    except FileNotFoundError:
        write_atomic(record, got + "\n")
        return got
    if got != want:
        raise DataError(f"{tok_path}: its sha256 {got[:12]} is not the {want[:12]} recorded when it was trained "
                        f"under this name ({record.name}): the file was replaced (two cache files swapped?); "
                        f"delete it and {record.name} to train it again")
    return got
