"""One writer per folder: an OS-level lock (``fcntl.flock``) on a lock file inside it.

The lock file records the holder's PID and host, so a refused process can name it. The lock
belongs to the open file, so it goes with the process: a killed run never leaves a stale lock.
Used through :meth:`studylib.run.rundir.RunDir.lock`.
"""
from __future__ import annotations

import contextlib
import errno
import os
import socket
from pathlib import Path

from studylib.config import ConfigError


class RunDirLocked(ConfigError):
    """Another process holds the run directory's lock (it is writing that run)."""


@contextlib.contextmanager
def dir_lock(path: str | os.PathLike, name: str = ".lock"):
    """Hold the lock of folder ``path`` (created if missing) for the block; :class:`RunDirLocked`
    naming the holder if another process (or another open of the file) holds it. A folder this
    call created is removed again if the block fails before anything but the lock file is in it."""
    import fcntl

    path = Path(path)
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    lock_path = path / name
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        if e.errno != errno.EROFS:
            raise
        fd = None
    if fd is None:  # a read-only filesystem: no process can write this run, so none can conflict;
        yield  # a finished run is read as usual, and the first write fails with one clear line
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 200, 0).decode("utf-8", "replace").split() or ["?", "?"]
        os.close(fd)
        raise RunDirLocked(f"{path}: in use by another training process (pid {holder[0]} on {holder[-1]}, "
                           f"per {lock_path}); wait for it to end or stop it") from None
    ok = False
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        yield
        ok = True
    finally:
        os.ftruncate(fd, 0)
        if created and not ok and [p.name for p in path.iterdir()] == [name]:
            lock_path.unlink()  # (a process that opened it meanwhile then fails on the missing folder)
            path.rmdir()
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
