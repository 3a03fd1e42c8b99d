"""Stage 2: the corpus read once (every file checked and fingerprinted) and split by story into
a training side and a validation side (see :mod:`studylib.data`)."""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional

import numpy as np

from studylib.config import DataConfig
from studylib.config.identity import DATA_SPLIT
from studylib.data.stories import DataError, fingerprint, resolved_source, story_source

SIDES = ("train", "val")  # in the order of the token file


def read_corpus(cfg: DataConfig) -> tuple[Callable[[], Iterator[str]], str, int]:
    """(a function giving a fresh iterator over the stories, the corpus sha256, the number of
    stories). Every data file is read here, so a bad one fails before anything is written."""
    stories = story_source(cfg)
    corpus, n_stories = fingerprint(stories())
    if n_stories == 0:
        raise DataError("the data source holds no non-empty stories")
    return stories, corpus, n_stories


def fingerprint_now(cfg: DataConfig) -> Optional[str]:
    """The corpus sha256 of the stories ``cfg`` reads when they are local files; None for a hub
    corpus (reading it needs the network)."""
    if resolved_source(cfg) != "local":
        return None
    return fingerprint(story_source(cfg)())[0]


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
