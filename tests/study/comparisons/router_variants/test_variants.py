"""Notebook 12's analysis: the paired gaps of every router against the reference and the dense
baselines, the router diagnostics from the last evaluation, and the bias trajectory."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from studylib.config import FFNConfig, ModelConfig
from studylib.run.rundir import RunDir
from studylib.study.comparisons.router_variants import variants as V
from studylib.study.analysis.stats import paired

LOSS = {  # model -> best val loss per seed 1, 2, 3
    "dense_active": [3.70, 3.72, 3.69],
    "moe": [3.60, 3.61, 3.62],
    "moe_bias": [3.58, 3.60, 3.59],
    "moe_sig": [3.65, 3.59, 3.66],
    "dense_total": [3.50, 3.52, 3.51],
}


def _summaries():
    return pd.DataFrame([{"model": m, "seed": s, "best_val_loss": v} for m, vals in LOSS.items()
                         for s, v in zip((1, 2, 3), vals)])


def test_variant_table_pairs_every_router_with_the_reference_and_both_baselines():
    t = V.variant_table(_summaries(), ["moe", "moe_bias", "moe_sig"], "moe", "dense_active", "dense_total")
    assert list(t.index) == ["moe", "moe_bias", "moe_sig"]
    want = paired(LOSS["moe_bias"], LOSS["moe"])
    assert t.loc["moe_bias", "vs_ref_mean"] == pytest.approx(want.mean)
    assert (t.loc["moe_bias", "vs_ref_low"], t.loc["moe_bias", "vs_ref_high"]) == pytest.approx((want.ci_low, want.ci_high))
    assert t.loc["moe_bias", "vs_ref_resolved"] == want.resolved
    assert t.loc["moe", "vs_ref_mean"] == 0.0 and math.isnan(t.loc["moe", "vs_ref_low"])  # the reference itself
    act = paired(LOSS["dense_active"], LOSS["moe_sig"])  # > 0: the variant beats the active-match model
    assert t.loc["moe_sig", "vs_active_mean"] == pytest.approx(act.mean) and act.mean > 0
    tot = paired(LOSS["moe"], LOSS["dense_total"])
    assert t.loc["moe", "vs_total_mean"] == pytest.approx(tot.mean) and t.loc["moe", "vs_total_resolved"]
    assert len(t.attrs["comparisons"]) == 2 + 3 * 2  # 2 vs the reference, 3 x 2 vs the baselines


def _run(tmp_path, name, shares_per_layer, bias=None, steps=(10, 20), picked=None):
    rd = RunDir(tmp_path / name)
    rd.path.mkdir(parents=True)
    for i, step in enumerate(steps):
        router = []
        for sh in shares_per_layer:
            st = {"shares": sh, "entropy": 0.5 * math.log(len(sh))}
            if bias is not None:
                st["bias"] = [b * (i + 1) for b in bias]
            if picked is not None:
                st["bias_picked"] = picked[len(router)] * (i + 1)
            router.append(st)
        rd.append_metrics({"kind": "eval", "step": step, "tokens": step * 100, "router": router})
    return rd.path


def test_diagnostics_read_the_last_evaluation(tmp_path):
    dirs = {"moe": {1: _run(tmp_path, "a", [[0.25] * 4, [0.7, 0.3, 0.0, 0.0]]),
                    2: _run(tmp_path, "b", [[0.4, 0.2, 0.2, 0.2], [0.25] * 4])}}
    d = V.diagnostics(dirs).loc["moe"]
    assert d["imbalance"] == pytest.approx((1.0 + 2.8 + 1.6 + 1.0) / 4)  # max share x E per layer and seed
    assert d["worst_imbalance"] == pytest.approx(2.8)
    assert d["dead_experts"] == pytest.approx((2 + 0) / 2)  # two dead experts in seed 1's layer 1
    assert d["entropy"] == pytest.approx(0.5) and math.isnan(d["bias_picked"])  # no selection bias
    biased = {"moe_bias": {1: _run(tmp_path, "e", [[0.25] * 4] * 2, picked=[0.05, 0.10]),
                           2: _run(tmp_path, "f", [[0.25] * 4] * 2, picked=[0.02, 0.03])}}
    assert V.diagnostics(biased).loc["moe_bias", "bias_picked"] == pytest.approx(2 * (0.05 + 0.10 + 0.02 + 0.03) / 4)


def test_bias_frame_reads_each_experts_bias_over_training(tmp_path):
    dirs = {"moe_bias": {1: _run(tmp_path, "c", [[0.25] * 4], bias=[0.001, -0.001, 0.002, -0.002])}}
    b = V.bias_frame(dirs)
    assert len(b) == 2 * 4 and set(b["step"]) == {10, 20}
    last = b[b["step"] == 20].set_index("expert")["bias"]
    assert last.tolist() == pytest.approx([0.002, -0.002, 0.004, -0.004])
    assert V.bias_frame({"moe": {1: _run(tmp_path, "d", [[0.25] * 4])}}).empty


def test_describe_names_the_router():
    f = FFNConfig(kind="moe", hidden=128, num_experts=4, top_k=1, score="sigmoid", bias_balance=True,
                  n_shared=1, seq_balance_coef=1e-4)
    s = V.describe(ModelConfig(ffn=f))
    assert s == "sigmoid, bias u=0.001, seq-balance 0.0001, 1 shared + top-1 of 4 x 128"
