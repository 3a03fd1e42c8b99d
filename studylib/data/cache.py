"""What every cache stage shares: the key that names a cache file, the warning raised when a
cache file is rebuilt, and the progress line."""
from __future__ import annotations

import hashlib
import json
import sys


class CacheWarning(UserWarning):
    """A cache file was corrupt or stale and is being rebuilt."""


def cache_key(*parts) -> str:
    """16 hex digits of the sha256 of ``parts`` (JSON, sorted keys): the name of a cache file."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def log(progress: bool, msg: str) -> None:
    """One progress line on stderr (when ``progress``)."""
    if progress:
        print(msg, file=sys.stderr, flush=True)
