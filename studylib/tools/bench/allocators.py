"""Memory allocators: which one this process uses, and ``bench alloc``: the train bench in fresh
processes under each allocator (glibc default, glibc tunables, tcmalloc via ``LD_PRELOAD``),
interleaved. The allocator environments themselves are :mod:`studylib.run.alloc`'s.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from studylib.config import ConfigError
from studylib.run.alloc import GLIBC_TUNED, TCMALLOC_PATHS

TCMALLOC = TCMALLOC_PATHS[0]
ALLOCATORS = {
    "glibc": {"STUDYLIB_ALLOCATOR": "system"},  # no re-exec into the fast allocator
    "glibc-tuned": {"GLIBC_TUNABLES": GLIBC_TUNED},
    "tcmalloc": {"LD_PRELOAD": TCMALLOC},
}


def allocator_info() -> str:
    """Which malloc this process uses (from /proc/self/maps) and any glibc malloc tunables."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                for name in ("tcmalloc", "jemalloc", "mimalloc"):
                    if name in line:
                        libs.add(name)
    except OSError:
        return "unknown"
    if libs:
        return "+".join(sorted(libs))
    tun = [f"GLIBC_TUNABLES={os.environ['GLIBC_TUNABLES']}"] if os.environ.get("GLIBC_TUNABLES") else []
    tun += [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_") and k.endswith("_")]
    return "glibc" + (f" ({' '.join(tun)})" if tun else "")


def _allocator_envs(allocators: Sequence[str]) -> dict[str, dict]:
    """{allocator: the process environment that selects it}; tcmalloc is skipped when missing."""
    envs = {}
    for a in allocators:
        if a not in ALLOCATORS:
            raise ConfigError(f"--allocators: unknown {a!r}; allowed: {list(ALLOCATORS)}")
        if a == "tcmalloc" and not Path(TCMALLOC).exists():
            print(f"note: {TCMALLOC} missing (apt-get install libtcmalloc-minimal4); skipping tcmalloc",
                  file=sys.stderr)
            continue
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "GLIBC_TUNABLES", "STUDYLIB_ALLOCATOR") and not k.startswith("MALLOC_")}
        env.update(ALLOCATORS[a])
        envs[a] = env
    return envs


def _train_json(argv: Sequence[str], env: dict, allocator: str) -> dict:
    """``bench train --json <argv>`` in a fresh process with ``env``; its JSON document."""
    cmd = [sys.executable, "-m", "studylib", "bench", "train", "--json", "--memory", "none", *argv]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"bench under {allocator} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)


def _rep_line(r: int, reps: int, a: str, doc: dict, seconds: float) -> str:
    return (f"rep {r + 1}/{reps} {a} ({doc['allocator']}, {seconds:.0f} s): "
            + ", ".join(f"{x['model']}{'[' + x['dispatch'] + ']' if x['dispatch'] else ''}"
                        f"{'' if x['impl'] == 'studylib' else '(' + x['impl'] + ')'} "
                        f"{x['tok_s']:,.0f}" for x in doc["rows"]))


def _column(docs: Sequence[dict], i: int, key: str) -> list:
    """Row ``i``'s ``key`` in each rep's document."""
    return [doc["rows"][i][key] for doc in docs]


def _allocator_rows(results: dict[str, list[dict]], reps: int) -> list[dict]:
    rows = []
    glibc = results.get("glibc", [])
    for a, docs in results.items():
        for i, x in enumerate(docs[0]["rows"]):
            toks, cpu = _column(docs, i, "tok_s"), _column(docs, i, "cpu_s")
            nan = [float("nan")] * reps
            base, base_cpu = _column(glibc, i, "tok_s") or nan, _column(glibc, i, "cpu_s") or nan
            rows.append({"allocator": a, "detected": docs[0]["allocator"], "model": x["model"],
                         "impl": x["impl"], "dispatch": x["dispatch"], "tok_s": statistics.median(toks),
                         "tok_s_all": toks,
                         "ratio_glibc": statistics.median(t / b for t, b in zip(toks, base)),
                         "cpu_s": statistics.median(cpu),
                         "cpu_ratio_glibc": statistics.median(b / c for c, b in zip(cpu, base_cpu)),
                         "sys_frac": statistics.median(_column(docs, i, "sys_frac")),
                         "minflt": statistics.median(_column(docs, i, "minflt"))})
    return rows


def bench_allocators(argv: Sequence[str], allocators: Sequence[str] = tuple(ALLOCATORS), reps: int = 2,
                     progress: bool = True):
    """Run ``python -m studylib bench train --json <argv>`` under each allocator, ``reps`` times,
    in rotated order; a DataFrame with one row per (allocator, variant): median tok/s over reps,
    ``ratio_glibc`` (median over reps of tok/s / glibc tok/s of the same rep), and the same on
    process CPU time (``cpu_ratio_glibc``: glibc CPU s / this CPU s; less sensitive to other jobs
    on a shared machine than wall time), ``sys_frac`` and minor page faults per step."""
    import pandas as pd  # kept out of the import path: the memory probe's baseline RSS excludes it

    envs = _allocator_envs(allocators)
    names = list(envs)
    results: dict = {a: [] for a in names}
    for r in range(reps):
        for a in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            doc = _train_json(argv, envs[a], a)
            results[a].append(doc)
            if progress:
                print(_rep_line(r, reps, a, doc, time.perf_counter() - t0), file=sys.stderr, flush=True)
    return pd.DataFrame(_allocator_rows(results, reps))
