"""The sweep on Dask distributed, with the real engine and the real trainer on the `ci` preset:
a LocalCluster (the default), and a scheduler and workers started as separate processes on
localhost, as a user with several machines starts them."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from _tiny import comparable, ensure_grids, ensure_runs
from conftest import ROOT, require_subset
from studylib.config import ConfigError, load_preset
from studylib.run.dirlock import RunDirLocked, dir_lock
from studylib.run.layout import LOG_FILE
from studylib.run.rundir import RunDir
from studylib.run.spec import RunSpec
from studylib.study.orchestration import train as sweep
from studylib.study.orchestration.cluster import SCHEDULER_TIMEOUT_S
from studylib.study.orchestration.common import ClusterError
from studylib.study.analysis.frames import runs_frame
from studylib.study.comparisons import registry, study_of

pytestmark = pytest.mark.slow

# long enough to be killed mid-run after a checkpoint: ~300 steps of the ci models (~5-10 s)
LONG = {"train.max_steps": 300, "train.eval_every": 50, "train.keep_checkpoints": False}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def ci_preset(cache: Path, *sets: str):
    """``params/ci.yaml`` on the shared TinyStories subset, its data cache in ``cache``."""
    return load_preset(ROOT / "params" / "ci.yaml",
                       [f"data.data_dir={require_subset()}", f"data.cache_dir={cache}", *sets])


def _headers(rd: RunDir) -> list[str]:
    return [ln for ln in (rd.path / LOG_FILE).read_text().splitlines() if ln.startswith("$ dask worker")]


def _pid(header: str) -> int:
    return int(re.search(r"\(pid (\d+),", header).group(1))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped) counts as gone once its last thread has exited
        with open(f"/proc/{pid}/stat") as f:
            zombie = f.read().split(")")[-1].split()[0] == "Z"
        return not zombie or len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def _lock_free(rd: RunDir) -> bool:
    try:
        with dir_lock(rd.path, rd.lock_path.name):
            return True
    except RunDirLocked:
        return False


def _holder(rd: RunDir) -> int | None:
    try:
        text = rd.lock_path.read_text().split()
    except OSError:
        return None
    return int(text[0]) if text else None


def _wait_for(cond, what: str, timeout: float = 120.0, proc=None) -> None:
    deadline = time.time() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process ended first:\n{proc.stdout.read().decode()[-3000:]}")
        assert time.time() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


# --------------------------------------------------------------------------------------------
# the default: a LocalCluster in this process
# --------------------------------------------------------------------------------------------
def test_scheduler_address_comes_from_the_flag_the_environment_or_the_preset(cache, monkeypatch):
    monkeypatch.delenv(sweep.SCHEDULER_ENV, raising=False)
    p = ci_preset(cache)
    assert sweep.scheduler_address(p) is None
    q = ci_preset(cache, "study.scheduler=tcp://preset:8786")
    assert sweep.scheduler_address(q) == "tcp://preset:8786"
    monkeypatch.setenv(sweep.SCHEDULER_ENV, "tcp://env:8786")
    assert sweep.scheduler_address(q) == "tcp://env:8786"
    assert sweep.scheduler_address(q, "tcp://flag:8786") == "tcp://flag:8786"
    with pytest.raises(ConfigError, match="--scheduler: expected a Dask scheduler address"):
        sweep.scheduler_address(q, "nowhere")


def test_a_local_cluster_trains_each_run_once_in_persistent_workers_as_this_process_would(
        cache, tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    p = ci_preset(cache)
    models, seeds = ["dense_active", "moe_top2_z"], [1337, 1338, 1339]
    df = runs_frame(ensure_runs(p, models, seeds, jobs=2, progress=False))
    assert list(zip(df["model"], df["seed"])) == [(m, s) for m in models for s in seeds]
    specs = [RunSpec.resolve(p, m, s) for m in models for s in seeds]
    headers = [_headers(spec.rundir) for spec in specs]
    assert all(len(h) == 1 for h in headers)  # each run trained once, its output in its own log
    assert "1 torch threads" in headers[0][0]  # 2 cores, 2 workers: one thread each
    assert len({_pid(h[0]) for h in headers}) == 2  # two worker processes trained six runs
    # a run trained after others in a worker equals the run trained alone here (one thread too)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        from studylib.run.trainer import train_run

        alone = train_run(p, "moe_top2_z", 1339, run_dir=tmp_path / "alone", progress=False)
    finally:
        torch.set_num_threads(n)
    after = specs[-1].rundir
    assert after.summary()["best_val_loss"] == alone["best_val_loss"]
    assert comparable(after.read_metrics()) == comparable(RunDir(tmp_path / "alone").read_metrics())


def test_a_run_that_fails_by_itself_names_model_seed_and_log_and_is_not_retried(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    p = ci_preset(cache, "train.lr=1e6", "train.min_lr=1e5", "train.grad_clip=0")  # diverges at once
    with pytest.raises(sweep.SweepError) as ei:
        ensure_runs(p, ["dense_active"], [1337], jobs=2, progress=False)
    rd = RunDir.of(p, "dense_active", 1337)
    msg = str(ei.value)
    assert msg.startswith("training dense_active seed 1337 failed (NonFiniteLossError: non-finite training loss")
    assert str(rd.path / LOG_FILE) in msg and "Traceback" in (rd.path / LOG_FILE).read_text()
    assert len(_headers(rd)) == 1  # not retried


def _default_sigint() -> None:
    """A process started in the background by a shell inherits SIGINT *ignored* (bash, without job
    control), and so would the sweep: give it the default disposition, as a terminal's Ctrl-C finds."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


_SWEEP = r"""
import sys
from studylib.config import load_preset
from studylib.study.orchestration.plan import Grid, plan_runs
from studylib.study.orchestration.train import train_plan
p = load_preset(sys.argv[1], sys.argv[2:])
train_plan(plan_runs(p, [Grid(["dense_active", "moe_top2_z"], [1337])]), jobs=2, progress=False)
"""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_a_killed_or_interrupted_sweep_leaves_no_worker_training_and_no_stale_lock(cache, tmp_path, monkeypatch,
                                                                                   how):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    sets = [f"data.data_dir={require_subset()}", f"data.cache_dir={cache}", *(f"{k}={v}" for k, v in LONG.items())]
    p = ci_preset(cache, *sets[2:])
    rds = [RunDir.of(p, m, 1337) for m in ("dense_active", "moe_top2_z")]
    proc = subprocess.Popen([sys.executable, "-c", _SWEEP, str(ROOT / "params" / "ci.yaml"), *sets],
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=_default_sigint)
    try:
        _wait_for(lambda: all(_holder(rd) for rd in rds), "both runs train", proc=proc)
        pids = [_holder(rd) for rd in rds]
        assert proc.pid not in pids  # the runs train in the cluster's worker processes
        proc.send_signal(getattr(signal, how))
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    _wait_for(lambda: not any(_alive(pid) for pid in pids), "the workers are gone", timeout=20)
    _wait_for(lambda: all(_lock_free(rd) for rd in rds), "no stale lock (the kernel's lock goes with the process)",
              timeout=20)
    assert not any(rd.finished() for rd in rds)
    df = runs_frame(ensure_runs(p, ["dense_active", "moe_top2_z"], [1337], jobs=2, progress=False))  # the next sweep
    assert list(df["steps"]) == [300, 300]


# --------------------------------------------------------------------------------------------
# a scheduler and workers started as separate processes (as on several machines)
# --------------------------------------------------------------------------------------------
class DaskProcesses:
    """``dask scheduler`` and ``dask worker`` processes on localhost (stopped by :meth:`stop`)."""

    def __init__(self, tmp: Path, workers: tuple = ()):
        """A scheduler, then one worker per name in ``workers`` (waited for)."""
        self.tmp, self.procs, self.workers = tmp, [], {}
        self.file = tmp / "scheduler.json"
        self._start([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                     "--no-dashboard", "--scheduler-file", str(self.file)], "scheduler")
        _wait_for(lambda: self.file.exists() and self.file.read_text().strip(), "the scheduler is up", 60)
        self.address = json.loads(self.file.read_text())["address"]
        try:
            for name in workers:
                self.worker(name)
            if workers:
                self.wait_for_workers(len(workers))
        except BaseException:
            self.stop()
            raise

    def _start(self, cmd: list, name: str, prefix: tuple = (), env: dict | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "w")
        proc = subprocess.Popen([*prefix, *cmd], stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp,
                                start_new_session=True, env=dict(os.environ, **(env or {})))
        self.procs.append(proc)
        return proc

    def worker(self, name: str, nthreads: int = 1, prefix: tuple = (), env: dict | None = None) -> subprocess.Popen:
        """A worker (with its nanny) named ``name``, started in another working directory (with
        ``env`` added to the environment)."""
        proc = self._start([sys.executable, "-m", "dask", "worker", self.address, "--nthreads", str(nthreads),
                            "--name", name, "--no-dashboard", "--memory-limit", "0"], name, prefix, env)
        self.workers[name] = proc
        return proc

    def wait_for_workers(self, n: int) -> None:
        from distributed import Client

        with Client(self.address, timeout="20s") as c:
            c.wait_for_workers(n, timeout=90)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def dask_dir(tmp_path) -> Path:
    (tmp_path / "dask").mkdir()
    return tmp_path


def _ci_study_runs(p) -> list:
    """The grids of every comparison (their plans, in notebook order)."""
    study = study_of(p)
    return [g for c in registry().values() for g in c.plan(study)]


def _all_metrics(out: Path) -> dict:
    return {str(m.parent.relative_to(out)): comparable(RunDir(m.parent).read_metrics())
            for m in sorted(out.rglob("metrics.jsonl"))}


def test_the_ci_study_on_two_dask_workers_equals_a_local_run(dask_dir, cache, monkeypatch):
    d = DaskProcesses(dask_dir / "dask", workers=("w1", "w2"))
    try:
        p = ci_preset(cache)
        grids = _ci_study_runs(p)
        monkeypatch.setenv("STUDYLIB_OUTPUTS", str(dask_dir / "remote"))
        t0 = time.perf_counter()
        remote = ensure_grids(p, grids, progress=False, scheduler=d.address)
        t_remote = time.perf_counter() - t0
    finally:
        d.stop()
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(dask_dir / "local"))
    t0 = time.perf_counter()
    local = ensure_grids(p, grids, jobs=2, progress=False)
    t_local = time.perf_counter() - t0
    print(f"ci study runs: two dask workers {t_remote:.1f} s, LocalCluster(2) {t_local:.1f} s")
    runs = _all_metrics(dask_dir / "remote")
    planned = {str(s.run_dir.relative_to(dask_dir / "local")) for specs in local for s in specs}
    assert set(runs) == planned and runs == _all_metrics(dask_dir / "local")  # every run of the plan, every record
    cols = ["model", "seed", "best_val_loss", "final_val_loss", "steps", "tokens"]
    for r, loc in zip(map(runs_frame, remote), map(runs_frame, local)):
        assert r[cols].equals(loc[cols])  # what the notebooks' tables are made of
    hosts = {_pid(_headers(RunDir(m.parent))[0]) for m in (dask_dir / "remote").rglob("metrics.jsonl")}
    assert len(hosts) == 2  # the runs spread over both workers


def test_a_worker_killed_mid_run_has_its_run_resumed_elsewhere_bit_identical(dask_dir, cache, monkeypatch):
    d = DaskProcesses(dask_dir / "dask", workers=("w1", "w2"))
    try:
        p = ci_preset(cache, *(f"{k}={v}" for k, v in LONG.items()))
        monkeypatch.setenv("STUDYLIB_OUTPUTS", str(dask_dir / "whole"))
        ensure_runs(p, ["moe_top2_z"], [1337], progress=False, scheduler=d.address)
        monkeypatch.setenv("STUDYLIB_OUTPUTS", str(dask_dir / "killed"))
        rd = RunDir.of(p, "moe_top2_z", 1337)
        box: dict = {}

        def sweep_in_thread():
            try:
                box["df"] = ensure_runs(p, ["moe_top2_z"], [1337], progress=False, scheduler=d.address)
            except BaseException as e:  # noqa: BLE001 - reported below
                box["error"] = e

        t = threading.Thread(target=sweep_in_thread)
        t.start()
        _wait_for(lambda: rd.checkpoint_steps() and _holder(rd), "the run has a checkpoint")
        victim = _holder(rd)
        os.kill(victim, signal.SIGKILL)
        t.join(timeout=180)
        assert not t.is_alive() and "error" not in box, box.get("error")
    finally:
        d.stop()
    headers = _headers(rd)
    assert len(headers) == 2 and _pid(headers[0]) == victim and _pid(headers[1]) != victim
    assert "resum" in (rd.path / LOG_FILE).read_text().split(headers[1])[1].lower()  # it resumed, not restarted
    whole = RunDir(dask_dir / "whole" / rd.path.relative_to(dask_dir / "killed"))
    assert rd.summary()["best_val_loss"] == whole.summary()["best_val_loss"]
    assert comparable(rd.read_metrics()) == comparable(whole.read_metrics())


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def test_a_worker_that_cannot_see_the_run_directory_or_runs_several_tasks_is_refused(dask_dir, cache, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(dask_dir / "out"))
    p = ci_preset(cache)
    d = DaskProcesses(dask_dir / "dask")
    try:
        crowded = d.worker("crowded", nthreads=2)
        d.wait_for_workers(1)
        with pytest.raises(ClusterError, match=r"runs several tasks at once; start each worker with --nthreads 1"):
            ensure_runs(p, ["dense_active"], [1337], progress=False, scheduler=d.address)
        os.killpg(crowded.pid, signal.SIGTERM)
        crowded.wait(timeout=30)
        if not _can_unshare():
            pytest.fail("this test needs `unshare -rm` (user + mount namespaces) to start a worker that cannot see "
                        "the outputs")
        # "another machine": a worker whose view of the outputs' folder is an empty tmpfs
        hidden = ("unshare", "-rm", "sh", "-c", f'mount -t tmpfs none "{dask_dir / "out"}" && exec "$0" "$@"')
        (dask_dir / "out").mkdir(exist_ok=True)
        d.worker("elsewhere", prefix=hidden)
        d.wait_for_workers(1)
        with pytest.raises(ClusterError) as ei:
            ensure_runs(p, ["dense_active"], [1337], progress=False, scheduler=d.address)
    finally:
        d.stop()
    msg = str(ei.value)
    assert re.match(r"worker tcp://\S+ on host \S+ cannot see the run directory " + re.escape(str(dask_dir / "out")),
                    msg), msg
    assert "\n" not in msg and "every worker sees" in msg
    assert not RunDir.of(p, "dense_active", 1337).path.exists()  # nothing trained, nothing left behind
    assert not list((dask_dir / "out").rglob(".studylib-sweep-*"))  # the markers are cleaned up


def test_local_workers_start_with_studylibs_allocator_and_their_share_of_the_cores():
    """Dask's nanny would start workers with MALLOC_TRIM_THRESHOLD_=65536, overriding the allocator
    studylib picks (run/alloc.py); the local cluster's workers start with that allocator instead,
    and with cores // workers OpenMP threads."""
    from studylib.study.orchestration.cluster import Cluster

    keys = ("MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS", "GLIBC_TUNABLES", "LD_PRELOAD", "STUDYLIB_ALLOCATOR")
    with Cluster(2) as cluster:
        envs = cluster.client.run(lambda: {k: os.environ.get(k) for k in keys})
    assert len(envs) == 2
    for env in envs.values():
        assert env["MALLOC_TRIM_THRESHOLD_"] is None
        assert env["OMP_NUM_THREADS"] == str(max(1, sweep.available_cores() // 2))
        if os.environ.get("STUDYLIB_ALLOCATOR") != "system":
            assert env["STUDYLIB_ALLOCATOR"] in ("tcmalloc", "glibc-tuned") and (env["GLIBC_TUNABLES"] or env["LD_PRELOAD"])


def test_a_worker_started_elsewhere_stops_profiling_the_training_thread(dask_dir):
    """A `dask worker` started by the user samples its task thread every 10 ms and ticks every
    20 ms, taking the GIL from training; the sweep's plugin stops the profiler and slows the tick."""
    from studylib.study.orchestration.cluster import Cluster

    d = DaskProcesses(dask_dir / "dask")
    try:
        d.worker("w1")
        d.wait_for_workers(1)
        with Cluster(address=d.address) as cluster:
            state = cluster.client.run(lambda dask_worker: (dask_worker.periodic_callbacks["profile"].is_running(),
                                                            dask_worker.periodic_callbacks["tick"].callback_time))
    finally:
        d.stop()
    assert list(state.values()) == [(False, 1000)]


def test_a_run_another_process_trains_stops_the_study_with_one_line_and_exit_2(cache, tmp_path):
    """issue #24: a lock conflict inside `study` exited 1 with a wrapped message; the README promises
    one `error:` line and exit 2 for a known error."""
    env = dict(os.environ, STUDYLIB_OUTPUTS=str(tmp_path / "out"), STUDYLIB_DATA_DIR=str(require_subset()),
               STUDYLIB_CACHE_DIR=str(cache))
    rd = RunDir.of(ci_preset(cache), "dense_total", 1337, root=tmp_path / "out")
    with dir_lock(rd.path, rd.lock_path.name):  # "another training process" holds this run
        r = subprocess.run([sys.executable, "-m", "studylib", "study", "--params", str(ROOT / "params" / "ci.yaml"),
                            "--notebooks", "03", "--no-report", "--no-progress"], env=env, capture_output=True,
                           text=True, timeout=600)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(errors) == 1 and f"in use by another training process (pid {os.getpid()} " in errors[0], errors



# --------------------------------------------------------------------------------------------
# issue #33: the code and numerics of a run, two studies on one scheduler, one-line errors
# --------------------------------------------------------------------------------------------
def _other_checkout(dest: Path) -> Path:
    """A copy of the studylib package with one constant of lr_at changed (the issue's other
    checkout); the folder to put on a worker's PYTHONPATH."""
    from studylib.run.provenance import PACKAGE

    shutil.copytree(PACKAGE, dest / "studylib", ignore=shutil.ignore_patterns("__pycache__"))
    optim = dest / "studylib" / "run" / "optim.py"
    text = optim.read_text()
    assert "0.5 * (cfg.lr - cfg.min_lr)" in text
    optim.write_text(text.replace("0.5 * (cfg.lr - cfg.min_lr)", "0.45 * (cfg.lr - cfg.min_lr)"))
    return dest


def test_a_worker_running_other_code_or_other_threads_is_refused(dask_dir, cache, monkeypatch):
    """Before: 6 of 12 runs trained on the other checkout's schedule, same config hash, exit 0; a
    worker under STUDYLIB_THREADS=2 beside one-thread workers mixed silently."""
    from studylib.run.provenance import code_sha256

    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(dask_dir / "out"))
    p = ci_preset(cache)
    other = _other_checkout(dask_dir / "other")
    d = DaskProcesses(dask_dir / "dask")
    try:
        stranger = d.worker("stranger", env={"PYTHONPATH": str(other), "STUDYLIB_THREADS": "1"})
        d.wait_for_workers(1)
        with pytest.raises(ClusterError) as ei:
            ensure_runs(p, ["dense_active"], [1337], progress=False, scheduler=d.address)
        code_line = str(ei.value)
        os.killpg(stranger.pid, signal.SIGTERM)
        stranger.wait(timeout=30)
        d.worker("one", env={"STUDYLIB_THREADS": "1"})
        d.worker("two", env={"STUDYLIB_THREADS": "2"})
        d.wait_for_workers(2)
        with pytest.raises(ClusterError) as ei:
            ensure_runs(p, ["dense_active"], [1337], progress=False, scheduler=d.address)
        threads_line = str(ei.value)
    finally:
        d.stop()
    assert "\n" not in code_line
    assert re.match(r"worker tcp://127\.0\.0\.1:\d+ runs other code than this study \(studylib code sha256 "
                    + code_sha256()[:12] + " -> " + code_sha256(other / "studylib")[:12], code_line), code_line
    assert "\n" not in threads_line and "different torch thread counts" in threads_line
    assert re.search(r"\(1 thread\(s\): tcp://127\.0\.0\.1:\d+; 2 thread\(s\): tcp://127\.0\.0\.1:\d+\)", threads_line)
    assert not RunDir.of(p, "dense_active", 1337).path.exists()  # nothing trained


def test_a_worker_with_other_code_that_joins_later_is_left_out_alone(dask_dir, cache, monkeypatch, capfd):
    """Before: the first run it refused stopped the whole study (ClusterError, exit 2)."""
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(dask_dir / "out"))
    p = ci_preset(cache, *(f"{k}={v}" for k, v in LONG.items()))
    seeds = [1337, 1338, 1339, 1340, 1341]
    other = _other_checkout(dask_dir / "other")
    d = DaskProcesses(dask_dir / "dask")
    outcome: dict = {}

    def study():
        try:
            outcome["specs"] = ensure_runs(p, ["dense_active"], seeds, progress=False, scheduler=d.address)
        except BaseException as e:  # noqa: BLE001 - reported below
            outcome["error"] = e

    try:
        good = d.worker("good", env={"STUDYLIB_THREADS": "1"})
        d.wait_for_workers(1)
        thread = threading.Thread(target=study)
        thread.start()
        first = RunDir.of(p, "dense_active", seeds[0])
        _wait_for(lambda: (first.path / LOG_FILE).exists() and _headers(first), "the first run trains on the good worker", 120)
        d.worker("stranger", env={"PYTHONPATH": str(other), "STUDYLIB_THREADS": "1"})
        thread.join(timeout=600)
        assert not thread.is_alive(), "the sweep did not end"
    finally:
        d.stop()
    assert "error" not in outcome, outcome.get("error")
    warnings = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("warning: worker")]
    assert len(warnings) == 1, warnings  # it refused at least one run, said once
    assert re.match(r"warning: worker tcp://127\.0\.0\.1:\d+ runs other code than this study \(.*; that worker is "
                    r"left out, the other workers train its runs$", warnings[0]), warnings
    for seed in seeds:  # every run finished, trained on the good worker only
        rd = RunDir.of(p, "dense_active", seed)
        assert rd.finished() and {_pid(h) for h in _headers(rd)} <= {_pid(_headers(first)[0])}, _headers(rd)
    assert good.poll() is not None  # stopped with the cluster


_ENSURE = r"""
import sys
from studylib.config import load_preset
from studylib.study.orchestration.plan import Grid, plan_runs
from studylib.study.orchestration.train import train_plan
p = load_preset(sys.argv[1], sys.argv[3:])
train_plan(plan_runs(p, [Grid(["dense_active"], [1337])]), progress=False, scheduler=sys.argv[2])
"""


def test_two_studies_with_the_same_model_and_seed_train_at_once_on_one_scheduler(dask_dir, cache):
    """Before: `ci` and a copy `ci_lr2` (lr 6e-3) at once on one scheduler shared the task
    train-dense_active-seed1337, and one study failed ("ended without a finished summary")."""
    text = (ROOT / "params" / "ci.yaml").read_text()
    assert "\nname: ci\n" in text and "  lr: 3.0e-3\n" in text
    lr2 = dask_dir / "ci_lr2.yaml"
    lr2.write_text(text.replace("\nname: ci\n", "\nname: ci_lr2\n").replace("  lr: 3.0e-3\n", "  lr: 6.0e-3\n"))
    sets = [f"data.data_dir={require_subset()}", f"data.cache_dir={cache}", *(f"{k}={v}" for k, v in LONG.items())]
    ci_preset(cache, *sets[2:])  # the data cache, built once before the two studies start
    env = dict(os.environ, STUDYLIB_OUTPUTS=str(dask_dir / "out"))
    d = DaskProcesses(dask_dir / "dask", workers=("w1", "w2"))
    try:
        studies = [subprocess.Popen([sys.executable, "-c", _ENSURE, str(params), d.address, *sets], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                   for params in (ROOT / "params" / "ci.yaml", lr2)]
        outs = [proc.communicate(timeout=400)[0].decode() for proc in studies]
    finally:
        d.stop()
    assert [proc.returncode for proc in studies] == [0, 0], outs
    rds = [RunDir(dask_dir / "out" / name / "runs" / "dense_active" / "seed1337") for name in ("ci", "ci_lr2")]
    assert all(rd.finished() for rd in rds)
    assert [len(_headers(rd)) for rd in rds] == [1, 1]  # each study trained its own run, once
    assert rds[0].summary()["best_val_loss"] != rds[1].summary()["best_val_loss"]  # lr 3e-3 vs 6e-3


def _study_cli(params: Path, scheduler: str, out: Path, cache: Path, timeout: float) -> subprocess.Popen:
    env = dict(os.environ, STUDYLIB_OUTPUTS=str(out), STUDYLIB_DATA_DIR=str(require_subset()),
               STUDYLIB_CACHE_DIR=str(cache))
    return subprocess.Popen([sys.executable, "-m", "studylib", "study", "--params", str(params), "--notebooks", "03",
                             "--no-report", "--no-progress", "--scheduler", scheduler], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _one_error_line(proc: subprocess.Popen, timeout: float) -> str:
    out, err = proc.communicate(timeout=timeout)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in err and len(errors) == 1, err[-3000:]
    return errors[0]


def test_an_address_where_no_dask_scheduler_answers_fails_with_one_line_in_time(tmp_path, cache):
    """Before: --scheduler at a port where a plain HTTP server listens waited silently (420 s+)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    http = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        _wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, "the http server listens", 30)
        t0 = time.monotonic()
        proc = _study_cli(ROOT / "params" / "ci.yaml", f"tcp://127.0.0.1:{port}", tmp_path / "out", cache, 300)
        line = _one_error_line(proc, 300)
        took = time.monotonic() - t0
    finally:
        http.kill()
        http.wait()
    assert line.startswith(f"error: scheduler tcp://127.0.0.1:{port}: no Dask scheduler answered within "
                           f"{SCHEDULER_TIMEOUT_S:.0f} s"), line
    assert took < SCHEDULER_TIMEOUT_S + 120, took  # the probe's wait, plus the CLI's start and the data
    print(f"non-Dask port: one line after {took:.1f} s")


def test_a_killed_scheduler_stops_the_study_with_one_line_and_exit_2(dask_dir, cache):
    """Before: distributed's ConnectionRefusedError traceback, then the line, exit 1."""
    import yaml

    raw = yaml.safe_load((ROOT / "params" / "ci.yaml").read_text())
    raw["name"] = "ci_long"
    raw["train"].update({k.split(".")[1]: v for k, v in LONG.items()})
    params = dask_dir / "ci_long.yaml"
    params.write_text(yaml.safe_dump(raw))
    d = DaskProcesses(dask_dir / "dask", workers=("w1",))
    try:
        proc = _study_cli(params, d.address, dask_dir / "out", cache, 600)
        locks = lambda: [f for f in (dask_dir / "out").rglob(".lock") if f.stat().st_size]  # noqa: E731
        _wait_for(lambda: locks(), "a run trains", timeout=300, proc=proc)
        os.killpg(d.procs[0].pid, signal.SIGKILL)  # the scheduler
        line = _one_error_line(proc, 300)
    finally:
        if proc.poll() is None:
            proc.kill()
        d.stop()
    assert f"scheduler {d.address}" in line and "resume" in line, line
