"""The comparisons' typed sections (studylib.config.sections): the flat preset keys each owns, the
model-list knobs derived from them, one ConfigError line per bad value, and the shipped presets."""
from __future__ import annotations

from pathlib import Path

import pytest

from _tiny import tiny_raw
from studylib.config import ConfigError, SECTIONS, load_preset, preset_from_dict, to_dict
from studylib.config.sections import Context, LrSweepSection, NoiseSplitSection, model_keys, section_keys
from studylib.config.study import GENERAL_KEYS, GENERAL_MODEL_LISTS, MODEL_LISTS, StudyConfig, study_from_dict

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ("ci", "cpu", "cpu_full", "paper")


def test_every_flat_key_belongs_to_one_section_or_the_general_knobs():
    keys = [k for cls in SECTIONS.values() for k in cls.keys()]
    assert len(keys) == len(set(keys)) and not set(keys) & set(GENERAL_KEYS)
    assert set(section_keys()) == set(keys)
    assert set(StudyConfig().flat()) == set(keys) | set(GENERAL_KEYS)


def test_the_model_list_knobs_come_from_the_sections():
    assert MODEL_LISTS == GENERAL_MODEL_LISTS + model_keys()
    assert MODEL_LISTS == ("headline", "ablation", "granularity", "iso_width", "router_variants")
    for attr, cls in SECTIONS.items():
        assert set(cls.MODELS) <= set(cls.keys()), attr


@pytest.mark.parametrize("key", MODEL_LISTS)
def test_a_typo_in_any_model_list_is_one_line_naming_the_field(key):
    with pytest.raises(ConfigError) as e:
        preset_from_dict(tiny_raw(study={key: ["dense", "nope"]}))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"study.{key}[1]: no model named 'nope' in the preset; allowed:")


@pytest.mark.parametrize("name", PRESETS)
def test_each_section_parses_each_shipped_preset(name):
    """Each section, parsed alone from the preset's flat study keys, is what the preset holds; the
    flat form reads back to the same study."""
    p = load_preset(ROOT / "params" / f"{name}.yaml")
    flat = to_dict(p)["study"]
    assert flat == to_dict(p.study.flat())
    ctx = Context(p.models, lambda m: p.model_config(m).ffn.kind)
    for attr, cls in SECTIONS.items():
        section = getattr(p.study, attr)
        assert cls.parse(flat, ctx) == section, attr
        if not cls.WHOLE:
            assert isinstance(section, cls), attr
    assert study_from_dict(flat, p.models, ctx.ffn_kind) == p.study


def test_the_flat_keys_read_as_before():
    p = preset_from_dict(tiny_raw(study={"ablation": ["moe"], "ablation_epochs": 0.5, "noise_split": {"seeds": 2},
                                         "bench": {"batch": 2}, "downstream_seeds": 2, "probe_windows": 8}))
    s = p.study
    assert s.ablation.models == ("moe",) and s.ablation_epochs == s.ablation.epochs == 0.5
    assert s.knob("ablation") == ("moe",) and "moe" in s.ablation and list(s.ablation) == ["moe"]
    assert s.noise_split == s.headline_sweep.noise_split == NoiseSplitSection(2)
    assert s.bench == s.throughput.bench == {"batch": 2} and s.decode == s.iso_width.decode == {}
    assert s.downstream_seeds == s.downstream.seeds == 2 and s.granularity.probe_windows == s.probe_windows == 8
    assert s.sample_tokens == 40 and s.lr_sweep is None and s.token_budget is None


def test_the_sections_resolve_what_depends_on_the_run():
    """What the preset alone decides is checked at load; what depends on the seeds and the lr a
    notebook is run with is the section's resolve step (one line each, naming the field)."""
    assert NoiseSplitSection(2).draws([5, 6, 7]) == (5, 6)
    with pytest.raises(ConfigError, match=r"^study\.noise_split: \{seeds: 4\} asks for more seeds"):
        NoiseSplitSection(4).draws([5, 6, 7])
    sweep = LrSweepSection((1e-3, 3e-3, 1e-2), 2, 0.5)
    spec = sweep.resolve(3e-3 * (1 + 1e-12), [5, 6, 7])
    assert spec.knobs is sweep and spec.seeds == (5, 6) and spec.lrs[1] == spec.preset_lr
    assert spec.epochs == 0.5 and spec.tolerance == 0.01
    with pytest.raises(ConfigError, match=r"^study\.lr_sweep\.lrs: must include the preset's train\.lr=0\.02"):
        sweep.resolve(2e-2, [5, 6, 7])
    with pytest.raises(ConfigError, match=r"^study\.lr_sweep\.seeds: 2 seeds asked, the preset has 1"):
        sweep.resolve(1e-3, [5])
