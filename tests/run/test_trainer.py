"""Tests of studylib.run.trainer in this process (and of the optimizer it builds): schedule, optimizer
groups, the run directory a run writes, skip / resume / conflicts, non-finite stop, grad
accumulation. Real processes (kill -9, crash mid-checkpoint, DDP, CLI): test_trainer_processes.py."""
from __future__ import annotations

import json
import math
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from _tiny import TINY_RAW, comparable, synthetic_data, tiny_preset
from studylib.config import ConfigError, override
from studylib.run import checkpoint as C
from studylib.run import optim as O
from studylib.run import trainer as T
from studylib.run.layout import run_dir_for
from studylib.run.metrics_file import MetricsDamaged, MetricsGap
from studylib.run.rundir import RunDir, RunDirConflict

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny shapes: threads only contend


@pytest.fixture(scope="module")
def data():
    return synthetic_data()


# --------------------------------------------------------------------------------------------
# a run and its directory
# --------------------------------------------------------------------------------------------
def test_run_directory_contents_moe_bf16(tmp_path, data):
    preset = tiny_preset(train={"amp": "bf16"})
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
    assert cfg["preset"]["train"]["amp"] == "bf16"
    recs = RunDir(r).read_metrics()
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
    assert trains[0]["lr"] == pytest.approx(O.lr_at(0, 12, preset.train))
    ck = C.load(r / "checkpoints" / "latest.pt")
    assert ck["step"] == 12 and ck["final"]["val_loss"] == s["final_val_loss"]
    assert ck["data_position"]["windows"] == 12 * 16
    assert [e["step"] for e in RunDir(r).read_metrics(kind="eval")] == [4, 8, 12]


def test_dense_router_entries_are_none(tmp_path, data):
    T.train_run(tiny_preset(train={"max_steps": 4}), "dense", 1, run_dir=tmp_path, progress=False,
                data=data)
    ev = RunDir(tmp_path).read_metrics(kind="eval")
    assert ev[-1]["router"] == [None, None]


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
    before = RunDir(tmp_path).read_metrics()
    import studylib.nn.model as M

    monkeypatch.setattr(M.Decoder, "forward", lambda *a, **k: pytest.fail("no training/eval expected"))
    s2 = T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=data)
    assert RunDir(tmp_path).read_metrics() == before
    for k in ("best_val_loss", "best_step", "final_val_loss", "steps", "tokens"):
        assert s2[k] == s1[k]


def test_different_config_in_run_dir_is_an_error(tmp_path, data):
    T.train_run(tiny_preset(train={"max_steps": 4}), "dense", 1, run_dir=tmp_path, progress=False, data=data)
    with pytest.raises(RunDirConflict, match=r"different configuration \(train\.lr: 0\.003 -> 0\.01; "
                                              r"stored -> this run\)"):
        T.train_run(tiny_preset(train={"max_steps": 4, "lr": 1e-2}), "dense", 1, run_dir=tmp_path,
                    progress=False, data=data)
    with pytest.raises(RunDirConflict):  # another seed in the same folder
        T.train_run(tiny_preset(train={"max_steps": 4}), "dense", 2, run_dir=tmp_path, progress=False, data=data)
    # execution-only settings (threads, device spelling) do not count as a different run
    s = T.train_run(tiny_preset(train={"max_steps": 4, "keep_checkpoints": True}), "dense", 1,
                    run_dir=tmp_path, progress=False, data=data)
    assert s["finished"]


def test_a_run_spec_trains_its_own_varied_preset_in_the_variant_dir(tmp_path, data):
    from studylib.run.spec import RunSpec

    spec = RunSpec.resolve(tiny_preset(), "moe", 1, {"train.max_steps": 2, "models.moe.ffn.top_k": 1}, root=tmp_path)
    assert spec.run_dir == tmp_path / "tiny" / "runs" / "moe" / "models.moe.ffn.top_k=1,train.max_steps=2" / "seed1"
    s = T.train_spec(spec, progress=False, data=data)
    cfg = yaml.safe_load((spec.run_dir / "config.yaml").read_text())
    assert s["steps"] == 2 and cfg["model"]["ffn"]["top_k"] == 1
    same = RunSpec.resolve(tiny_preset(), "moe", 1, {"train.checkpoint_every": 1}, root=tmp_path)
    assert same.run_dir == tmp_path / "tiny" / "runs" / "moe" / "seed1"  # identity unchanged: the base run's dir


def test_default_run_dir_under_outputs_env(tmp_path, data, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    preset = tiny_preset(train={"max_steps": 2, "eval_every": 2})
    T.train_run(preset, "dense", 2, progress=False, data=data)
    rd = tmp_path / "out" / "tiny" / "runs" / "dense" / "seed2"
    assert run_dir_for(preset, "dense", 2) == rd and RunDir(rd).finished()


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
    assert_same_training(tmp_path / "a", tmp_path / "b", steps=12)
    assert a["final_val_loss"] == pytest.approx(b["final_val_loss"], abs=1e-5)


def assert_same_training(a, b, steps: int, weights_atol: float = 1e-5) -> None:
    """Runs ``a`` and ``b`` trained the same model to fp32 tolerance: every logged training loss
    (1e-5) and the final weights (``weights_atol``)."""
    la = [r["train_loss"] for r in RunDir(a).read_metrics() if r["kind"] == "train"]
    lb = [r["train_loss"] for r in RunDir(b).read_metrics() if r["kind"] == "train"]
    assert len(la) == steps and np.allclose(la, lb, rtol=0, atol=1e-5)
    wa = C.load(Path(a) / "checkpoints" / "latest.pt")["model"]
    wb = C.load(Path(b) / "checkpoints" / "latest.pt")["model"]
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=weights_atol, rtol=1e-4)


def test_data_seed_moves_the_data_order_and_leaves_the_initialisation(tmp_path, data):
    """train.data_seed: None is the run's seed (the same run, bit for bit); another value keeps the
    initialisation (seed) and changes only which windows each step reads."""
    preset = tiny_preset(train={"max_steps": 3, "eval_every": 3, "keep_checkpoints": True})
    runs = {}
    for name, ds in (("plain", None), ("same", 1), ("other", 2)):
        ov = {} if ds is None else {"train.data_seed": ds}
        T.train_run(override(preset, ov), "dense", 1, run_dir=tmp_path / name, progress=False, data=data)
        runs[name] = C.load(tmp_path / name / "checkpoints" / "latest.pt")
    for k, w in runs["plain"]["model"].items():
        assert torch.equal(w, runs["same"]["model"][k])
    assert runs["other"]["data_position"]["seed"] == 2 and runs["plain"]["data_position"]["seed"] == 1
    assert any(not torch.equal(w, runs["other"]["model"][k]) for k, w in runs["plain"]["model"].items())
    # the initialisation is the seed's: a zero-step view of it is the same model in both runs
    zero = {"train.max_steps": 1, "train.lr": 1e-9, "train.min_lr": 1e-9}
    T.train_run(override(preset, zero), "dense", 1, run_dir=tmp_path / "init_a", progress=False, data=data)
    T.train_run(override(preset, {**zero, "train.data_seed": 2}), "dense", 1, run_dir=tmp_path / "init_b",
                progress=False, data=data)
    a = C.load(tmp_path / "init_a" / "checkpoints" / "latest.pt")["model"]
    b = C.load(tmp_path / "init_b" / "checkpoints" / "latest.pt")["model"]
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6


def test_data_seed_is_validated():
    with pytest.raises(ConfigError, match="train.data_seed"):
        tiny_preset(train={"data_seed": -1})


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


@pytest.mark.parametrize("damage_latest", [False, True])
def test_resume_in_process_equals_uninterrupted(tmp_path, data, monkeypatch, capsys, damage_latest):
    """Crash in step 8 (checkpoints at 3 and 6), resume: the same records, weights, optimizer state
    and summary as the uninterrupted run; from prev.pt (step 3) if latest.pt got damaged."""
    preset = tiny_preset(train={"max_steps": 10, "eval_every": 3})
    ref = RunDir(tmp_path / "ref")
    T.train_run(preset, "moe", 1, run_dir=ref.path, progress=False, data=data)
    res = RunDir(tmp_path / "res")
    with monkeypatch.context() as mp:
        _patch_forward(mp, after_calls=2 * 7 + 1, action="crash")  # dies in step 8 (ckpt at 6)
        with pytest.raises(_Boom):
            T.train_run(preset, "moe", 1, run_dir=res.path, progress=False, data=data)
    latest, prev = res.checkpoints / C.LATEST, res.checkpoints / C.PREV
    assert C.load(latest)["step"] == 6 and C.load(prev)["step"] == 3
    assert max(r["step"] for r in res.read_metrics()) == 7
    if damage_latest:
        latest.write_bytes(latest.read_bytes()[:4096])
    capsys.readouterr()
    T.train_run(preset, "moe", 1, run_dir=res.path, progress=False, data=data)
    err = capsys.readouterr().err
    step, loaded = (3, prev) if damage_latest else (6, latest)
    assert f"resuming from step {step} of 10 (checkpoint {loaded})" in err  # names the file it read
    assert ("skipping damaged checkpoint" in err) == damage_latest
    assert comparable(res.read_metrics()) == comparable(ref.read_metrics())
    timing = ("wall_time_s", "train_time_s", "train_tok_per_s")
    assert {k: v for k, v in res.summary().items() if k not in timing} == \
        {k: v for k, v in ref.summary().items() if k not in timing}
    ca, cb = C.load(ref.checkpoints / C.LATEST), C.load(latest)
    assert all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])
    sa, sb = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


def test_a_resume_that_would_change_precision_is_refused(tmp_path, data, monkeypatch):
    """`amp: auto` resolves per machine: a run checkpointed in fp32 must not go on in bf16 (and the
    other way round) because the machine that resumes it has (no) native bf16."""
    preset = tiny_preset(train={"max_steps": 10, "eval_every": 3, "amp": "auto"})
    monkeypatch.setattr(T, "resolve_amp", lambda cfg, device: None)  # this "machine": fp32
    res = RunDir(tmp_path / "res")
    with monkeypatch.context() as mp:
        _patch_forward(mp, after_calls=2 * 7 + 1, action="crash")  # dies in step 8 (ckpt at 6)
        with pytest.raises(_Boom):
            T.train_run(preset, "moe", 1, run_dir=res.path, progress=False, data=data)
    assert C.load(res.checkpoints / C.LATEST)["amp"] == "fp32"
    monkeypatch.setattr(T, "resolve_amp", lambda cfg, device: torch.bfloat16)  # another machine
    with pytest.raises(ConfigError, match=r"trained in fp32, but here train.amp=auto gives bfloat16"):
        T.train_run(preset, "moe", 1, run_dir=res.path, progress=False, data=data)
    assert C.load(res.checkpoints / C.LATEST)["step"] == 6  # nothing written


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
    with pytest.raises(T.NonFiniteLossError, match="non-finite.*No checkpoint was written yet.*removed"):
        T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=data)
    # issue #24: it said "untouched" but left config.yaml and metrics.jsonl, and the corrected rerun
    # into the same directory was refused as "a different configuration"
    assert not (tmp_path / "config.yaml").exists() and not (tmp_path / "metrics.jsonl").exists()
    fixed = tiny_preset(train={"max_steps": 3, "eval_every": 3})
    assert T.train_run(fixed, "dense", 1, run_dir=tmp_path, progress=False, data=data)["finished"]


def test_the_summary_records_the_torch_thread_count_the_run_trained_with(tmp_path, data):
    """issue #24: --jobs 1 (in-process, every core) and --jobs 2 (one thread per worker) differ by
    ~1e-7 in fp32; the summary says which thread count a run had."""
    s = T.train_run(tiny_preset(train={"max_steps": 2, "eval_every": 2, "num_threads": 1}), "dense", 1,
                    run_dir=tmp_path / "one", progress=False, data=data)
    assert s["torch_threads"] == 1


# --------------------------------------------------------------------------------------------
# nothing lost, nothing silently wrong: metrics vs checkpoint, impossible batches, bad summaries
# --------------------------------------------------------------------------------------------
def _crashed_at_step_8(tmp_path, data, monkeypatch, preset, name="res") -> RunDir:
    """The run of ``preset`` (checkpoints every 3 steps) killed in step 8: latest.pt holds step 6."""
    res = RunDir(tmp_path / name)
    with monkeypatch.context() as mp:
        _patch_forward(mp, after_calls=2 * 7 + 1, action="crash")
        with pytest.raises(_Boom):
            T.train_run(preset, "moe", 1, run_dir=res.path, progress=False, data=data)
    assert C.load(res.checkpoints / C.LATEST)["step"] == 6
    return res


@pytest.mark.parametrize("damage", ["truncate", "delete_lines", "delete_file"])
def test_lost_metrics_are_restored_from_the_checkpoint(tmp_path, data, monkeypatch, capsys, damage):
    preset = tiny_preset(train={"max_steps": 10, "eval_every": 3})
    ref = RunDir(tmp_path / "ref")
    T.train_run(preset, "moe", 1, run_dir=ref.path, progress=False, data=data)
    res = _crashed_at_step_8(tmp_path, data, monkeypatch, preset)
    lines = res.metrics_path.read_text().splitlines(keepends=True)
    if damage == "truncate":  # the file lost its tail: the records of steps 5-7 are gone
        res.metrics_path.write_text("".join(lines[:5]))
    elif damage == "delete_lines":  # records from the middle (train 2, eval 3) are gone
        res.metrics_path.write_text("".join(lines[:1] + lines[4:]))
    else:
        res.metrics_path.unlink()
    capsys.readouterr()
    T.train_run(preset, "moe", 1, run_dir=res.path, progress=False, data=data)
    assert "restored its 8 records up to step 6 from the checkpoint" in capsys.readouterr().err
    assert comparable(res.read_metrics()) == comparable(ref.read_metrics())


def test_a_torn_last_line_resumes_and_a_damaged_record_is_restored(tmp_path, data, monkeypatch, capsys):
    """What a kill mid-write leaves (a torn last line) is read with a warning and dropped on resume;
    a record damaged in place (a NaN loss) is refused when read, and restored from the checkpoint."""
    preset = tiny_preset(train={"max_steps": 10, "eval_every": 3})
    ref = RunDir(tmp_path / "ref")
    T.train_run(preset, "moe", 1, run_dir=ref.path, progress=False, data=data)
    res = _crashed_at_step_8(tmp_path, data, monkeypatch, preset)
    lines = res.metrics_path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if '"kind": "eval"' in line)
    lines[at] = re.sub(r'"val_loss": [^,]+', '"val_loss": NaN', lines[at])
    res.metrics_path.write_text("".join(lines) + '{"kind": "train", "step": 8, "tok')  # killed mid-line
    with pytest.raises(MetricsDamaged, match=rf"{res.metrics_path}: line {at + 1}: val_loss is nan; expected a "
                                             "finite number"):
        res.read_metrics()
    capsys.readouterr()
    T.train_run(preset, "moe", 1, run_dir=res.path, progress=False, data=data)
    assert "restored its 8 records up to step 6 from the checkpoint" in capsys.readouterr().err
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torn line left, nothing damaged
        assert comparable(res.read_metrics()) == comparable(ref.read_metrics())


def test_lost_metrics_without_a_copy_in_the_checkpoint_are_an_error(tmp_path, data, monkeypatch):
    preset = tiny_preset(train={"max_steps": 10, "eval_every": 3})
    res = _crashed_at_step_8(tmp_path, data, monkeypatch, preset)
    latest = res.checkpoints / C.LATEST
    state = C.load(latest)
    del state["metrics"]  # as written before checkpoints carried the records
    C.save(latest, state)
    lines = res.metrics_path.read_text().splitlines(keepends=True)
    res.metrics_path.write_text("".join(lines[:3]))  # train 1-3 kept; eval 3 and train 4 on lost
    with pytest.raises(MetricsGap, match=r"lacks the train records of steps \[4, 5, 6\]; eval records of "
                                         r"steps \[3, 6\], written before the checkpoint at step 6"):
        T.train_run(preset, "moe", 1, run_dir=res.path, progress=False, data=data)
    res.metrics_path.write_text("".join(lines))  # complete: the run resumes, and its next checkpoints
    T.train_run(preset, "moe", 1, run_dir=res.path, progress=False, data=data)  # carry every record
    assert C.load(latest)["metrics"] == res.metrics_path.read_text() and len(res.read_metrics()) == 10 + 4


def test_summary_without_its_numbers_is_not_a_finished_run(tmp_path, data, capsys):
    preset = tiny_preset(train={"max_steps": 4})
    s1 = T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=data)
    (tmp_path / "summary.json").write_text('{"finished": true}')
    capsys.readouterr()
    s2 = T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=data)
    err = capsys.readouterr().err
    assert "marked finished but lacks best_val_loss, best_val_ppl" in err and "resuming from step 4" in err
    assert s2["best_val_loss"] == s1["best_val_loss"] and RunDir(tmp_path).summary() == s2


def test_impossible_batch_is_refused_before_the_model_exists(tmp_path, data, monkeypatch):
    import studylib.nn.model as M

    monkeypatch.setattr(M.Decoder, "__init__", lambda *a, **k: pytest.fail("model built"))
    preset = tiny_preset(train={"batch_size": 100000})
    with pytest.raises(ConfigError, match=r"train.batch_size=100000 x train.grad_accum=2 = 200,000 windows "
                                          r"per step, but the training split has only 376 windows"):
        T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=data)
    preset = tiny_preset(train={"batch_size": 188})  # fits the data (188 x 2 = 376) but not 1 MiB
    monkeypatch.setattr("studylib.run.resources.free_bytes", lambda device: 2**20)
    with pytest.raises(ConfigError, match=r"train.batch_size=188: one micro-batch of model dense .* needs at "
                                          r"least .* GiB but cpu has 0.0 GiB free"):
        T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=data)
    assert not (tmp_path / "metrics.jsonl").exists()
    with pytest.raises(ConfigError, match="windows per step"):  # an up-front error leaves no folder
        T.train_run(tiny_preset(train={"batch_size": 1000}), "dense", 1, run_dir=tmp_path / "new" / "r",
                    progress=False, data=data)
    assert (tmp_path / "new").is_dir() and not (tmp_path / "new" / "r").exists()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="torch.compile's CPU backend needs a C compiler")
@pytest.mark.parametrize("model", ["dense", "moe"])
def test_compiled_training_matches_eager(tmp_path, data, model):
    """train.compile: the compiled step (inductor, CPU) trains the same model as the eager one to
    fp32 tolerance: losses, best val loss and weights after 4 steps."""
    preset = tiny_preset(train={"max_steps": 4, "eval_every": 2}, model={**TINY_RAW["model"], "dropout": 0.0})
    eager = T.train_run(preset, model, 1, run_dir=tmp_path / "eager", progress=False, data=data)
    compiled = T.train_run(override(preset, {"train.compile": True}), model, 1, run_dir=tmp_path / "compiled",
                           progress=False, data=data)
    # Adam scales each gradient by its own size, so a weight whose gradients are near 0 (a rare
    # token's embedding) takes steps set by their last bits: compile's reordered sums moved one
    # such element by 2.4e-5 in 4 steps (seed 1; every other element within 1e-5)
    assert_same_training(tmp_path / "eager", tmp_path / "compiled", steps=4, weights_atol=5e-5)
    assert compiled["best_val_loss"] == pytest.approx(eager["best_val_loss"], abs=1e-5)
