"""The CLI re-executes itself under the fast allocator exactly once, and respects opt-outs."""
import platform
import subprocess
import sys

import pytest

from studylib.run import alloc

linux_glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                 reason="glibc-only mechanism")


@linux_glibc
def test_env_choice_and_opt_outs(monkeypatch):
    new = alloc.fast_allocator_env({"PATH": "/bin"})
    assert new["PATH"] == "/bin" and new[alloc.GUARD] in ("tcmalloc", "glibc-tuned")
    if new[alloc.GUARD] == "tcmalloc":
        assert alloc.tcmalloc_path() in new["LD_PRELOAD"]
    else:
        assert new["GLIBC_TUNABLES"] == alloc.GLIBC_TUNED
    assert alloc.fast_allocator_env(new) is None  # never twice
    assert alloc.fast_allocator_env({alloc.GUARD: "system"}) is None
    assert alloc.fast_allocator_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=1"}) is None
    monkeypatch.setattr(alloc, "tcmalloc_path", lambda: None)
    assert alloc.fast_allocator_env({})["GLIBC_TUNABLES"] == alloc.GLIBC_TUNED


@linux_glibc
def test_cli_reexec_keeps_arguments():
    """`python -m studylib` with no allocator set goes through the re-exec and still runs the command."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-m", "studylib", "budget", "params/ci.yaml", "--json"],
                       capture_output=True, text=True, cwd=root, env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    assert [r["name"] for r in json.loads(p.stdout)] == ["dense_active", "moe_top2_z", "dense_total"]
