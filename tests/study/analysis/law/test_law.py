"""The joint law of the three models (issue #40) on synthetic maps of the token-budget grid's shape:
three sizes (the MoE's N_active 9e4, 2e5, 3.6e5; N_total = 1.43 N_active; the dense active match
1.01 N_active, the dense total match N_total), 1, 3.5 and 10 tokens per active parameter at each size
and 28.9 at the two larger, 0.87M unique tokens (0.1 to 12 passes), two repetition cells (the same
D from half and a quarter of the stories), three seeds per cell, seed noise of sd 0.01 bits per byte
on losses of 1.4 to 2.5 bits per byte. The losses come from known parameters (:data:`TRUE`)."""
import math
import runpy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from studylib.study.analysis.law import checks as C
from studylib.study.analysis.law import fit as J
from studylib.study.analysis.law import form as F
from studylib.study.analysis.law import words as W
from studylib.study.analysis.paper import PAPER_MODELS, PAPER_POSITION, PAPER_TABLE6
from studylib.study.analysis.position import ROLES, position
from studylib.study.comparisons.token_budget.glance import map_glance

TRUE = {"E": 0.8, "A": 34.0, "alpha": 0.35, "B": 32.0, "beta": 0.3, "lambda": 0.6, "R*": 5.0}
SIZES = {"s": 9e4, "m": 2e5, "l": 3.6e5}
TPP = {"s": (1, 3.5, 10), "m": (1, 3.5, 10, 28.9), "l": (1, 3.5, 10, 28.9)}
UNIQUE, RATIO, SD = 0.87e6, 1.43, 0.01


def _true_loss(role, active, total, tokens, unique, p=TRUE, m=None, rstar=None):
    """The generating law: N_eff = N_active^(1-lambda) N_total^lambda for the MoE (or m N_active
    where ``m`` is given), Muennighoff's D_eff with R* (per role where ``rstar`` is a dict)."""
    if role != "moe":
        neff = active
    else:
        neff = active * m if m is not None else active ** (1 - p["lambda"]) * total ** p["lambda"]
    seen = min(tokens, unique)
    rs = p["R*"] if rstar is None else rstar[role]
    d_eff = seen + seen * rs * (1 - math.exp(-(tokens / seen - 1) / rs))
    return p["E"] + p["A"] / neff ** p["alpha"] + p["B"] / d_eff ** p["beta"]


def _map(seed=0, sizes=SIZES, tpp=TPP, repeats=True, seeds=3, sd=SD, ratio=RATIO, **law):
    """One row per run (role, size, seed, active, total, tokens, unique, value)."""
    rng = np.random.default_rng(seed)
    cells = [(s, t * n, UNIQUE) for s, n in sizes.items() for t in tpp[s]]
    if repeats:
        cells += [("m", 10 * sizes["m"], UNIQUE / 2), ("m", 10 * sizes["m"], UNIQUE / 4)]
    rows = []
    for size, d, u in cells:
        n = sizes[size]
        r = ratio[size] if isinstance(ratio, dict) else ratio
        trio = {"dense_active": (1.01 * n, 1.01 * n), "moe": (n, r * n), "dense_total": (r * n, r * n)}
        for role, (a, t) in trio.items():
            mu = _true_loss(role, a, t, d, u, **law)
            rows += [{"role": role, "size": size, "seed": k, "active": a, "total": t, "tokens": d, "unique": u,
                      "value": mu + rng.normal(0, sd)} for k in range(seeds)]
    return pd.DataFrame(rows)


def _true_theta():
    return np.log([TRUE["E"], TRUE["A"], TRUE["B"]]).tolist() + [TRUE["alpha"], TRUE["beta"], TRUE["lambda"],
                                                                  math.log(TRUE["R*"])]


@pytest.fixture(scope="module")
def law():
    return J.fit_law(_map(0), n_boot=40, n_boot_cell=40)


def test_the_map_has_the_grid_shape():
    df = _map(0)
    passes = df["tokens"] / df["unique"]
    assert len(df) == 13 * 3 * 3 and 0.1 < passes.min() < 0.11 and 11 < passes.max() < 12.5
    assert 1.4 < df["value"].min() and df["value"].max() < 2.5


def test_the_fit_recovers_the_generating_parameters(law):
    """Tolerances: over 40 maps like this one the estimates' sd was 0.047 (lambda), 0.053 (alpha),
    0.010 (beta) and 6% (R*); each bound is about three of those."""
    t = law.table()
    assert list(t.index) == ["E", "A", "B", "alpha", "beta", "lambda", "R*"] and t["identified"].all()
    assert t.loc["lambda", "estimate"] == pytest.approx(TRUE["lambda"], abs=0.15)
    assert t.loc["alpha", "estimate"] == pytest.approx(TRUE["alpha"], abs=0.15)
    assert t.loc["beta", "estimate"] == pytest.approx(TRUE["beta"], abs=0.03)
    assert abs(math.log(t.loc["R*", "estimate"] / TRUE["R*"])) < 0.2
    for lo, hi in (("ci_low", "ci_high"), ("cell_ci_low", "cell_ci_high")):
        assert (t[lo] < t["estimate"]).all() and (t["estimate"] < t[hi]).all()
    # a refit from a moved start reaches the same optimum
    again = J.fit_law(_map(0), n_boot=0, n_boot_cell=0, start=law.theta + 0.05)
    assert again.theta == pytest.approx(law.theta, abs=1e-5)
    (lo,), (hi,) = law.at("moe", 2e5, 2.86e5, 2e6, UNIQUE).interval()
    assert lo < _true_loss("moe", 2e5, 2.86e5, 2e6, UNIQUE) < hi and not law.extrapolated(2e5, 2e6)[0]
    assert law.extrapolated(1.477e7, 4.263e8)[0]


def test_the_jacobian_of_every_form_is_its_derivative():
    """Each form's analytic Jacobian against central finite differences (h = 1e-6) at a point away
    from the optimum, where every column moves."""
    X = F.design(J.runs_frame(_map(0)))
    for form in F.FORMS:
        for per_role in ((False, True) if form in F.JOINT_FORMS else (False,)):
            theta = np.array([0.1, 2.0, 3.0, 0.3, 0.35, 0.4, 1.0, 2.0, 0.5])[:len(F.bounds(form, per_role)[0])]
            fd = np.stack([(F.log_loss(theta + h, X, form) - F.log_loss(theta - h, X, form)) / 2e-6
                           for h in np.eye(len(theta)) * 1e-6], axis=1)
            J_form = F.log_loss_jacobian(theta, X, form)[1]
            assert J_form.shape == fd.shape and np.abs(J_form - fd).max() < 1e-6, (form, per_role)


def test_the_named_parameters_pack_and_unpack():
    theta = np.arange(9.0)
    p = F.unpack(theta, "lambda")
    assert p.alpha.tolist() == [3.0] and p.lam.tolist() == [5.0] and p.log_rstar.tolist() == [6.0, 7.0, 8.0]
    assert F.pack(p).tolist() == theta.tolist() and F.unpack(theta[:5], "chinchilla").beta.tolist() == [4.0]
    assert F.param_names("multiplier", True) == ("E", "A", "B", "alpha", "beta", "m", "R*_dense_active", "R*_moe",
                                                 "R*_dense_total")
    lo, hi = F.bounds("multiplier")
    assert np.exp([lo[5], hi[5], lo[6], hi[6]]) == pytest.approx([*F.M_BOUNDS, *F.RSTAR_BOUNDS])
    assert F.natural(np.log([2.0, 3.0, 4.0]).tolist() + [0.3, 0.2], "chinchilla") == pytest.approx([2, 3, 4, 0.3, 0.2])


def test_seed_intervals_cover_lambda_and_alpha_near_their_nominal_rate():
    """30 maps, 20 seed replicates each (a 95% percentile interval from 20 draws is coarse); the
    point fit starts at the truth to save the grid (its optimum is the grid's: the test above)."""
    hits = []
    for r in range(30):
        t = J.fit_law(_map(100 + r), n_boot=20, n_boot_cell=0, seed=r, start=_true_theta()).table()
        hits.append([t.loc[k, "ci_low"] <= TRUE[k] <= t.loc[k, "ci_high"] for k in ("lambda", "alpha")])
    rate = np.mean(hits, axis=0)
    assert (rate >= 0.7).all(), f"coverage of lambda, alpha: {rate} (nominal 0.95)"


def test_the_coverage_script_measures_every_parameter(capsys):
    """scripts/law_coverage.py (the rate at more maps and replicates, docs/statistics.md) cannot rot."""
    script = runpy.run_path(str(Path(__file__).resolve().parents[4] / "scripts" / "law_coverage.py"))
    assert script["main"](["--maps", "2", "--boot", "8", "--jobs", "1", "--held-out", "1"]) == 0
    out = capsys.readouterr().out
    for k in TRUE:
        assert sum(line.split()[1] == k for line in out.splitlines()[1:-1]) == 2, (k, out)
    assert "2 maps x 8 replicates" in out
    assert "held-out size, 1 maps x 8 replicates" in out and "by quantity: loss" in out


def test_the_form_choice_picks_the_generating_form():
    # this grid: N_total / N_active is 1.43 at every size, so the forms tie unless m leaves [1, 1.43]
    lam = C.choose(_map(1))
    assert lam.form == "lambda" and not lam.per_role_rstar and lam.errors["chosen"].sum() == 1
    assert len(lam.errors) == 2 * len(C.CANDIDATES) and "N_total / N_active is 1.43 at every size" in C.choice_sentence(lam.errors)
    mult = C.choose(_map(1, m=2.0), per_role=(False,))  # the MoE worth 2x its active N: beyond lambda = 1
    e = mult.errors.set_index("form")["loo_mse"]
    assert mult.form == "multiplier" and e["multiplier"] < 0.5 * e["lambda"]
    # where the ratio grows with size (more experts at larger sizes) lambda wins on its own data
    grown = C.choose(_map(1, ratio={"s": 1.2, "m": 2.0, "l": 4.0}), per_role=(False,))
    e = grown.errors.set_index("form")["loo_mse"]
    assert grown.form == "lambda" and e["lambda"] < 0.5 * e["multiplier"]
    assert "at every size" not in C.choice_sentence(grown.errors)
    per = C.choose(_map(1, rstar={"dense_active": 1.0, "moe": 1.0, "dense_total": 30.0}), forms=("lambda",))
    assert per.per_role_rstar and "so R* is one per role" in C.choice_sentence(per.errors)


def test_what_the_grid_cannot_identify_is_never_a_number():
    one = J.fit_law(_map(2, sizes={"m": 2e5}, tpp={"m": (1, 3.5, 10, 28.9)}), n_boot=5, n_boot_cell=5).table()
    for k in ("E", "A", "alpha", "lambda"):
        assert not one.loc[k, "identified"] and math.isnan(one.loc[k, "estimate"])
        assert "the grid has one model size" in one.loc[k, "reason"]
    assert W.paper_sentences(C.paper_point(J.fit_law(_map(2, sizes={"m": 2e5}, tpp={"m": (1, 3.5, 10)}),
                                                     n_boot=0, n_boot_cell=0)))[0].startswith(
        "The joint law is not carried to the paper's point")
    fresh = J.fit_law(_map(2, tpp={s: (0.2, 0.5) for s in SIZES}, repeats=False), n_boot=5, n_boot_cell=0).table()
    assert not fresh.loc["R*", "identified"] and "no cell repeats data" in fresh.loc["R*", "reason"]
    assert math.isnan(fresh.loc["R*", "estimate"]) and fresh.loc["lambda", "identified"]
    beyond = J.fit_law(_map(2, m=2.0), n_boot=0, n_boot_cell=0).table()  # the MoE worth more than lambda = 1
    assert not beyond.loc["lambda", "identified"] and math.isnan(beyond.loc["lambda", "estimate"])
    assert "the fit sits on the bound [0, 1]" in beyond.loc["lambda", "reason"]
    lonely = J.fit_law(_map(2, seeds=1), n_boot=5, n_boot_cell=0).table()
    assert (lonely["verdict"] == "no interval").all() and lonely["ci_low"].isna().all()
    assert lonely["reason"].str.startswith("no interval: 39 of 39 cells (one role at one map point) have one seed").all()


def _inside(t) -> tuple[int, int]:
    """(held-out points checked and inside their interval, points checked)."""
    return int((t["checked"] & t["inside"]).sum()), int(t["checked"].sum())


def _share(t) -> float:
    inside, checked = _inside(t)
    return inside / checked


def test_held_out_size_and_budget_are_mostly_inside():
    df = _map(3)
    t = C.held_out(df, "size", n_boot=30)
    assert len(t) == 4 * len(C.QUANTITIES) and (t["size"] == "l").all()
    # every loss and gap is checked; a position only where the dense pair is resolved apart (paired t, 3 seeds)
    pos = t["quantity"] == "position"
    assert t.loc[~pos, "checked"].all() and t.loc[pos & ~t["checked"], "note"].str.startswith("not defined").all()
    inside, checked = _inside(t)
    assert inside >= 0.75 * checked and C.held_out_verdict(t, "size") == (
        f"the law passes the held-out-size check: {inside} of {checked} points inside their 95% interval")
    budget = C.held_out(df, "budget", n_boot=20)
    assert sorted(set(budget["held_out"])) == ["1 tokens/param", "10 tokens/param", "28.9 tokens/param",
                                                "3.5 tokens/param"]
    assert len(budget) == 13 * len(C.QUANTITIES) and _share(budget) >= 0.75
    # a repeated cell whose steps round to 0.2% fewer tokens is held out with its budget, not alone
    off = df.assign(tokens=np.where(df["unique"] < UNIQUE, df["tokens"] * 0.998, df["tokens"]))
    assert [g for g, _ in C._groups(J.runs_frame(off), "budget")] == [
        "1 tokens/param", "3.5 tokens/param", "10 tokens/param", "28.9 tokens/param"]
    # a law that is wrong for the largest size fails: its MoE is as good as its total match there
    bad = df.copy()
    big = (bad["size"] == "l") & (bad["role"] == "moe")
    bad.loc[big, "value"] -= 0.04
    worse = C.held_out(bad, "size", n_boot=30)
    assert _share(worse) < min(_share(t), C.PASS_SHARE) and C.held_out_verdict(worse, "size").startswith("the law fails")


def test_a_mix_on_its_bound_predicts_at_the_bound_and_says_so():
    """The MoE worth 0.9 of its active N (a multiplier below lambda = 0): the lambda form's fit holds
    lambda at 0. The parameter stays "not identified" (no interval), but the law's predictions are
    the constrained fit's, checked against held-out cells and carried to the paper's point."""
    df = _map(5, m=0.9)
    law = J.fit_law(df, n_boot=10, n_boot_cell=0)
    assert law.on_bound == {"lambda": 0.0} and not law.coefs["lambda"].identified
    t = C.held_out(df, "size", n_boot=20)
    assert t.loc[t["quantity"] != "position", "checked"].all() and _inside(t)[1] >= 15
    assert set(t.loc[t["checked"], "note"]) == {"lambda held at its bound 0 by the fit"}
    assert C.held_out_verdict(t, "size").endswith("interval (lambda held at its bound 0 by the fit)")
    paper = C.paper_point(law).set_index("quantity")
    assert paper.loc["lambda", "estimate"] == 0.0 and paper.loc["position", "identified"]
    # issue 49: every replicate holds lambda there too, so what rests on it has no interval of its own
    # (before: a near-zero-width one, "p = -0.03 [-0.03, -0.03]"), and the first screen says "on the bound"
    assert paper.loc["gap_active", "reason"] == "lambda held at its bound 0 by the fit" + C.ON_BOUND
    rests = ["loss_dense_active", "loss_moe", "gap_active", "gap_total", "position"]
    assert paper.loc[rests, "estimate"].notna().all() and paper.loc[rests, ["ci_low", "ci_high"]].isna().all().all()
    assert paper.loc["position", "paper_inside"] is None
    words = W.paper_sentences(C.paper_point(law))
    assert "lambda = 0, held at its bound by the fit (no interval)" in words[1]
    assert "(lambda held at its bound 0 by the fit: on the bound, no interval)" in words[0]
    rows, lead = map_glance(pd.DataFrame({"tokens_per_param": [1.0]}), None, C.paper_point(law))
    law_row = rows[-1]
    for cell in (law_row.dense_active, law_row.moe, law_row.gap_active, law_row.gap_total, law_row.position):
        assert cell.endswith(" (on the bound)") and "[" not in cell  # a loss rests on every parameter but R*
    assert "(on a bound, no interval)" in lead[-1]
    both = C.held_out(_map(6, m=0.9), "budget", n_boot=5)  # several refits: the note names each one's
    assert "held at its bound 0 by the fit without 1 tokens/param" in C.held_out_verdict(both, "budget")


def test_held_out_intervals_carry_the_noise_of_their_budget():
    """Seeds that scatter 10x more at 1 token/param (a stalled run) widen only that budget's
    held-out intervals, not those at 10 tokens/param (a pooled sd would widen both alike)."""
    df = _map(4)
    rng = np.random.default_rng(0)
    stall = df["tokens"] == df["active"].where(df["role"] == "moe").groupby(df["size"]).transform("max")
    df.loc[stall, "value"] += rng.normal(0, 0.1, stall.sum())
    t = C.held_out(df, "size", n_boot=20)
    width = (t["pi_high"] - t["pi_low"]).where(t["quantity"] == "loss_moe").groupby(t["tokens_per_param"].round()).max()
    assert width[1] > 3 * width[10], width  # pooled over budgets: 0.05 at 1, 0.07 at 10


def test_paper_point_contains_the_generating_position(law):
    t = C.paper_point(law).set_index("quantity")
    n = {"dense_active": (14.89e6, 14.89e6), "moe": (14.77e6, 21.06e6), "dense_total": (21.06e6, 21.06e6)}
    true = [_true_loss(r, *n[r], 426.3e6, 426.3e6) for r in ROLES]
    p_true = (true[0] - true[1]) / (true[0] - true[2])
    assert t.loc["position", "ci_low"] <= p_true <= t.loc["position", "ci_high"]
    assert t.loc["position", "paper"] == pytest.approx(0.81, abs=0.005)
    p = t.loc["position"]
    assert p["paper_inside"] == (p["ci_low"] <= PAPER_POSITION <= p["ci_high"])
    assert t.loc["gap_active", "ci_low"] <= true[0] - true[1] <= t.loc["gap_active", "ci_high"]
    assert t.loc["ordering", "note"] == "dense_total < moe < dense_active" == t.loc["ordering", "paper_note"]
    assert t.loc["decades", "estimate"] == pytest.approx(math.log10(14.77e6 / 3.6e5)) and t["extrapolated"].all()
    words = W.paper_sentences(C.paper_point(law))
    assert len(words) <= 3 and f"p = {t.loc['position', 'estimate']:.2f}" in words[0] and "extrapolation" in words[0]
    assert f"{t.loc['lambda', 'estimate']:.3f}" in words[1]


def test_the_papers_position_agrees_between_its_tables():
    """Table 2's gaps (PAPER_POSITION) and Table 6's per-seed losses give one position."""
    m = PAPER_TABLE6.mean()
    assert position(*(m[PAPER_MODELS[r]] for r in ROLES)) == pytest.approx(PAPER_POSITION, abs=2e-3)
    assert PAPER_POSITION == pytest.approx(0.0758 / (0.0758 + 0.0180))


def test_position_by_hand():
    assert position(2.0, 1.9, 1.8) == pytest.approx(0.5)
    assert position(2.0, 2.05, 1.9) == pytest.approx(-0.5)  # the MoE worse than its active match
    assert position([1.0, 3.0], [0.5, 2.0], [0.0, 2.0]).tolist() == pytest.approx([0.5, 1.0])
    assert math.isnan(position(1.8, 1.7, 1.8))


def _cell(la, lm, lt, seeds=(1, 2, 3), size="m"):
    return pd.DataFrame([{"size": size, "tokens": 1e6, "unique": 8.7e5, "role": r, "seed": s, "value": v[i]}
                         for r, v in zip(ROLES, (la, lm, lt)) for i, s in enumerate(seeds)])


def test_position_per_cell():
    r = C.cell_position(_cell([2.00, 2.02, 1.99], [1.95, 1.94, 1.96], [1.90, 1.905, 1.89]))
    # means 2.003333, 1.95, 1.898333: p = 0.053333 / 0.105
    assert r["position_defined"] and r["position"] == pytest.approx(0.507937, abs=1e-6)
    assert 0 < r["position_low"] < r["position"] < r["position_high"] < 1
    close = C.cell_position(_cell([2.00, 2.03, 1.97], [1.95, 1.96, 1.94], [1.99, 2.02, 1.99]))
    assert not close["position_defined"] and math.isnan(close["position"])
    assert close["position_reason"].startswith("not defined")
    one = C.cell_position(_cell([2.0], [1.95], [1.9], seeds=(1,)))
    assert one["position"] == pytest.approx(0.5) and math.isnan(one["position_low"])
    assert "no interval" in one["position_reason"]


def test_a_frame_that_is_not_the_map_is_refused():
    df = _map(0)
    with pytest.raises(ValueError, match="no column"):
        J.fit_law(df.drop(columns="unique"))
    with pytest.raises(ValueError, match="active and total parameters must agree"):
        J.fit_law(df.assign(total=df["active"] * 1.43))
    with pytest.raises(ValueError, match="form must be one of"):
        J.fit_law(df, form="clark")


def test_a_run_far_off_is_named_and_its_weight_on_the_answer_measured():
    """issue 49: one run's loss x 3 (a damaged or diverged run) moved the whole answer silently; x 100
    raised a ValueError. Now the run is named by its standardised residual, the position at the paper's
    point is refitted without each run, and a non-positive bootstrap replicate costs the intervals,
    in one reason, not the fit."""
    df = _map(7)
    clean = C.influence(df, J.fit_law(df, n_boot=0, n_boot_cell=0))
    assert len(clean) == len(df) and not clean["beyond"].any()
    assert clean["std_residual"].abs().max() < C.RESIDUAL_LIMIT and clean["position_change"].abs().max() < 0.1
    bad = df.copy()
    hit = (bad["role"] == "moe") & (bad["size"] == "l") & (bad["seed"] == 1) & (bad["tokens"] == 10 * SIZES["l"])
    bad.loc[hit, "value"] *= 3
    law = J.fit_law(bad, n_boot=20, n_boot_cell=0)
    runs = C.influence(bad, law)
    far = runs[runs["beyond"]]
    assert len(far) == 1 and (far["role"].iloc[0], far["size"].iloc[0], far["seed"].iloc[0]) == ("moe", "l", 1)
    assert far["std_residual"].iloc[0] > 10 * C.RESIDUAL_LIMIT
    # without it the position is the clean map's: leaving one run out undoes it
    assert far["position_without"].iloc[0] == pytest.approx(clean["position"].iloc[0], abs=0.02)
    words = W.influence_sentence(runs, C.paper_point(law))
    assert words.startswith(f"1 of {len(bad)} runs lie beyond 4 robust sd of the joint law: moe of size l seed 1 at ")
    assert " tokens (+" in words and "moves it from" in words
    huge = df.copy()
    huge.loc[hit, "value"] *= 100
    t = J.fit_law(huge, n_boot=20, n_boot_cell=0).table()
    assert t["ci_low"].isna().all() and t["reason"].str.contains("bootstrap replicates hold a loss <= 0").all()
