"""The sweep the notebooks call (studylib.study.sweep.ensure_runs): finished runs are reused,
a run directory holding another config is refused, a failing child names its model, seed and log."""
from __future__ import annotations

import os
import sys

import pytest
import yaml

from _tiny import synthetic_data, tiny_preset
from studylib.config import ConfigError, run_document
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
    other = tiny_preset(train={"lr": 1e-3})  # same name, same run dir, another config in it
    _fake_finished_run(other, "dense", 1, 2.0)
    with pytest.raises(RunDirConflict):
        sweep.ensure_runs(p, ["dense"], [1], progress=False)


def test_variant_runs_live_apart_and_an_unchanged_identity_reuses_the_base_run(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    p = tiny_preset()
    base = RunDir.of(p, "dense", 1).path
    assert RunDir.variant(p, "dense", 1, {"train.lr": p.train.lr}).path == base  # same identity
    assert RunDir.variant(p, "dense", 1, {"train.eval_every": p.train.eval_every}).path == base
    lr = RunDir.variant(p, "dense", 1, {"train.lr": 1e-3, "train.max_steps": 6}).path
    assert lr == base.parent / "train.lr=0.001,train.max_steps=6" / "seed1"
    assert RunDir.variant(p, "dense", 1, ["train.max_steps=6", "train.lr=1e-3"]).path.parent.name == \
        "train.lr=0.001,train.max_steps=6"  # the --set form names the same variant
    assert RunDir.variant(p, "dense", 1, {"train.lr": 1e-3}, tag="lowlr").path == base.parent / "lowlr" / "seed1"
    with pytest.raises(ConfigError, match="tag"):
        RunDir.variant(p, "dense", 1, {"train.lr": 1e-3}, tag="a/b")


def test_ensure_runs_trains_a_variant_into_its_own_dir_and_reuses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.setattr("studylib.run.data.load_data", lambda *a, **k: synthetic_data())
    p = tiny_preset(train={"max_steps": 4, "eval_every": 2})
    _fake_finished_run(p, "dense", 1, 2.0)  # the base run: must stay untouched
    over = sweep.budget_overrides(p, 0.5)
    assert over == {"train.max_steps": 2} and sweep.budget_overrides(p, 1) == {}
    df = sweep.ensure_runs(p, ["dense"], [1], jobs=1, overrides=over, progress=False)
    rd = RunDir.variant(p, "dense", 1, over)
    assert rd.path != RunDir.of(p, "dense", 1).path and rd.finished()
    assert int(df.loc[0, "steps"]) == 2 and df.loc[0, "best_val_loss"] != 2.0
    assert RunDir.of(p, "dense", 1).summary()["best_val_loss"] == 2.0

    def no_data(*a, **k):
        raise AssertionError("the variant is finished: nothing may train again")

    monkeypatch.setattr("studylib.run.data.load_data", no_data)
    again = sweep.ensure_runs(p, ["dense"], [1], jobs=1, overrides=over, progress=False)
    assert again.loc[0, "best_val_loss"] == df.loc[0, "best_val_loss"]


def test_budget_of_a_fraction_of_an_epoch_counts_the_training_windows(monkeypatch):
    data = synthetic_data()
    monkeypatch.setattr("studylib.run.data.load_data", lambda *a, **k: data)
    p = tiny_preset(train={"max_steps": None})
    per_step = p.train.batch_size * p.train.grad_accum
    assert sweep.epoch_steps(p) == -(-len(data.train_idx) // per_step)  # the last partial batch is kept
    assert sweep.budget_overrides(p, 3.0) == {"train.max_steps": round(3 * sweep.epoch_steps(p))}
    with pytest.raises(ConfigError, match="epochs"):
        sweep.budget_overrides(p, 0)


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


_KILLED_SWEEP = r"""
import os, sys, time
sys.path.insert(0, {tests!r})
from _tiny import synthetic_data, tiny_preset
import studylib.run.data
from studylib.study import sweep

studylib.run.data.load_data = lambda *a, **k: synthetic_data()

def fake_command(params_file, model, seed, run_dir, threads):  # a child that trains "forever"
    code = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"
    return [sys.executable, "-c", code, str(run_dir / "child.pid")]

sweep.train_command = fake_command
sweep.ensure_runs(tiny_preset(), ["dense", "moe"], [1], jobs=2, progress=False)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped by init) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_killed_sweep_takes_its_children_down_and_the_next_one_resumes(tmp_path, monkeypatch):
    import signal
    import subprocess
    import time
    from pathlib import Path

    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    tests = str(Path(__file__).resolve().parents[1])
    parent = subprocess.Popen([sys.executable, "-c", _KILLED_SWEEP.format(tests=tests)],
                              env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    p = tiny_preset()
    pid_files = [RunDir.of(p, m, 1).path / "child.pid" for m in ("dense", "moe")]
    deadline = time.time() + 120
    while not all(f.exists() and f.read_text() for f in pid_files):
        assert parent.poll() is None, parent.stdout.read().decode()
        assert time.time() < deadline, "the sweep's children did not start"
        time.sleep(0.2)
    pids = [int(f.read_text()) for f in pid_files]
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while any(_alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids), "a training child outlived its killed sweep"

    monkeypatch.setattr("studylib.run.data.load_data", lambda *a, **k: synthetic_data())
    started = []

    def finishing_command(params_file, model, seed, run_dir, threads):
        started.append(model)
        summary = {"model": model, "seed": seed, "best_val_loss": 3.0, "finished": True}
        return [sys.executable, "-c", f"import json, sys; json.dump({summary!r}, open(sys.argv[1], 'w'))",
                str(run_dir / "summary.json")]

    monkeypatch.setattr(sweep, "train_command", finishing_command)
    df = sweep.ensure_runs(p, ["dense", "moe"], [1], jobs=2, progress=False)
    assert sorted(started) == ["dense", "moe"] and len(df) == 2
