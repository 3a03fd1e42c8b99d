"""Tests of studylib.run.trainer in real processes: kill -9 then resume, a crash in the middle of a
checkpoint write (injected by the script the test runs), a damaged latest.pt, DDP, the CLI."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from _tiny import TINY_RAW, comparable, tiny_raw
from studylib.run import checkpoint as C
from studylib.run.rundir import RunDir

TESTS = Path(__file__).resolve().parents[1]
TINY_SCRIPT = TESTS / "_tiny.py"
SUBSET = Path("/work/shared/data/tinystories")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


# ``python dying_run.py N RUN_DIR ...``: the tiny run of ``_tiny.py`` whose N-th checkpoint write
# stops half-way through its temporary file and kills the process, as a kill mid-write would
DYING_RUN = """
import io, os, sys

sys.path.insert(0, {tests!r})
from _tiny import main
from studylib.run import checkpoint

crash_at, calls = int(sys.argv.pop(1)), [0]
real_save = checkpoint.torch.save


def dying_save(obj, f, *args, **kwargs):
    calls[0] += 1
    if calls[0] != crash_at:
        return real_save(obj, f, *args, **kwargs)
    buf = io.BytesIO()
    real_save(obj, buf, *args, **kwargs)
    f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
    f.flush()
    os.fsync(f.fileno())
    os._exit(86)


checkpoint.torch.save = dying_save
raise SystemExit(main())
"""


def _run_script(run_dir, raw: dict, model="dense", delay=0.0, env=None, timeout=300, crash_at_save=None):
    """The tiny run in a fresh process (``crash_at_save=N``: it dies writing its N-th checkpoint)."""
    script = [str(TINY_SCRIPT)]
    if crash_at_save is not None:
        dying = Path(run_dir).parent / "dying_run.py"
        dying.parent.mkdir(parents=True, exist_ok=True)
        dying.write_text(DYING_RUN.format(tests=str(TESTS)))
        script = [str(dying), str(crash_at_save)]
    cmd = [sys.executable, *script, str(run_dir), "--model", model, "--raw", json.dumps(raw)]
    if delay:
        cmd += ["--delay", str(delay)]
    return subprocess.run(cmd, env=env or _env(), capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------------------------
# real processes: kill -9, crash mid-checkpoint, DDP, CLI
# --------------------------------------------------------------------------------------------
KILL_RAW = {"train": {"max_steps": 40, "eval_every": 4, "amp": "bf16", "num_threads": 1}}


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """An uninterrupted subprocess run of the kill-test config."""
    d = tmp_path_factory.mktemp("ref") / "run"
    r = _run_script(d, KILL_RAW, model="moe")
    assert r.returncode == 0, r.stderr
    return d


@pytest.mark.slow
def test_kill9_then_resume_is_bit_exact(tmp_path, reference_run):
    run = tmp_path / "run"
    cmd = [sys.executable, str(TINY_SCRIPT), str(run), "--model", "moe", "--raw", json.dumps(KILL_RAW),
           "--delay", "0.03"]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    latest = run / "checkpoints" / "latest.pt"
    deadline = time.time() + 120
    while not latest.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    time.sleep(0.15)  # now somewhere in the middle of training (a few steps after the checkpoint)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (run / "summary.json").exists()
    killed_at = max(r["step"] for r in RunDir(run).read_metrics())
    ck_step = C.load(latest)["step"]
    assert 0 < ck_step < 40 and killed_at < 40
    r = _run_script(run, KILL_RAW, model="moe")
    assert r.returncode == 0, r.stderr
    assert f"resuming from step {ck_step}" in r.stderr
    got, want = RunDir(run).read_metrics(), RunDir(reference_run).read_metrics()
    assert comparable(got) == comparable(want)  # every train and eval loss, router stat, lr: exact
    s1, s2 = RunDir(run).summary(), RunDir(reference_run).summary()
    assert s1["best_val_loss"] == s2["best_val_loss"] and s1["final_val_loss"] == s2["final_val_loss"]
    wa, wb = C.load(latest)["model"], C.load(reference_run / "checkpoints" / "latest.pt")["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_kill_during_checkpoint_write_resumes_from_last_good(tmp_path, reference_run):
    run = tmp_path / "run"
    r = _run_script(run, KILL_RAW, model="moe", crash_at_save=3)  # dies writing step 12
    assert r.returncode == 86, r.stderr
    ck = run / "checkpoints"
    torn = list(ck.glob(".tmp-*"))
    assert len(torn) == 1 and torn[0].stat().st_size > 0  # the half-written temporary file
    assert C.load(ck / "latest.pt")["step"] == 8  # the last good checkpoint is intact
    r = _run_script(run, KILL_RAW, model="moe")
    assert r.returncode == 0, r.stderr
    assert "resuming from step 8" in r.stderr and not list(ck.glob(".tmp-*"))
    assert comparable(RunDir(run).read_metrics()) == comparable(RunDir(reference_run).read_metrics())


@pytest.mark.slow
def test_truncated_latest_falls_back_to_prev(tmp_path, reference_run):
    run = tmp_path / "run"
    r = _run_script(run, KILL_RAW, model="moe", crash_at_save=5)  # dies writing step 20
    assert r.returncode == 86
    latest = run / "checkpoints" / "latest.pt"
    latest.write_bytes(latest.read_bytes()[:4096])  # and the disk lost the end of latest.pt too
    r = _run_script(run, KILL_RAW, model="moe")
    assert r.returncode == 0, r.stderr
    prev = run / "checkpoints" / "prev.pt"
    assert "skipping damaged checkpoint" in r.stderr
    assert f"resuming from step 12 of 40 (checkpoint {prev})" in r.stderr  # the file it really read
    assert comparable(RunDir(run).read_metrics()) == comparable(RunDir(reference_run).read_metrics())


def _torchrun(run_dir, raw, nproc=2, model="dense", timeout=300):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(TINY_SCRIPT), str(run_dir), "--model", model, "--raw", json.dumps(raw)]
    env = _env(OMP_NUM_THREADS=1)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [8, 7])  # 7: ranks get unequal shares (4 and 3 windows)
def test_ddp_two_gloo_processes_equal_single_process(tmp_path, batch):
    raw = {"model": {**TINY_RAW["model"], "dropout": 0.0},
           "train": {"batch_size": batch, "grad_accum": 2, "max_steps": 8, "eval_every": 4,
                     "amp": "off", "num_threads": 1}}
    single = _run_script(tmp_path / "single", raw)
    assert single.returncode == 0, single.stderr
    r = _torchrun(tmp_path / "ddp", raw)
    assert r.returncode == 0, r.stderr[:4000] + "\n...\n" + r.stderr[-2000:]
    a, b = RunDir(tmp_path / "single").read_metrics(), RunDir(tmp_path / "ddp").read_metrics()
    assert [x["step"] for x in a] == [x["step"] for x in b] and len(a) == 8 + 2
    for x, y in zip(a, b):
        for k in ("train_loss", "val_loss"):
            if k in x:
                assert y[k] == pytest.approx(x[k], abs=2e-5), (x, y)
    sd, ss = RunDir(tmp_path / "ddp").summary(), RunDir(tmp_path / "single").summary()
    assert sd["world_size"] == 2 and sd["final_val_loss"] == pytest.approx(ss["final_val_loss"], abs=2e-5)
    # the DDP run resumes under DDP too: kill-free check that a finished DDP run is skipped
    r = _torchrun(tmp_path / "ddp", raw)
    assert r.returncode == 0 and "skipping" in r.stderr


@pytest.mark.slow
@pytest.mark.skipif(not (SUBSET / "train.txt.gz").exists(), reason="shared TinyStories subset absent")
def test_cli_train_on_real_data(tmp_path):
    params = tmp_path / "params"
    params.mkdir()
    raw = tiny_raw(data={"source": "local", "data_dir": str(SUBSET), "max_stories": 200,
                         "vocab_size": 512, "context": 65, "cache_dir": str(tmp_path / "cache")},
                   train={"max_steps": 6, "eval_every": 3, "eval_windows": 8, "batch_size": 4,
                          "grad_accum": 1, "amp": "auto"})
    (params / "clitiny.yaml").write_text(yaml.safe_dump(raw))
    env = _env(STUDYLIB_OUTPUTS=tmp_path / "out")
    cmd = [sys.executable, "-m", "studylib", "train", "--params", str(params / "clitiny.yaml"),
           "--model", "moe", "--seed", "3", "--set", "train.max_steps=5", "--no-progress"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "best val loss" in r.stdout
    rd = tmp_path / "out" / "tiny" / "runs" / "moe" / "seed3"
    s = RunDir(rd).summary()
    assert s["finished"] and s["steps"] == 5 and s["data"]["vocab_size"] == 512
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "skipping" in r.stderr
    bad = subprocess.run(cmd[:-1] + ["--set", "train.lr=1.0"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "different configuration" in bad.stderr


@pytest.mark.slow
def test_second_writer_of_a_run_directory_fails_fast(tmp_path):
    """Two trainings of one run directory at once: the second (the same run; then the CLI) stops at
    once naming the first one's PID; the first finishes with every record written once."""
    run = tmp_path / "run"
    raw = {"train": {"max_steps": 30, "eval_every": 10, "num_threads": 1}}
    cmd = [sys.executable, str(TINY_SCRIPT), str(run), "--raw", json.dumps(raw), "--delay", "0.3"]
    first = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").exists():
        assert first.poll() is None, first.stderr.read()
        assert time.time() < deadline, "the first run wrote no metrics"
        time.sleep(0.01)
    same = subprocess.run(cmd[:-2], env=_env(), capture_output=True, text=True, timeout=120)
    cli = [sys.executable, "-m", "studylib", "train", "--params", str(TESTS.parent / "params" / "ci.yaml"),
           "--model", "moe_top1", "--run-dir", str(run), "--no-progress"]
    second = subprocess.run(cli, env=_env(), capture_output=True, text=True, timeout=120, cwd=TESTS.parent)
    holder = f"in use by another training process (pid {first.pid} "
    assert same.returncode != 0 and "RunDirLocked" in same.stderr and holder in same.stderr, same.stderr
    assert first.poll() is None, "the first run ended before the others started: the test proves nothing"
    assert second.returncode == 2 and second.stderr.count("\n") == 1 and holder in second.stderr
    assert first.wait(timeout=300) == 0, first.stderr.read()
    steps = [(r["kind"], r["step"]) for r in RunDir(run).read_metrics()]
    assert len(steps) == len(set(steps)) == 30 + 3 and RunDir(run).finished()
