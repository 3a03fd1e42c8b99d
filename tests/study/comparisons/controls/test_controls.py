"""Notebook 13's comparison: its knobs (one line naming the field for a bad cell), its plan (the
map's runs of a cell are the same runs), the positions and gaps (against hand-computed values) and
the router measurements on a trained tiny run (the initial router rebuilt exactly)."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
import torch

from _tiny import synthetic_data, tiny_preset
from studylib.config import ConfigError, load_preset
from studylib.run.spec import RunSpec
from studylib.study.analysis.stats import holm, paired
from studylib.study.comparisons import registry, study_of
from studylib.study.comparisons.controls import analysis as A
from studylib.run.spec import tokens_per_step
from studylib.study.comparisons.controls import routers as R
from studylib.study.comparisons.controls.knobs import ControlCell, parse_cells
from studylib.study.comparisons.knobs import Context

MOE = {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2}
MODELS = {"hash": {"ffn": {**MOE, "router": "hash"}},
          "frozen": {"ffn": {**MOE, "balance_coef": 0.01, "z_coef": 0.001, "router": "frozen"}},
          "one": {"ffn": {"kind": "moe", "hidden": 32, "num_experts": 1, "top_k": 1, "balance_coef": 0.01}},
          "twin": {"ffn": {"kind": "dense", "hidden": 32}},
          "da": {"derive": "matched_active", "from": "moe"}, "dt": {"derive": "matched_total", "from": "moe"}}
CELL = {"trio": ["da", "moe", "dt"], "hash": "hash", "frozen": "frozen", "one_expert": "one",
        "dense_twin": "twin", "epochs": 1.0}


def _ctx(**models):
    return Context.of(tiny_preset(models={**tiny_preset().models, **MODELS, **models}))


def test_a_cell_is_parsed_with_its_roles_in_order():
    (c,) = parse_cells([CELL], "study.controls", _ctx())
    assert c.controls == (("hash", "hash"), ("frozen", "frozen"), ("one_expert", "one"), ("dense_twin", "twin"))
    assert c.models == ["da", "moe", "dt", "hash", "frozen", "one", "twin"] and c.epochs == 1.0


@pytest.mark.parametrize("change,match", [
    ({"hash": "frozen"}, r"study.controls\[0\].hash: 'frozen' must be a routed MoE with ffn.router: hash"),
    ({"frozen": "hash"}, r"study.controls\[0\].frozen: 'hash' must be a routed MoE with ffn.router: frozen"),
    ({"one_expert": "frozen"}, r"study.controls\[0\].one_expert: 'frozen' must be a routed MoE with num_experts 1"),
    ({"frozen": "moe"}, r"study.controls\[0\].frozen: 'moe' is the trio's MoE, the reference; expected another"),
    ({"dense_twin": "one"}, r"study.controls\[0\].dense_twin: 'one' must be a dense model"),
    ({"tokens_per_param": 3.0}, r"study.controls\[0\]: give exactly one budget"),
    ({"epochs": None}, r"study.controls\[0\]: give exactly one budget"),
    ({"epochs": -1.0}, r"study.controls\[0\].epochs: expected a positive number"),
    ({"hash": "nope"}, r"study.controls\[0\].hash: expected a model name of the preset"),
    ({"seeds": 3}, r"study.controls\[0\]: unknown key\(s\) \['seeds'\]"),
    ({"trio": ["da", "moe"]}, r"study.controls\[0\].trio: expected \[dense_active, moe, dense_total\]"),
])
def test_a_bad_cell_is_one_line_naming_its_field(change, match):
    with pytest.raises(ConfigError, match=match):
        parse_cells([{**CELL, **change}], "study.controls", _ctx())


SHARED = {"ffn": {**MODELS["one"]["ffn"], "n_shared": 1}}


@pytest.mark.parametrize("models, change, match", [
    # issue 57: each was accepted, the controls then compared the wrong pair
    ({"wide": {"d_model": 48, "ffn": {"kind": "dense", "hidden": 32}}}, {"dense_twin": "wide"},
     r"^study.controls\[0\].dense_twin: 'wide' is not the dense twin of the one-expert MoE 'one': d_model 48 against "
     r"32; [\d,]+ active parameters against [\d,]+ \(the one expert's [\d,]+ less its router's 64\)$"),
    ({"wider": {"ffn": {"kind": "dense", "hidden": 64}}}, {"dense_twin": "wider"},
     r"^study.controls\[0\].dense_twin: 'wider' is not the dense twin .*: ffn.hidden 64 against 32; "),
    ({"shared": SHARED}, {"one_expert": "shared"},
     r"^study.controls\[0\].one_expert: 'shared' must be a routed MoE with num_experts 1, top_k 1 and no shared"),
    ({}, {"trio": ["dt", "moe", "da"]},
     r"^study.controls\[0\].trio\[0\]: 'dt' has [\d,]+ active parameters against the [\d,]+ of the MoE 'moe' "
     r"\(\+\d+\.\d\d%\): not its active match \(expected \[dense_active, moe, dense_total\], this one within 1.0%"),
    ({}, {"trio": ["da", "moe", "dense"]}, r"^study.controls\[0\].trio\[2\]: 'dense' has [\d,]+ total parameters"),
    ({}, {"trio": ["da", "hash", "dt"]},
     r"^study.controls\[0\].trio\[1\]: the reference MoE 'hash' has ffn.router: hash; expected a learned router"),
    ({}, {"trio": ["da", "frozen", "dt"]},
     r"^study.controls\[0\].trio\[1\]: the reference MoE 'frozen' has ffn.router: frozen; expected a learned"),
    ({"da1": {"derive": "matched_active", "from": "one"}, "dt1": {"derive": "matched_total", "from": "one"}},
     {"trio": ["da1", "one", "dt1"]}, r"^study.controls\[0\].one_expert: 'one' is the trio's MoE, the reference"),
])
def test_a_cell_comparing_the_wrong_pair_is_one_line_with_both_models_numbers(models, change, match):
    with pytest.raises(ConfigError, match=match):
        parse_cells([{**CELL, **change}], "study.controls", _ctx(**models))


def test_a_typed_in_match_is_the_trios_within_the_tolerance_and_a_derived_one_as_the_solver_left_it():
    ctx = _ctx()
    da, dt = ctx.config("da"), ctx.config("dt")
    typed = {"d_model": da.d_model, "n_heads": da.n_heads, "ffn": {"kind": "dense", "hidden": da.ffn.hidden}}
    (c,) = parse_cells([{**CELL, "trio": ["da_typed", "moe", "dt"]}], "study.controls", _ctx(da_typed=typed))
    assert c.trio == ("da_typed", "moe", "dt")
    # the solver's closest total match at this size is just outside 0.1%: derived, it stands; typed in, it does not
    assert abs(dt.num_params.total / ctx.config("moe").num_params.total - 1) > 0.001
    typed = {"d_model": dt.d_model, "n_heads": dt.n_heads, "ffn": {"kind": "dense", "hidden": dt.ffn.hidden}}
    with pytest.raises(ConfigError, match=r"trio\[2\]: 'dt_typed' has [\d,]+ total parameters .*\(-0.10%\)"):
        parse_cells([{**CELL, "trio": ["da", "moe", "dt_typed"]}], "study.controls", _ctx(dt_typed=typed))


def test_the_controls_seeds_are_at_most_the_presets():
    p = tiny_preset(models={**tiny_preset().models, **MODELS}, study={"controls": [CELL], "controls_seeds": 3})
    with pytest.raises(ConfigError, match=r"^study.controls_seeds: 3 seeds asked for, but the preset has 2 "
                                          r"\(\[1, 2\]\); expected at most 2$"):
        study_of(p)
    assert study_of(tiny_preset(models=p.models, study={"controls": [CELL], "controls_seeds": 2}))["controls"].seeds == 2


def test_the_cells_plan_the_headline_runs_and_the_maps_runs_of_the_small_cell():
    preset = load_preset("params/ci.yaml")
    study = study_of(preset)
    grids = registry()["controls"].plan(study)
    assert grids[0].overrides is None  # epochs 1.0: the preset's own runs, the headline's
    assert set(study.headline) <= set(grids[0].models) and grids[0].seeds == list(preset.seeds[:2])
    small = grids[1]
    a = int(preset.model_config("moe_s").num_params.active)
    assert small.overrides == {"train.max_steps": round(0.288 * a / tokens_per_step(preset)),
                               "data.vocab_size": preset.model_config("moe_s").vocab_size}
    mapped = [g.overrides for g in registry()["token_budget"].plan(study)]
    assert small.overrides in mapped  # the map's cell at 0.288 tokens/param: the same runs


LOSS = {  # model -> best val loss per seed 1..4
    "da": [3.70, 3.72, 3.69, 3.71], "moe": [3.60, 3.61, 3.62, 3.60], "dt": [3.50, 3.52, 3.51, 3.49],
    "hash": [3.66, 3.67, 3.65, 3.68], "frozen": [3.605, 3.615, 3.61, 3.60],
    "one": [3.75, 3.76, 3.74, 3.75], "twin": [3.751, 3.759, 3.741, 3.749],
}
TCELL = ControlCell(("da", "moe", "dt"), (("hash", "hash"), ("frozen", "frozen"), ("one_expert", "one"),
                                          ("dense_twin", "twin")), epochs=1.0)


def _summaries():
    return pd.DataFrame([{"model": m, "seed": s, "best_val_loss": v} for m, vals in LOSS.items()
                         for s, v in zip((1, 2, 3, 4), vals)])


def test_positions_gaps_and_the_twin_from_hand_computed_values():
    t = A.cell_tables([_summaries()], [TCELL], 0.03)
    pos = t["positions"].set_index("model")
    la, lt = np.array(LOSS["da"]), np.array(LOSS["dt"])
    for m in ("moe", "hash", "frozen", "one", "twin"):
        lm = np.array(LOSS[m])
        assert pos.loc[m, "position"] == pytest.approx((la - lm).mean() / (la - lt).mean())
        assert pos.loc[m, "position_low"] <= pos.loc[m, "position"] <= pos.loc[m, "position_high"]
    g = t["gaps"]
    assert list(g["a"]) == ["hash", "frozen", "one", "twin"] and set(g["b"]) == {"moe"}
    ps = [paired(LOSS[m], LOSS["moe"]).p for m in g["a"]]
    np.testing.assert_allclose(g["p_holm"], holm(ps))  # Holm over the cell's four controls
    h = paired(LOSS["hash"], LOSS["moe"])
    assert (g.iloc[0]["mean"], g.iloc[0]["ci_low"], g.iloc[0]["ci_high"]) == pytest.approx((h.mean, h.ci_low, h.ci_high))
    tw = t["twin"].iloc[0]
    assert tw["verdict"] == "equivalent" and tw["family_size"] == 1  # within ±0.03 by TOST
    words = A.learns_to_route(g, TCELL)
    assert "not resolvably better than `frozen`" in words and "`hash`" not in words  # hash: resolved; frozen: not
    table = A.control_table(t["positions"], g)
    assert table.loc[table["model"] == "moe", "gap to the reference"].item() == ""  # the reference itself


def test_the_learned_router_better_than_both_is_said_so():
    s = _summaries()
    s.loc[s["model"] == "frozen", "best_val_loss"] += 0.05
    g = A.cell_tables([s], [TCELL], 0.03)["gaps"]
    assert "is resolvably better than `hash` and `frozen`" in A.learns_to_route(g, TCELL)


@pytest.fixture(scope="module")
def data():
    return synthetic_data()


@pytest.mark.filterwarnings("ignore:.*could not find the run.s tokenizer")
@pytest.mark.parametrize("name", ["frozen", "hash", "moe"])
def test_router_measures_against_the_initial_router_rebuilt_exactly(tmp_path, data, name, one_thread):
    from studylib.run import checkpoint as C
    from studylib.run import trainer as T

    models = {**MODELS, "moe": tiny_preset().models["moe"]}
    p = tiny_preset(models={name: models[name]}, train={"max_steps": 6, "eval_every": 3})
    T.train_run(p, name, 3, run_dir=tmp_path / "r", progress=False, data=data)
    spec = RunSpec(p, name, 3, tmp_path / "r")
    init = R.initial_model(spec).state_dict()
    final = C.load(spec.rundir.checkpoints / C.LATEST)["model"]
    if name == "frozen":  # the frozen router never moved: the rebuilt step 0 is the trainer's, bit for bit
        keys = [k for k in final if k.endswith("router.weight")]
        assert keys and all(torch.equal(init[k], final[k]) for k in keys)
    m = R.router_measures(spec, data)
    assert list(m["layer"]) == [0, 1] and (m["tokens"] == len(data.val_idx) * (data.context - 1)).all()
    loads = m[[f"load_{e}" for e in range(4)]].sum(axis=1)
    np.testing.assert_allclose(loads, 1.0)
    assert ((m["busiest"] >= 1) & (m["busiest"] <= 4)).all()
    assert ((m["entropy_given_id"] >= 0) & (m["entropy_given_id"] <= m["entropy"] + 1e-9)).all()
    assert (m["entropy"] <= math.log2(6) + 1e-9).all()
    if name == "moe":  # the learned router moved: some choices differ from its step-0 weights'
        assert (m["changed"] > 0).all()
        return
    assert (m["changed"] == 0).all()  # neither router's weights moved: same input, same choice
    if name == "hash":  # the id alone decides, whatever the input: the model's routing never changed
        assert (m["changed_model"] == 0).all() and (m["entropy_given_id"] == 0).all()
    else:  # the frozen router's input moved with the model
        assert (m["changed_model"] > 0).any()
    s = R.summary(m)
    assert list(s["n"]) == [1, 1]


def test_conditional_entropy_is_zero_for_a_function_of_the_id_and_the_plug_in_value_otherwise():
    joint = np.array([[4, 0], [0, 2], [1, 1]])
    assert R._conditional_entropy_bits(joint[:2]) == 0.0
    assert R._conditional_entropy_bits(joint) == pytest.approx(2 / 8 * 1.0)  # id 2: one bit, a quarter of tokens


def test_the_recipe_plans_the_same_tokens_in_larger_steps_with_the_router_lr_on_the_moe_only():
    preset = load_preset("params/ci.yaml")
    study = study_of(preset)
    r = study["controls"].recipe
    grids = registry()["controls"].plan(study)[2:]
    cell = registry()["controls"].plan(study)[1]
    assert len(grids) == 2 * len(r.lrs)
    for dense, moe in zip(grids[::2], grids[1::2]):
        assert dense.models == ["dense_active_s", "dense_total_s"] and moe.models == ["moe_s"]
        assert dense.overrides["train.max_steps"] == round(cell.overrides["train.max_steps"] / r.batch_scale)
        assert dense.overrides["train.batch_size"] == preset.train.batch_size * r.batch_scale
        assert "train.router_lr_scale" not in dense.overrides
        assert moe.overrides == {**dense.overrides, "train.router_lr_scale": r.router_lr_scale}
        assert dense.overrides["train.min_lr"] / dense.overrides["train.lr"] == pytest.approx(
            preset.train.min_lr / preset.train.lr)
    assert [g.overrides["train.lr"] for g in grids[::2]] == list(r.lrs)


@pytest.mark.parametrize("raw,match", [
    ({"cell": 1, "lrs": [0.01]}, r"study.controls_recipe.lrs: expected at least two"),
    ({"cell": -1, "lrs": [0.01, 0.02]}, r"study.controls_recipe.cell: expected the index"),
    ({"cell": 0, "lrs": [0.01, 0.01]}, r"study.controls_recipe.lrs: each learning rate once"),
    ({"cell": 0, "lrs": [0.01, 0.02], "batch": 4}, r"study.controls_recipe: unknown key\(s\) \['batch'\]"),
])
def test_a_bad_recipe_is_one_line_naming_its_field(raw, match):
    from studylib.study.comparisons.controls.knobs import RECIPE

    with pytest.raises(ConfigError, match=match):
        RECIPE(raw, "study.controls_recipe", _ctx())


def test_the_recipe_tables_pick_each_models_best_lr_and_place_the_moe_there():
    base = _summaries()
    rows = []
    for lr, shift in ((0.01, {"da": 0.0, "moe": 0.02, "dt": 0.01}), (0.02, {"da": 0.01, "moe": -0.03, "dt": 0.0})):
        for m, d in shift.items():
            rows += [{"model": m, "seed": s, "best_val_loss": v + d, "lr": lr} for s, v in zip((1, 2, 3, 4), LOSS[m])]
    t = A.recipe_tables(pd.DataFrame(rows), base, TCELL)
    best = t["lrs"][t["lrs"]["best"]].set_index("model")["lr"].to_dict()
    assert best == {"da": 0.01, "moe": 0.02, "dt": 0.02}
    la, lm, lt = (np.array(LOSS[m]) for m in ("da", "moe", "dt"))
    p_new = t["position"].iloc[1]["position"]
    assert p_new == pytest.approx(((la + 0.0) - (lm - 0.03)).mean() / ((la + 0.0) - (lt + 0.0)).mean())
    assert t["position"].iloc[0]["position"] == pytest.approx((la - lm).mean() / (la - lt).mean())
    assert "the router at 0.1x" in A.recipe_sentence(t["position"], 2, 4, 0.1)


def _trend(p, lo, hi, moe="moe"):
    """clark_trend.csv's S-Base E = 4 row at the cell's MoE (and a Hash row that must not be read)."""
    row = {"router": "S-Base", "experts": 4, "size": f"this study, {moe} (9.9k active)", "p": p, "ci_lo": lo,
           "ci_hi": hi, "decades_out": 2.4}
    return pd.DataFrame([row, {**row, "router": "Hash", "p": 9.0}, {**row, "experts": 8, "p": 9.0}])


def test_the_first_screen_sentence_words_each_controls_verdict_and_places_the_moe_against_clark():
    t = A.cell_tables([_summaries()], [TCELL], 0.03)
    pos, g, tw = t["positions"], t["gaps"], t["twin"]
    p = pos.set_index("model").loc["moe", "position"]
    h = paired(LOSS["hash"], LOSS["moe"])
    fz = g.set_index("a").loc["frozen"]
    assert fz["verdict"] not in ("A better", "B better")  # frozen: not resolved from the reference
    frozen = "is as good as it (within ±0.03 nats)" if fz["verdict"] == "equivalent" else "is not told apart from it"
    s = A.lead_sentence(pos, g, tw, _trend(p + 0.30, p + 0.10, p + 0.50))
    assert s == (f"Controls at that budget: a router hashing the token id trails the learned one by {h.mean:.3f} "
                 f"[{h.ci_low:.3f}, {h.ci_high:.3f}] nats, one frozen at its start {frozen} and one expert is as good "
                 f"as its dense twin (within ±0.03 nats); Clark et al.'s learned routers, extrapolated 2.4 decades "
                 f"down, trend to p = {p + 0.30:.2f} [{p + 0.10:.2f}, {p + 0.50:.2f}] here, above the MoE's {p:.2f}.")
    # the first screen: the same verdicts in short plain sentences, Clark's trend left below it
    assert A.lead_sentences(pos, g, tw) == [
        f"A router hashing the token id trails the learned router by {h.mean:.3f} [{h.ci_low:.3f}, {h.ci_high:.3f}] "
        f"nats, and one frozen at its start {frozen}.", "One expert is as good as its dense twin (within ±0.03 nats)."]
    assert A.lead_sentence(pos, g, tw, _trend(p, p - 0.1, p + 0.1)).endswith(f"here, around the MoE's {p:.2f}.")
    assert A.lead_sentence(pos, g, tw, _trend(p - 0.3, p - 0.5, p - 0.1)).endswith(f"here, below the MoE's {p:.2f}.")
    # no Clark table (the shared file absent) or no row for this MoE: the controls alone
    assert A.lead_sentence(pos, g, tw, None).endswith("dense twin (within ±0.03 nats).")
    assert A.lead_sentence(pos, g, tw, _trend(p, p, p, moe="other")).endswith("dense twin (within ±0.03 nats).")
    # a control better than the learned router: by how much, the interval turned to match
    s2 = _summaries()
    s2.loc[s2["model"] == "hash", "best_val_loss"] -= 0.30
    t2 = A.cell_tables([s2], [TCELL], 0.03)
    h2 = paired(s2[s2["model"] == "hash"]["best_val_loss"].to_numpy(), LOSS["moe"])
    assert f"a router hashing the token id beats the learned one by {-h2.mean:.3f} [{-h2.ci_high:.3f}, {-h2.ci_low:.3f}] nats," in \
        A.lead_sentence(t2["positions"], t2["gaps"], t2["twin"], None)


def _tables(out, positions=None, gaps=None, twin=None):
    """Notebook 13's tables of TCELL as it writes them under ``out`` (each frame replaceable)."""
    from studylib.study.analysis.plots import save_table
    from studylib.study.comparisons import controls as C

    t = A.cell_tables([_summaries()], [TCELL], 0.03)
    save_table(t["positions"] if positions is None else positions(t["positions"]), C.POSITIONS, out, index=False)
    save_table(t["gaps"] if gaps is None else gaps(t["gaps"]), C.GAPS, out, index=False)
    if twin is not False:
        save_table(t["twin"], C.TWIN, out, index=False)
    return out / "tables"


@pytest.mark.parametrize("name", ["controls_positions", "controls_gaps"])
def test_a_table_cut_mid_row_is_one_line_naming_it(tmp_path, name):
    """issue 57: a torn table read as rows of NaN: the frozen router dropped from the answer, or a traceback."""
    from studylib.study.comparisons import controls as C

    path = _tables(tmp_path) / f"{name}.csv"
    text = path.read_text()
    path.write_text(text[: text.index("frozen", text.index("\n")) + 3])
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: cut mid-row \(its last line is unfinished"):
        C.answer(tmp_path)


@pytest.mark.parametrize("damage, said", [
    (dict(gaps=lambda g: g[g["a"] != "frozen"]),
     "Controls at that budget (incomplete tables, run notebook 13 again: controls_gaps.csv lacks the frozen "
     "router `frozen`): a router hashing the token id trails the learned one by"),
    (dict(positions=lambda p: p[~p["model"].isin(["hash", "frozen"])]),
     "Controls at that budget (incomplete tables, run notebook 13 again: controls_positions.csv lacks `hash` "
     "and `frozen`): one expert is as good as its dense twin (within ±0.03 nats)."),
    (dict(gaps=lambda g: g[~g["a"].isin(["hash", "frozen"])], twin=False),
     "Controls at that budget: not stated (incomplete tables, run notebook 13 again: controls_gaps.csv lacks the "
     "hash router `hash` and the frozen router `frozen`; controls_twin.csv lacks `one` − `twin`)."),
    (dict(positions=lambda p: p.iloc[:1], gaps=lambda g: g.iloc[:0], twin=False),
     "Controls at that budget: not stated (incomplete tables, run notebook 13 again: controls_positions.csv lacks "
     "the cell's controls)."),
    (dict(positions=lambda p: p.iloc[:0]),
     "Controls: not stated (incomplete tables, run notebook 13 again: controls_positions.csv has no rows)."),
])
def test_a_table_without_rows_the_sentence_reads_names_them_and_never_prints_an_empty_list(tmp_path, damage, said):
    """issue 57: rows missing from notebook 13's tables were dropped from the sentence in silence,
    or left "Controls at that budget (nats): ." on the first screen."""
    from studylib.study.comparisons import controls as C

    _tables(tmp_path, **damage)
    a = C.answer(tmp_path)
    assert said in a.markdown and "): ." not in a.markdown
    assert all(s.strip(" .") and not s.endswith(": .") for s in a.lead)  # the first screen: never an empty list


def test_a_first_cell_without_a_control_the_sentence_words_says_so_below_the_first_screen(tmp_path):
    from studylib.study.comparisons import controls as C

    only = lambda t, col: t[t[col].isin(["moe", "one"])]  # noqa: E731  the reference and one expert, no twin
    _tables(tmp_path, positions=lambda p: only(p, "model"), gaps=lambda g: only(g, "a"), twin=False)
    a = C.answer(tmp_path)
    assert a.lead == () and "No sentence on the first screen: its first cell has no hash or frozen" in a.markdown
