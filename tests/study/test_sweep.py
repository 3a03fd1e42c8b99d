"""The sweep the notebooks call (studylib.study.sweep.ensure_runs): finished runs are reused,
a run directory holding another config is refused, a failing child names its model, seed and log."""
from __future__ import annotations

import os
import sys

import pytest
import yaml

from _tiny import synthetic_data, tiny_preset
from studylib.config import ConfigError, override, run_document
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


def fake_worker(train_src: str) -> str:
    """A worker process that serves the real protocol (:func:`studylib.study.worker.serve`) with
    ``train(model, seed, run_dir)`` defined by ``train_src`` instead of the trainer."""
    tests = os.path.dirname(os.path.abspath(__file__))
    return "\n".join(["import json, os, sys, time", f"sys.path.insert(0, {os.path.dirname(tests)!r})",
                      "from studylib.study.worker import serve", train_src, "sys.exit(serve(train))"])


FINISHING = """
def train(model, seed, run_dir, overrides=None):
    s = {"model": model, "seed": seed, "best_val_loss": 3.0 + seed, "finished": True, "pid": os.getpid()}
    json.dump(s, open(os.path.join(run_dir, "summary.json"), "w"))
    return s
"""


def test_parallel_failure_names_model_seed_and_log(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.setattr("studylib.run.data.load_data", lambda *a, **k: synthetic_data())
    seen = []
    failing = """
def train(model, seed, run_dir, overrides=None):
    print("child says: out of cheese")
    os.write(2, b"native stderr line\\n")
    raise RuntimeError("no cheese left")
"""

    def fake_command(params_file, threads):
        seen.append((params_file, threads))
        doc = yaml.safe_load(open(params_file))
        assert os.path.isabs(doc["data"]["cache_dir"])  # resolved as the parent resolves it
        return [sys.executable, "-c", fake_worker(failing)]

    monkeypatch.setattr(sweep, "worker_command", fake_command)
    p = tiny_preset()  # no file behind it: the workers get a resolved copy of the preset
    with pytest.raises(sweep.SweepError) as ei:
        sweep.ensure_runs(p, ["moe"], [1], jobs=4, progress=False)
    msg = str(ei.value)
    log = tmp_path / "out" / "tiny" / "runs" / "moe" / "seed1" / "train.log"
    assert "training moe seed 1 failed (RuntimeError: no cheese left)" in msg
    assert str(log) in msg and "out of cheese" in msg
    text = log.read_text()
    assert "out of cheese" in text and "native stderr line" in text and "Traceback" in text
    params_file, threads = seen[0]
    assert len(seen) == 1 and threads == sweep.available_cores()  # one missing run: one worker, every core
    assert not tmp_path.joinpath(params_file).exists()  # the temporary preset copy is cleaned up


def test_a_worker_that_dies_mid_run_fails_the_sweep_with_its_exit_code(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.setattr("studylib.run.data.load_data", lambda *a, **k: synthetic_data())
    dying = """
def train(model, seed, run_dir, overrides=None):
    print("about to crash", flush=True)
    os._exit(7)
"""
    monkeypatch.setattr(sweep, "worker_command", lambda f, t: [sys.executable, "-c", fake_worker(dying)])
    with pytest.raises(sweep.SweepError, match=r"training dense seed 1 failed: its worker process exited with code 7"
                       ) as ei:
        sweep.ensure_runs(tiny_preset(), ["dense"], [1], jobs=2, progress=False)
    assert "about to crash" in str(ei.value)


def test_parallel_sweep_trains_every_missing_run_once_in_persistent_workers(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.setattr("studylib.run.data.load_data", lambda *a, **k: synthetic_data())
    p = tiny_preset()
    _fake_finished_run(p, "dense", 1, 2.0)  # reused, not retrained
    started = []

    def fake_command(params_file, threads):
        started.append(threads)
        return [sys.executable, "-c", fake_worker(FINISHING)]

    monkeypatch.setattr(sweep, "worker_command", fake_command)
    df = sweep.ensure_runs(p, ["dense", "moe"], [1, 2, 3], jobs=2, progress=False)
    assert started == [max(1, sweep.available_cores() // 2)] * 2  # two workers for five runs
    assert list(zip(df["model"], df["seed"], df["best_val_loss"])) == [
        ("dense", 1, 2.0), ("dense", 2, 5.0), ("dense", 3, 6.0), ("moe", 1, 4.0), ("moe", 2, 5.0), ("moe", 3, 6.0)]
    pids = {RunDir.of(p, m, s).summary()["pid"] for m, s in [("dense", 2), ("dense", 3), ("moe", 1), ("moe", 2),
                                                            ("moe", 3)]}
    assert len(pids) == 2  # each worker trained several runs
    log = (RunDir.of(p, "moe", 2).path / sweep.LOG_FILE).read_text()
    assert log.startswith("$ studylib train-worker") and "moe seed 2" in log  # each run has its own log


_IN_WORKER = """
from _tiny import synthetic_data, tiny_preset
from studylib.config import override
from studylib.run.trainer import train_run

def train(model, seed, run_dir, overrides=None):
    return train_run(override(tiny_preset(), overrides), model, seed, run_dir=run_dir, progress=False,
                     data=synthetic_data())
"""


def test_a_run_trained_after_another_in_one_worker_equals_the_run_alone(tmp_path, monkeypatch):
    from _tiny import comparable

    from studylib.run.trainer import train_run

    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    tests = os.path.dirname(os.path.abspath(__file__))
    code = fake_worker(f"sys.path.insert(0, {os.path.dirname(tests)!r})\n" + _IN_WORKER)
    monkeypatch.setattr(sweep, "worker_command", lambda f, t: [sys.executable, "-c", code])
    p = tiny_preset()
    short = {"train.max_steps": 6}  # the second run is a variant: the worker applies its overrides
    moe_dir = RunDir.variant(p, "moe", 2, short).path
    sweep._train_parallel(p, [sweep._Job("dense", 2, RunDir.of(p, "dense", 2).path),
                              sweep._Job("moe", 2, moe_dir, short)], 1, _NoBar())  # one worker, both runs
    alone = train_run(override(p, short), "moe", 2, run_dir=tmp_path / "alone", progress=False,
                      data=synthetic_data())
    after = RunDir(moe_dir)
    assert after.summary()["steps"] == 6 and RunDir.of(p, "dense", 2).summary()["steps"] == 12
    assert after.summary()["best_val_loss"] == alone["best_val_loss"]
    assert comparable(after.read_metrics()) == comparable(RunDir(tmp_path / "alone").read_metrics())


def test_grids_share_one_queue_longest_runs_first(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.setattr("studylib.run.data.load_data", lambda *a, **k: synthetic_data())
    order = []

    def fake_train_run(preset, model, seed, run_dir=None, progress=True, data=None):
        order.append((model, seed, preset.train.max_steps))
        rd = RunDir(run_dir)
        rd.path.mkdir(parents=True, exist_ok=True)
        rd.write_config(run_document(preset, preset.model_config(model), model, seed))
        rd.write_summary({"model": model, "seed": seed, "best_val_loss": float(preset.train.max_steps),
                          "finished": True})

    monkeypatch.setattr("studylib.run.trainer.train_run", fake_train_run)
    p = tiny_preset()  # 12 steps; the moe has more training FLOPs per token than the dense model
    grids = [sweep.Grid(["dense", "moe"], [1], {"train.max_steps": 3}), sweep.Grid(["dense", "moe"], [1]),
             sweep.Grid(["moe"], [1, 2], {"train.max_steps": 6})]
    frames = sweep.ensure_grids(p, grids, jobs=1, progress=False)
    assert order == [("moe", 1, 12), ("dense", 1, 12), ("moe", 1, 6), ("moe", 2, 6), ("moe", 1, 3), ("dense", 1, 3)]
    assert [list(f["best_val_loss"]) for f in frames] == [[3.0, 3.0], [12.0, 12.0], [6.0, 6.0]]


class _NoBar:
    def set_postfix_str(self, s):
        pass

    def update(self, n):
        pass


_KILLED_SWEEP = r"""
import os, sys, time
sys.path.insert(0, {tests!r})
from _tiny import synthetic_data, tiny_preset
import studylib.run.data
from studylib.study import sweep

studylib.run.data.load_data = lambda *a, **k: synthetic_data()
forever = '''
def train(model, seed, run_dir, overrides=None):  # a worker that trains "forever"
    open(os.path.join(run_dir, "child.pid"), "w").write(str(os.getpid()))
    time.sleep(300)
'''
sweep.worker_command = lambda f, t: [sys.executable, "-c", {fake!r}.replace("TRAIN_SRC", forever)]
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
    script = _KILLED_SWEEP.format(tests=tests, fake=fake_worker("TRAIN_SRC"))
    parent = subprocess.Popen([sys.executable, "-c", script],
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
    monkeypatch.setattr(sweep, "worker_command", lambda f, t: [sys.executable, "-c", fake_worker(FINISHING)])
    df = sweep.ensure_runs(p, ["dense", "moe"], [1], jobs=2, progress=False)
    assert list(df["best_val_loss"]) == [4.0, 4.0]  # both runs trained by the next sweep
