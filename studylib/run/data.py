"""Data pipeline: corpus -> split by story -> SentencePiece BPE (training stories) -> token file
-> windows per side.

In the spirit of llama2.c's ``tinystories.py``; :func:`load_data` runs one function per stage:

1. **Stories** (:func:`read_corpus`) come from local files (``data.data_dir``) or the Hugging Face
   hub (``data.hub_dataset``); ``data.max_stories`` keeps only the first N. One pass reads every
   story (a bad file fails here, before anything is written) and fingerprints the corpus (sha256
   of the story texts, in order).
2. **Split by story** (:func:`split_stories`): the story numbers ``0..n-1`` are permuted with
   ``np.random.default_rng(split_seed)``; the first ``round(n * val_fraction)`` (at least 1, at
   most n-1) are the validation stories, the rest the training stories. Each side keeps the
   corpus order (training order per epoch comes from :func:`epoch_order`). A story lies wholly
   on one side, so no validation text is ever trained on, nor seen by the tokenizer. (Splitting
   windows instead, as before ``DATA_SPLIT`` ``story/v1``, put part of nearly every validation
   story into training: at context 128 a story spans ~2 windows.)
3. **Tokenizer** (:func:`tokenizer_for`): a SentencePiece BPE model (byte fallback, unk=0, bos=1,
   eos=2, no pad) trained on the **training stories only**, cached as
   ``<cache_dir>/tokenizer-<key>.model``; the key hashes the corpus fingerprint, the split
   (``DATA_SPLIT``, ``split_seed``, ``val_fraction``), the vocab size and the trainer options.
4. **Token file** (:func:`token_file`): every story is encoded once as ``story <eos>`` (no
   ``<bos>``: the eos that ends one story is the separator before the next) into one flat
   ``uint16`` array (``uint32`` when the vocab exceeds 65,535) holding the training stories'
   tokens, then the validation stories' tokens: ``<cache_dir>/tokens-<key>.bin`` + a sidecar
   ``tokens-<key>.json`` with the token and story counts per side and the sha256. Both files are
   written atomically; a cache whose size or sha256 is wrong is reported and rebuilt, never used.
   The array is loaded with ``np.memmap``. SentencePiece's default normalisation turns newlines
   inside a story into spaces.
5. **Windows per side** (:func:`split_windows`): each side is cut on its own into fixed,
   non-overlapping windows of ``context`` tokens starting at the side's first token (each side's
   trailing partial window is dropped), so no window crosses from training text into validation
   text. Windows are numbered training first: window ``i < T`` is ``tokens[i*context:(i+1)*context]``,
   window ``T + j`` is the j-th window of the validation region (:meth:`TokenData.window_starts`).
   Each window gives ``context - 1`` next-token targets.
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
from typing import Callable, Iterable, Iterator, Optional

import numpy as np
import sentencepiece as spm
import torch
from tqdm.auto import tqdm

from studylib.config import DataConfig
from studylib.config.identity import DATA_SPLIT
from studylib.run.files import atomic_open, clean_temp_files
from studylib.run.stories import DataError, fingerprint, story_source

SPM_OPTIONS = dict(  # everything that changes the trained model (part of the cache key)
    model_type="bpe", byte_fallback=True, character_coverage=0.9995,
    unk_id=0, bos_id=1, eos_id=2, pad_id=-1, max_sentence_length=65536,
    input_sentence_size=2_000_000, shuffle_input_sentence=True,
)
TOKEN_FORMAT = "train+val/story+eos/v2"  # layout of the token file (part of its cache key)
SIDES = ("train", "val")  # in the order of the token file
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
# stages 1-2: the stories and their split
# --------------------------------------------------------------------------------------------
def read_corpus(cfg: DataConfig) -> tuple[Callable[[], Iterator[str]], str, int]:
    """(a function giving a fresh iterator over the stories, the corpus sha256, the number of
    stories). Every data file is read here, so a bad one fails before anything is written."""
    stories = story_source(cfg)
    corpus, n_stories = fingerprint(stories())
    if n_stories == 0:
        raise DataError("the data source holds no non-empty stories")
    return stories, corpus, n_stories


def split_stories(n_stories: int, val_fraction: float, seed: int) -> np.ndarray:
    """Which stories are validation stories: a bool mask over the corpus, True for the first
    ``round(n * val_fraction)`` (at least 1, at most n - 1) stories of a permutation by ``seed``."""
    if n_stories < 2:
        raise DataError(f"the corpus holds {n_stories} story; at least 2 are needed for a train/val "
                        f"split by story: use more stories (data.max_stories, data.data_dir)")
    n_val = min(max(1, round(n_stories * val_fraction)), n_stories - 1)
    is_val = np.zeros(n_stories, dtype=bool)
    is_val[np.random.default_rng(seed).permutation(n_stories)[:n_val]] = True
    return is_val


def side_stories(stories: Callable[[], Iterable[str]], is_val: np.ndarray, side: str) -> Iterator[str]:
    """The stories of one side (``"train"`` or ``"val"``), in corpus order."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    want = side == "val"
    return (s for s, v in zip(stories(), is_val.tolist()) if v == want)


def split_key(cfg: DataConfig) -> dict:
    """What defines the split: part of every cache key (a cache built on another split, or on the
    window split before ``story/v1``, is never reused)."""
    return dict(format=DATA_SPLIT, split_seed=cfg.split_seed, val_fraction=cfg.val_fraction)


# --------------------------------------------------------------------------------------------
# stage 3: the tokenizer (training stories only)
# --------------------------------------------------------------------------------------------
def tokenizer_for(cfg: DataConfig, corpus: str, train_stories: Callable[[], Iterable[str]],
                  n_train: int, cache: Path, threads: int, progress: bool,
                  build: dict) -> tuple[spm.SentencePieceProcessor, Path, str]:
    """(tokenizer, its path, its cache key): loaded from ``cache``, else trained on
    ``train_stories()`` (``n_train`` of them) and written there."""
    tok_key = _key("tokenizer", corpus, split_key(cfg), cfg.vocab_size, SPM_OPTIONS)
    tok_path = cache / f"tokenizer-{tok_key}.model"
    sp = None
    if tok_path.exists():
        try:
            sp = load_tokenizer(tok_path)
        except (OSError, RuntimeError) as e:
            warnings.warn(f"{tok_path}: unreadable tokenizer ({e}); retraining", CacheWarning)
    build["tokenizer_trained"] = sp is None
    if sp is None:
        _log(progress, f"training SentencePiece BPE (vocab {cfg.vocab_size}) on the {n_train:,} "
                       f"training stories ...")
        t0 = time.perf_counter()
        train_tokenizer(train_stories(), cfg.vocab_size, tok_path, threads)
        build["tokenizer_seconds"] = time.perf_counter() - t0
        _log(progress, f"tokenizer trained in {build['tokenizer_seconds']:.1f} s -> {tok_path}")
        sp = load_tokenizer(tok_path)
    return sp, tok_path, tok_key


# --------------------------------------------------------------------------------------------
# stage 4: the token file (training stories, then validation stories)
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
        if not 0 <= meta["n_train_tokens"] <= meta["n_tokens"]:
            return f"n_train_tokens {meta['n_train_tokens']} outside [0, {meta['n_tokens']}]"
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


def _write_tokens(sp: spm.SentencePieceProcessor, sides: dict, n_side: dict, bin_path: Path,
                  meta_path: Path, meta: dict, threads: int, progress: bool, build: dict) -> None:
    """Encode ``sides["train"]()`` then ``sides["val"]()`` into ``bin_path``; write the sidecar."""
    dtype = np.dtype(meta["dtype"])
    t0, counts = time.perf_counter(), {side: 0 for side in SIDES}
    bar = tqdm(total=sum(n_side.values()), unit="story", desc="tokenising", disable=not progress,
               file=sys.stderr)

    def chunks():
        for side in SIDES:
            for arr in encode_stories(sp, sides[side](), dtype, threads):
                counts[side] += len(arr)
                bar.update(int((arr == sp.eos_id()).sum()))
                yield arr.tobytes()

    digest = _atomic_write(bin_path, chunks())
    bar.close()
    n_tokens = sum(counts.values())
    build["tokenize_seconds"] = time.perf_counter() - t0
    build["tokens_per_s"] = n_tokens / max(build["tokenize_seconds"], 1e-9)
    meta = dict(meta, n_tokens=n_tokens, n_train_tokens=counts["train"], sha256=digest,
                n_train_stories=n_side["train"], n_val_stories=n_side["val"])
    _atomic_write(meta_path, [json.dumps(meta, indent=1).encode()])
    _log(progress, f"{n_tokens:,} tokens ({counts['train']:,} train, {counts['val']:,} val) in "
                   f"{build['tokenize_seconds']:.1f} s ({build['tokens_per_s']:,.0f} tok/s) -> {bin_path}")


def token_file(sp: spm.SentencePieceProcessor, tok_key: str, sides: dict, n_side: dict, cache: Path,
               threads: int, progress: bool, build: dict, **info) -> tuple[np.memmap, dict]:
    """(the tokens as a memmap, the sidecar) of the token file keyed by the tokenizer: checked
    and loaded from ``cache``, else (re)built; ``info`` is recorded in the sidecar."""
    dtype = np.dtype(np.uint16 if sp.get_piece_size() <= 65535 else np.uint32)
    key = _key(TOKEN_FORMAT, tok_key, dtype.name)
    bin_path, meta_path = cache / f"tokens-{key}.bin", cache / f"tokens-{key}.json"
    problem = _check_tokens(bin_path, meta_path, key)
    if problem:
        warnings.warn(f"{bin_path}: token cache is corrupt or stale ({problem}); rebuilding", CacheWarning)
    build["tokens_built"] = problem is not None
    if problem is not None:
        meta = dict(key=key, dtype=dtype.name, tokenizer_key=tok_key, format=TOKEN_FORMAT, **info)
        _write_tokens(sp, sides, n_side, bin_path, meta_path, meta, threads, progress, build)
    meta = json.loads(meta_path.read_text())
    tokens = np.memmap(bin_path, dtype=np.dtype(meta["dtype"]), mode="r", shape=(meta["n_tokens"],))
    return tokens, meta


# --------------------------------------------------------------------------------------------
# stage 5: windows per side
# --------------------------------------------------------------------------------------------
def split_windows(n_train_tokens: int, n_tokens: int, context: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) window indices: ``0..T-1`` over the first ``n_train_tokens`` tokens and
    ``T..T+V-1`` over the rest, each side cut into whole windows of ``context`` on its own."""
    n_val_tokens = n_tokens - n_train_tokens
    n_train, n_val = n_train_tokens // context, n_val_tokens // context
    if n_train == 0:
        raise DataError(f"the training stories hold {n_train_tokens:,} tokens, less than one window of "
                        f"data.context={context}: use more stories, a smaller data.val_fraction or a "
                        f"smaller data.context")
    if n_val == 0:
        raise DataError(f"the validation stories hold {n_val_tokens:,} tokens, less than one window of "
                        f"data.context={context}: use more stories, a larger data.val_fraction or a "
                        f"smaller data.context")
    return np.arange(n_train, dtype=np.int64), np.arange(n_train, n_train + n_val, dtype=np.int64)


@dataclass
class TokenData:
    """The tokens and windows of both sides. ``tokens[:n_train_tokens]`` are the training stories'
    tokens, the rest the validation stories'; ``train_idx`` = ``0..T-1`` and ``val_idx`` =
    ``T..T+V-1`` index windows that lie wholly in their own side (:meth:`window_starts`)."""

    tokens: np.ndarray  # flat memmap of token ids: training stories, then validation stories
    context: int
    train_idx: np.ndarray  # int64 window indices, sorted
    val_idx: np.ndarray  # int64 window indices, sorted
    vocab_size: int
    tokenizer_path: Path
    n_train_tokens: int  # where the validation stories' tokens begin
    n_train_stories: int = 0
    n_val_stories: int = 0
    build: dict = field(default_factory=dict)  # cache keys, what was (re)built, timings

    @property
    def n_stories(self) -> int:
        return self.n_train_stories + self.n_val_stories

    @property
    def n_windows(self) -> int:
        return self.n_train_tokens // self.context + (len(self.tokens) - self.n_train_tokens) // self.context

    def side_tokens(self, side: str) -> np.ndarray:
        """The tokens of one side's stories (``story <eos>`` each, whole): ``"train"`` or ``"val"``."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {side!r}")
        return self.tokens[: self.n_train_tokens] if side == "train" else self.tokens[self.n_train_tokens:]

    def window_starts(self, idx) -> np.ndarray:
        """The offsets in ``tokens`` where windows ``idx`` begin."""
        idx = np.asarray(idx, dtype=np.int64)
        n, t = self.n_windows, self.n_train_tokens // self.context
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"window index out of range [0, {n})")
        return np.where(idx < t, idx * self.context, self.n_train_tokens + (idx - t) * self.context)

    def windows(self, idx) -> torch.Tensor:
        """Windows ``idx`` (array of window indices) as a (len(idx), context) int64 tensor."""
        rows = np.lib.stride_tricks.sliding_window_view(self.tokens, self.context)  # row r: tokens[r:r+context]
        return torch.from_numpy(np.asarray(rows[self.window_starts(idx)]).astype(np.int64))

    def summary(self) -> dict:
        """Corpus totals and, per side, stories / windows / target tokens (context - 1 per
        window) / tokens: ``train_windows``, ``val_targets``, ..."""
        t = self.context - 1
        out = dict(stories=self.n_stories, tokens=len(self.tokens), vocab_size=self.vocab_size,
                   context=self.context, tokenizer=str(self.tokenizer_path))
        for side, idx, n in (("train", self.train_idx, self.n_train_stories),
                             ("val", self.val_idx, self.n_val_stories)):
            out.update({f"{side}_stories": n, f"{side}_windows": len(idx), f"{side}_targets": len(idx) * t,
                        f"{side}_tokens": len(self.side_tokens(side))})
        return out

    def tokenizer(self) -> spm.SentencePieceProcessor:
        return load_tokenizer(self.tokenizer_path)


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of ``range(n)`` determined by (seed, epoch): same seed -> same batches."""
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)


class DataMemo:
    """:func:`load_data` once per distinct data section in this process (a sweep's runs and a
    training worker's runs share their data)."""

    def __init__(self, progress: bool = True):
        self.progress = progress
        self._loaded: list = []  # [(DataConfig, TokenData)]

    def get(self, cfg: DataConfig) -> TokenData:
        for c, data in self._loaded:
            if c == cfg:
                return data
        data = load_data(cfg, progress=self.progress)
        self._loaded.append((cfg, data))
        return data


def load_data(cfg: DataConfig, progress: bool = True) -> TokenData:
    """The stages of the module doc in order: stories, split by story, tokenizer (training stories),
    token file, windows per side; the tokenizer and token file come from ``cfg.cache_dir`` when
    they are there and intact."""
    cfg.validate()
    threads = cfg.tokenizer_threads or os.cpu_count() or 1
    cache = Path(cfg.cache_dir)
    if cache.exists() and not cache.is_dir():
        raise DataError(f"data.cache_dir={str(cache)!r} exists and is not a directory")
    t0, build = time.perf_counter(), {}
    stories, corpus, n_stories = read_corpus(cfg)
    is_val = split_stories(n_stories, cfg.val_fraction, cfg.split_seed)
    cache.mkdir(parents=True, exist_ok=True)  # only once the data has been read
    clean_temp_files(cache, stale_only=True)  # what a killed prepare-data left (issue #24)
    build["read_seconds"] = time.perf_counter() - t0
    sides = {side: (lambda side=side: side_stories(stories, is_val, side)) for side in SIDES}
    n_side = {"train": int((~is_val).sum()), "val": int(is_val.sum())}

    sp, tok_path, tok_key = tokenizer_for(cfg, corpus, sides["train"], n_side["train"], cache, threads,
                                          progress, build)
    tokens, meta = token_file(sp, tok_key, sides, n_side, cache, threads, progress, build,
                              corpus_sha256=corpus, split=split_key(cfg))
    train_idx, val_idx = split_windows(meta["n_train_tokens"], len(tokens), cfg.context)
    build.update(tokenizer_key=tok_key, tokens_key=meta["key"], corpus_sha256=corpus)
    return TokenData(tokens=tokens, context=cfg.context, train_idx=train_idx, val_idx=val_idx,
                     vocab_size=sp.get_piece_size(), tokenizer_path=tok_path,
                     n_train_tokens=meta["n_train_tokens"], n_train_stories=n_side["train"],
                     n_val_stories=n_side["val"], build=build)


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
    s.update(split=DATA_SPLIT, tokenizer=str(data.tokenizer_path), tokens_file=str(data.tokens.filename),
             **{k: data.build[k] for k in ("tokenizer_seconds", "tokenize_seconds", "tokens_per_s")
                if k in data.build})
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    print(f"stories {s['stories']:,}  tokens {s['tokens']:,}  vocab {s['vocab_size']:,}  "
          f"context {s['context']}  (split by story: {DATA_SPLIT})")
    for side in SIDES:
        print(f"{side + ':':6} {s[side + '_stories']:,} stories, {s[side + '_tokens']:,} tokens, "
              f"{s[side + '_windows']:,} windows, {s[side + '_targets']:,} target tokens")
    print("tokenizer: " + (f"trained in {s['tokenizer_seconds']:.1f} s" if "tokenizer_seconds" in s
                           else "cached") + f"  ({s['tokenizer']})")
    print("tokens: " + (f"{s['tokens_per_s']:,.0f} tok/s ({s['tokenize_seconds']:.1f} s)"
                        if "tokens_per_s" in s else "cached") + f"  ({s['tokens_file']})")
    return 0
