"""Pick the fastest memory allocator a user can get, before torch allocates anything.

Measured on the project's 2-core machines (``python -m studylib bench alloc``, paper models,
batch 16 x 512 bf16): glibc's default malloc returns large freed blocks to the OS and faults them
in again (0.7-0.9M page faults per training step, 12-15% of CPU time in the kernel). tcmalloc
(Debian's ``libtcmalloc-minimal4``, via ``LD_PRELOAD``) made the step 1.16-1.22x faster; glibc
tunables that keep big blocks in the heap, 1.14-1.22x (1-3% behind tcmalloc), with the same peak
memory. Both must be in the environment when the process starts, so ``python -m studylib``
re-executes itself once with them (and every subprocess and notebook kernel it starts inherits
them). ``STUDYLIB_ALLOCATOR=system`` turns this off; an ``LD_PRELOAD`` or ``GLIBC_TUNABLES``
already set is respected.
"""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Mapping, Optional

TCMALLOC_PATHS = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
                  "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
                  "/usr/lib64/libtcmalloc_minimal.so.4", "/usr/lib/libtcmalloc_minimal.so.4")
# large blocks stay in the heap (no mmap per big tensor) and the heap top is never given back
GLIBC_TUNED = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736:glibc.malloc.top_pad=67108864"
GUARD = "STUDYLIB_ALLOCATOR"


def tcmalloc_path() -> Optional[str]:
    return next((p for p in TCMALLOC_PATHS if Path(p).exists()), None)


def fast_allocator_env(env: Mapping[str, str]) -> Optional[dict]:
    """The environment to re-execute with, or None when nothing should change."""
    if env.get(GUARD) or env.get("GLIBC_TUNABLES") or "malloc" in env.get("LD_PRELOAD", ""):
        return None
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    new = dict(env)
    tc = tcmalloc_path()
    if tc:
        new["LD_PRELOAD"] = f"{tc} {env.get('LD_PRELOAD', '')}".strip()
        new[GUARD] = "tcmalloc"
    else:
        new["GLIBC_TUNABLES"] = GLIBC_TUNED
        new[GUARD] = "glibc-tuned"
    return new


def reexec_with_fast_allocator(module: str = "studylib") -> None:
    """Replace this process by ``python -m <module> <same args>`` under the fast allocator."""
    env = fast_allocator_env(os.environ)
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], env)
