"""Tests of studylib.run.trainer and studylib.run.rundir: schedule, optimizer groups, batches, run directory,
skip / resume / conflicts, non-finite stop, grad accumulation, kill -9 resume, DDP, CLI."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from _tiny import TINY_RAW, comparable, synthetic_data, tiny_preset, tiny_raw
from studylib.run import checkpoint as C
from studylib.run import rundir as runs
from studylib.run import trainer as T
from studylib.config import TrainConfig

TESTS = Path(__file__).resolve().parent
TINY_SCRIPT = TESTS / "_tiny.py"
SUBSET = Path("/work/shared/data/tinystories")


@pytest.fixture(scope="module")
def data():
    return synthetic_data()


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != C.CRASH_ENV and k not in ("WORLD_SIZE", "RANK")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run_script(run_dir, raw: dict, model="dense", delay=0.0, env=None, timeout=300):
    cmd = [sys.executable, str(TINY_SCRIPT), str(run_dir), "--model", model, "--raw", json.dumps(raw)]
    if delay:
        cmd += ["--delay", str(delay)]
    return subprocess.run(cmd, env=env or _env(), capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------------------------
# pure pieces
# --------------------------------------------------------------------------------------------
def test_lr_schedule_warmup_peak_end():
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_frac=0.1)
    total = 100
    assert T.warmup_steps(total, cfg) == 10
    assert T.lr_at(0, total, cfg) == pytest.approx(1e-3 / 11)  # first step: small, not zero
    assert T.lr_at(10, total, cfg) == pytest.approx(1e-3)  # end of warmup: peak
    assert T.lr_at(9, total, cfg) < T.lr_at(10, total, cfg)
    assert T.lr_at(total - 1, total, cfg) == pytest.approx(1e-4)  # last step: min_lr
    assert T.lr_at(5 * total, total, cfg) == pytest.approx(1e-4)
    mid = 10 + (total - 1 - 10) / 2
    assert T.lr_at(mid, total, cfg) == pytest.approx((1e-3 + 1e-4) / 2)  # cosine midpoint
    lrs = [T.lr_at(s, total, cfg) for s in range(total)]
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:11]))  # warmup rises
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then decays monotonically
    # the paper's schedule: 26,073 steps, 3% warmup
    paper = TrainConfig()
    assert T.warmup_steps(26073, paper) == 782
    assert T.lr_at(782, 26073, paper) == pytest.approx(3e-4)
    assert T.lr_at(26072, 26073, paper) == pytest.approx(3e-5)
    # no warmup: the first step is at the peak
    assert T.lr_at(0, 50, TrainConfig(warmup_frac=0.0)) == pytest.approx(3e-4)


def test_weight_decay_only_on_matrices(data):
    from studylib.nn.model import Decoder

    cfg = tiny_preset().model_config("moe")
    model = Decoder(cfg)
    groups = T.param_groups(model, 0.1)
    decay, no_decay = groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert "tok_emb.weight" in decay["names"]  # the (tied) embedding, once
    assert any("w_in_EFD" in n for n in decay["names"]) and any("router" in n for n in decay["names"])
    assert all("norm" in n for n in no_decay["names"]) and "norm.weight" in no_decay["names"]
    assert sum(p.numel() for g in groups for p in g["params"]) == model.num_params()
    opt = T.make_optimizer(model, tiny_preset().train, torch.device("cpu"))
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)


def test_batches_pure_function_of_seed_step_micro():
    idx = np.arange(100, 200, dtype=np.int64)
    a, b = T.BatchSampler(idx, 7, 8, 2), T.BatchSampler(idx, 7, 8, 2)
    assert np.array_equal(a.indices(5, 1), b.indices(5, 1))
    assert not np.array_equal(a.indices(5, 1), T.BatchSampler(idx, 8, 8, 2).indices(5, 1))
    # one epoch = 100 // 16 = 6 steps: no window repeats within it, all from the train set
    seen = np.concatenate([a.indices(s, m) for s in range(6) for m in range(2)])
    assert len(np.unique(seen)) == len(seen) == 96 and set(seen) <= set(idx.tolist())
    # the stream crosses into epoch 1 with a new permutation (position 96..111 straddles it)
    straddle = a.indices(6, 0)
    assert len(straddle) == 8 and set(straddle) <= set(idx.tolist())
    # 2x8 and 1x16 read the same windows per optimizer step
    one = T.BatchSampler(idx, 7, 16, 1)
    for s in range(4):
        assert np.array_equal(np.concatenate([a.indices(s, 0), a.indices(s, 1)]), one.indices(s, 0))


def test_eval_subset_is_fixed_and_shared():
    val = np.arange(1000, 1100, dtype=np.int64)
    s1, s2 = T.eval_subset(val, 10, 1337), T.eval_subset(val, 10, 1337)
    assert np.array_equal(s1, s2) and len(np.unique(s1)) == 10 and np.all(np.diff(s1) > 0)
    assert np.array_equal(T.eval_subset(val, None, 1337), val)
    assert np.array_equal(T.eval_subset(val, 500, 1337), val)


def test_tree_mean_of_router_stats():
    acc = T._tree_add(None, [None, {"a": 1.0, "s": [1.0, 0.0], "name": "x"}], 2)
    acc = T._tree_add(acc, [None, {"a": 4.0, "s": [0.0, 1.0], "name": "y"}], 1)
    out = T._tree_scale(acc, 1 / 3)
    assert out[0] is None and out[1]["a"] == pytest.approx(2.0) and out[1]["name"] == "x"
    assert out[1]["s"] == pytest.approx([2 / 3, 1 / 3])


# --------------------------------------------------------------------------------------------
# a run and its directory
# --------------------------------------------------------------------------------------------
def test_run_directory_contents_moe_bf16(tmp_path, data):
    preset = tiny_preset(train={"amp": "auto"})
    s = T.train_run(preset, "moe", 1, run_dir=tmp_path / "r", progress=False, data=data)
    r = tmp_path / "r"
    assert s["finished"] and s["amp"] == "bfloat16" and s["steps"] == 12
    assert s["tokens"] == 12 * 8 * 2 * 32
    assert s["params"]["total"] == s["num_params"] and s["params"]["active"] < s["params"]["total"]
    assert json.loads((r / "summary.json").read_text()) == json.loads(json.dumps(s))
    for key in ("best_val_loss", "best_step", "final_val_loss", "final_val_ppl", "wall_time_s",
                "train_tok_per_s", "model", "seed"):
        assert key in s
    cfg = yaml.safe_load((r / "config.yaml").read_text())
    assert cfg["run"]["model"] == "moe" and cfg["model"]["ffn"]["num_experts"] == 4
    assert cfg["preset"]["train"]["amp"] == "auto"
    recs = runs.read_metrics(r)
    evals = [x for x in recs if x["kind"] == "eval"]
    trains = [x for x in recs if x["kind"] == "train"]
    assert [e["step"] for e in evals] == [4, 8, 12] and len(trains) == 12
    assert [e["full"] for e in evals] == [False, False, True]
    assert [e["val_windows"] for e in evals] == [16, 16, 24]
    # best is the lowest loss on the 16-window subset (the last step evaluates it as well)
    subset = [e["val_loss"] for e in evals[:-1]] + [evals[-1]["subset_val_loss"]]
    assert s["best_val_loss"] == min(subset) and not s["best_is_full_eval"]
    assert s["final_val_loss"] == evals[-1]["val_loss"] != evals[-1]["subset_val_loss"]
    for e in evals:
        for k in ("step", "tokens", "val_loss", "val_ppl", "train_loss", "lr", "tok_per_s", "elapsed_s",
                  "eval_s", "full", "router"):
            assert k in e
        assert e["val_ppl"] == pytest.approx(math.exp(e["val_loss"]))
        assert len(e["router"]) == 2
        for layer in e["router"]:
            assert sum(layer["shares"]) == pytest.approx(1.0) and 0 < layer["entropy"] <= math.log(4) + 1e-6
    assert trains[0]["lr"] == pytest.approx(T.lr_at(0, 12, preset.train))
    ck = C.load(r / "checkpoints" / "latest.pt")
    assert ck["step"] == 12 and ck["final"]["val_loss"] == s["final_val_loss"]
    assert ck["data_position"]["windows"] == 12 * 16
    # frames for the notebooks
    df = runs.load_metrics(r, kind="eval")
    assert list(df["step"]) == [4, 8, 12]


def test_dense_router_entries_are_none(tmp_path, data):
    T.train_run(tiny_preset(train={"max_steps": 4}), "dense", 1, run_dir=tmp_path, progress=False,
                data=data)
    ev = runs.load_metrics(tmp_path, kind="eval")
    assert ev["router"].iloc[-1] == [None, None]


def test_finished_run_is_skipped(tmp_path, data, capsys):
    preset = tiny_preset(train={"max_steps": 4})
    s1 = T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=data)
    before = (tmp_path / "metrics.jsonl").read_bytes()
    mtime = (tmp_path / "summary.json").stat().st_mtime_ns
    capsys.readouterr()
    s2 = T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=None)  # no data needed
    assert s2 == json.loads(json.dumps(s1))
    assert "skipping" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
    assert (tmp_path / "summary.json").stat().st_mtime_ns == mtime


def test_crash_after_final_checkpoint_only_writes_summary(tmp_path, data, monkeypatch):
    preset = tiny_preset(train={"max_steps": 4, "eval_every": 2})
    s1 = T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=data)
    (tmp_path / "summary.json").unlink()  # as if killed between the last checkpoint and the summary
    before = runs.read_metrics(tmp_path)
    import studylib.nn.model as M

    monkeypatch.setattr(M.Decoder, "forward", lambda *a, **k: pytest.fail("no training/eval expected"))
    s2 = T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=data)
    assert runs.read_metrics(tmp_path) == before
    for k in ("best_val_loss", "best_step", "final_val_loss", "steps", "tokens"):
        assert s2[k] == s1[k]


def test_different_config_in_run_dir_is_an_error(tmp_path, data):
    T.train_run(tiny_preset(train={"max_steps": 4}), "dense", 1, run_dir=tmp_path, progress=False, data=data)
    with pytest.raises(runs.RunDirConflict, match="different configuration"):
        T.train_run(tiny_preset(train={"max_steps": 4, "lr": 1e-2}), "dense", 1, run_dir=tmp_path,
                    progress=False, data=data)
    with pytest.raises(runs.RunDirConflict):  # another seed in the same folder
        T.train_run(tiny_preset(train={"max_steps": 4}), "dense", 2, run_dir=tmp_path, progress=False, data=data)
    # execution-only settings (threads, device spelling) do not count as a different run
    s = T.train_run(tiny_preset(train={"max_steps": 4, "keep_checkpoints": True}), "dense", 1,
                    run_dir=tmp_path, progress=False, data=data)
    assert s["finished"]


def test_overrides_argument(tmp_path, data):
    s = T.train_run(tiny_preset(), "dense", 1, run_dir=tmp_path / "a", progress=False, data=data,
                    overrides=["train.max_steps=3", "train.eval_every=3"])
    assert s["steps"] == 3
    s = T.train_run(tiny_preset(), "moe", 1, run_dir=tmp_path / "b", progress=False, data=data,
                    overrides={"train.max_steps": 2, "models.moe.ffn.top_k": 1})
    cfg = yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())
    assert s["steps"] == 2 and cfg["model"]["ffn"]["top_k"] == 1


def test_default_run_dir_under_outputs_env(tmp_path, data, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    preset = tiny_preset(train={"max_steps": 2, "eval_every": 2})
    T.train_run(preset, "dense", 2, progress=False, data=data)
    rd = tmp_path / "out" / "tiny" / "runs" / "dense" / "seed2"
    assert runs.run_dir_for(preset, "dense", 2) == rd and runs.is_finished(rd)


def test_keep_checkpoints_writes_snapshots(tmp_path, data):
    T.train_run(tiny_preset(train={"keep_checkpoints": True}), "dense", 1, run_dir=tmp_path,
                progress=False, data=data)
    snaps = C.list_snapshots(tmp_path / "checkpoints")
    assert [s for s, _ in snaps] == [4, 8, 12]
    assert "optimizer" not in C.load(snaps[0][1], kind="snapshot")


def test_checkpoint_every(tmp_path, data):
    T.train_run(tiny_preset(train={"checkpoint_every": 5, "keep_checkpoints": True}), "dense", 1,
                run_dir=tmp_path, progress=False, data=data)
    assert [s for s, _ in C.list_snapshots(tmp_path / "checkpoints")] == [5, 10, 12]


# --------------------------------------------------------------------------------------------
# numerics: grad accumulation, resume, non-finite loss
# --------------------------------------------------------------------------------------------
def test_grad_accumulation_2x8_equals_1x16(tmp_path, data):
    model = {"dropout": 0.0}
    a = T.train_run(tiny_preset(model={**TINY_RAW["model"], **model}, train={"batch_size": 8, "grad_accum": 2}),
                    "dense", 1, run_dir=tmp_path / "a", progress=False, data=data)
    b = T.train_run(tiny_preset(model={**TINY_RAW["model"], **model}, train={"batch_size": 16, "grad_accum": 1}),
                    "dense", 1, run_dir=tmp_path / "b", progress=False, data=data)
    ra, rb = runs.read_metrics(tmp_path / "a"), runs.read_metrics(tmp_path / "b")
    la = [r["train_loss"] for r in ra if r["kind"] == "train"]
    lb = [r["train_loss"] for r in rb if r["kind"] == "train"]
    assert len(la) == 12 and np.allclose(la, lb, rtol=0, atol=1e-5)
    assert a["final_val_loss"] == pytest.approx(b["final_val_loss"], abs=1e-5)
    wa = C.load(tmp_path / "a" / "checkpoints" / "latest.pt")["model"]
    wb = C.load(tmp_path / "b" / "checkpoints" / "latest.pt")["model"]
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=1e-4)


class _Boom(Exception):
    pass


def _patch_forward(monkeypatch, after_calls: int, action: str):
    """Make the ``after_calls``-th training forward raise (crash) or return a NaN loss."""
    import studylib.nn.model as M

    forward = M.Decoder.forward
    calls = {"n": 0}

    def patched(self, *a, **kw):
        out = forward(self, *a, **kw)
        if self.training:
            calls["n"] += 1
            if calls["n"] >= after_calls:
                if action == "crash":
                    raise _Boom("simulated crash")
                out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(M.Decoder, "forward", patched)


def test_resume_in_process_equals_uninterrupted(tmp_path, data, monkeypatch):
    raw = dict(train={"max_steps": 10, "eval_every": 3})
    preset = tiny_preset(**raw)
    T.train_run(preset, "moe", 1, run_dir=tmp_path / "ref", progress=False, data=data)
    with monkeypatch.context() as mp:
        _patch_forward(mp, after_calls=2 * 7 + 1, action="crash")  # dies in step 8 (ckpt at 6)
        with pytest.raises(_Boom):
            T.train_run(preset, "moe", 1, run_dir=tmp_path / "res", progress=False, data=data)
    assert C.load(tmp_path / "res" / "checkpoints" / "latest.pt")["step"] == 6
    assert max(r["step"] for r in runs.read_metrics(tmp_path / "res")) == 7
    T.train_run(preset, "moe", 1, run_dir=tmp_path / "res", progress=False, data=data)
    assert comparable(runs.read_metrics(tmp_path / "res")) == comparable(runs.read_metrics(tmp_path / "ref"))
    wa = C.load(tmp_path / "ref" / "checkpoints" / "latest.pt")["model"]
    wb = C.load(tmp_path / "res" / "checkpoints" / "latest.pt")["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, data, monkeypatch):
    preset = tiny_preset(train={"eval_every": 2})
    with monkeypatch.context() as mp:
        _patch_forward(mp, after_calls=2 * 5 + 1, action="nan")  # step 6 (1-based) goes NaN
        with pytest.raises(T.NonFiniteLossError, match=r"step 6\b.*step 4"):
            T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=data)
    ck = tmp_path / "checkpoints"
    assert C.load(ck / "latest.pt")["step"] == 4 and C.load(ck / "prev.pt")["step"] == 2
    assert not (tmp_path / "summary.json").exists()
    # the run can then be resumed (e.g. after fixing the cause) and finishes
    s = T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=data)
    assert s["finished"] and s["steps"] == 12


def test_huge_lr_reports_non_finite(tmp_path, data):
    preset = tiny_preset(train={"lr": 1e30, "min_lr": 1e29, "grad_clip": 0.0, "warmup_frac": 0.0,
                                "max_steps": 30, "eval_every": 30})
    with pytest.raises(T.NonFiniteLossError, match="non-finite"):
        T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=data)


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
    killed_at = max(r["step"] for r in runs.read_metrics(run))
    ck_step = C.load(latest)["step"]
    assert 0 < ck_step < 40 and killed_at < 40
    r = _run_script(run, KILL_RAW, model="moe")
    assert r.returncode == 0, r.stderr
    assert f"resuming from step {ck_step}" in r.stderr
    got, want = runs.read_metrics(run), runs.read_metrics(reference_run)
    assert comparable(got) == comparable(want)  # every train and eval loss, router stat, lr: exact
    s1, s2 = runs.load_summary(run), runs.load_summary(reference_run)
    assert s1["best_val_loss"] == s2["best_val_loss"] and s1["final_val_loss"] == s2["final_val_loss"]
    wa, wb = C.load(latest)["model"], C.load(reference_run / "checkpoints" / "latest.pt")["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_kill_during_checkpoint_write_resumes_from_last_good(tmp_path, reference_run):
    run = tmp_path / "run"
    r = _run_script(run, KILL_RAW, model="moe", env=_env(**{C.CRASH_ENV: "3"}))  # dies writing step 12
    assert r.returncode == 86, r.stderr
    ck = run / "checkpoints"
    assert len(list(ck.glob(".tmp-*"))) == 1  # the torn temporary file
    assert C.load(ck / "latest.pt")["step"] == 8  # the last good checkpoint is intact
    r = _run_script(run, KILL_RAW, model="moe")
    assert r.returncode == 0, r.stderr
    assert "resuming from step 8" in r.stderr and not list(ck.glob(".tmp-*"))
    assert comparable(runs.read_metrics(run)) == comparable(runs.read_metrics(reference_run))


@pytest.mark.slow
def test_truncated_latest_falls_back_to_prev(tmp_path, reference_run):
    run = tmp_path / "run"
    r = _run_script(run, KILL_RAW, model="moe", env=_env(**{C.CRASH_ENV: "5"}))  # dies writing step 20
    assert r.returncode == 86
    latest = run / "checkpoints" / "latest.pt"
    latest.write_bytes(latest.read_bytes()[:4096])  # and the disk lost the end of latest.pt too
    r = _run_script(run, KILL_RAW, model="moe")
    assert r.returncode == 0, r.stderr
    assert "skipping damaged checkpoint" in r.stderr and "resuming from step 12" in r.stderr
    assert comparable(runs.read_metrics(run)) == comparable(runs.read_metrics(reference_run))


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
    a, b = runs.read_metrics(tmp_path / "single"), runs.read_metrics(tmp_path / "ddp")
    assert [x["step"] for x in a] == [x["step"] for x in b] and len(a) == 8 + 2
    for x, y in zip(a, b):
        for k in ("train_loss", "val_loss"):
            if k in x:
                assert y[k] == pytest.approx(x[k], abs=2e-5), (x, y)
    sd, ss = runs.load_summary(tmp_path / "ddp"), runs.load_summary(tmp_path / "single")
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
    s = runs.load_summary(rd)
    assert s["finished"] and s["steps"] == 5 and s["data"]["vocab_size"] == 512
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "skipping" in r.stderr
    bad = subprocess.run(cmd[:-1] + ["--set", "train.lr=1.0"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "different configuration" in bad.stderr


# --------------------------------------------------------------------------------------------
# runs: frames across seeds
# --------------------------------------------------------------------------------------------
def test_collect_aggregate_and_paired_gaps(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path))
    preset = tiny_preset(seeds=[1, 2, 3])
    losses = {"dense": [2.0, 2.1, 2.3], "moe": [1.9, 2.05, 2.1]}
    for m, vals in losses.items():
        for seed, v in zip([1, 2, 3], vals):
            d = runs.run_dir_for(preset, m, seed)
            d.mkdir(parents=True)
            runs.write_json_atomic(d / "summary.json", {"best_val_loss": v, "finished": True,
                                                        "params": {"total": 10}, "seed": seed})
            (d / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "step": 1, "val_loss": v}) + "\n")
    df = runs.collect_runs(preset, ["dense", "moe"])
    assert len(df) == 6 and "params_total" in df and df.attrs["missing"] == []
    agg = runs.aggregate(df)
    assert agg.loc["dense", "best_val_loss_mean"] == pytest.approx(np.mean(losses["dense"]))
    assert agg.loc["moe", "best_val_loss_std"] == pytest.approx(np.std(losses["moe"], ddof=1))
    assert agg.loc["moe", "ppl_mean"] == pytest.approx(np.mean(np.exp(losses["moe"])))
    gap = runs.paired_gaps(df, "dense", "moe")
    diffs = np.subtract(losses["dense"], losses["moe"])
    assert gap["n"] == 3 and gap["mean"] == pytest.approx(diffs.mean())
    assert gap["std"] == pytest.approx(diffs.std(ddof=1))
    assert list(gap["per_seed"].index) == [1, 2, 3]
    curves = runs.collect_metrics(preset, ["dense", "moe"])
    assert len(curves) == 6 and set(curves.columns) >= {"model", "seed", "val_loss"}
    part = runs.collect_runs(preset, ["dense"], seeds=[1, 4])
    assert len(part) == 1 and part.attrs["missing"] == [("dense", 4)]
