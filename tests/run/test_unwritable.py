"""Where nothing can be written, or the disk fills (issue #24): every command that only reads a run
works on a read-only run directory (train on a finished run, generate, export and evaluate into
another folder); every write that cannot happen is one line ``error: ...``, exit 2, no traceback,
nothing half-written. Mount-based cases skip where mounting is not allowed."""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from contextlib import contextmanager

import pytest
import yaml

from _tiny import tiny_raw, write_stories
from studylib.cli import main
from studylib.run.rundir import RunDir

pytestmark = pytest.mark.usefixtures("one_thread")


def _mount(args, target) -> None:
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    r = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount here: {r.stderr.strip()}")


@contextmanager
def read_only(folder):
    """``folder`` seen through a read-only bind mount (the returned path)."""
    view = folder.parent / f"ro-{uuid.uuid4().hex[:6]}"
    view.mkdir()
    _mount(["--bind", str(folder)], view)
    try:
        r = subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot remount read-only: {r.stderr.strip()}")
        yield view
    finally:
        subprocess.run(["umount", str(view)], check=False)
        view.rmdir()


@contextmanager
def tmpfs(parent, size):
    d = parent / f"tmpfs-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    _mount(["-t", "tmpfs", "-o", f"size={size}", "tmpfs"], d)
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=False)
        d.rmdir()


def _one_line(argv, capsys) -> str:
    rc = main(argv)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    errors = [ln for ln in err if ln.startswith("error: ")]
    assert rc == 2 and len(errors) == 1 and err[-1] == errors[0], err
    assert not any("Traceback" in ln for ln in err)
    return errors[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A finished run (6 steps) with its preset, stories and cache."""
    root = tmp_path_factory.mktemp("unwritable")
    write_stories(root / "data", 400)
    raw = tiny_raw(data={"source": "local", "data_dir": str(root / "data"), "cache_dir": str(root / "cache"),
                         "vocab_size": 320, "context": 33, "val_fraction": 0.2, "tokenizer_threads": 1},
                   train={"max_steps": 6, "eval_every": 3, "lr": 1e-2, "min_lr": 1e-3})
    (root / "tiny.yaml").write_text(yaml.safe_dump(raw))
    with pytest.MonkeyPatch.context() as mp:
        for k in ("STUDYLIB_DATA_DIR", "STUDYLIB_CACHE_DIR"):
            mp.delenv(k, raising=False)
        assert main(["train", "--params", str(root / "tiny.yaml"), "--model", "dense", "--seed", "1",
                     "--run-dir", str(root / "run"), "--no-progress"]) == 0
    return root


@pytest.fixture
def env(world, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for k in ("STUDYLIB_DATA_DIR", "STUDYLIB_CACHE_DIR"):
        monkeypatch.delenv(k, raising=False)
    return world


def test_read_only_run_directory_serves_every_read_only_command(env, tmp_path, capsys):
    root = env
    with read_only(root / "run") as run:
        assert main(["train", "--params", str(root / "tiny.yaml"), "--model", "dense", "--seed", "1",
                     "--run-dir", str(run), "--no-progress"]) == 0  # finished: reported, not retrained
        assert "finished run found" in capsys.readouterr().err
        assert main(["generate", "--run", str(run), "--max-new-tokens", "2", "--seed", "1"]) == 0
        assert main(["export", "--run", str(run), "--out", str(tmp_path / "hf")]) == 0
        assert (tmp_path / "hf" / "model.safetensors").is_file()
        line = _one_line(["evaluate", "--run", str(run)], capsys)  # its default folder is inside the run
        assert str(run) in line and "Read-only file system" in line
        assert not any(p.name.startswith(".tmp") for p in run.iterdir())


def test_read_only_unfinished_run_stops_with_one_line(env, tmp_path, capsys):
    root = env
    run = tmp_path / "run"
    shutil.copytree(root / "run", run)
    (run / "summary.json").unlink()  # unfinished: training would write
    with read_only(run) as view:
        line = _one_line(["train", "--params", str(root / "tiny.yaml"), "--model", "dense", "--seed", "1",
                          "--run-dir", str(view), "--no-progress"], capsys)
        assert str(view) in line and "Read-only file system" in line


def test_read_only_empty_data_cache_is_one_line(env, tmp_path, capsys):
    root = env
    (tmp_path / "cache").mkdir()
    with read_only(tmp_path / "cache") as cache:
        line = _one_line(["prepare-data", "--params", str(root / "tiny.yaml"), "--set", f"data.cache_dir={cache}"],
                         capsys)
        assert f"data.cache_dir='{cache}'" in line and "Read-only file system" in line
    assert list((tmp_path / "cache").iterdir()) == []


def test_disk_full_during_export_leaves_nothing(env, tmp_path, capsys):
    root = env
    with tmpfs(tmp_path, "64k") as small:
        line = _one_line(["export", "--run", str(root / "run"), "--out", str(small / "hf")], capsys)
        assert "no space left on device" in line.lower()
        assert list(small.iterdir()) == []  # no half export, no temporary folder


def test_disk_full_while_appending_metrics_names_the_file(tmp_path):
    from studylib.storage.files import DiskFullError

    with tmpfs(tmp_path, "16k") as small:
        rd = RunDir(small / "run")
        rd.path.mkdir()
        rd.append_metrics({"kind": "train", "step": 1})
        fd = os.open(small / "filler", os.O_WRONLY | os.O_CREAT)  # fill the disk
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        with pytest.raises(DiskFullError, match=r"metrics\.jsonl: no space left on device"):
            for step in range(2, 200):  # a line that fits in the last free block may still land
                rd.append_metrics({"kind": "train", "step": step, "pad": "x" * 512})
        os.remove(small / "filler")
        assert [r["step"] for r in rd.read_metrics()][0] == 1  # what was written stays readable
