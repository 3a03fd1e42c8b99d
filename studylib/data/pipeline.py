"""The pipeline in order (:func:`load_data`: stories, split, tokenizer, token file, windows),
once per data section per process (:func:`shared_data`), and the ``prepare-data`` command."""
from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import numpy as np

from studylib.config import DataConfig
from studylib.config.identity import DATA_SPLIT
from studylib.data.split import SIDES, read_corpus, side_stories, split_key, split_stories
from studylib.data.stories import DataError
from studylib.data.tokenizer import tokenizer_for
from studylib.data.tokens import token_file
from studylib.data.windows import TokenData, split_windows
from studylib.storage.files import clean_temp_files


_LOADED: dict = {}  # DataConfig -> TokenData: what this process has loaded


def shared_data(cfg: DataConfig, progress: bool = False) -> TokenData:
    """:func:`load_data` once per distinct data section in this process: the plan's step counts,
    the runs trained here or by one worker, and the notebooks' readers share it (the token file is
    memory-mapped, so holding it costs little). ``progress``: shown when it loads."""
    if cfg not in _LOADED:
        _LOADED[cfg] = load_data(cfg, progress=progress)
    return _LOADED[cfg]


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
    build["read_seconds"] = time.perf_counter() - t0
    sides = {side: (lambda side=side: side_stories(stories, is_val, side)) for side in SIDES}
    n_side = {"train": int((~is_val).sum()), "val": int(is_val.sum())}
    try:
        cache.mkdir(parents=True, exist_ok=True)  # only once the data has been read
        clean_temp_files(cache, stale_only=True)  # what a killed prepare-data left (issue #24)
        sp, tok_path, tok_key = tokenizer_for(cfg, corpus, sides["train"], n_side["train"], cache, threads,
                                              progress, build)
        tokens, meta = token_file(sp, tok_key, sides, n_side, cache, threads, progress, build,
                                  corpus_sha256=corpus, split=split_key(cfg))
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT):
            raise
        raise DataError(f"data.cache_dir={str(cache)!r}: cannot write the tokenizer / token cache there "
                        f"({e}); point STUDYLIB_CACHE_DIR or data.cache_dir at a writable folder with space") from None
    train_idx, val_idx = split_windows(meta["n_train_tokens"], len(tokens), cfg.context)
    n_train, used = n_side["train"], None
    if cfg.train_fraction < 1:
        n_train, used = train_prefix(tokens[: meta["n_train_tokens"]], sp.eos_id(), n_side["train"], cfg)
        train_idx = train_idx[: used // cfg.context]
    build.update(tokenizer_key=tok_key, tokens_key=meta["key"], corpus_sha256=corpus)
    val_bytes = sum(len(s.encode("utf-8")) for s in sides["val"]())
    return TokenData(tokens=tokens, context=cfg.context, train_idx=train_idx, val_idx=val_idx,
                     vocab_size=sp.get_piece_size(), tokenizer_path=tok_path,
                     n_train_tokens=meta["n_train_tokens"], n_train_stories=n_train,
                     n_val_stories=n_side["val"], build=build, val_bytes=val_bytes, train_used=used)


def train_prefix(train_tokens, eos: int, n_stories: int, cfg: DataConfig) -> tuple[int, int]:
    """(stories, tokens) of the first ``data.train_fraction`` of the training stories (at least
    one; each story ends with ``eos`` in the token file): the windows a run with that fraction
    reads, the same budget with fewer unique tokens. Too few tokens for one window: a DataError."""
    k = max(1, round(cfg.train_fraction * n_stories))
    ends = np.flatnonzero(np.asarray(train_tokens) == eos)
    used = int(ends[k - 1]) + 1 if k <= len(ends) else len(train_tokens)
    if used < cfg.context:
        raise DataError(f"data.train_fraction={cfg.train_fraction:g}: {k} training stories hold {used:,} tokens, "
                        f"less than one window of data.context={cfg.context}; give a larger fraction")
    return k, used



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
