"""How often the joint law's 95% intervals cover the parameters that generated the data.

The synthetic maps are the test suite's (tests/study/comparisons/token_budget/test_law.py: the
token-budget grid's shape, three seeds per cell, seed noise of sd 0.01 bits per byte, known
parameters). Each map is fitted once with ``--boot`` seed replicates and ``--boot`` cell replicates
(the point fit starts at the truth, as the test does, to skip the grid of starts); a parameter's
coverage is the share of maps whose interval holds the truth, with its Wilson 95% interval
(statsmodels). The test only asks for >= 70% from 30 maps of 20 replicates; this measures the rate.

    .venv/bin/python scripts/law_coverage.py                        # 200 maps, 200 replicates, 2 processes
    .venv/bin/python scripts/law_coverage.py --maps 40 --boot 100   # a quicker look

Output: one row per parameter and interval (seeds resampled within cells; whole map cells
resampled within each size), and the time taken.
"""
from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd
from statsmodels.stats.proportion import proportion_confint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from studylib.study.comparisons.token_budget import law as J  # noqa: E402
from tests.study.comparisons.token_budget.test_law import TRUE, _map, _true_theta  # noqa: E402

def one_map(args) -> list[dict]:
    r, boot = args
    t = J.fit_law(_map(10_000 + r), n_boot=boot, n_boot_cell=boot, seed=r, start=_true_theta()).table()
    return [{"map": r, "parameter": k, "interval": which, "inside": bool(t.loc[k, lo] <= TRUE[k] <= t.loc[k, hi]),
             "width": t.loc[k, hi] - t.loc[k, lo]}
            for k in TRUE for which, lo, hi in (("seed", "ci_low", "ci_high"), ("cell", "cell_ci_low", "cell_ci_high"))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--maps", type=int, default=200, help="synthetic maps (default 200)")
    ap.add_argument("--boot", type=int, default=200, help="bootstrap replicates per interval (default 200)")
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    work = [(r, a.boot) for r in range(a.maps)]
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs) as pool:
            rows = [row for rows in pool.map(one_map, work) for row in rows]
    else:
        rows = [row for w in work for row in one_map(w)]
    df = pd.DataFrame(rows)
    out = df.groupby(["interval", "parameter"], sort=False).agg(maps=("inside", "size"), covered=("inside", "sum"),
                                                               median_width=("width", "median")).reset_index()
    out["coverage"] = out["covered"] / out["maps"]
    out["low"], out["high"] = proportion_confint(out["covered"], out["maps"], alpha=0.05, method="wilson")
    with pd.option_context("display.width", 120, "display.float_format", "{:.3f}".format):
        print(out.to_string(index=False))
    print(f"{a.maps} maps x {a.boot} replicates per interval, nominal 0.95; {time.perf_counter() - t0:.0f} s "
          f"with {a.jobs} process(es)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
