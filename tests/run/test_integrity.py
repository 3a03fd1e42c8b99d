"""Nothing silently wrong, nothing lost: a bit-flipped checkpoint is never used (SHA-256 digest,
fallback to prev.pt with one warning), a kill between the snapshot and latest.pt loses no
snapshot, and a full disk is one clear error that leaves the previous checkpoint intact."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest
import torch

from _tiny import comparable, synthetic_data, tiny_preset
from studylib.run import checkpoint as C
from studylib.run import trainer as T
from studylib.storage.files import DiskFullError, write_atomic
from studylib.run.rundir import RunDir

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny shapes: threads only contend
TESTS = Path(__file__).resolve().parents[1]
PRESET = {"train": {"max_steps": 12, "eval_every": 4, "keep_checkpoints": True}}


@pytest.fixture(scope="module")
def data():
    return synthetic_data()


def _state(step=3, chash="abc", n=64):
    m = torch.nn.Linear(n, n)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, n)).sum().backward()
    opt.step()
    return {"kind": "full", "step": step, "config_hash": chash, "model": m.state_dict(),
            "optimizer": opt.state_dict(), "rng": C.capture_rng(), "best": {}, "final": None}


def _flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x10
    path.write_bytes(bytes(data))


def _tensor_offset(path: Path) -> int:
    """An offset in the middle of the largest tensor record: the zip still parses after a flip there."""
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
    return info.header_offset + 30 + name_len + extra_len + info.file_size // 2


# --------------------------------------------------------------------------------------------
# 1. bit flips: the digest
# --------------------------------------------------------------------------------------------
def test_flip_in_tensor_data_is_caught(tmp_path):
    """torch does not check the zip CRCs: without the digest this flip loads silently. A bad
    latest.pt and prev.pt: one error listing both."""
    d = tmp_path / "checkpoints"
    for step in (2, 4):
        C.save(d / C.LATEST, _state(step=step), keep_prev=True)
    for p in (d / C.LATEST, d / C.PREV):
        _flip(p, _tensor_offset(p))
        with pytest.raises(C.CheckpointError, match=rf"{p.name}: SHA-256 mismatch, the file is damaged"):
            C.load(p)
    with pytest.raises(C.CheckpointError, match=r"(?s)no usable checkpoint.*latest\.pt.*prev\.pt"):
        C.load_resume(d, warn=pytest.fail)


def test_every_flipped_or_torn_file_is_refused(tmp_path):
    """A flip at any of ~250 positions (header, tensors, zip directory, digest trailer) and a cut
    at any of ~40 lengths: always a CheckpointError, never a state."""
    good = C.save(tmp_path / "good.pt", _state()).read_bytes()
    n = len(good)
    positions = sorted(set(range(0, n, max(1, n // 200))) | set(range(n - C.TRAILER_LEN - 30, n)))
    p = tmp_path / "bad.pt"
    for pos in positions:
        p.write_bytes(good)
        _flip(p, pos)
        with pytest.raises(C.CheckpointError):
            C.load(p)
    for cut in sorted(set(range(0, n, max(1, n // 40))) | {n - 1, n - C.TRAILER_LEN}):
        p.write_bytes(good[:cut])
        with pytest.raises(C.CheckpointError):
            C.load(p)


def test_version1_checkpoint_without_digest_still_loads(tmp_path):
    """Checkpoints of the previous version (no digest trailer) load, unverified."""
    d = tmp_path / "checkpoints"
    d.mkdir()
    torch.save({"format": C.FORMAT, "version": 1, **_state(step=5)}, d / C.LATEST)
    assert C.load(d / C.LATEST, kind="full")["step"] == 5
    assert C.peek_step(d) == 5
    state, path = C.load_resume(d, expect_hash="abc", warn=pytest.fail)
    assert state["step"] == 5 and path == d / C.LATEST
    # ... but a version-2 file whose trailer is missing is damaged
    torch.save({"format": C.FORMAT, "version": 2, **_state(step=6)}, d / "v2.pt")
    with pytest.raises(C.CheckpointError, match="digest trailer is missing"):
        C.load(d / "v2.pt")


class _Killed(Exception):
    pass


def test_run_resumed_past_flipped_latest_equals_uninterrupted(tmp_path, data, monkeypatch, capsys):
    """The attack: a run killed at step 8, one byte of latest.pt flipped, train again. Before the
    digest it resumed from the flipped weights (exit 0, different results); now it warns once and
    resumes from prev.pt (step 4), ending bit-identical to the uninterrupted run."""
    preset = tiny_preset(**PRESET)
    ref = RunDir(tmp_path / "ref")
    T.train_run(preset, "dense", 1, run_dir=ref.path, progress=False, data=data)
    res = RunDir(tmp_path / "res")
    real_save = C.save

    def dying_save(path, state, **kw):
        if state["step"] == 12:
            raise _Killed
        return real_save(path, state, **kw)

    with monkeypatch.context() as mp:
        mp.setattr(C, "save", dying_save)
        with pytest.raises(_Killed):
            T.train_run(preset, "dense", 1, run_dir=res.path, progress=False, data=data)
    latest = res.checkpoints / C.LATEST
    assert C.peek_step(res.checkpoints) == 8
    _flip(latest, _tensor_offset(latest))
    capsys.readouterr()
    T.train_run(preset, "dense", 1, run_dir=res.path, progress=False, data=data)
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "damaged" in line]
    assert len(warned) == 1 and str(latest) in warned[0] and str(res.checkpoints / C.PREV) in warned[0]
    assert "resuming from step 4 " in err
    assert comparable(res.read_metrics()) == comparable(ref.read_metrics())
    a, b = C.load(ref.checkpoints / C.LATEST), C.load(latest)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])
    assert [s for s, _ in C.list_snapshots(res.checkpoints)] == [4, 8, 12]


# --------------------------------------------------------------------------------------------
# 2. a kill between the snapshot and latest.pt loses no snapshot
# --------------------------------------------------------------------------------------------
KILL_BETWEEN = """
import os, sys
sys.path.insert(0, {tests!r})
from _tiny import main
from studylib.run import checkpoint

real_save, seen = checkpoint.save, set()


def save_then_die(path, state, **kw):  # the process dies right after the FIRST file of step 8
    out = real_save(path, state, **kw)
    if state["step"] == 8 and not seen:
        seen.add(8)
        os._exit(87)
    return out


checkpoint.save = save_then_die
raise SystemExit(main())
"""


@pytest.mark.slow
def test_kill_between_snapshot_and_latest_loses_no_snapshot(tmp_path):
    run = tmp_path / "run"
    script = tmp_path / "kill_between.py"
    script.write_text(KILL_BETWEEN.format(tests=str(TESTS)))
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    base = ["--raw", json.dumps({"train": {**PRESET["train"], "num_threads": 1}})]
    r = subprocess.run([sys.executable, str(script), str(run), *base], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 87, r.stderr
    r = subprocess.run([sys.executable, str(TESTS / "_tiny.py"), str(run), *base], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    evals = [rec["step"] for rec in RunDir(run).read_metrics() if rec["kind"] == "eval"]
    snaps = C.list_snapshots(run / "checkpoints")
    assert evals == [4, 8, 12] and [s for s, _ in snaps] == evals
    for step, p in snaps:
        assert C.load(p, kind="snapshot")["step"] == step


# --------------------------------------------------------------------------------------------
# 3. disk full
# --------------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path, request):
    """A tmpfs of ``request.param`` (default 512k; skips where mounting is not allowed)."""
    size = getattr(request, "param", "512k")
    d = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=False)


def test_disk_full_checkpoint_save_is_one_clear_error(small_disk):
    d = small_disk / "checkpoints"
    C.save(d / C.LATEST, _state(step=2), keep_prev=True)
    C.save(d / C.LATEST, _state(step=4), keep_prev=True)
    big = {**_state(step=6), "model": {"w": torch.zeros(200_000)}}  # 800 KB: does not fit
    with pytest.raises(C.CheckpointError) as e:
        C.save(d / C.LATEST, big, keep_prev=True)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{d / C.LATEST}: no space left on device")
    assert "needs about 8" in msg and "KiB" in msg and "free in" in msg  # 800 KB+ of tensors
    assert e.value.__cause__ is None and e.value.__suppress_context__
    assert C.load(d / C.LATEST)["step"] == 4 and C.load(d / C.PREV)["step"] == 2
    assert sorted(p.name for p in d.iterdir()) == [C.LATEST, C.PREV]  # no temp file left


def test_disk_full_plain_write_names_file(small_disk):
    p = small_disk / "blob.bin"
    write_atomic(p, b"old")
    with pytest.raises(DiskFullError, match=r"blob\.bin: no space left on device .*when the disk fill"):
        write_atomic(p, (b"x" * 65536 for _ in range(16)))
    assert p.read_bytes() == b"old" and [q.name for q in small_disk.iterdir()] == ["blob.bin"]


@pytest.mark.parametrize("small_disk", ["1m"], indirect=True)
def test_disk_full_during_training_stops_clearly(small_disk, data):
    """A tiny MoE run on a 1 MiB disk: snapshots are 160 KB, full checkpoints 510 KB, so step 4's
    files fit and step 8's latest.pt does not."""
    run = small_disk / "run"
    with pytest.raises(C.CheckpointError, match=r"checkpoints/latest\.pt: no space left on device"):
        T.train_run(tiny_preset(**PRESET), "moe", 1, run_dir=run, progress=False, data=data)
    ck = run / "checkpoints"
    assert not list(ck.glob(".tmp-*"))
    assert C.load_resume(ck, warn=pytest.fail)[0]["step"] == 4
