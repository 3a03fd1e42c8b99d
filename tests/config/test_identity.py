"""Run identity (studylib.config.identity): what makes two runs the same run, by rule."""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import yaml

from studylib.config import config_hash, load_preset, preset_from_dict, run_document, same_run

ROOT = Path(__file__).resolve().parents[2]
# config.yaml of a ci run written by studylib 0.1.0 before the re-layering (hash scheme v1): kept
# so that a change to the identity rules that would orphan existing run directories fails here
V1_RUN = Path(__file__).with_name("data") / "config_v1_moe_top1_switch.yaml"


def _doc(model="moe_top1", seed=1, **sets):
    p = load_preset(ROOT / "params" / "ci.yaml", [f"{k}={v}" for k, v in sets.items()])
    return run_document(p, p.model_config(model), model, seed)


def test_config_hash_stable_and_order_free():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def test_results_changing_settings_change_the_identity():
    base = _doc()
    for key, value in (("train.lr", 0.002), ("data.vocab_size", 320), ("models.moe_top1.ffn.top_k", 2),
                       ("models.moe_top1.ffn.renormalize", "false")):
        other = _doc(**{key: value})
        assert not same_run(base, other), key
        assert other["run"]["config_hash"] != base["run"]["config_hash"], key
    assert not same_run(base, _doc(seed=2)) and not same_run(base, _doc(model="moe_top1_bal"))


def test_execution_only_settings_leave_the_identity_alone():
    base = _doc()
    for key, value in (("models.moe_top1.ffn.dispatch", "naive"), ("models.moe_top1.ffn.grouped_mm", "\"off\""),
                       ("train.num_threads", 1), ("train.compile", "true"), ("train.keep_checkpoints", "false"),
                       ("data.cache_dir", "/elsewhere"), ("data.tokenizer_threads", 1)):
        other = _doc(**{key: value})
        assert same_run(base, other), key
        assert other["run"]["config_hash"] == base["run"]["config_hash"], key


def test_a_field_added_later_at_its_default_keeps_old_runs():
    """A stored document from before a field existed (no key at all) is the same run as today's
    document with that field at its default; away from the default it is another run."""
    new = _doc()
    old = copy.deepcopy(new)
    del old["model"]["ffn"]["renormalize"], old["model"]["rope_theta"], old["preset"]["train"]["final_full_eval"]
    assert same_run(old, new)
    switch = _doc(**{"models.moe_top1.ffn.renormalize": "false"})
    assert not same_run(old, switch)


def test_run_written_before_the_relayering_stays_valid():
    stored = yaml.safe_load(V1_RUN.read_text())
    preset = preset_from_dict(stored["preset"])
    model, seed = stored["run"]["model"], stored["run"]["seed"]
    today = run_document(preset, preset.model_config(model), model, seed)
    assert same_run(stored, today)
    # and a real change is still caught
    cfg = preset.model_config(model)
    changed = dataclasses.replace(cfg, ffn=dataclasses.replace(cfg.ffn, top_k=2))
    assert not same_run(stored, run_document(preset, changed, model, seed))
