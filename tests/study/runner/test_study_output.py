"""What the terminal shows during ``make study``: the runs in flight with their step and ETA
(studylib.study.orchestration.watch), and no "Kernel is running over TCP without encryption" noise."""
from __future__ import annotations

import json
import time

from studylib.run.rundir import RunDir
from studylib.study.runner.execute import execute_notebook
from studylib.study.orchestration.watch import RunWatcher


def _run(root, model, seed, steps, max_steps=100, finished=False) -> RunDir:
    rd = RunDir(root / model / f"seed{seed}")
    rd.path.mkdir(parents=True)
    rd.write_config({"run": {"model": model, "seed": seed}, "preset": {"train": {"max_steps": max_steps}}})
    for s in steps:
        rd.append_metrics({"kind": "train", "step": s})
    if finished:
        rd.write_summary({"finished": True, "best_val_loss": 2.0})
    return rd


def test_watcher_lists_runs_in_flight_with_step_and_eta(tmp_path):
    old = _run(tmp_path, "dense", 1, [100], finished=True)  # finished: never shown
    lines = []
    w = RunWatcher(tmp_path, lines.append, tty=True, interval=0.05)
    w.t0 = time.time() - 1
    a = _run(tmp_path, "moe", 1, [10])
    _run(tmp_path, "moe", 2, [3], max_steps=None)
    _run(tmp_path / "moe", "lowlr", 1, [4], max_steps=8)  # a variant: runs/<model>/<tag>/seed<N>
    w.first["moe seed1"] = (time.time() - 10, 0)  # 10 steps in 10 s: 90 to go -> ~1m30s
    w.poll()
    assert len(lines) == 1
    assert "moe seed1 10/100 eta 1m30s" in lines[0] and "moe seed2 step 3" in lines[0]
    assert "moe lowlr seed1 4/8" in lines[0]
    assert "dense" not in lines[0] and old.finished()
    w.poll()
    assert len(lines) == 1  # nothing changed: nothing printed
    a.append_metrics({"kind": "train", "step": 20})
    w.poll()
    assert len(lines) == 2 and "moe seed1 20/100" in lines[1]


def test_watcher_without_a_terminal_prints_one_line_per_change_of_the_runs(tmp_path):
    lines = []
    w = RunWatcher(tmp_path, lines.append, tty=False, interval=0.05)
    w.t0 = time.time() - 1
    a = _run(tmp_path, "moe", 1, [1])
    w.poll()
    a.append_metrics({"kind": "train", "step": 2})
    w.poll()
    assert len(lines) == 1  # a step is not a change
    a.write_summary({"finished": True, "best_val_loss": 2.0})
    _run(tmp_path, "moe", 2, [1])
    w.poll()
    assert len(lines) == 2 and "moe seed2" in lines[1] and "seed1" not in lines[1]
    with RunWatcher(tmp_path / "none", lines.append, tty=False, interval=0.01):  # the thread starts and stops
        time.sleep(0.05)


def test_notebook_kernel_uses_ipc_without_the_tcp_warning(tmp_path, capfd, monkeypatch):
    import tempfile

    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))  # where the kernel's socket folder goes
    py = tmp_path / "01_t.py"
    py.write_text('# %% tags=["parameters"]\nx = 1\n# %%\nprint(x + 1)\n')
    out = tmp_path / "out.ipynb"
    execute_notebook(py, out, {"x": 41}, tmp_path, progress=False)
    nb = json.loads(out.read_text())
    assert "42" in "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))
    err = capfd.readouterr().err
    assert "without encryption" not in err and "KeyboardInterrupt" not in err
    assert not list(private.glob("studylib-kernel-*"))  # the socket folder is removed with the kernel


def test_a_finished_notebooks_kernel_is_shut_down_without_an_interrupt(monkeypatch):
    """jupyter_client sends SIGINT before every shutdown request; the study's kernels have finished
    their notebook by then, so the manager skips it (ipykernel logged an ERROR when it landed
    mid-message). An interrupt outside a shutdown (a timed-out cell) still goes through."""
    import asyncio

    from jupyter_client.manager import AsyncKernelManager

    from studylib.study.runner.execute import ipc_kernel_manager

    sent = []

    async def interrupt(self):
        sent.append(self.shutting_down)

    monkeypatch.setattr(AsyncKernelManager, "_async_interrupt_kernel", interrupt)
    km = ipc_kernel_manager()()
    km.shutting_down = True
    asyncio.run(km._async_interrupt_kernel())
    assert sent == []
    km.shutting_down = False
    asyncio.run(km._async_interrupt_kernel())
    assert sent == [False]
