"""scripts/gpu_check.sh cannot rot: run on the CPU with the ci preset and 4 steps, it trains the
headline trio (every seed, no data-order runs), executes notebook 03 on them and prints each run's
tokens/s, the headline table (the numbers of the headline_gaps.csv it wrote) and the time."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def ci_data_problem() -> str:
    """Why the ci preset has no local data ("" when it has): its data as the script's study
    loads it (``STUDYLIB_DATA_DIR``, else the preset's ``data_dir``, ../shared beside the repo)."""
    from studylib.config import load_preset
    from studylib.data.stories import resolved_source

    data = load_preset(ROOT / "params" / "ci.yaml").data
    if resolved_source(data) == "local":
        return ""
    return (f"no local TinyStories files at {data.data_dir} (the ci preset's data.data_dir, or "
            f"STUDYLIB_DATA_DIR); the ci preset would go to the hub")


@pytest.mark.slow
def test_gpu_check_on_the_cpu(tmp_path):
    if ci_data_problem():
        pytest.skip(ci_data_problem())
    env = {**os.environ, "PY": sys.executable, "CHECK_PARAMS": "params/ci.yaml", "CHECK_STEPS": "4",
           "CHECK_STORIES": "300", "CHECK_DEVICE": "cpu", "CHECK_JOBS": "1", "CHECK_NAME": "gc",
           "STUDYLIB_OUTPUTS": str(tmp_path / "outputs"), "OUT": str(tmp_path / "out")}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                       env=env, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    runs = sorted(p.parent.relative_to(tmp_path / "outputs" / "gc" / "runs")
                  for p in (tmp_path / "outputs" / "gc" / "runs").glob("**/summary.json"))
    assert [str(p) for p in runs] == [f"{m}/seed{s}" for m in ("dense_active", "dense_total", "moe_top2_z")
                                      for s in (1337, 1338)]
    tput = out[out.index("## training throughput"):out.index("## the headline table")]
    assert len(re.findall(r"^\s*(dense_active|moe_top2_z|dense_total)\s+133[78]\s+cpu\s+fp32\s+4\s", tput, re.M)) == 6
    gaps = pd.read_csv(tmp_path / "outputs" / "gc" / "tables" / "headline_gaps.csv")
    table = out[out.index("## the headline table"):]
    for g in gaps.itertuples():
        line = next(ln for ln in table.splitlines() if ln.strip().startswith(g.comparison))
        assert float(line[len(line) - len(line.lstrip()) + len(g.comparison):].split()[0]) == pytest.approx(g.mean, abs=1e-6)
    assert re.search(r"^## time: \d+ s$", out, re.M)
    nxt = re.search(r"^## next on a GPU: .*--params (\S+)", out, re.M)  # a preset that exists (and plans:
    assert nxt and (ROOT / nxt.group(1)).is_file()  # tests/study/comparisons/test_presets.py plans every one)
    assert (tmp_path / "out" / "gpu_check.txt").read_text() == out
    assert (tmp_path / "out" / "gc" / "notebooks" / "03_headline_sweep.ipynb").is_file()
