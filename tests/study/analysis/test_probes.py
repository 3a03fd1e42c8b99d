"""Probes of trained models (studylib.study.analysis.probes) on two tiny soft-MoE runs trained here on
synthetic tokens: the uniform-gate ablation (and that it restores the learned gates), the
expert-output cosine matrices."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from _tiny import synthetic_data, tiny_preset
from studylib.run.rundir import RunDir
from studylib.study.analysis import probes

pytestmark = pytest.mark.filterwarnings("ignore:.*could not find the run.s tokenizer")

SOFT = {"soft1": {"ffn": {"kind": "soft", "hidden": 64, "num_experts": 1}},
        "soft2": {"ffn": {"kind": "soft", "hidden": 32, "num_experts": 2}}}


@pytest.fixture(scope="module")
def soft_runs(tmp_path_factory):
    from studylib.run.trainer import train_run

    root = tmp_path_factory.mktemp("probes")
    preset = tiny_preset(models=SOFT, train={"max_steps": 4, "lr": 1e-2})
    data = synthetic_data()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes: one thread avoids OpenMP stalls on a busy machine
    try:
        for m in SOFT:
            train_run(preset, m, 1, run_dir=root / m, progress=False, data=data)
    finally:
        torch.set_num_threads(threads)
    return {m: root / m for m in SOFT}, data


def _capture_models(monkeypatch) -> list:
    """Record every model RunDir.load_model hands out."""
    seen, load = [], RunDir.load_model

    def capture(self, *a, **k):
        loaded = load(self, *a, **k)
        seen.append(loaded.model)
        return loaded

    monkeypatch.setattr(RunDir, "load_model", capture)
    return seen


def test_eval_windows_are_the_same_for_every_run(soft_runs):
    runs, data = soft_runs
    _, a = probes.eval_windows(runs["soft1"], 8, data)
    _, b = probes.eval_windows(runs["soft2"], 8, data)
    assert len(a) == 8 and np.array_equal(a, b) and set(a) <= set(data.val_idx)
    with pytest.raises(FileNotFoundError):
        probes.eval_windows(runs["soft1"].parent / "nope", 8, data)


def test_uniform_gate_ablation(soft_runs, monkeypatch):
    runs, data = soft_runs
    models = _capture_models(monkeypatch)
    k1 = probes.uniform_gate_ablation(runs["soft1"], n_windows=8, data=data, device="cpu")
    assert list(k1["layer"]) == [0, 1] and (k1["delta"].abs() < 1e-6).all()  # K=1: the gate is 1 either way
    k2 = probes.uniform_gate_ablation(runs["soft2"], n_windows=8, data=data, device="cpu")
    assert (k2["delta"].abs() > 0).all() and k2.attrs["n_windows"] == 8
    np.testing.assert_allclose(k2["loss"] - k2["base_loss"], k2["delta"])
    assert all(blk.ffn.router.mode == "learned" for m in models for blk in m.blocks)


def test_uniform_gate_ablation_restores_the_gates_when_evaluation_fails(soft_runs, monkeypatch):
    runs, data = soft_runs
    models = _capture_models(monkeypatch)
    calls = []

    def failing_loss(model, *a):
        calls.append(model.blocks[0].ffn.router.mode)
        if len(calls) == 2:  # the first ablated evaluation
            raise RuntimeError("out of memory")
        return 1.0

    monkeypatch.setattr(probes, "_loss", failing_loss)
    with pytest.raises(RuntimeError, match="out of memory"):
        probes.uniform_gate_ablation(runs["soft2"], n_windows=8, data=data, device="cpu")
    assert calls == ["learned", "uniform"]
    assert all(blk.ffn.router.mode == "learned" for blk in models[0].blocks)


def test_expert_cosine_matrices(soft_runs):
    runs, data = soft_runs
    mats = probes.expert_cosine(runs["soft2"], n_windows=8, data=data, batch_size=3, device="cpu")
    assert sorted(mats) == [0, 1]
    for m in mats.values():
        a = m.to_numpy()
        assert list(m.index) == ["e0", "e1"] == list(m.columns)
        np.testing.assert_allclose(np.diag(a), 1.0, atol=1e-5)  # a mean over every token: counts are right
        np.testing.assert_allclose(a, a.T, atol=1e-6)
        assert -1.0 <= a[0, 1] < 1.0 - 1e-4
    summary = probes.cosine_summary(mats)
    assert list(summary["K"]) == [2, 2]
    assert summary.loc[0, "mean_offdiag_cos"] == pytest.approx(mats[0].iloc[0, 1])
    k1 = probes.cosine_summary(probes.expert_cosine(runs["soft1"], n_windows=4, data=data, device="cpu"))
    assert k1["mean_offdiag_cos"].isna().all()  # one expert: nothing off the diagonal
