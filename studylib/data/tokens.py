"""Stage 4: the token file: every story encoded once as ``story <eos>``, the training stories
then the validation stories, in one flat array with a sidecar (counts per side, sha256); checked
before use and rebuilt when corrupt or stale."""
from __future__ import annotations

import itertools
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np
import sentencepiece as spm
from tqdm.auto import tqdm

from studylib.data.cache import CacheWarning, cache_key, log
from studylib.data.split import SIDES
from studylib.storage.files import sha256_file, write_atomic

TOKEN_FORMAT = "train+val/story+eos/v2"  # layout of the token file (part of its cache key)
CHUNK = 4096  # stories per encode call


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
        if sha256_file(bin_path) != meta["sha256"]:
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

    digest = write_atomic(bin_path, chunks())
    bar.close()
    n_tokens = sum(counts.values())
    build["tokenize_seconds"] = time.perf_counter() - t0
    build["tokens_per_s"] = n_tokens / max(build["tokenize_seconds"], 1e-9)
    meta = dict(meta, n_tokens=n_tokens, n_train_tokens=counts["train"], sha256=digest,
                n_train_stories=n_side["train"], n_val_stories=n_side["val"])
    write_atomic(meta_path, json.dumps(meta, indent=1))
    log(progress, f"{n_tokens:,} tokens ({counts['train']:,} train, {counts['val']:,} val) in "
                   f"{build['tokenize_seconds']:.1f} s ({build['tokens_per_s']:,.0f} tok/s) -> {bin_path}")


def token_file(sp: spm.SentencePieceProcessor, tok_key: str, sides: dict, n_side: dict, cache: Path,
               threads: int, progress: bool, build: dict, **info) -> tuple[np.memmap, dict]:
    """(the tokens as a memmap, the sidecar) of the token file keyed by the tokenizer: checked
    and loaded from ``cache``, else (re)built; ``info`` is recorded in the sidecar."""
    dtype = np.dtype(np.uint16 if sp.get_piece_size() <= 65535 else np.uint32)
    key = cache_key(TOKEN_FORMAT, tok_key, dtype.name)
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
