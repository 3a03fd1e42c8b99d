"""The noise split (studylib.study.analysis.noise): which runs the design trains, and the table it makes,
on hand-made frames (no training)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from studylib.config import ConfigError, load_preset
from studylib.run.rundir import RunDir
from studylib.run.spec import RunSpec
from studylib.study.comparisons import study_of
from studylib.study.comparisons.headline import noise
from studylib.study.analysis.stats import variance_ratio
from studylib.study.comparisons.headline import noise_grids

ROOT = Path(__file__).resolve().parents[4]


def _noise_seeds(p):
    return study_of(p)["headline"].noise_seeds(p.seeds)


def test_noise_seeds_reads_and_validates_the_knob():
    p = load_preset(ROOT / "params" / "ci.yaml", ["seeds=[1,2,3,4]", "study.noise_split={seeds: 3}"])
    assert _noise_seeds(p) == (1, 2, 3)  # the first is the fixed seed
    assert _noise_seeds(load_preset(ROOT / "params" / "cpu.yaml")) is None
    for bad in ("{seeds: 1}", "{seeds: 5}", "{n: 3}", "3"):
        with pytest.raises(ConfigError, match="study.noise_split"):  # when it loads, or when it is read
            _noise_seeds(load_preset(ROOT / "params" / "ci.yaml", ["seeds=[1,2,3,4]", f"study.noise_split={bad}"]))


def test_the_design_reuses_the_headline_runs_and_adds_two_per_extra_seed():
    p = load_preset(ROOT / "params" / "ci.yaml", ["seeds=[1,2,3]", "study.noise_split={seeds: 3}"])
    seeds = _noise_seeds(p)
    dirs = {RunSpec.resolve(p, "moe_top2_z", s, g.overrides).run_dir for g in noise_grids(["moe_top2_z"], seeds)
            for s in g.seeds}
    own = {RunDir.of(p, "moe_top2_z", s).path for s in (1, 2, 3)}
    # seed 1 with data seed 1 is the headline run itself; 2 init-only + 2 order-only runs more
    assert own <= dirs and len(dirs) == 3 + 4


def _design(init, order, both, model="m"):
    rows = []
    for f, vals in (("init only", init), ("order only", order), ("both", both)):
        rows += [{"factor": f, "draw": i, "model": model, "best_val_loss": v} for i, v in enumerate(vals)]
    return pd.DataFrame(rows)


def test_noise_table_finds_the_factor_that_dominates():
    rng = np.random.default_rng(1)
    init, order = 3.7 + 0.05 * rng.standard_normal(10), 3.7 + 0.002 * rng.standard_normal(10)
    both = 3.7 + 0.05 * rng.standard_normal(10)
    a = _design(init, order, both, "a")
    b = _design(init - 0.1, order - 0.1 + 0.01 * rng.standard_normal(10), both - 0.1, "b")
    t = noise.noise_table(pd.concat([a, b]), ["a", "b"], {"a - b": ("a", "b")})
    assert t.loc["a", "std_init only"] == pytest.approx(np.std(init, ddof=1))
    assert t.loc["a", "low_init only"] < t.loc["a", "std_init only"] < t.loc["a", "high_init only"]
    assert t.loc["a", "dominant"] == "init" and t.loc["a", "ratio"] == pytest.approx(
        variance_ratio(init, order).ratio)
    # the gap: init noise cancels (same init offset in both models), order noise does not
    assert t.loc["a - b", "std_init only"] == pytest.approx(0, abs=1e-12)
    assert t.loc["a - b", "dominant"] == "order"
    s = noise.noise_sentence(t)
    assert "the initialisation dominates" in s and "the data order dominates" in s
