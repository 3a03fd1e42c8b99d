"""The gap plane, the crossing line, a role's law and leave-one-out, on synthetic maps with known
parameters and seeded noise."""
import math

import numpy as np
import pandas as pd
import pytest

from studylib.study.comparisons.token_budget import plane as F
from studylib.study.analysis.law.fit import role_law

SIZES, TPP = (1e6, 3e6, 1e7), (1.0, 3.5, 10.0, 28.9)


def _gap_map(b, sd=0.01, seeds=5, sizes=SIZES, tpp=TPP, seed=0):
    """Per-seed gaps b0 + b1 (u - u0) + b2 (v - v0) + b3 (u - u0)(v - v0) + noise, centred on the
    grid's means of log10 tokens/param (u0) and log10 params (v0), as gap_frame's rows (params from
    tokens / tokens_per_param)."""
    rng = np.random.default_rng(seed)
    u0, v0 = np.log10(tpp).mean(), np.log10(sizes).mean()
    rows = []
    for n in sizes:
        for t in tpp:
            u, v = math.log10(t) - u0, math.log10(n) - v0
            for s in range(seeds):
                rows.append({"size": f"m{n:g}", "seed": s, "tokens": t * n, "tokens_per_param": t,
                             "value": b[0] + b[1] * u + b[2] * v + b[3] * u * v + rng.normal(0, sd)})
    return pd.DataFrame(rows)


def test_gap_model_recovers_its_coefficients():
    truth = (0.01, 0.03, -0.02, 0.015)
    m = F.gap_model(_gap_map(truth), n_boot=2000)
    assert m.terms == F.TERMS and m.n_cells == 12 and m.n_obs == 60
    for name, b in zip(F.TERMS, truth):  # whether the CIs cover: the coverage test below (one map
        c = m.coefs[name]                  # misses with 5% probability per coefficient)
        assert c.ci_low < c.estimate < c.ci_high and c.estimate == pytest.approx(b, abs=0.01)
    assert m.coefs["tokens_per_param"].verdict == "positive" and m.coefs["size"].verdict == "negative"
    # the estimate is ordinary least squares on every seed
    df = _gap_map(truth)
    u, v = np.log10(df["tokens_per_param"]) - m.centre[0], np.log10(df["tokens"] / df["tokens_per_param"]) - m.centre[1]
    X = np.column_stack([np.ones_like(u), u, v, u * v])
    assert m.fit.point == pytest.approx(np.linalg.lstsq(X, df["value"], rcond=None)[0], abs=1e-12)


def test_bootstrap_interval_coverage_is_near_nominal():
    """Resampling seeds within cells (variance-corrected): 95% intervals of the three coefficients
    cover the truth in ~95% of 150 synthetic maps (plain resampling of 5 seeds gives ~91%)."""
    truth = (0.01, 0.03, -0.02, 0.0)
    hits = [np.mean([c.ci_low <= b <= c.ci_high for b, c in zip(truth, (m.coefs[t] for t in F.TERMS[:3]))])
            for m in (F.gap_model(_gap_map(truth, seed=r), interaction=False, n_boot=500, seed=r) for r in range(150))]
    assert 0.90 <= np.mean(hits) <= 0.99


def test_gap_model_says_what_the_grid_does_not_identify():
    one = F.gap_model(_gap_map((0.01, 0.03, 0, 0), sizes=(3e6,)), n_boot=200)
    assert one.terms == ("intercept", "tokens_per_param")
    assert not one.coefs["size"].identified and one.coefs["size"].reason == "the grid has one model size"
    assert one.coefs["size"].verdict == "not identified" and math.isnan(one.coefs["size"].estimate)
    small = F.gap_model(_gap_map((0.01, 0.03, -0.02, 0), sizes=(1e6, 1e7), tpp=(1.0, 10.0)), n_boot=200)
    assert "interaction" not in small.terms and "four-term model" in small.coefs["interaction"].reason
    # sizes and tokens/param moving together (one budget per size, T = N / 1e6) identify neither slope
    diag = pd.concat([_gap_map((0, 0.03, 0, 0), sizes=(n,), tpp=(n / 1e6,)) for n in SIZES])
    d = F.gap_model(diag, n_boot=50)
    assert d.terms == ("intercept",) and "vary together" in d.coefs["size"].reason
    with pytest.raises(ValueError, match="gap_model: the per-seed frame has no column 'value'"):
        F.gap_model(_gap_map((0, 0, 0, 0)).drop(columns="value"))


def test_crossing_line_is_where_the_fitted_gap_is_zero():
    # no interaction: gap = 0.01 + 0.03 u - 0.02 v is zero at u = u0 + (0.02 (v - v0) - 0.01) / 0.03
    m = F.gap_model(_gap_map((0.01, 0.03, -0.02, 0.0), sd=0.002), interaction=False, n_boot=1000)
    cr = m.crossing()
    assert cr["params"].tolist() == list(SIZES)
    b0, b1, b2 = (m.coefs[t].estimate for t in F.TERMS[:3])
    u_star = m.centre[0] + (-b0 - b2 * (np.log10(SIZES) - m.centre[1])) / b1
    assert np.log10(cr["tokens_per_param"].to_numpy()) == pytest.approx(u_star, abs=1e-9)
    assert ((cr["low"] <= cr["tokens_per_param"]) & (cr["tokens_per_param"] <= cr["high"])).all()
    assert not cr["extrapolated"].any()
    far = m.crossing(params=[1e9])  # a size beyond the map: extrapolated
    assert far["extrapolated"].all()


def test_leave_one_out_has_one_row_per_point_and_mostly_covers():
    df = _gap_map((0.01, 0.03, -0.02, 0.0))
    loo = F.leave_one_out(df, n_boot=400, interaction=False)
    assert len(loo) == 12 and set(zip(loo["params"], loo["tokens_per_param"])) == set(
        zip(np.round(df["tokens"] / df["tokens_per_param"]), df["tokens_per_param"]))
    assert loo["inside"].mean() >= 0.75 and (loo["n"] == 5).all()
    assert not loo["extrapolated"].any()  # a corner left out still leaves both ranges whole here
    # a point far off the plane is not inside its prediction interval
    bad = df.copy()
    bad.loc[(bad["tokens_per_param"] == 3.5) & (bad["tokens"] == 3.5e6), "value"] += 0.2
    out = F.leave_one_out(bad, n_boot=400, interaction=False)
    assert not out.set_index(["params", "tokens_per_param"]).loc[(1e6, 3.5), "inside"]


# a role's law: the "chinchilla" form of the joint law
LAW = {"E": 1.8, "A": 50.0, "alpha": 0.35, "B": 30.0, "beta": 0.3}


def _losses(sizes=(1e5, 3e5, 1e6, 3e6), tpp=(1, 3, 10, 30), seeds=4, sd=0.003, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        for t in tpp:
            loss = LAW["E"] + LAW["A"] / n ** LAW["alpha"] + LAW["B"] / (t * n) ** LAW["beta"]
            rows += [{"params": n, "tokens": t * n, "seed": s, "value": loss * math.exp(rng.normal(0, sd))}
                     for s in range(seeds)]
    return pd.DataFrame(rows)


def test_loss_law_recovers_its_parameters_and_the_ci_covers_them():
    law = role_law(_losses(), n_boot=20)
    for k, v in LAW.items():
        c = law.coefs[k]
        assert c.identified and c.ci_low <= v <= c.ci_high, (k, c)
        assert c.estimate == pytest.approx(v, rel=0.15)
    point, draws = law.predict_draws([1e6, 1e8], [1e7, 1e10])
    assert law.extrapolated([1e6, 1e8], [1e7, 1e10]).tolist() == [False, True] and draws.shape == (20, 2)
    assert point[0] == pytest.approx(LAW["E"] + LAW["A"] / 1e6 ** 0.35 + LAW["B"] / 1e7 ** 0.3, rel=0.01)


def test_loss_law_with_one_size_does_not_print_what_it_cannot_know():
    law = role_law(_losses(sizes=(1e6,), tpp=(1, 3, 10, 30, 100)), n_boot=10)
    bad = {k for k, c in law.coefs.items() if not c.identified}
    assert bad == {"E", "A", "alpha"}
    assert all(math.isnan(law.coefs[k].estimate) for k in bad)
    assert law.coefs["beta"].identified and law.coefs["B"].identified
    assert law.coefs["E"].reason == "the grid has one model size"
    with pytest.raises(ValueError, match="role law: column 'value' must be positive"):
        role_law(_losses().assign(value=-1.0))


def test_loss_law_with_two_sizes_leaves_its_size_term_unidentified():
    """Two sizes give two asymptotes E + A/N^alpha for three unknowns: E, A and alpha trade off
    however many budgets pin each size's curve; B and beta stay identified and recovered."""
    law = role_law(_losses(sizes=(1e6, 1e7), tpp=(1, 3, 10, 30, 100)), n_boot=10)
    bad = {k for k, c in law.coefs.items() if not c.identified}
    assert bad == {"E", "A", "alpha"}
    assert law.coefs["E"].reason == "the grid has 2 model sizes: A and alpha trade off (a power law with its floor needs three)"
    assert law.coefs["beta"].estimate == pytest.approx(LAW["beta"], rel=0.15)
    three = role_law(_losses(sizes=(1e6, 1e7, 1e8), tpp=(1, 3, 10, 30, 100)), n_boot=10)
    assert not [k for k, c in three.coefs.items() if not c.identified]
