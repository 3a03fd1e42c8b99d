"""Clark et al. 2022's curves (studylib.study.comparisons.controls.clark): the position p between the dense
matches reproduces SOURCE.md's figures on the shared file, is exact on a synthetic dense law that
is linear in log N, and bad input gives one clear error naming the file."""
from __future__ import annotations

import gzip
import math

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from studylib.study.comparisons.controls import clark, clark_tables
from studylib.study.analysis.paper import PAPER_ACTIVE_PARAMS, PAPER_POSITION
from conftest import ROOT

SHARED = ROOT.parent / "shared" / "data" / "clark2022" / "curves.csv.gz"


@pytest.fixture(scope="module")
def last() -> pd.DataFrame:
    if not SHARED.is_file():
        pytest.skip(f"Clark et al. 2022's curves are not on this machine ({SHARED}; see SOURCE.md beside it)")
    return clark.last_evaluations(clark.load_curves(SHARED))


@pytest.fixture(autouse=True)
def _close():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


# --------------------------------------------------------------------------------------------
# the shared file
# --------------------------------------------------------------------------------------------
def test_the_default_path_is_the_shared_folder_beside_the_repository():
    assert clark.clark_file(ROOT) == SHARED.resolve()


def test_e4_positions_reproduce_source_md(last):
    """SOURCE.md (measured by whoever fetched the file): S-Base 0.57, 0.62, 0.70, 0.75; Hash
    0.32, 0.37, 0.40, 0.40 at 15M, 25M, 55M, 130M with E = 4."""
    pos = clark.positions(last).set_index(["router", "experts", "size_label"])["p"]
    sizes = ["15M", "25M", "55M", "130M"]
    assert [round(pos["S-Base", 4, s], 2) for s in sizes] == [0.57, 0.62, 0.70, 0.75]
    assert [round(pos["Hash", 4, s], 2) for s in sizes] == [0.32, 0.37, 0.40, 0.40]


def test_the_file_shapes_the_method_rests_on(last):
    """One run per routed config in the main setting, the 130M dense averaged over its 3 seeds,
    and the 1.3B routed runs (total N beyond the largest dense) without a position."""
    dense = clark.dense_sizes(last)
    assert list(dense["size_label"]) == ["15M", "25M", "55M", "130M", "370M", "1.3B"]
    assert dict(zip(dense["size_label"], dense["n"]))["130M"] == 3
    pos = clark.positions(last)
    assert set(pos["n"]) == {1}
    big = pos[pos["size_label"] == "1.3B"]
    assert len(big) == 6 and big["p"].isna().all() and big["note"].str.contains("outside the plain dense").all()
    assert pos.loc[pos["size_label"] != "1.3B", "p"].notna().all()


def test_the_law_frame_splits_15_55m_from_130m(last):
    f = clark.law_frame(last)
    assert set(f.loc[f["split"] == "fit", "size"]) == {"15M", "25M", "55M"}
    assert set(f.loc[f["split"] == "held_out", "size"]) == {"130M"}
    assert f.groupby("role").size().to_dict() == {"dense_active": 6, "moe": 8}  # 130M dense: 3 seeds
    assert set(f["router"]) == {"Dense", "S-Base"} and set(f.loc[f["role"] == "moe", "experts"]) == {4, 8}
    assert (f["step"] == 249_000).all() and (f["tokens"] == f["unique"]).all()
    d = f[f["role"] == "dense_active"]
    assert (d["active"] == d["total"]).all() and (f["total"] >= f["active"]).all()


# --------------------------------------------------------------------------------------------
# the method on a synthetic frame with known answers
# --------------------------------------------------------------------------------------------
A, B = 5.0, 0.25  # dense law L = A - B ln N: linear in log N, so the interpolation is exact


def _law(n):
    return A - B * np.log(n)


def _row(hid, router, e, n_active, n_total, loss, step=100, seed=42, k=1, freq=0.5, flop=1.0, label="x"):
    return {"hyper_id": hid, "step": step, "loss_validation": loss, "router_type": router, "num_experts": e,
            "k": k, "routing_frequency": freq, "flop_increase": flop, "seed": seed,
            "dense_parameter_count": n_active, "total_parameter_count": n_total, "model_size_label": label}


def _synthetic() -> tuple[pd.DataFrame, dict]:
    """Dense at 1e6, 1e7, 1e8 on the law (the 1e7 size from two seeds at law +- 0.05); routed
    runs whose total N falls between the dense sizes, placed at known p; decoys that the method
    must ignore: an earlier evaluation, a wider-FFN dense run, a k = 2 run, one beyond the range."""
    rows = [_row(0, "Dense", 1, 1e6, 1e6, _law(1e6), label="1M"),
            _row(1, "Dense", 1, 1e7, 1e7, _law(1e7) + 0.05, seed=1, label="10M"),
            _row(2, "Dense", 1, 1e7, 1e7, _law(1e7) - 0.05, seed=2, label="10M"),
            _row(3, "Dense", 1, 1e8, 1e8, _law(1e8), label="100M"),
            _row(3, "Dense", 1, 1e8, 1e8, 99.0, step=50, label="100M"),  # an earlier evaluation
            _row(4, "Dense", 1, 1e7, 1e7, 0.0, flop=4.0, label="10M")]  # wider FFN: not a plain baseline
    want = {}
    for hid, (router, e, na, nt, p) in enumerate([("S-Base", 4, 2e6, 5e6, 0.6), ("Hash", 4, 2e6, 5e6, 0.3),
                                                  ("S-Base", 8, 3e6, 4e7, 0.75), ("Hash", 8, 1e6, 1e8, -0.2)],
                                                 start=10):
        la, lt = _law(na), _law(nt)
        rows.append(_row(hid, router, e, na, nt, la - p * (la - lt), label=f"{na:g}"))
        rows.append(_row(hid, router, e, na, nt, 50.0, step=10, label=f"{na:g}"))  # earlier: ignored
        want[(router, e)] = p
    rows.append(_row(20, "S-Base", 4, 2e6, 5e6, 0.0, k=2, label="2e+06"))  # not the main setting
    rows.append(_row(21, "S-Base", 4, 5e7, 2e8, 1.0, label="5e+07"))  # total beyond the largest dense
    return pd.DataFrame(rows), want


def test_position_is_exact_on_a_dense_law_linear_in_log_n():
    curves, want = _synthetic()
    pos = clark.positions(clark.last_evaluations(curves))
    got = pos.dropna(subset=["p"]).set_index(["router", "experts"])["p"]
    assert set(got.index) == set(want)
    for key, p in want.items():
        assert got[key] == pytest.approx(p, abs=1e-12)
    beyond = pos[pos["n_active"] == 5e7].iloc[0]
    assert math.isnan(beyond["p"]) and "total N 200M outside" in beyond["note"]
    assert (pos["n"] == 1).all()  # the k = 2 run is not averaged in


def test_interpolation_is_in_log_n_not_n():
    """Between 1e6 and 1e7 the dense loss at 5e6 is the law's, not the straight line in N."""
    curves, _ = _synthetic()
    dense = clark.dense_sizes(clark.last_evaluations(curves))
    assert list(dense["n"]) == [1, 2, 1] and dense["loss"].iloc[1] == pytest.approx(_law(1e7))
    got = clark.dense_loss_at(dense, [5e6, 1e6, 1e8, 5e5, 2e8])
    assert got[0] == pytest.approx(_law(5e6), abs=1e-12)
    linear_in_n = _law(1e6) + (5e6 - 1e6) / (1e7 - 1e6) * (_law(1e7) - _law(1e6))
    assert abs(got[0] - linear_in_n) > 0.05
    assert got[1:3] == pytest.approx([_law(1e6), _law(1e8)]) and np.isnan(got[3:]).all()


def test_trend_matches_scipy_linregress_and_reads_out_with_its_intervals():
    rng = np.random.default_rng(3)
    n = np.array([1.5e7, 2.5e7, 5.5e7, 1.3e8, 3.7e8])
    p = 0.2 + 0.06 * np.log10(n) + rng.normal(0, 0.02, n.size)
    pos = pd.DataFrame({"router": "S-Base", "experts": 4, "n_active": n, "p": p})
    t = clark_tables.trends(pos)[("S-Base", 4)]
    ref = stats.linregress(np.log10(n), p)
    half = stats.t.ppf(0.975, n.size - 2) * ref.stderr
    assert (t.slope, t.slope_lo, t.slope_hi) == pytest.approx((ref.slope, ref.slope - half, ref.slope + half))
    at = t.at([1e5, 5e7])
    assert at["p"].to_numpy() == pytest.approx(ref.intercept + ref.slope * np.log10([1e5, 5e7]))
    assert ((at["pi_lo"] < at["ci_lo"]) & (at["ci_lo"] < at["p"]) & (at["p"] < at["ci_hi"])
            & (at["ci_hi"] < at["pi_hi"])).all()
    assert at["decades_out"].to_numpy() == pytest.approx([np.log10(1.5e7 / 1e5), 0.0])
    tab = clark_tables.trend_table({("S-Base", 4): t}, {"0.1M": 1e5, "50M": 5e7})
    assert list(tab["readout"]) == ["extrapolated, 2.18 decades below Clark's sizes", "inside Clark's sizes"]
    two = pos.iloc[:2]
    assert clark_tables.trends(two) == {}  # two sizes: no interval, no trend


def test_position_against_size_holds_every_source_and_the_figure_draws_them():
    curves, _ = _synthetic()
    pos = clark.positions(clark.last_evaluations(curves))
    cells = pd.DataFrame({"n_active": [59_072, 231_392], "p": [-0.36, 0.03], "p_lo": [-0.72, -0.14],
                          "p_hi": [-0.07, 0.19], "source": ["d 16, 28.9", "d 32, 3.53"]})
    tab = clark.position_against_size(cells, pos)
    assert tab["kind"].value_counts().to_dict() == {"Clark et al. 2022": 5, "this study": 2, "the paper": 1}
    paper = tab[tab["kind"] == "the paper"].iloc[0]
    assert (paper["n_active"], paper["p"]) == (PAPER_ACTIVE_PARAMS, PAPER_POSITION)
    assert tab.loc[tab["kind"] == "this study", "p"].tolist() == [-0.36, 0.03]
    fits = clark_tables.trends(pd.DataFrame({"router": "S-Base", "experts": 4, "n_active": [1e6, 1e7, 1e8],
                                      "p": [0.5, 0.6, 0.72]}))
    ax = clark_tables.position_against_size_figure(tab, fits).axes[0]
    assert ax.get_xscale() == "log"
    assert {0.0, 1.0} <= {ln.get_ydata()[0] for ln in ax.get_lines() if len(set(ln.get_ydata())) == 1}
    assert len(ax.containers) == 1  # this study's error bars


def test_cells_from_gap_table_keeps_undefined_cells_as_nan():
    table = pd.DataFrame({"moe_active": [59_072, 59_072], "size_label": ["d 16 (59k)"] * 2,
                          "tokens_per_param": [3.53, 28.9], "position": [np.nan, -0.36],
                          "position_low": [np.nan, -0.72], "position_high": [np.nan, -0.07],
                          "position_defined": [False, True], "position_reason": ["not defined: ...", ""]})
    cells = clark.cells_from_gap_table(table)
    assert list(cells.columns[:5]) == list(clark.STUDY_COLUMNS)
    assert math.isnan(cells["p"][0]) and cells["p"][1] == -0.36
    assert list(cells["source"]) == ["d 16 (59k), 3.53 tokens/param", "d 16 (59k), 28.9 tokens/param"]


# --------------------------------------------------------------------------------------------
# bad input: one clear line naming the file
# --------------------------------------------------------------------------------------------
def test_a_missing_column_is_one_error_naming_file_and_column(tmp_path):
    curves, _ = _synthetic()
    path = tmp_path / "curves.csv.gz"
    curves.drop(columns="loss_validation").to_csv(path, index=False)
    with pytest.raises(clark.ClarkDataError) as e:
        clark.load_curves(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "missing column(s) ['loss_validation']" in msg


def test_absent_unreadable_or_non_numeric_files_are_one_error_each(tmp_path):
    with pytest.raises(clark.ClarkDataError, match="curves are missing"):
        clark.load_curves(tmp_path / "nothing.csv.gz")
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(clark.ClarkDataError, match="not a readable CSV"):
        clark.load_curves(bad)
    curves, _ = _synthetic()
    text = tmp_path / "text.csv.gz"
    with gzip.open(text, "wt") as f:
        curves.assign(step="late").to_csv(f, index=False)
    with pytest.raises(clark.ClarkDataError, match=r"\['step'\] are not numeric"):
        clark.load_curves(text)


def test_study_cells_without_a_named_column_are_one_error():
    with pytest.raises(ValueError, match=r"study_cells: missing column\(s\) \['p_lo', 'p_hi'\]"):
        clark.position_against_size(pd.DataFrame({"n_active": [1.0], "p": [0.1], "source": ["x"]}),
                                    clark.positions(clark.last_evaluations(_synthetic()[0])))


# --------------------------------------------------------------------------------------------
# the study's law fitted on Clark's runs
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clark_fits():
    if not SHARED.is_file():
        pytest.skip(f"Clark et al. 2022's curves are not on this machine ({SHARED}; see SOURCE.md beside it)")
    last = clark.last_evaluations(clark.load_curves(SHARED))
    frame = clark.law_frame(last)
    return last, frame, clark_tables.fit_all(frame, n_boot=0)


def test_the_fitter_on_clarks_runs(clark_fits):
    """On Clark's 15-55M dense and S-Base runs: every parameter fitted, with no interval (one run
    per model and size, said); the size form's p at the fit sizes within 0.12 of the p computed
    directly from the runs (an independent computation: interpolated dense losses), the one-lambda
    form's lambda within 0.1 of the direct p's mean at the fit sizes; the 130M predicted within
    0.05 nats of the measured loss (the dense 130M's seed sd is 0.0007)."""
    last, frame, fits = clark_fits
    params = clark_tables.clark_law_table(fits)
    assert set(params["experts"]) == {4, 8} and params["identified"].all() and params["ci_low"].isna().all()
    assert params["reason"].str.contains("one seed").all()
    pos = clark_tables.clark_positions_table(fits, frame, last)
    fit_rows = pos[(pos["split"] == "fit")]
    assert (fit_rows.loc[fit_rows["form"] == "n_lambda_size", "difference"].abs() < 0.12).all(), pos
    for e in (4, 8):
        lam = params.set_index(["experts", "form", "parameter"]).loc[(e, "n_lambda", "lambda"), "estimate"]
        assert lam == pytest.approx(fit_rows.loc[fit_rows["experts"] == e, "p_direct"].mean(), abs=0.1)
    held = clark_tables.clark_held_out_table(fits, frame)
    assert set(held["size_label"]) == {"130M"} and (held["error"].abs() < 0.05).all()
    assert held.loc[held["role"] == "dense", "runs"].eq(3).all() and held["ci_low"].isna().all()
    assert len(clark_tables.clark_law_sentences(params, pos, held)) == 4


def test_the_clark_law_rejects_a_form_with_a_d_term():
    with pytest.raises(ValueError, match="no D term"):
        clark_tables.fit_clark(pd.DataFrame(), 4, form="lambda")


def test_clark_tables_hold_every_table_notebook_13_saves(clark_fits):
    """Without a map table: Clark's rows and the paper only, the trend read at the paper's size."""
    last, _, _ = clark_fits
    t = clark_tables.clark_tables(last, None)
    assert set(t) >= {clark_tables.CLARK_POSITIONS, clark_tables.POSITION_AGAINST_SIZE, clark_tables.CLARK_TREND, clark_tables.CLARK_LAW_FIT,
                      clark_tables.CLARK_LAW_POSITIONS, clark_tables.CLARK_LAW_HELD_OUT, "trends"}
    against = t[clark_tables.POSITION_AGAINST_SIZE]
    assert "this study" not in set(against["kind"]) and (against["kind"] == "the paper").sum() == 1
    assert set(t[clark_tables.CLARK_TREND]["size"]) == {"the paper"}


def test_clark_section_says_why_without_the_file_or_the_map(tmp_path):
    tables, why = clark_tables.clark_section(tmp_path, "token_budget_gaps", tmp_path / "absent.csv.gz")
    assert tables is None and "absent.csv.gz" in why and "missing" in why
    if SHARED.is_file():
        tables, note = clark_tables.clark_section(tmp_path, "token_budget_gaps", SHARED)
        assert set(clark_tables.TABLES) <= set(tables) and "notebook 09 did not run" in note


# --------------------------------------------------------------------------------------------
# the shared file with holes or bad numbers (issue #57): refused where the method needs what is missing
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def curves() -> pd.DataFrame:
    if not SHARED.is_file():
        pytest.skip(f"Clark et al. 2022's curves are not on this machine ({SHARED}; see SOURCE.md beside it)")
    return pd.read_csv(SHARED)


def _write(tmp_path, curves: pd.DataFrame):
    path = tmp_path / "curves.csv.gz"
    curves.to_csv(path, index=False)
    return path


def _last_row(curves: pd.DataFrame, router: str, size: str) -> int:
    """The row of the last evaluation of the first ``router`` run of ``size``."""
    last = curves.sort_values(["hyper_id", "step"]).groupby("hyper_id").tail(1)
    return int(last.index[(last["router_type"] == router) & (last["model_size_label"] == size)][0])


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_nan_or_inf_loss_the_method_reads_is_one_error_naming_the_file_and_row(tmp_path, curves, bad):
    """The complete file holds 8 NaN losses one step before their runs' last evaluations (read
    without complaint); one at a last evaluation (the dense 130M's) is refused in one line naming
    the file and its line, and the section says the curves are not used."""
    df = curves.copy()
    i = _last_row(df, "Dense", "130M")
    df.loc[i, "loss_validation"] = bad
    path = _write(tmp_path, df)
    with pytest.raises(clark.ClarkDataError) as e:
        clark.load_curves(path)
    msg = str(e.value)
    where = f"line {i + 2} (hyper_id {df.at[i, 'hyper_id']}, step 249000)"
    assert "\n" not in msg and str(path) in msg and "NaN or infinite loss_validation" in msg and where in msg, msg
    with gzip.open(path, "rt") as f:
        line = f.read().splitlines()[i + 1].split(",")
    assert line[0] == str(df.at[i, "hyper_id"]) and line[list(df.columns).index("loss_validation")] in ("", "inf")
    tables, why = clark_tables.clark_section(tmp_path, "token_budget_gaps", path)
    assert tables is None and why == f"Clark et al.'s curves are not used: {msg}"


def test_curves_without_s_base_rows_are_one_error_naming_the_file(tmp_path, curves):
    path = _write(tmp_path, curves[curves["router_type"] != "S-Base"])
    tables, why = clark_tables.clark_section(tmp_path, "token_budget_gaps", path)
    assert tables is None and "\n" not in why
    assert why == (f"Clark et al.'s curves are not used: {path}: no rows with router_type S-Base (the method reads "
                   f"Dense, S-Base, Hash, RL-R)")


def test_a_missing_dense_size_gives_no_position_across_it_and_no_law(tmp_path, curves, last):
    """Without the plain dense 130M runs, the dense loss at 107M-248M would be interpolated from
    55M to 370M (S-Base E = 4 at 130M: 0.75 -> 0.83; Hash 0.40 -> 0.51): the routed sizes that
    need it get no p and say which dense size is missing, the others keep theirs, and the law
    (fitted on 15-55M, 130M held out) is not fitted, in one line naming what is missing."""
    path = _write(tmp_path, curves[~((curves["router_type"] == "Dense") & (curves["model_size_label"] == "130M"))])
    tables, note = clark_tables.clark_section(tmp_path, "token_budget_gaps", path)
    pos = tables[clark_tables.CLARK_POSITIONS].set_index(["router", "experts", "size_label"])
    full = clark.positions(last).set_index(["router", "experts", "size_label"])
    for key in (("S-Base", 4, "130M"), ("Hash", 4, "130M"), ("S-Base", 4, "55M")):
        assert math.isnan(pos.loc[key, "p"]) and pos.loc[key, "note"].startswith(
            "the plain dense 130M is missing from Clark's curves"), pos.loc[key]
    for key in (("S-Base", 4, "15M"), ("S-Base", 4, "25M"), ("Hash", 4, "370M")):
        assert pos.loc[key, "p"] == full.loc[key, "p"] and pos.loc[key, "note"] == ""
    refused = ("Clark et al.'s curves lack the law's runs: dense 130M (the fit on 15M, 25M, 55M and the held-out "
               "130M need plain dense and S-Base E = 4, 8 runs at each size): the law is not fitted")
    assert tables["law_refused"] == refused and note.endswith("; " + refused)
    for name in (clark_tables.CLARK_LAW_FIT, clark_tables.CLARK_LAW_POSITIONS, clark_tables.CLARK_LAW_HELD_OUT):
        assert tables[name].empty and list(tables[name].columns) == list(clark_tables.LAW_COLUMNS[name])


def test_a_missing_fit_size_is_refused_by_the_law(tmp_path, curves):
    """Without every 25M run, the size form was fitted on two sizes ("no parameter identified") and
    still printed a 130M value: now the law is refused, naming the dense and S-Base runs it lacks,
    and the 15M routed runs, whose total N lies across the missing 25M, get no p."""
    last = clark.last_evaluations(clark.load_curves(_write(tmp_path, curves[curves["model_size_label"] != "25M"])))
    with pytest.raises(clark.ClarkDataError, match=r"lack the law's runs: dense 25M, S-Base E = 4 at 25M, S-Base E = "
                                                    r"8 at 25M \(the fit on 15M, 25M, 55M"):
        clark.law_frame(last)
    pos = clark.positions(last).set_index(["router", "experts", "size_label"])
    assert math.isnan(pos.loc[("S-Base", 4, "15M"), "p"]) and "dense 25M is missing" in pos.loc[("S-Base", 4, "15M"), "note"]


def test_the_complete_file_misses_no_expected_size(last):
    """Every plain dense size the method expects is in the file, and no position says one is missing."""
    assert tuple(clark.dense_sizes(last)["size_label"]) == clark.DENSE_SIZES
    assert not clark.positions(last)["note"].str.contains("missing").any()
    assert len(clark.law_frame(last))
