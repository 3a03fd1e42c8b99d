"""Atomic file writes (the one implementation): write a temporary file in the same folder,
flush and fsync it, rename it over the target (``os.replace`` is atomic) and fsync the folder.
A crash at any point leaves either the old file or the new one, never a torn one.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import IO, Iterable, Iterator, Union

TMP_PREFIX = ".tmp-"


def tmp_path_for(path: Path) -> Path:
    return path.parent / f"{TMP_PREFIX}{path.name}.{os.getpid()}"


def fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """``with atomic_open(p) as f: f.write(...)``: ``p`` appears complete at the end of the block,
    or (on any error, the temporary file removed) not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path_for(path)
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_atomic(path: str | os.PathLike, data: Union[bytes, str, Iterable[bytes]]) -> None:
    """Write ``data`` (bytes, text, or an iterable of byte chunks) to ``path`` atomically."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_open(path, "wb") as f:
        if isinstance(data, (bytes, bytearray)):
            f.write(data)
        else:
            for chunk in data:
                f.write(chunk)


def write_json_atomic(path: str | os.PathLike, obj, **dump_kwargs) -> None:
    dump_kwargs.setdefault("indent", 1)
    write_atomic(path, json.dumps(obj, **dump_kwargs) + "\n")


def clean_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Remove temporary files an interrupted write left in ``folder``; returns what was removed."""
    d = Path(folder)
    removed = []
    if d.is_dir():
        for p in d.glob(f"{TMP_PREFIX}*"):
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed
