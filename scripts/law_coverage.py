"""How often the joint law's 95% intervals cover the parameters that generated the data.

The synthetic maps are the test suite's (tests/study/analysis/law/test_law.py: the
token-budget grid's shape, three seeds per cell, seed noise of sd 0.01 bits per byte, known
parameters). Each map is fitted once with ``--boot`` seed replicates and ``--boot`` cell replicates
(the point fit starts at the truth, as the test does, to skip the grid of starts); a parameter's
coverage is the share of maps whose interval holds the truth, with its Wilson 95% interval
(statsmodels). The test only asks for >= 70% from 30 maps of 20 replicates; this measures the rate.
``--held-out K`` also puts K maps to the held-out-size check (:func:`studylib.study.analysis.law.checks.held_out`, the
largest size left out, ``--boot`` replicates): the share of each map's checked points inside
their 95% prediction intervals, and how many maps fall below the check's pass share.

    .venv/bin/python scripts/law_coverage.py                        # 200 maps, 200 replicates, 2 processes
    .venv/bin/python scripts/law_coverage.py --maps 40 --boot 100   # a quicker look
    .venv/bin/python scripts/law_coverage.py --maps 0 --held-out 20 --boot 100

Output: one row per parameter and interval (seeds resampled within cells; whole map cells
resampled within each size), the held-out shares, and the time taken.
"""
from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd
from statsmodels.stats.proportion import proportion_confint
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from studylib.cli import Parser  # noqa: E402
from studylib.config import args as T  # noqa: E402
from studylib.study.orchestration.common import available_cores  # noqa: E402
from studylib.study.analysis.law import checks as C  # noqa: E402
from studylib.study.analysis.law import fit as J  # noqa: E402
from tests.study.analysis.law.test_law import TRUE, _map, _true_theta  # noqa: E402


def one_map(args) -> list[dict]:
    r, boot = args
    t = J.fit_law(_map(10_000 + r), n_boot=boot, n_boot_cell=boot, seed=r, start=_true_theta()).table()
    return [{"map": r, "parameter": k, "interval": which, "inside": bool(t.loc[k, lo] <= TRUE[k] <= t.loc[k, hi]),
             "width": t.loc[k, hi] - t.loc[k, lo]}
            for k in TRUE for which, lo, hi in (("seed", "ci_low", "ci_high"), ("cell", "cell_ci_low", "cell_ci_high"))]


def held_out_map(args) -> dict:
    r, boot = args
    h = C.held_out(_map(20_000 + r), "size", n_boot=boot, seed=r)
    t = h[h["checked"]]
    return {"map": r, "checked": len(t), "inside": int(t["inside"].sum()),
            **{f"{k}_inside": float(g["inside"].mean()) for k, g in t.groupby(t["quantity"].str.split("_").str[0])}}


def capped_jobs(jobs: int, items: int, cores: int) -> tuple[int, str]:
    """The processes to start for ``items`` maps: ``jobs``, at most ``cores`` and ``items`` (the
    pool forks every worker up front: ``--jobs 100000`` hung the machine), with the line that says
    it was capped ("" when ``jobs`` stands)."""
    n = max(1, min(jobs, cores, items))
    return n, "" if n == jobs else f"--jobs {jobs}: capped at {n} process(es) ({cores} cores here, {items} maps)"


def _run(fn, work, jobs, what) -> list:
    bar = dict(total=len(work), desc=what, unit="map", file=sys.stderr)
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            return list(tqdm(pool.map(fn, work), **bar))
    return [fn(w) for w in tqdm(work, **bar)]


def main(argv=None) -> int:
    ap = Parser(prog="law_coverage.py", description=__doc__.split("\n\n")[0])  # one error: line, exit 2
    ap.add_argument("--maps", type=T.non_negative_int, default=200, help="synthetic maps (default 200)")
    ap.add_argument("--boot", type=T.positive_int, default=200, help="bootstrap replicates per interval (default 200)")
    ap.add_argument("--jobs", type=T.positive_int, default=2, help="processes (default 2)")
    ap.add_argument("--held-out", type=T.non_negative_int, default=0,
                    help="maps put to the held-out-size check (default 0)")
    a = ap.parse_args(argv)
    if not a.maps and not a.held_out:
        ap.error("--maps 0 and --held-out 0: nothing to measure; give at least one map")
    jobs, capped = capped_jobs(a.jobs, max(a.maps, a.held_out), available_cores())
    if capped:
        print(capped, file=sys.stderr)
    t0 = time.perf_counter()
    pd.set_option("display.width", 120)
    pd.set_option("display.float_format", "{:.3f}".format)
    if a.maps:
        rows = [row for rows in _run(one_map, [(r, a.boot) for r in range(a.maps)], jobs, "intervals")
                for row in rows]
        df = pd.DataFrame(rows)
        out = df.groupby(["interval", "parameter"], sort=False).agg(
            maps=("inside", "size"), covered=("inside", "sum"), median_width=("width", "median")).reset_index()
        out["coverage"] = out["covered"] / out["maps"]
        out["low"], out["high"] = proportion_confint(out["covered"], out["maps"], alpha=0.05, method="wilson")
        print(out.to_string(index=False))
        print(f"{a.maps} maps x {a.boot} replicates per interval, nominal 0.95")
    if a.held_out:
        h = pd.DataFrame(_run(held_out_map, [(r, a.boot) for r in range(a.held_out)], jobs, "held-out size"))
        share = h["inside"] / h["checked"]
        print(f"held-out size, {a.held_out} maps x {a.boot} replicates: share of each map's checked points inside "
              f"their 95% interval min {share.min():.2f}, median {share.median():.2f}, max {share.max():.2f}; "
              f"{int((share < C.PASS_SHARE).sum())} maps below the pass share {C.PASS_SHARE:.2f}; "
              f"{int(h['inside'].sum())} of {int(h['checked'].sum())} points inside overall; by quantity: "
              + ", ".join(f"{k} {h[f'{k}_inside'].mean():.2f}" for k in ("loss", "gap", "position")
                          if f"{k}_inside" in h))
    print(f"{time.perf_counter() - t0:.0f} s with {jobs} process(es)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
