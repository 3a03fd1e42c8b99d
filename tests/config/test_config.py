"""Config validation: every bad case names the field and what is allowed."""
import dataclasses
from pathlib import Path

import pytest
import yaml

from studylib.config import ConfigError, load_preset, preset_from_dict

ROOT = Path(__file__).resolve().parents[2]


def preset(**models):
    return preset_from_dict({
        "model": {"n_layers": 2, "context": 16},
        "data": {"vocab_size": 64, "context": 16},
        "models": models or {"m": {"d_model": 32, "n_heads": 2, "n_kv_heads": 1}},
    })


def bad(match, **model):
    with pytest.raises(ConfigError, match=match):
        preset(m=model).model_config("m")


def test_good_preset_resolves():
    cfg = preset().model_config("m")
    assert (cfg.d_model, cfg.vocab_size, cfg.context, cfg.name) == (32, 64, 16, "m")


def test_unknown_key_names_it_and_lists_allowed():
    bad(r"models\.m: unknown key\(s\) \['d_modle'\]; allowed: \[.*'d_model'", d_modle=32)
    bad(r"models\.m\.ffn: unknown key\(s\) \['experts'\]", d_model=32, n_heads=2, n_kv_heads=1,
        ffn={"experts": 4})
    with pytest.raises(ConfigError, match=r"train: unknown key\(s\) \['lr_max'\]"):
        preset_from_dict({"models": {"m": {}}, "train": {"lr_max": 1.0}})
    with pytest.raises(ConfigError, match=r"unknown top-level key\(s\) \['modles'\]"):
        preset_from_dict({"modles": {}})


def test_wrong_types():
    bad(r"models\.m\.d_model: must be an integer, got str 'wide'", d_model="wide")
    bad(r"models\.m\.dropout: must be a number", dropout=[0.1])
    with pytest.raises(ConfigError, match=r"train\.betas: must be a list of 2 items"):
        preset_from_dict({"models": {"m": {}}, "train": {"betas": [0.9]}})
    with pytest.raises(ConfigError, match=r"train\.compile: must be true or false"):
        preset_from_dict({"models": {"m": {}}, "train": {"compile": "yes"}})


def test_literal_fields_list_allowed_values():
    bad(r"models\.m\.ffn\.kind: must be one of \['dense', 'moe', 'soft'\], got 'sparse'",
        d_model=32, n_heads=2, n_kv_heads=1, ffn={"kind": "sparse"})
    bad(r"models\.m\.ffn\.dispatch: must be one of \['naive', 'grouped', 'stacked'\]",
        d_model=32, n_heads=2, n_kv_heads=1, ffn={"kind": "moe", "dispatch": "fast"})


def test_top_k_greater_than_experts():
    bad(r"models\.m\.ffn\.top_k: must be between 1 and num_experts=4, got 5",
        d_model=32, n_heads=2, n_kv_heads=1, ffn={"kind": "moe", "num_experts": 4, "top_k": 5})


def test_heads_must_divide_d_model():
    bad(r"models\.m\.n_heads: must divide d_model=32; allowed: \[1, 2, 4, 8, 16, 32\], got 3",
        d_model=32, n_heads=3, n_kv_heads=1)


def test_kv_heads_must_divide_q_heads():
    bad(r"models\.m\.n_kv_heads: must divide n_heads=4; allowed: \[1, 2, 4\], got 3",
        d_model=32, n_heads=4, n_kv_heads=3)


@pytest.mark.parametrize("h", [0, -8])
def test_hidden_must_be_positive(h):
    bad(rf"models\.m\.ffn\.hidden: must be a positive integer, got {h}",
        d_model=32, n_heads=2, n_kv_heads=1, ffn={"hidden": h})


def test_layer_pattern_indices_checked():
    bad(r"models\.m\.ffn\.layers: layer indices must be in 0\.\.1, got \[2\]",
        d_model=32, n_heads=2, n_kv_heads=1, ffn={"kind": "moe", "num_experts": 2, "layers": [0, 2]})


def test_unknown_model_and_derive_errors():
    p = preset(m={"d_model": 32, "n_heads": 2, "n_kv_heads": 1},
               d={"derive": "matched_width", "from": "m"}, e={"derive": "matched_total"})
    with pytest.raises(ConfigError, match=r"models: no model named 'x'; allowed: \['d', 'e', 'm'\]"):
        p.model_config("x")
    with pytest.raises(ConfigError, match=r"models\.d\.derive: must be one of \['matched_active'"):
        p.model_config("d")
    with pytest.raises(ConfigError, match=r"models\.e\.from: name the model"):
        p.model_config("e")


def test_overrides_and_env(tmp_path, monkeypatch):
    monkeypatch.delenv("STUDYLIB_DATA_DIR", raising=False)
    monkeypatch.delenv("STUDYLIB_CACHE_DIR", raising=False)
    path = tmp_path / "params" / "p.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({"models": {"m": {"d_model": 32, "n_heads": 2, "n_kv_heads": 1}},
                                    "data": {"data_dir": "data"}}))
    p = load_preset(path, ["train.max_steps=7", "models.m.d_model=64", "train.lr=1e-3"])
    assert p.train.max_steps == 7 and p.model_config("m").d_model == 64 and p.train.lr == 1e-3
    assert p.data.data_dir == str(tmp_path / "data")  # relative to the repository root
    monkeypatch.setenv("STUDYLIB_DATA_DIR", "/elsewhere")
    assert load_preset(path).data.data_dir == "/elsewhere"
    with pytest.raises(ConfigError, match="expected key.path=value"):
        load_preset(path, ["train.max_steps"])
    with pytest.raises(ConfigError, match="preset file not found"):
        load_preset(tmp_path / "nope.yaml")


@pytest.mark.parametrize("name", ["paper", "cpu", "cpu_full", "ci"])
def test_shipped_presets_resolve_every_model(name):
    p = load_preset(ROOT / "params" / f"{name}.yaml")
    for m in p.model_names():
        p.model_config(m).validate()


def test_bare_on_off_reach_on_off_fields():
    """YAML 1.1 reads `--set train.amp=off` as False; a field whose choices include on/off takes it."""
    p = load_preset(ROOT / "params" / "ci.yaml", ["train.amp=off", "models.moe_top1.ffn.grouped_mm=on"])
    assert p.train.amp == "off" and p.model_config("moe_top1").ffn.grouped_mm == "on"
    with pytest.raises(ConfigError, match="train.compile"):
        load_preset(ROOT / "params" / "ci.yaml", ["train.compile=maybe"])


def test_default_cache_dir_is_anchored_at_the_repository(monkeypatch, tmp_path):
    monkeypatch.delenv("STUDYLIB_CACHE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    p = load_preset(ROOT / "params" / "ci.yaml")
    assert p.data.cache_dir == str(ROOT / "outputs" / "cache")


def test_expert_init_option():
    """`expert_init` takes normal / fan_in; a wrong value names the field; the default leaves the
    run identity as it was (identity drops defaults) and fan_in changes it."""
    from studylib.config.identity import run_identity

    bad(r"models\.m\.expert_init: must be one of \['normal', 'fan_in'\], got 'kaiming'",
        d_model=32, n_heads=2, n_kv_heads=1, expert_init="kaiming")
    p = preset(m={"d_model": 32, "n_heads": 2, "n_kv_heads": 1},
               f={"d_model": 32, "n_heads": 2, "n_kv_heads": 1, "expert_init": "fan_in"})
    assert p.model_config("m").expert_init == "normal" and p.model_config("f").expert_init == "fan_in"
    assert "expert_init" not in run_identity(p, p.model_config("m"), "m", 1)["model"]
    assert run_identity(p, p.model_config("f"), "f", 1)["model"]["expert_init"] == "fan_in"


def test_extends_merges_mappings_and_replaces_the_rest(tmp_path):
    """A preset that ``extends`` another starts from it: mappings merge key by key, lists and
    scalars are replaced, and the child's relative paths (extends, data_dir) are its own."""
    params = tmp_path / "params"
    (params / "more").mkdir(parents=True)
    (params / "base.yaml").write_text(yaml.safe_dump({
        "name": "base", "seeds": [1, 2, 3], "train": {"lr": 1e-2, "max_steps": 10},
        "models": {"m": {"d_model": 32, "n_heads": 2, "n_kv_heads": 1}},
        "study": {"lr_sweep": {"lrs": [1e-3, 1e-2, 1e-1], "seeds": 2, "epochs": 0.25}, "notebooks": ["01", "02"]}}))
    (params / "more" / "long.yaml").write_text(yaml.safe_dump({
        "extends": "../base.yaml", "name": "long", "seeds": [7, 8], "train": {"max_steps": 40},
        "study": {"lr_sweep": {"epochs": 1.0}, "notebooks": ["03"]}}))
    base, long = load_preset(params / "base.yaml"), load_preset(params / "more" / "long.yaml")
    assert (long.name, long.seeds, long.train.max_steps, long.train.lr) == ("long", (7, 8), 40, 1e-2)
    assert long.study.comparisons["lr_sweep"] == {"lrs": [1e-3, 1e-2, 1e-1], "seeds": 2, "epochs": 1.0}
    assert long.study.notebooks == ("03",)
    assert long.models == base.models and base.train.max_steps == 10


def test_extends_errors_name_the_file_and_what_was_expected(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\nname: a\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\nname: b\n")
    with pytest.raises(ConfigError, match=r"b\.yaml: extends: the presets extend each other in a cycle "
                                          r"\(a\.yaml -> b\.yaml -> a\.yaml\)"):
        load_preset(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: nope.yaml\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: extends: 'nope\.yaml' not found"):
        load_preset(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("extends: [a.yaml]\n")
    with pytest.raises(ConfigError, match=r"d\.yaml: extends: expected the path of another preset file"):
        load_preset(tmp_path / "d.yaml")


@pytest.mark.parametrize("text, key, lines", [
    ("name: t\ntrain:\n  lr: 1.0e-3\n  lr: 2.0e-3\n", "lr", (3, 4)),
    ("name: t\ntrain:\n  lr: 1.0e-3\nseeds: [1]\ntrain:\n  batch_size: 16\n", "train", (2, 5)),
])
def test_a_key_written_twice_is_refused_naming_it_and_both_lines(tmp_path, text, key, lines):
    """yaml.safe_load keeps the last of two equal keys without a word (issue #24: a second ``lr`` or
    a second ``train:`` section silently won); the preset loader refuses it."""
    f = tmp_path / "dup.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_preset(f)
    msg = str(e.value)
    assert msg == f"{f}: key {key!r} appears twice in one mapping (lines {lines[0]} and {lines[1]}); keep one"


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf"])
def test_a_bad_lr_is_reported_against_lr_itself(value):
    """issue #24: train.lr nan or -1 was reported against train.min_lr."""
    with pytest.raises(ConfigError, match=r"^train\.lr: must be a positive finite number"):
        load_preset(ROOT / "params" / "ci.yaml", [f"train.lr={value}"])
