"""RunDir: the one owner of a run directory (identity check, metrics, summary, loading a model)."""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from _tiny import tiny_tokenizer
import torch
import yaml

from studylib.config import FFNConfig, ModelConfig, load_preset, preset_from_dict, run_document, to_dict
from studylib.nn.model import Decoder
from studylib.run import checkpoint as C
from studylib.run.decode import generate
from studylib.run.dirlock import RunDirLocked
from studylib.run.metrics_file import MetricsDamaged, MetricsGap, TornLineWarning
from studylib.run.rundir import RunDir, RunDirConflict

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [5, 17, 3, 42, 8, 1, 77]


def _tiny(kind="moe", vocab_size=97, seed=0) -> Decoder:
    ffn = (FFNConfig(kind="moe", hidden=48, num_experts=4, top_k=2) if kind == "moe"
           else FFNConfig(kind="dense", hidden=96))
    torch.manual_seed(seed)
    return Decoder(ModelConfig(name="t", vocab_size=vocab_size, d_model=64, n_layers=2, n_heads=4,
                               n_kv_heads=2, context=48, dropout=0.0, ffn=ffn))


def _write_run(path: Path, m: Decoder, cache_dir: Path, vocab: int | None = None, steps=(3,)) -> RunDir:
    rd = RunDir(path)
    rd.write_config({"run": {"preset": "x", "model": "t", "seed": 1, "config_hash": "x"},
                     "model": to_dict(m.cfg),
                     "preset": {"data": {"cache_dir": str(cache_dir), "vocab_size": vocab}}})
    for step in steps:
        C.save(rd.checkpoints / C.LATEST, {"kind": "full", "step": step, "config_hash": "x",
                                           "model": m.state_dict()}, keep_prev=True)
    return rd


def test_check_keeps_the_stored_hash_and_refuses_another_run(tmp_path):
    p = load_preset(ROOT / "params" / "ci.yaml")
    doc = run_document(p, p.model_config("moe_top1"), "moe_top1", 1)
    rd = RunDir(tmp_path / "r")
    assert rd.check(doc) == doc["run"]["config_hash"]  # a new folder: this run's hash
    stored = json.loads(json.dumps(doc))
    stored["run"]["config_hash"] = "written-by-v1"  # a run written under an older hash scheme
    rd.write_config(stored)
    assert rd.check(doc) == "written-by-v1"  # same run: its checkpoints' hash is kept
    other = load_preset(ROOT / "params" / "ci.yaml", ["train.lr=0.01"])
    with pytest.raises(RunDirConflict, match="different configuration"):
        rd.check(run_document(other, other.model_config("moe_top1"), "moe_top1", 1))


def test_a_run_from_before_the_story_split_is_refused_and_says_why(tmp_path):
    stored = yaml.safe_load((ROOT / "tests/config/data/config_v1_moe_top1_switch.yaml").read_text())
    preset = preset_from_dict(stored["preset"])
    rd = RunDir(tmp_path / "r")
    rd.write_config(stored)
    with pytest.raises(RunDirConflict, match="another data split .*window split"):
        rd.check(run_document(preset, preset.model_config("moe_top1_switch"), "moe_top1_switch", 1337))


def test_a_run_drawn_before_the_keyed_init_is_refused_and_says_why(tmp_path):
    """A finished run of the same settings whose weights were drawn in construction order (no
    ``run.init``) is another run: refused with one line, never reused."""
    p = load_preset(ROOT / "params" / "ci.yaml")
    doc = run_document(p, p.model_config("moe_top1"), "moe_top1", 1)
    stored = json.loads(json.dumps(doc))
    del stored["run"]["init"]
    rd = RunDir(tmp_path / "r")
    rd.write_config(stored)
    with pytest.raises(RunDirConflict, match=r"initial weights were drawn another way \(in construction order, "
                                             r"before keyed draws; now keyed/v1\)") as e:
        rd.check(doc)
    assert "\n" not in str(e.value)


def test_metrics_skip_a_torn_line_and_truncate(tmp_path):
    rd = RunDir(tmp_path)
    for step in (1, 2, 3):
        rd.append_metrics({"kind": "train", "step": step, "train_loss": 5.0 - step})
    rd.append_metrics({"kind": "eval", "step": 3, "val_loss": 2.5})
    with open(rd.metrics_path, "a") as f:
        f.write('{"kind": "train", "st')  # a crash mid-line
    with pytest.warns(TornLineWarning, match=rf"{rd.metrics_path}: line 5 is torn .*left out"):
        assert [r["step"] for r in rd.read_metrics()] == [1, 2, 3, 3]
    with pytest.warns(TornLineWarning):
        assert [r["val_loss"] for r in rd.read_metrics("eval")] == [2.5]


def _four_records(rd):
    for step in (1, 2, 3):
        rd.append_metrics({"kind": "train", "step": step, "train_loss": 5.0 - step})
    rd.append_metrics({"kind": "eval", "step": 3, "val_loss": 2.5, "val_ppl": 12.2})


@pytest.mark.parametrize("damage, match", [
    (lambda ls: ls[:2] + ["this is not json {"] + ls[2:], r"line 3 is not JSON \(Expecting value: 'this is not json \{'\)"),
    (lambda ls: ls[:3] + [ls[3].replace("2.5", "NaN")], r"line 4: val_loss is nan; expected a finite number"),
    (lambda ls: [ls[0].replace("4.0", "Infinity")] + ls[1:], r"line 1: train_loss is inf; expected a finite number"),
    (lambda ls: ls[:1] + ['"a string"'] + ls[1:], r"line 2: expected a JSON object \(a record\), got '\"a string\"'"),
    (lambda ls: ls[:1] + ["[1, 2]"] + ls[1:], r"line 2: expected a JSON object"),
    (lambda ls: ls[:3] + [ls[3].replace("2.5", '"2.5"')], r"line 4: val_loss is '2.5'; expected a finite number"),
    (lambda ls: ls[:-1] + ["[1, 2]"], r"line 4: expected a JSON object"),  # last, but whole: not torn
])
def test_damaged_metrics_are_refused_naming_the_file_and_line(tmp_path, damage, match):
    rd = RunDir(tmp_path)
    _four_records(rd)
    rd.metrics_path.write_text("\n".join(damage(_lines(rd))) + "\n")
    with pytest.raises(MetricsDamaged, match=rf"^{rd.metrics_path}: {match}"):
        rd.read_metrics()
    with pytest.raises(MetricsDamaged):
        rd.read_metrics("train")  # whichever kind is asked for


def test_a_finished_run_with_damaged_metrics_is_refused_when_checked(tmp_path):
    p = load_preset(ROOT / "params" / "ci.yaml")
    doc = run_document(p, p.model_config("moe_top1"), "moe_top1", 1)
    rd = RunDir(tmp_path / "r")
    rd.write_config(doc)
    _four_records(rd)
    lines = _lines(rd)
    rd.metrics_path.write_text("\n".join(lines[:2] + ["this is not json {"] + lines[2:]) + "\n")
    assert rd.check(doc) == doc["run"]["config_hash"]  # unfinished: its resume restores the records
    rd.write_summary({"finished": True, "best_val_loss": 2.5, "config_hash": doc["run"]["config_hash"]})
    with pytest.raises(MetricsDamaged, match=rf"{rd.metrics_path}: line 3 is not JSON"):
        rd.check(doc)  # finished: reused as it is, so refused


@pytest.mark.parametrize("text", ["", "\n", "{}\n{}\n"])
def test_a_finished_run_whose_metrics_hold_no_record_is_refused_naming_the_file(tmp_path, text):
    """Emptied, or only ``{}`` lines: the curves lost that seed without a word (n 2 -> 1)."""
    p = load_preset(ROOT / "params" / "ci.yaml")
    doc = run_document(p, p.model_config("moe_top1"), "moe_top1", 1)
    rd = RunDir(tmp_path / "r")
    rd.write_config(doc)
    _four_records(rd)
    rd.write_summary({"finished": True, "best_val_loss": 2.5, "config_hash": doc["run"]["config_hash"]})
    assert len(rd.read_metrics("eval")) == 1
    rd.metrics_path.write_text(text)
    with pytest.raises(MetricsDamaged, match=rf"^{rd.metrics_path}: "):
        rd.read_metrics("eval")
    with pytest.raises(MetricsDamaged, match=rf"^{rd.metrics_path}: "):
        rd.check(doc)


def test_a_record_without_its_kind_and_step_is_damage(tmp_path):
    rd = RunDir(tmp_path)
    _four_records(rd)
    rd.metrics_path.write_text("\n".join(_lines(rd)[:2] + ["{}"] + _lines(rd)[2:]) + "\n")
    with pytest.raises(MetricsDamaged, match=r"line 3: expected a record with its kind and step, got '\{\}'"):
        rd.read_metrics()


def test_summary_and_finished(tmp_path):
    rd = RunDir(tmp_path)
    assert rd.summary() is None and not rd.finished()
    rd.summary_path.write_text("{not json")
    assert rd.summary() is None
    rd.write_summary({"finished": True, "best_val_loss": 1.25})
    assert rd.finished() and rd.summary()["best_val_loss"] == 1.25
    assert rd.summary_missing(("best_val_loss", "best_step")) == ["best_step"]
    for bad in ({"finished": True}, {"finished": True, "best_val_loss": "1.2"}, {"best_val_loss": 1.0}):
        rd.write_summary(bad)  # a summary without its numbers is not a finished run
        assert not rd.finished()


def test_lock_is_exclusive_and_names_the_holder(tmp_path):
    rd = RunDir(tmp_path / "r")
    with rd.lock():
        assert rd.lock_path.read_text().split()[0] == str(os.getpid())
        with pytest.raises(RunDirLocked, match=rf"in use by another training process \(pid {os.getpid()} "):
            with RunDir(tmp_path / "r").lock():  # another open file: flock refuses it as it would a process
                pass
    with rd.lock():  # released at the end of the block
        pass
    assert rd.lock_path.read_text() == ""


def _lines(rd):
    return rd.metrics_path.read_text().splitlines()


def test_resume_metrics_restores_lost_records_from_the_copy(tmp_path):
    rd = RunDir(tmp_path)
    written = "".join(rd.append_metrics({"kind": "train", "step": s, "train_loss": 1.0 / s}) for s in range(1, 7))
    rd.append_metrics({"kind": "train", "step": 7, "train_loss": 0.1})  # after the checkpoint at 6
    expected = {"train": [1, 2, 3, 4, 5, 6], "eval": []}
    assert rd.resume_metrics(6, written, expected) is None and _lines(rd) == written.splitlines()
    rd.metrics_path.write_text("\n".join(written.splitlines()[:2]) + "\n")  # steps 3-6 lost
    note = rd.resume_metrics(6, written, expected)
    assert "restored its 6 records up to step 6" in note and "held 2" in note
    assert _lines(rd) == written.splitlines()


def test_resume_metrics_without_a_copy_checks_every_expected_step(tmp_path):
    rd = RunDir(tmp_path)
    for s in (1, 2, 3, 4):
        rd.append_metrics({"kind": "train", "step": s})
    rd.append_metrics({"kind": "eval", "step": 4})
    rd.append_metrics({"kind": "train", "step": 5})
    assert rd.resume_metrics(4, None, {"train": [1, 2, 3, 4], "eval": [4]}) is None
    assert [r["step"] for r in rd.read_metrics()] == [1, 2, 3, 4, 4]
    with pytest.raises(MetricsGap, match=r"lacks the train records of steps \[6, 8\]; eval records of steps \[8\]"):
        rd.resume_metrics(8, None, {"train": [2, 4, 6, 8], "eval": [4, 8]})


def test_load_model_roundtrip_and_steps(tmp_path):
    m = _tiny("moe")
    rd = _write_run(tmp_path / "run", m, tmp_path / "nocache", steps=(2, 3))
    C.save(C.snapshot_path(rd.checkpoints, 1), {"kind": "snapshot", "step": 1, "config_hash": "x",
                                                "model": _tiny("moe", seed=1).state_dict()})
    assert rd.checkpoint_steps() == [1, 3] and rd.latest_step() == 3 and rd.has_checkpoint()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        loaded = rd.load_model()
        early = rd.load_model(step=1)
    assert loaded.tokenizer is None and loaded.config == m.cfg and not loaded.model.training
    assert loaded.step == 3 and loaded.checkpoint == rd.checkpoints / C.LATEST
    assert generate(loaded.model, PROMPT, 10, temperature=0) == generate(m, PROMPT, 10, temperature=0)
    assert early.step == 1 and not torch.equal(early.model.tok_emb.weight, m.tok_emb.weight)
    with pytest.raises(Exception, match="no checkpoint at step 2"):
        rd.load_model(step=2)  # prev.pt holds step 2, but a step is loaded from its snapshot or latest


def test_load_model_falls_back_to_prev_when_latest_is_damaged(tmp_path):
    m = _tiny("dense")
    rd = _write_run(tmp_path / "run", m, tmp_path / "nocache", steps=(2, 3))
    (rd.checkpoints / C.LATEST).write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="latest.pt"):
        loaded = rd.load_model()
    assert loaded.step == 2 and loaded.checkpoint == rd.checkpoints / C.PREV


def test_tokenizer_from_the_cache_and_cli(tmp_path, capsys):

    from studylib.cli import main

    cache = tmp_path / "cache"
    _, n = tiny_tokenizer(cache)
    rd = _write_run(tmp_path / "run", _tiny("dense", vocab_size=n), cache, vocab=n)
    assert rd.tokenizer_path() == cache / "tokenizer-abc.model"
    assert rd.load_model().tokenizer.get_piece_size() == n
    rc = main(["generate", "--run", str(rd.path), "--prompt", "Once upon", "--max-new-tokens", "5",
               "--temperature", "0", "--no-stop", "--routing"])
    assert rc == 0
    assert capsys.readouterr().out.startswith("Once upon")
    assert yaml.safe_load(rd.config_path.read_text())["model"]["vocab_size"] == n


def test_relative_tokenizer_paths_are_anchored_at_the_runs_repository(tmp_path, monkeypatch):
    """Runs record the default cache as ``outputs/cache``: it is found from any working directory
    (nbval runs a notebook in its own folder)."""
    repo = tmp_path / "repo"
    (repo / "params").mkdir(parents=True)
    _, n = tiny_tokenizer(repo / "outputs" / "cache")
    rd = _write_run(tmp_path / "run", _tiny("dense", vocab_size=n), Path("outputs/cache"), vocab=n)
    doc = rd.read_config()
    doc["run"]["preset_path"] = str(repo / "params" / "x.yaml")
    rd.write_config(doc)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert rd.tokenizer_path() == repo / "outputs" / "cache" / "tokenizer-abc.model"
    rd.write_summary({"finished": False, "data": {"tokenizer": "outputs/cache/tokenizer-abc.model"}})
    assert rd.tokenizer_path() == repo / "outputs" / "cache" / "tokenizer-abc.model"
