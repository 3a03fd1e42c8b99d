"""Data pipeline: corpus -> SentencePiece BPE tokenizer -> flat token file -> windows -> split.

In the spirit of llama2.c's ``tinystories.py``:

1. **Stories** come from local files (``data.data_dir``) or the Hugging Face hub
   (``data.hub_dataset``); ``data.max_stories`` keeps only the first N.
2. A **SentencePiece BPE** tokenizer (byte fallback, unk=0, bos=1, eos=2, no pad) is trained on
   all training stories and cached as ``<cache_dir>/tokenizer-<key>.model``; the key hashes the
   corpus fingerprint (sha256 of the story texts), the vocab size and the trainer options.
3. Every story is encoded once and written as ``story <eos>`` (no ``<bos>``: the eos that ends
   one story is the separator before the next) into one flat ``uint16`` array (``uint32`` when
   the vocab exceeds 65,535): ``<cache_dir>/tokens-<key>.bin`` + a sidecar ``tokens-<key>.json``
   with the token count and sha256. Both files are written atomically; a cache whose size or
   sha256 is wrong is reported and rebuilt, never used. The array is loaded with ``np.memmap``.
   SentencePiece's default normalisation turns newlines inside a story into spaces.
4. **Windows** are fixed and non-overlapping: window ``i`` is ``tokens[i*context:(i+1)*context]``
   (a trailing partial window is dropped), giving ``context - 1`` next-token targets each.
5. **Split**: the window indices are permuted with ``np.random.default_rng(split_seed)``; the
   first ``round(n * val_fraction)`` (at least 1) are validation, the rest training. Both index
   arrays are returned sorted; training order per epoch comes from :func:`epoch_order`.
"""
from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np
import sentencepiece as spm
import torch
from tqdm.auto import tqdm

from studylib.config import DataConfig
from studylib.run.files import atomic_open
from studylib.run.stories import DataError, fingerprint, story_source

SPM_OPTIONS = dict(  # everything that changes the trained model (part of the cache key)
    model_type="bpe", byte_fallback=True, character_coverage=0.9995,
    unk_id=0, bos_id=1, eos_id=2, pad_id=-1, max_sentence_length=65536,
    input_sentence_size=2_000_000, shuffle_input_sentence=True,
)
TOKEN_FORMAT = "story+eos/v1"  # layout of the token file (part of its cache key)
CHUNK = 4096  # stories per encode call


class CacheWarning(UserWarning):
    """A cache file was corrupt or stale and is being rebuilt."""


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _atomic_write(path: Path, chunks: Iterable[bytes]) -> str:
    """Write chunks to ``path`` atomically; return their sha256."""
    h = hashlib.sha256()
    with atomic_open(path, "wb") as f:
        for c in chunks:
            h.update(c)
            f.write(c)
    return h.hexdigest()


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------
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
    _atomic_write(path, [model.getvalue()])


# --------------------------------------------------------------------------------------------
# token cache
# --------------------------------------------------------------------------------------------
def _check_tokens(bin_path: Path, meta_path: Path, key: str) -> Optional[str]:
    """None if the cache is complete and intact, else what is wrong with it."""
    if not bin_path.exists() and not meta_path.exists():
        return ""  # nothing cached: build silently
    try:
        meta = json.loads(meta_path.read_text())
        itemsize = np.dtype(meta["dtype"]).itemsize
        if meta["key"] != key:
            return f"key {meta['key']} != {key}"
        size = bin_path.stat().st_size
        if size != meta["n_tokens"] * itemsize:
            return f"{size} bytes, expected {meta['n_tokens'] * itemsize}"
        h = hashlib.sha256()
        with open(bin_path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
        if h.hexdigest() != meta["sha256"]:
            return "sha256 mismatch"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable ({type(e).__name__}: {e})"
    return None


def encode_stories(sp: spm.SentencePieceProcessor, stories: Iterable[str], dtype,
                   threads: int) -> Iterator[np.ndarray]:
    """Token chunks ``story <eos> story <eos> ...``, encoded CHUNK stories at a time in parallel."""
    eos = sp.eos_id()
    it = iter(stories)
    while batch := list(itertools.islice(it, CHUNK)):
        ids = sp.encode(batch, num_threads=threads)
        yield np.fromiter(itertools.chain.from_iterable(x + [eos] for x in ids), dtype=dtype)


@dataclass
class TokenData:
    tokens: np.ndarray  # flat memmap of token ids
    context: int
    train_idx: np.ndarray  # int64 window indices, sorted
    val_idx: np.ndarray  # int64 window indices, sorted
    vocab_size: int
    tokenizer_path: Path
    n_stories: int = 0
    build: dict = field(default_factory=dict)  # cache keys, what was (re)built, timings

    @property
    def n_windows(self) -> int:
        return len(self.tokens) // self.context

    def windows(self, idx) -> torch.Tensor:
        """Windows ``idx`` (array of window indices) as a (len(idx), context) int64 tensor."""
        grid = self.tokens[: self.n_windows * self.context].reshape(self.n_windows, self.context)
        return torch.from_numpy(grid[np.asarray(idx, dtype=np.int64)].astype(np.int64))

    def summary(self) -> dict:
        t = self.context - 1
        return dict(train_windows=len(self.train_idx), val_windows=len(self.val_idx),
                    train_targets=len(self.train_idx) * t, val_targets=len(self.val_idx) * t,
                    tokens=len(self.tokens), stories=self.n_stories, vocab_size=self.vocab_size,
                    context=self.context, tokenizer=str(self.tokenizer_path))

    def tokenizer(self) -> spm.SentencePieceProcessor:
        return load_tokenizer(self.tokenizer_path)


def split_windows(n_windows: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) window indices, each sorted; val = first round(n*f) (>= 1) of a permutation."""
    if n_windows < 2:
        raise DataError(f"the corpus gives {n_windows} window(s); at least 2 are needed for a "
                        f"train/val split: use more stories or a smaller data.context")
    n_val = min(max(1, round(n_windows * val_fraction)), n_windows - 1)
    perm = np.random.default_rng(seed).permutation(n_windows)
    return np.sort(perm[n_val:]).astype(np.int64), np.sort(perm[:n_val]).astype(np.int64)


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of ``range(n)`` determined by (seed, epoch): same seed -> same batches."""
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)


def load_data(cfg: DataConfig, progress: bool = True) -> TokenData:
    """Build (or load from ``cfg.cache_dir``) the tokenizer and the token file; split windows."""
    cfg.validate()
    stories = story_source(cfg)
    threads = cfg.tokenizer_threads or os.cpu_count() or 1
    cache = Path(cfg.cache_dir)
    if cache.exists() and not cache.is_dir():
        raise DataError(f"data.cache_dir={str(cache)!r} exists and is not a directory")
    build: dict = {}

    t0 = time.perf_counter()
    corpus, n_stories = fingerprint(stories())  # reads every file first: a bad one fails here
    if n_stories == 0:
        raise DataError("the data source holds no non-empty stories")
    cache.mkdir(parents=True, exist_ok=True)  # only once the data has been read
    build["read_seconds"] = time.perf_counter() - t0

    tok_key = _key("tokenizer", corpus, cfg.vocab_size, SPM_OPTIONS)
    tok_path = cache / f"tokenizer-{tok_key}.model"
    sp = None
    if tok_path.exists():
        try:
            sp = load_tokenizer(tok_path)
        except (OSError, RuntimeError) as e:
            warnings.warn(f"{tok_path}: unreadable tokenizer ({e}); retraining", CacheWarning)
    build["tokenizer_trained"] = sp is None
    if sp is None:
        _log(progress, f"training SentencePiece BPE (vocab {cfg.vocab_size}) on {n_stories:,} stories ...")
        t0 = time.perf_counter()
        train_tokenizer(stories(), cfg.vocab_size, tok_path, threads)
        build["tokenizer_seconds"] = time.perf_counter() - t0
        _log(progress, f"tokenizer trained in {build['tokenizer_seconds']:.1f} s -> {tok_path}")
        sp = load_tokenizer(tok_path)

    vocab = sp.get_piece_size()
    dtype = np.dtype(np.uint16 if vocab <= 65535 else np.uint32)
    key = _key(TOKEN_FORMAT, tok_key, dtype.name)
    bin_path, meta_path = cache / f"tokens-{key}.bin", cache / f"tokens-{key}.json"
    problem = _check_tokens(bin_path, meta_path, key)
    if problem:
        warnings.warn(f"{bin_path}: token cache is corrupt or stale ({problem}); rebuilding", CacheWarning)
    build["tokens_built"] = problem is not None
    if problem is not None:
        t0, n_tokens = time.perf_counter(), 0
        bar = tqdm(total=n_stories, unit="story", desc="tokenising", disable=not progress,
                   file=sys.stderr)

        def chunks():
            nonlocal n_tokens
            for arr in encode_stories(sp, stories(), dtype, threads):
                n_tokens += len(arr)
                bar.update(int((arr == sp.eos_id()).sum()))
                yield arr.tobytes()

        digest = _atomic_write(bin_path, chunks())
        bar.close()
        build["tokenize_seconds"] = time.perf_counter() - t0
        build["tokens_per_s"] = n_tokens / max(build["tokenize_seconds"], 1e-9)
        meta = dict(key=key, dtype=dtype.name, n_tokens=n_tokens, sha256=digest, tokenizer_key=tok_key,
                    n_stories=n_stories, corpus_sha256=corpus, format=TOKEN_FORMAT)
        _atomic_write(meta_path, [json.dumps(meta, indent=1).encode()])
        _log(progress, f"{n_tokens:,} tokens in {build['tokenize_seconds']:.1f} s "
                       f"({build['tokens_per_s']:,.0f} tok/s) -> {bin_path}")
    meta = json.loads(meta_path.read_text())
    tokens = np.memmap(bin_path, dtype=np.dtype(meta["dtype"]), mode="r", shape=(meta["n_tokens"],))
    train_idx, val_idx = split_windows(len(tokens) // cfg.context, cfg.val_fraction, cfg.split_seed)
    build.update(tokenizer_key=tok_key, tokens_key=key, corpus_sha256=corpus)
    return TokenData(tokens=tokens, context=cfg.context, train_idx=train_idx, val_idx=val_idx,
                     vocab_size=vocab, tokenizer_path=tok_path, n_stories=n_stories, build=build)


# --------------------------------------------------------------------------------------------
# CLI: python -m studylib prepare-data --params params/X.yaml [--set data.key=value ...]
# --------------------------------------------------------------------------------------------
def add_cli(parser) -> None:
    parser.add_argument("--params", required=True, help="preset YAML (params/*.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a preset value, e.g. data.max_stories=1000 (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run_cli(args) -> int:
    from studylib.config import load_preset

    preset = load_preset(args.params, args.set)
    data = load_data(preset.data, progress=True)
    s = data.summary()
    s.update(tokenizer=str(data.tokenizer_path), tokens_file=str(data.tokens.filename),
             **{k: data.build[k] for k in ("tokenizer_seconds", "tokenize_seconds", "tokens_per_s")
                if k in data.build})
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    print(f"stories {s['stories']:,}  tokens {s['tokens']:,}  vocab {s['vocab_size']:,}  "
          f"context {s['context']}")
    print(f"train: {s['train_windows']:,} windows, {s['train_targets']:,} target tokens")
    print(f"val:   {s['val_windows']:,} windows, {s['val_targets']:,} target tokens")
    print("tokenizer: " + (f"trained in {s['tokenizer_seconds']:.1f} s" if "tokenizer_seconds" in s
                           else "cached") + f"  ({s['tokenizer']})")
    print("tokens: " + (f"{s['tokens_per_s']:,.0f} tok/s ({s['tokenize_seconds']:.1f} s)"
                        if "tokens_per_s" in s else "cached") + f"  ({s['tokens_file']})")
    return 0
