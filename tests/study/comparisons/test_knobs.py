"""The study section typed (studylib.study.comparisons.knobs and study_of): the general knobs at
load, each comparison's knobs from the flat keys it owns (a key owned twice, or by nobody, is
refused), one ConfigError line per bad value naming the field, and the shipped presets."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from _tiny import tiny_raw
from studylib.config import ConfigError, load_preset, override, preset_from_dict, to_dict
from studylib.config.study import GENERAL_KEYS, study_from_dict
from studylib.study import comparisons as C
from studylib.study.comparisons.headline import NoiseSplit
from studylib.study.comparisons.knobs import Knobs, Study
from studylib.study.comparisons.lr_sweep.knobs import LrSweep

ROOT = Path(__file__).resolve().parents[3]
PRESETS = ("ci", "cpu", "cpu_full", "paper")


def _study(study: dict) -> Study:
    return C.study_of(preset_from_dict(tiny_raw(study=study)))


def test_every_flat_key_belongs_to_one_comparison_or_the_general_knobs():
    keys = [k for c in C.registry().values() for k in c.knobs.keys()]
    assert len(keys) == len(set(keys)) and not set(keys) & set(GENERAL_KEYS)
    assert C.comparison("02_routing_ablation").knobs.keys() == ("ablation", "ablation_epochs")


def test_the_model_lists_come_from_the_knobs():
    s = _study({"headline": ["dense", "moe"], "ablation": ["moe"], "iso_width": ["dense", "moe"],
                "router_variants": ["moe"]})
    assert s.lists_naming("moe") == ["headline", "ablation", "iso_width", "router_variants"]
    assert s.lists_naming("dense") == ["headline", "iso_width"]


@pytest.mark.parametrize("key", ["headline", "ablation", "granularity", "iso_width", "router_variants"])
def test_a_typo_in_any_model_list_is_one_line_naming_the_field(key):
    with pytest.raises(ConfigError) as e:
        _study({key: ["dense", "nope"]})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"study.{key}[1]: no model named 'nope' in the preset; allowed:")


@pytest.mark.parametrize("study, match", [
    ({"headlin": ["dense", "moe"]}, r"study: unknown key\(s\) \['headlin'\]; allowed: \['notebooks', 'headline'"),
    ({"headline": ["dense", "mo"]}, r"study\.headline\[1\]: no model named 'mo' in the preset; allowed: \['dense', 'moe'\]"),
    ({"reference_moe": "nope"}, r"study\.reference_moe: expected a model name of the preset, got 'nope'"),
    ({"ablation_epochs": 0}, r"study\.ablation_epochs: expected a number of epochs > 0, got 0"),
    ({"comparison_seeds": 1}, r"study\.comparison_seeds: expected how many of the preset's seeds to use"),
    ({"jobs": 0}, r"study\.jobs: must be a positive integer, got 0"),
    ({"scheduler": "nowhere"}, r"study\.scheduler: expected a Dask scheduler address"),
    ({"power_target": -1}, r"study\.power_target: expected a CI half-width"),
    ({"map_power_target": 0}, r"study\.map_power_target: expected a CI half-width"),
    ({"margin": 0}, r"study\.margin: expected an equivalence margin in nats \(a number > 0\), got 0$"),
    ({"margin": "0.03"}, r"study\.margin: expected an equivalence margin in nats \(a number > 0\), got '0.03'"),
    ({"margin": True}, r"study\.margin: expected an equivalence margin"),
    ({"margin": float("inf")}, r"study\.margin: expected an equivalence margin"),
    ({"lr_sweep": {"lrs": [1e-3, 1e-2], "seeds": 2, "epochs": 1}}, r"study\.lr_sweep\.lrs: need at least 3"),
    ({"noise_split": {"seeds": 1}}, r"study\.noise_split: expected \{seeds: k\} with k >= 2"),
    ({"downstream_seeds": 1}, r"study\.downstream_seeds: expected how many"),
    ({"downstream_seeds": 3}, r"^study\.downstream_seeds: 3 seeds asked for, but the preset has 2 \(\[1, 2\]\); "
                              r"expected at most 2$"),
    ({"probe_windows": 0}, r"study\.probe_windows: must be a positive integer"),
    ({"notebooks": "01"}, r"study\.notebooks: expected a non-empty list"),
])
def test_the_study_section_is_checked_when_a_study_loads_the_preset(study, match):
    """The general knobs are checked when the preset loads, each comparison's when a study types
    it (study_of: the `study` command, a notebook's context), before anything trains."""
    with pytest.raises(ConfigError, match=match):
        _study(study)


def test_a_trio_is_checked_by_its_parameter_counts_for_every_comparison_that_asks():
    """issue 57: a trio in another order read every p mirrored (0.51 as 0.49), exit 0."""
    from studylib.study.comparisons.knobs import Context, trio

    models = {"da": {"derive": "matched_active", "from": "moe"}, "dt": {"derive": "matched_total", "from": "moe"}}
    ctx = Context.of(preset_from_dict(tiny_raw(models=models)))
    assert trio(["da", "moe", "dt"], "study.x", ctx) == ("da", "moe", "dt")
    for names, match in [
        (["dt", "moe", "da"], r"^study\.x\[0\]: 'dt' has [\d,]+ active parameters against the [\d,]+ of the MoE 'moe' "
                              r"\(\+\d+\.\d\d%\): not its active match"),
        (["da", "moe", "da"], r"^study\.x\[2\]: 'da' has [\d,]+ total parameters against the [\d,]+ of the MoE 'moe'"),
        (["da", "dense", "dt"], r"^study\.x\[1\]: 'dense' has a dense FFN; expected \[dense_active, moe, dense_total\]"),
        (["moe", "moe", "dt"], r"^study\.x\[0\]: 'moe' has a moe FFN; expected .* with a dense active match here$"),
        (["da", "moe"], r"^study\.x: expected \[dense_active, moe, dense_total\], got \['da', 'moe'\]$"),
    ]:
        with pytest.raises(ConfigError, match=match):
            trio(names, "study.x", ctx)


def test_the_headline_is_a_trio_checked_as_every_other():
    """study.headline given in another order: every headline p mirrored until it was checked."""
    models = {"dt": {"derive": "matched_total", "from": "moe"}}
    assert C.study_of(preset_from_dict(tiny_raw(models=models, study={"headline": ["dense", "moe", "dt"]}))).headline \
        == ("dense", "moe", "dt")
    wrong = C.study_of(preset_from_dict(tiny_raw(models=models, study={"headline": ["dt", "moe", "dense"]})))
    with pytest.raises(ConfigError, match=r"^study\.headline\[0\]: 'dt' has [\d,]+ active parameters"):
        wrong.headline


def test_the_study_section_reads_typed_and_survives_an_override():
    raw = {"headline": ["dense", "moe", "dense_t"], "notebooks": ["01", 3], "noise_split": {"seeds": 2}, "jobs": 2}
    p = preset_from_dict(tiny_raw(models={"dense_t": {"derive": "matched_total", "from": "moe"}}, study=raw))
    s = C.study_of(p)
    assert s.headline == ("dense", "moe", "dense_t") and s.general.notebooks == ("01", "03")
    assert s["headline"].noise_split == NoiseSplit(2) and s["headline"].noise_split.seeds == 2
    assert s.general.jobs == 2 and s.reference_moe == "moe" and s["ablation"].epochs == 1.0
    assert s["lr_sweep"].sweep is None and s["token_budget"].trios is None and s["throughput"].bench == {}
    varied = override(p, {"train.max_steps": 3})
    assert varied.study == p.study and C.study_of(varied).knobs == s.knobs  # round-trips through to_dict
    assert to_dict(p)["study"]["noise_split"] == {"seeds": 2}  # the flat keys as the preset wrote them


def test_the_equivalence_margin_is_read_from_the_preset():
    """study.margin (nats) is the TOST margin of every family; default the power target."""
    assert _study({}).general.margin == 0.03
    assert _study({"power_target": 0.05}).general.margin == 0.05  # follows the power target
    assert _study({"power_target": 0.05, "margin": 0.01}).general.margin == 0.01
    assert _study({"margin": None}).general.margin == 0.03
    for name in PRESETS:
        assert load_preset(ROOT / "params" / f"{name}.yaml").study.margin == 0.03, name
    assert "margin" in yaml.safe_load((ROOT / "params" / "cpu.yaml").read_text())["study"]


@pytest.mark.parametrize("name", PRESETS)
def test_each_comparison_parses_each_shipped_preset(name):
    """Each comparison's knobs, parsed alone from the preset's flat study keys, are what the study
    holds; the flat form reads back to the same study section."""
    p = load_preset(ROOT / "params" / f"{name}.yaml")
    s = C.study_of(p)
    flat = to_dict(p)["study"]
    ctx = C.Context.of(p)
    for c in C.registry().values():
        assert isinstance(s[c], c.knobs) and c.knobs.parse(flat, ctx) == s[c], c.name
    assert study_from_dict(flat, p.models) == p.study


def test_cpu_full_is_cpu_with_longer_study_budgets_only():
    """params/cpu_full.yaml trains the same models with the same recipe, data and seeds as cpu; only
    its name, the notebooks it runs and its study budgets differ (so its header's claim holds)."""
    cpu, full = load_preset(ROOT / "params" / "cpu.yaml"), load_preset(ROOT / "params" / "cpu_full.yaml")
    assert (full.data, full.train, full.model, full.models, full.seeds) == \
        (cpu.data, cpu.train, cpu.model, cpu.models, cpu.seeds)
    assert full.name == "cpu_full" != cpu.name
    a, b = to_dict(cpu)["study"], to_dict(full)["study"]
    assert {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} == \
        {"ablation_epochs", "granularity_epochs", "iso_width_epochs", "lr_sweep", "token_budget", "notebooks",
         "downstream_seeds", "controls"}
    assert b["controls"][:len(a["controls"])] == a["controls"]  # cpu's cell, then cpu_full's own
    s, f = C.study_of(cpu), C.study_of(full)

    def cells(study) -> dict:  # {(MoE, budget as written, stories): seeds}
        return {(t.moe, x, 1.0 if f == 1.0 else f): len(t.seeds_of(cpu.seeds, (x, f))) for t in study["token_budget"].trios
                for x, f in [(e, 1.0) for e in t.epochs + t.tokens_per_param] + [(x, f) for x in t.repeat for f in t.stories]}
    small, big = cells(s), cells(f)
    assert all(big.get(c, 0) >= n for c, n in small.items()), "cpu_full's map holds each of cpu's cells and seeds"
    assert f["downstream"].seeds is None  # every seed
    assert set(cpu.study.notebooks) < set(full.study.notebooks)
    for name in ("ablation", "granularity", "iso_width"):
        assert s[name].epochs < f[name].epochs == 1.0
    assert f["lr_sweep"].sweep == dataclasses.replace(s["lr_sweep"].sweep, epochs=1.0)


def test_what_depends_on_the_run_is_resolved_by_the_knobs():
    """What the preset alone decides is checked at load; what depends on the seeds and the lr a
    notebook is run with is resolved by the knobs (one line each, naming the field)."""
    assert NoiseSplit(2).draws([5, 6, 7]) == (5, 6)
    with pytest.raises(ConfigError, match=r"^study\.noise_split: \{seeds: 4\} asks for more seeds"):
        NoiseSplit(4).draws([5, 6, 7])
    sweep = LrSweep((1e-3, 3e-3, 1e-2), 2, 0.5)
    spec = sweep.resolve(3e-3 * (1 + 1e-12), [5, 6, 7])
    assert spec.knobs is sweep and spec.seeds == (5, 6) and spec.lrs[1] == spec.preset_lr
    assert spec.epochs == 0.5 and spec.tolerance == 0.01
    with pytest.raises(ConfigError, match=r"^study\.lr_sweep\.lrs: must include the preset's train\.lr=0\.02"):
        sweep.resolve(2e-2, [5, 6, 7])
    with pytest.raises(ConfigError, match=r"^study\.lr_sweep\.seeds: 2 seeds asked, the preset has 1"):
        sweep.resolve(1e-3, [5])
    with pytest.raises(ConfigError, match=r"^study\.lr_sweep: missing; add e\.g\."):
        _study({})["lr_sweep"].resolve(1e-3, [5, 6])


def test_a_key_two_comparisons_claim_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Twice(Knobs):
        x: float = C.knobs.knob("ablation_epochs", C.knobs.EPOCHS, 1.0)

    other = dataclasses.replace(C.comparison("ablation"), name="other", notebook="99_other", knobs=Twice)
    with pytest.raises(ConfigError, match=r"comparison 'other': the study key 'ablation_epochs' belongs to 'ablation'"):
        C.check_owners([*C.registry().values(), other])
