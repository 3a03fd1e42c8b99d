"""Atomic file writes (the one implementation): write a temporary file in the same folder,
flush and fsync it, rename it over the target (``os.replace`` is atomic) and fsync the folder.
A crash at any point leaves either the old file or the new one, never a torn one (a kill leaves
the temporary file ``.tmp-<name>.<pid>`` too: the next write of that file removes it once its
writer is gone). A write that runs out of space (ENOSPC/EDQUOT) raises :class:`DiskFullError`
naming the file and the space it needed; the temporary file is removed and the old file is
untouched. A file or folder finished elsewhere is put in place the same way
(:func:`move_into_place`), and a whole folder is written atomically by :func:`atomic_folder`.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import IO, Iterable, Iterator, Optional, Union

TMP_PREFIX = ".tmp-"
_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """A write ran out of disk space (``errno`` ENOSPC, ``filename`` the target); the message
    names the file and the space needed."""

    def __str__(self) -> str:
        return str(self.strerror)


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


def _is_disk_full(exc: Optional[BaseException]) -> bool:
    """``exc`` or an exception it was raised from / during is ENOSPC or EDQUOT (torch, for one,
    turns a failed write into its own RuntimeError raised while handling the OSError)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def disk_full_error(path: Path, needed: Optional[int], written: int) -> DiskFullError:
    """The one-line error for a write to ``path`` that ran out of space."""
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:  # pragma: no cover
        free = 0
    need = (f"it needs about {_human(needed)}" if needed else
            f"it had written {_human(written)} when the disk filled")
    return DiskFullError(errno.ENOSPC, f"{path}: no space left on device writing this file ({need}; "
                         f"{_human(free)} free in {path.parent}); free some space and rerun (the "
                         f"previous {path.name}, if any, is intact)", str(path))


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", *,
                needed: Optional[int] = None) -> Iterator[IO]:
    """``with atomic_open(p) as f: f.write(...)``: ``p`` appears complete at the end of the block,
    or (on any error, the temporary file removed) not at all. ``needed``: the expected size in
    bytes, quoted by the :class:`DiskFullError` raised when the disk fills."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(path)  # what a killed writer of this file left
    tmp = tmp_path_for(path)
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        written = tmp.stat().st_size if tmp.exists() else 0
        tmp.unlink(missing_ok=True)
        if _is_disk_full(e):
            raise disk_full_error(path, needed, written) from e
        raise
    fsync_dir(path.parent)


def write_atomic(path: str | os.PathLike, data: Union[bytes, str, Iterable[bytes]]) -> str:
    """Write ``data`` (bytes, text, or an iterable of byte chunks) to ``path`` atomically; return
    the sha256 (hex) of what was written."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    h = hashlib.sha256()
    with atomic_open(path, "wb") as f:
        for chunk in ([data] if isinstance(data, (bytes, bytearray)) else data):
            h.update(chunk)
            f.write(chunk)
    return h.hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """The sha256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def write_json_atomic(path: str | os.PathLike, obj, **dump_kwargs) -> None:
    dump_kwargs.setdefault("indent", 1)
    write_atomic(path, json.dumps(obj, **dump_kwargs) + "\n")


def _writer_alive(tmp: Path) -> bool:
    """Whether the process that is writing ``tmp`` (its name ends in ``.<pid>``) still runs."""
    pid = tmp.name.rsplit(".", 1)[-1]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def clean_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of ``path`` (``.tmp-<name>.<pid>``) whose writer is gone: a
    write of it killed before its rename (the file itself is whole, old or new). A temporary file
    of a process still running is left alone: it may be writing now. Returns what was removed."""
    path = Path(path)
    removed = []
    for p in path.parent.glob(glob.escape(f"{TMP_PREFIX}{path.name}.") + "*"):
        if p.name.rsplit(".", 1)[-1].isdigit() and not _writer_alive(p):
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def clean_temp_files(folder: str | os.PathLike, stale_only: bool = False) -> list[Path]:
    """Remove temporary files an interrupted write left in ``folder``; returns what was removed.
    ``stale_only``: only those whose writer (the pid in the name) is gone, for a folder other
    processes may be writing now (a shared data cache)."""
    d = Path(folder)
    removed = []
    if d.is_dir():
        for p in d.glob(f"{TMP_PREFIX}*"):
            if stale_only and _writer_alive(p):
                continue
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def move_into_place(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Rename the finished file (or folder) ``src`` to ``dst`` in one atomic step (``os.replace``:
    same filesystem; a file at ``dst`` is replaced) and fsync the folder, so ``dst`` is the old or
    the new one after a crash, never a part: a file written by a library into a scratch folder
    (TensorBoard's event file), a checkpoint set aside as the previous one."""
    dst = Path(dst)
    os.replace(src, dst)
    fsync_dir(dst.parent)


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike) -> Iterator[Path]:
    """``with atomic_folder(p) as tmp: write files into tmp``: at the end of the block ``tmp``
    becomes ``p`` (a folder already at ``p`` is renamed aside first and removed after; each rename
    is atomic), or, on any error, ``tmp`` is removed and ``p`` is untouched. ``tmp`` has the
    permissions of a normal new folder."""
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{path.name}.", dir=path.parent))
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes it 0700
        yield tmp
        old = None
        if path.exists():
            old = path.with_name(f".old-{path.name}.{os.getpid()}")
            os.replace(path, old)
        move_into_place(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
