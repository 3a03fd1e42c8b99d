"""Tests of studylib.run.checkpoint: atomic save, safe load, RNG capture, resume lookup, crash mid-write."""
from __future__ import annotations

import pickle
import re
import random
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from studylib.run import checkpoint as C
from studylib.storage.files import clean_temp_files


def _state(step=3, chash="abc"):
    m = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    return {"kind": "full", "step": step, "config_hash": chash, "model": m.state_dict(),
            "optimizer": opt.state_dict(), "rng": C.capture_rng(), "best": {"val_loss": 1.5, "step": 2},
            "final": None}


def test_roundtrip_weights_only(tmp_path):
    s = _state()
    p = C.save(tmp_path / "latest.pt", s)
    got = C.load(p, expect_hash="abc", kind="full")
    assert got["format"] == C.FORMAT and got["version"] == C.VERSION and got["step"] == 3
    for k, v in s["model"].items():
        assert torch.equal(got["model"][k], v)
    assert got["optimizer"]["param_groups"][0]["betas"] == s["optimizer"]["param_groups"][0]["betas"]
    assert not list(tmp_path.glob(".tmp-*"))  # no stray temp file after a good save


def test_rng_capture_restore_all_generators():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    st = C.capture_rng()
    a = (random.random(), np.random.rand(), torch.rand(3), random.gauss(0, 1), np.random.randn())
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    C.restore_rng(st)
    b = (random.random(), np.random.rand(), torch.rand(3), random.gauss(0, 1), np.random.randn())
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2]) and a[3] == b[3] and a[4] == b[4]


def test_rng_state_survives_weights_only_file(tmp_path):
    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    np.random.randn()  # leave a cached gaussian in numpy's state
    C.save(tmp_path / "x.pt", {"kind": "full", "step": 0, "config_hash": "h", "model": {},
                               "rng": C.capture_rng()})
    a = (np.random.randn(), random.random(), torch.randn(2))
    C.restore_rng(C.load(tmp_path / "x.pt")["rng"])
    b = (np.random.randn(), random.random(), torch.randn(2))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def test_truncated_file_is_a_clear_error(tmp_path):
    p = C.save(tmp_path / "latest.pt", _state())
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(C.CheckpointError, match=r"latest\.pt.*(truncated|corrupt)"):
        C.load(p)


@pytest.mark.parametrize("kind", ["text", "plain_torch", "pickle_object", "empty", "zip"])
def test_foreign_files_are_clear_errors(tmp_path, kind):
    p = tmp_path / f"foreign_{kind}.pt"
    if kind == "text":
        p.write_text("hello, I am not a checkpoint\n")
    elif kind == "plain_torch":
        torch.save({"model": {}, "step": 1}, p)  # a torch file, but not ours
    elif kind == "pickle_object":
        with open(p, "wb") as f:
            pickle.dump(zipfile.ZipInfo("x"), f)  # arbitrary object: refused by weights_only
    elif kind == "empty":
        p.write_bytes(b"")
    else:
        with zipfile.ZipFile(p, "w") as z:
            z.writestr("a.txt", "zip but not torch")
    with pytest.raises(C.CheckpointError, match=f"foreign_{kind}.pt"):
        C.load(p)


class _Payload:
    """Unpickled, it would run a shell command (weights_only refuses it)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("kind, line", [
    ("code", r"refused to execute code from this file: it names the Python global (posix|os|nt)\.system, and a "
             r"studylib checkpoint holds only tensors and plain values; not loaded \(a foreign or tampered file\)"),
    ("object", r"refused to execute code from this file: it names the Python global zipfile\.ZipInfo, "),
    ("protocol4", r"not a readable studylib checkpoint \(truncated, corrupt or foreign file\): UnpicklingError: "
                  r"the safe loader refused it \(Unsupported operand 149\)$"),
])
def test_a_refused_pickle_says_so_without_advising_the_unsafe_setting(tmp_path, kind, line):
    """Its line was torch's: "Re-running torch.load with weights_only set to False will likely
    succeed" (issue #41): the setting that would run the code."""
    p = tmp_path / "latest.pt"
    marker = tmp_path / "pwned"
    if kind == "code":
        torch.save({"model": _Payload(marker)}, p)
    elif kind == "object":
        torch.save({"model": {}, "info": zipfile.ZipInfo("x")}, p)
    else:
        with open(p, "wb") as f:
            pickle.dump({"model": {}}, f, protocol=4)
    with pytest.raises(C.CheckpointError) as e:
        C.load(p)
    got = str(e.value)
    assert re.match(rf"{re.escape(str(p))}: {line}", got), got
    assert "weights_only" not in got and "False" not in got and "\n" not in got
    assert not marker.exists()


def test_wrong_version_and_hash(tmp_path):
    s = _state()
    torch.save({**s, "format": C.FORMAT, "version": 999}, tmp_path / "v.pt")
    with pytest.raises(C.CheckpointError, match="version 999"):
        C.load(tmp_path / "v.pt")
    C.save(tmp_path / "h.pt", s)
    with pytest.raises(C.CheckpointError, match="config hash"):
        C.load(tmp_path / "h.pt", expect_hash="other")
    with pytest.raises(C.CheckpointError, match="not found"):
        C.load(tmp_path / "missing.pt")


def test_keep_prev_and_resume_fallback(tmp_path):
    d = tmp_path / "checkpoints"
    C.save(d / C.LATEST, _state(step=2), keep_prev=True)
    C.save(d / C.LATEST, _state(step=4), keep_prev=True)
    assert C.load(d / C.PREV)["step"] == 2 and C.load(d / C.LATEST)["step"] == 4
    state, path = C.load_resume(d, expect_hash="abc")
    assert state["step"] == 4 and path == d / C.LATEST
    # damage latest.pt: resume falls back to the previous good checkpoint, with ONE warning line
    # naming both files; peek_step agrees; the next save does not rotate the bad file over prev.pt
    for damage in ("truncate", "flip"):
        data = bytearray((d / C.LATEST).read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 1
        (d / C.LATEST).write_bytes(bytes(data if damage == "flip" else data[:100]))
        lines = []
        state, path = C.load_resume(d, expect_hash="abc", warn=lines.append)
        assert state["step"] == 2 and path == d / C.PREV and C.peek_step(d) == 2
        assert len(lines) == 1 and "\n" not in lines[0]
        assert str(d / C.LATEST) in lines[0] and f"using {d / C.PREV} (step 2)" in lines[0]
        C.save(d / C.LATEST, _state(step=4), keep_prev=True)
        assert C.load(d / C.PREV)["step"] == 2 and C.load(d / C.LATEST)["step"] == 4
    # nothing usable: a clear error naming both files
    (d / C.LATEST).write_bytes(b"junk")
    (d / C.PREV).write_bytes(b"junk")
    with pytest.raises(C.CheckpointError, match="no usable checkpoint"):
        C.load_resume(d, warn=lambda m: None)
    # config mismatch is an error, not a silent fresh start
    C.save(d / C.LATEST, _state(step=6, chash="zzz"))
    with pytest.raises(C.CheckpointError, match="refusing to mix runs"):
        C.load_resume(d, expect_hash="abc")
    assert C.load_resume(tmp_path / "empty") is None


DYING_SAVER = """
import io, os, sys, torch
from studylib.run import checkpoint as C
from studylib.storage.files import clean_temp_files

real_save, calls = torch.save, [0]


def dying_save(obj, f):  # the 2nd save writes half its bytes, then the process dies
    calls[0] += 1
    if calls[0] == 2:
        buf = io.BytesIO()
        real_save(obj, buf)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        f.flush()
        os.fsync(f.fileno())
        os._exit(86)
    real_save(obj, f)


torch.save = dying_save
d = sys.argv[1]
for step in (1, 2, 3):
    C.save(d + "/latest.pt", {"kind": "full", "step": step, "config_hash": "h",
                              "model": {"w": torch.full((256, 256), float(step))}}, keep_prev=True)
"""


def test_kill_during_save_leaves_last_good_checkpoint(tmp_path):
    """A real process dies in the middle of writing its 2nd checkpoint: the last good one stays."""
    d = tmp_path / "checkpoints"
    script = tmp_path / "saver.py"
    script.write_text(DYING_SAVER)
    r = subprocess.run([sys.executable, str(script), str(d)], capture_output=True, timeout=120)
    assert r.returncode == 86, r.stderr.decode()
    stray = list(d.glob(".tmp-*"))
    assert len(stray) == 1 and stray[0].stat().st_size > 0  # the half-written file
    with pytest.raises(C.CheckpointError):
        C.load(stray[0])
    state, path = C.load_resume(d, expect_hash="h")
    assert path == d / C.LATEST and state["step"] == 1 and float(state["model"]["w"][0, 0]) == 1.0
    assert clean_temp_files(d) == stray and not list(d.glob(".tmp-*"))


def test_snapshots_listed_by_step(tmp_path):
    for s in (10, 2, 100):
        C.save(C.snapshot_path(tmp_path, s), {"kind": "snapshot", "step": s, "config_hash": "h",
                                               "model": {}})
    (tmp_path / "step_x.pt").write_text("not a snapshot name")
    assert [s for s, _ in C.list_snapshots(tmp_path)] == [2, 10, 100]
    assert C.load(C.snapshot_path(tmp_path, 10), kind="snapshot")["step"] == 10
