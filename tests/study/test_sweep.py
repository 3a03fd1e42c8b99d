"""The sweep the notebooks call (studylib.study.sweep.ensure_runs): finished runs are reused,
a run directory holding another config is refused, a failing child names its model, seed and log."""
from __future__ import annotations

import os
import sys

import pytest
import yaml

from _tiny import synthetic_data, tiny_preset
from studylib.config import run_document
from studylib.run.rundir import RunDir, RunDirConflict
from studylib.study import sweep


def _fake_finished_run(preset, model, seed, loss):
    rd = RunDir.of(preset, model, seed)
    rd.path.mkdir(parents=True, exist_ok=True)
    rd.write_config(run_document(preset, preset.model_config(model), model, seed))
    rd.write_summary({"model": model, "seed": seed, "best_val_loss": loss, "final_val_loss": loss, "tokens": 10,
                      "finished": True, "params": {"total": 5}})
    return rd


def test_ensure_runs_reuses_finished_runs_without_training(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    p = tiny_preset()
    for s, loss in ((1, 2.0), (2, 2.5)):
        _fake_finished_run(p, "dense", s, loss)

    def no_data(*a, **k):
        raise AssertionError("nothing to train: the data must not be loaded")

    monkeypatch.setattr("studylib.run.data.load_data", no_data)
    df = sweep.ensure_runs(p, ["dense", "dense"], [1, 2], jobs=2, progress=False)
    assert list(df["seed"]) == [1, 2] and list(df["best_val_loss"]) == [2.0, 2.5]
    assert df.loc[0, "params_total"] == 5


def test_ensure_runs_refuses_a_run_dir_with_another_config(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    p = tiny_preset()
    _fake_finished_run(p, "dense", 1, 2.0)
    with pytest.raises(RunDirConflict):
        sweep.ensure_runs(p, ["dense"], [1], overrides={"train.lr": 1e-3}, progress=False)


def test_parallel_failure_names_model_seed_and_log(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.setattr("studylib.run.data.load_data", lambda *a, **k: synthetic_data())
    seen = []

    def fake_command(params_file, model, seed, run_dir, threads):
        seen.append((params_file, model, seed, threads))
        doc = yaml.safe_load(open(params_file))
        assert os.path.isabs(doc["data"]["cache_dir"])  # resolved as the parent resolves it
        code = "import sys; print('child says: out of cheese'); sys.exit(3)" if model == "moe" else "pass"
        return [sys.executable, "-c", code]

    monkeypatch.setattr(sweep, "train_command", fake_command)
    p = tiny_preset()  # no file behind it: the children get a resolved copy of the preset
    with pytest.raises(sweep.SweepError) as ei:
        sweep.ensure_runs(p, ["moe"], [1], jobs=4, progress=False)
    msg = str(ei.value)
    log = tmp_path / "out" / "tiny" / "runs" / "moe" / "seed1" / "train.log"
    assert "training moe seed 1 failed (exit code 3)" in msg
    assert str(log) in msg and "out of cheese" in msg
    assert "out of cheese" in log.read_text()
    params_file, _, _, threads = seen[0]
    assert threads == sweep.available_cores()  # one missing run: it gets every core
    assert not tmp_path.joinpath(params_file).exists()  # the temporary preset copy is cleaned up


def test_parallel_sweep_trains_every_missing_run_once(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.setattr("studylib.run.data.load_data", lambda *a, **k: synthetic_data())
    p = tiny_preset()
    _fake_finished_run(p, "dense", 1, 2.0)  # reused, not retrained
    started = []

    def fake_command(params_file, model, seed, run_dir, threads):
        started.append((model, seed))
        summary = {"model": model, "seed": seed, "best_val_loss": 3.0 + seed, "finished": True}
        code = f"import json, sys; json.dump({summary!r}, open(sys.argv[1], 'w'))"
        return [sys.executable, "-c", code, str(run_dir / "summary.json")]

    monkeypatch.setattr(sweep, "train_command", fake_command)
    df = sweep.ensure_runs(p, ["dense", "moe"], [1, 2], jobs=2, progress=False)
    assert sorted(started) == [("dense", 2), ("moe", 1), ("moe", 2)]
    assert list(zip(df["model"], df["seed"], df["best_val_loss"])) == [
        ("dense", 1, 2.0), ("dense", 2, 5.0), ("moe", 1, 4.0), ("moe", 2, 5.0)]
    assert "$ " in (RunDir.of(p, "moe", 2).path / sweep.LOG_FILE).read_text()  # the command is logged
