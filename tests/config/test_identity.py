"""Run identity (studylib.config.identity): what makes two runs the same run, by rule."""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import yaml

from studylib.config import config_hash, identity_diff, load_preset, preset_from_dict, run_document, same_run
from studylib.config.identity import DATA_SPLIT, INIT, run_identity, stored_identity

ROOT = Path(__file__).resolve().parents[2]
# config.yaml of a ci run written by studylib 0.1.0 before the re-layering (hash scheme v1), and
# before the split by story (its validation windows shared stories with training windows): it must
# now be another run (its directory is refused), and the split must be the only difference
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
                       ("data.cache_dir", "/elsewhere"), ("data.tokenizer_threads", 1),
                       ("models.moe_top1.lm_head_chunk", 256)):
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


def test_a_run_trained_on_the_window_split_is_another_run():
    """The real pre-move config.yaml (no ``run.data_split``: window split) is not today's run; marked
    with today's split it is (so the split is the only difference, and the other rules still keep
    documents of older versions valid), and a real change is still caught."""
    stored = yaml.safe_load(V1_RUN.read_text())
    preset = preset_from_dict(stored["preset"])
    model, seed = stored["run"]["model"], stored["run"]["seed"]
    today = run_document(preset, preset.model_config(model), model, seed)
    assert "data_split" not in stored["run"] and today["run"]["data_split"] == DATA_SPLIT == "story/v1"
    assert not same_run(stored, today)
    assert stored_identity(stored)["split"] is None and stored_identity(today)["split"] == "story/v1"
    assert today["run"]["config_hash"] != stored["run"]["config_hash"]
    marked = copy.deepcopy(stored)
    marked["run"]["data_split"] = DATA_SPLIT
    marked["run"]["init"] = INIT
    assert same_run(marked, today)
    assert config_hash(stored_identity(today)) == today["run"]["config_hash"] == \
        config_hash(run_identity(preset, preset.model_config(model), model, seed))
    cfg = preset.model_config(model)
    changed = dataclasses.replace(cfg, ffn=dataclasses.replace(cfg.ffn, top_k=2))
    assert not same_run(marked, run_document(preset, changed, model, seed))


def test_another_split_version_is_another_run():
    new = _doc()
    other = copy.deepcopy(new)
    other["run"]["data_split"] = "story/v2"
    assert not same_run(other, new)
    del other["run"]["data_split"]
    assert not same_run(other, new)


def test_data_seed_of_the_runs_own_seed_is_the_same_run():
    """train.data_seed equal to the run's seed is the run's own data order (its default): the same
    run; another data seed is another run, and so is the same data seed under another run seed."""
    base = _doc(seed=3)
    assert same_run(_doc(seed=3, **{"train.data_seed": 3}), base)
    assert not same_run(_doc(seed=3, **{"train.data_seed": 4}), base)
    assert not same_run(_doc(seed=4, **{"train.data_seed": 3}), base)
    assert same_run(_doc(seed=4, **{"train.data_seed": 4}), _doc(seed=4))


def test_identity_diff_names_what_makes_two_runs_different():
    base = _doc(seed=3)
    assert identity_diff(base, _doc(seed=3, **{"train.num_threads": 1})) == []  # execution-only
    assert identity_diff(base, _doc(seed=3, **{"train.lr": 0.01})) == ["train.lr: 0.003 -> 0.01"]
    assert identity_diff(base, _doc(seed=4)) == ["seed: 3 -> 4"]
