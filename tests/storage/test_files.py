"""Atomic writes: a temporary file a killed writer left (``.tmp-<name>.<pid>``) is removed by the
next write of that file once its writer is gone; a running writer's is left alone (issue #41: a
SIGKILL while the report was written left ``.tmp-report.html.<pid>`` behind for good)."""
from __future__ import annotations

import subprocess
import sys

from studylib.storage.files import TMP_PREFIX, write_atomic, write_json_atomic


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_next_write_removes_the_temporaries_of_dead_writers_only(tmp_path):
    target = tmp_path / "report.html"
    target.write_text("the previous report")
    dead = tmp_path / f"{TMP_PREFIX}report.html.{_dead_pid()}"
    dead.write_text("half a rep")
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        running = tmp_path / f"{TMP_PREFIX}report.html.{alive.pid}"
        running.write_text("being written")
        others = [tmp_path / f"{TMP_PREFIX}other.html.{_dead_pid()}",  # another file's: its own write cleans it
                  tmp_path / f"{TMP_PREFIX}report.html.bak"]  # not a writer's temporary file
        for p in others:
            p.write_text("x")
        write_atomic(target, "the new report")
        assert target.read_text() == "the new report"
        assert not dead.exists() and running.exists() and all(p.exists() for p in others)
    finally:
        alive.kill()
        alive.wait()
    write_json_atomic(target, {"a": 1})  # its writer gone now: removed too
    assert not running.exists()


def test_a_name_with_glob_characters_cleans_only_its_own(tmp_path):
    target = tmp_path / "04_diag-model=[x].ipynb"
    mine, near = (tmp_path / f"{TMP_PREFIX}{name}.{_dead_pid()}" for name in (target.name, "04_diag-model=x.ipynb"))
    mine.write_text("x")
    near.write_text("x")
    write_atomic(target, b"{}")
    assert not mine.exists() and near.exists()
