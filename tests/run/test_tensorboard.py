"""TensorBoard event files from metrics.jsonl: read back with tensorboard's own EventAccumulator,
every number of every record is there at its step (and nothing else), the file is rewritten only
when metrics.jsonl changed, and the command's errors are one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorboard")

from _tiny import synthetic_data, tiny_preset  # noqa: E402

from studylib.config import ConfigError  # noqa: E402
from studylib.run import tensorboard as tb  # noqa: E402
from studylib.run.trainer import train_run  # noqa: E402

BIAS = {"ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, "score": "sigmoid",
                "bias_balance": True, "bias_rate": 0.01}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tb") / "runs"
    preset = tiny_preset(train={"max_steps": 8, "eval_every": 4}, models={"bias": BIAS})
    data = synthetic_data()
    for model in ("dense", "moe", "bias"):
        train_run(preset, model, 1, run_dir=root / model / "seed1", progress=False, data=data)
    return root


def _events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def _expected(run_dir):
    """{tag: {step: value}} straight from metrics.jsonl: ``<kind>/<field>``, and per router layer
    ``layer<i>/<stat>`` (``/e<e>`` for each entry of a per-expert list)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        step = rec["step"]
        for k, v in rec.items():
            if k not in ("kind", "step") and isinstance(v, (int, float)) and not isinstance(v, bool):
                out.setdefault(f"{rec['kind']}/{k}", {})[step] = v
        for i, layer in enumerate(rec.get("router") or []):
            for k, v in (layer or {}).items():
                for tag, x in ([(f"layer{i}/{k}", v)] if not isinstance(v, list)
                               else [(f"layer{i}/{k}/e{e}", x) for e, x in enumerate(v)]):
                    out.setdefault(tag, {})[step] = x
    return out


@pytest.mark.parametrize("model", ["dense", "moe", "bias"])
def test_round_trip_every_scalar(runs, model):
    run = runs / model / "seed1"
    assert tb.write_run(run) == run / tb.EVENT_FILE
    got, want = _events(run), _expected(run)
    assert set(got) == set(want)
    for tag, by_step in want.items():
        assert got[tag] == pytest.approx(by_step, rel=1e-6, abs=1e-7), tag  # float32 in the event file
    assert {"train/train_loss", "train/lr", "train/grad_norm", "eval/val_loss", "eval/tok_per_s"} <= set(got)
    if model != "dense":
        assert {"layer0/entropy", "layer0/busiest", "layer0/logz", "layer1/shares/e3"} <= set(got)
    if model == "bias":
        assert "layer0/bias_picked" in got


def test_idempotent_and_rewritten_when_metrics_change(runs):
    run = runs / "moe" / "seed1"
    tb.write_run(run, force=True)
    ev = run / tb.EVENT_FILE
    before = ev.read_bytes()
    assert tb.write_run(run) is None and ev.read_bytes() == before  # up to date: left alone
    assert [p.name for p in run.iterdir() if p.name.startswith((".tensorboard", "events."))] == [tb.EVENT_FILE]
    with open(run / "metrics.jsonl", "a"):  # touched (a run resumed and appended): rewritten
        os.utime(run / "metrics.jsonl", ns=(ev.stat().st_mtime_ns + 10**9,) * 2)
    assert tb.write_run(run) == ev
    assert set(_events(run)) == set(_expected(run)) and len(list(run.glob("events.*"))) == 1
    written, kept = tb.write_all(runs)
    assert written == [] and sorted(kept) == sorted(runs / m / "seed1" for m in ("bias", "dense", "moe"))


def test_cli_writes_every_run_and_errors_are_one_line(runs, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    ok = subprocess.run([sys.executable, "-m", "studylib", "tensorboard", "--runs", str(runs), "--force"],
                        capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0 and "3 event file(s) written" in ok.stdout, ok.stderr
    for bad, why in ((tmp_path / "nowhere", "not a folder"), (tmp_path, "no run directory")):
        r = subprocess.run([sys.executable, "-m", "studylib", "tensorboard", "--runs", str(bad)],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_without_tensorboard_one_clear_error(runs, monkeypatch):
    monkeypatch.setattr(tb, "available", lambda: False)
    with pytest.raises(ConfigError, match=r"tensorboard: the optional package is not installed; pip install"):
        tb.write_run(runs / "moe" / "seed1")
    messages = []
    tb.after_runs(runs, messages.append)  # the study's hook: skipped, no error
    assert messages == []


def test_the_hook_never_fails_a_finished_run(runs, monkeypatch):
    """A run directory the hook cannot write (read-only, full disk): one line, no exception."""
    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied", str(runs / "moe" / "seed1"))

    monkeypatch.setattr(tb, "write_run", refuse)
    messages = []
    tb.after_runs(runs, messages.append)
    assert len(messages) == 1 and "event files not written" in messages[0] and "Permission denied" in messages[0]
