"""Clark et al. 2022's public loss curves beside this study's MoE: where a routed model sits
between its two dense matches, per router, number of experts E and size; the trend of that
position in log10 N (:mod:`.clark_tables`, with the table and figure "position against size" and
the study's law fitted on their runs). Everything notebook 13 reads of Clark's curves is read and
converted here, once: :func:`positions` (p per router, E and size), :func:`law_frame` (the one
adapter to the law's input, :data:`~studylib.study.analysis.law.fit.COLUMNS`) and
:func:`position_against_size` (this study's cells, Clark's and the paper's in one table).

**The data.** ``curves.csv.gz`` of ``google-deepmind/scaling_laws_for_routing`` (*Unified Scaling
Laws for Routed Language Models*, Clark et al., ICML 2022; CC-BY 4.0, cite the paper), found at
``../shared/data/clark2022/`` beside the repository (:func:`clark_file`; its SOURCE.md gives the
commit and checksum). It is never committed here.

**The method** (docs/statistics.md, "Clark et al.'s position against size"):

1. The loss at the end of training, as the paper's laws use: the last evaluation (largest ``step``)
   of each run (``hyper_id``), column ``loss_validation`` (the held-out part of their training
   data; it reproduces SOURCE.md's figures, the other columns do not).
2. The plain dense baselines: ``router_type == "Dense"`` and ``flop_increase == 1`` (wider-FFN
   dense runs emulate k > 1 and are left out), one loss per size, the mean over its runs (``n``:
   the 130M has 3 seeds, the others 1).
3. The dense loss at any N between the smallest and largest plain dense sizes: linear
   interpolation in log10 N between the neighbouring sizes (exact where the dense loss is linear in
   log N between them). Outside that range it is not extrapolated: the routed runs whose total N
   lies beyond the largest dense model (the 1.3B routed runs) get no position, and their row says so.
4. Routed runs in the paper's main setting only: ``k == 1`` and ``routing_frequency == 0.5`` (every
   other block routed; the other values are ablations at 25M and 370M). Per router, E and size the
   mean loss over its runs with their number ``n`` (every such config has one run, seed 42).
5. ``p = (L_dense(N_active) - L_routed) / (L_dense(N_active) - L_dense(N_total))``
   (:func:`studylib.study.analysis.position.position`): 0 at a dense model of the routed model's
   ``dense_parameter_count``, 1 at one of its ``total_parameter_count``.
6. The trend: per router and E, ``p = a + b log10(N_active)`` by OLS (statsmodels) over the sizes
   where p is defined, with the 95% CI of ``b``; read at other sizes with the 95% CI of the line
   and the 95% prediction interval of one new size. Read at this study's 59k-231k active
   parameters it is an extrapolation of about 2 decades below Clark's smallest run (15M), and
   every readout says how many decades outside Clark's sizes it lies.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from studylib.config.schema import ConfigError
from studylib.study.analysis.law.fit import COLUMNS as LAW_COLUMNS
from studylib.study.analysis.paper import PAPER_ACTIVE_PARAMS, PAPER_POSITION
from studylib.study.analysis.position import position

#: where the data lies, relative to the repository root (as ``params/*.yaml`` find the TinyStories subset)
CLARK_DIR = Path("..") / "shared" / "data" / "clark2022"
CLARK_FILE = "curves.csv.gz"
#: the loss that reproduces SOURCE.md's figures (and the paper's laws use)
LOSS = "loss_validation"
ROUTERS = ("S-Base", "Hash", "RL-R")
EXPERTS = (4, 8)
#: the columns :func:`load_curves` checks (besides ``loss``)
COLUMNS = ("hyper_id", "step", "router_type", "num_experts", "k", "routing_frequency", "flop_increase", "seed",
           "dense_parameter_count", "total_parameter_count", "model_size_label")
_TEXT = ("router_type", "model_size_label")
#: the law frame's split (:func:`law_frame`): fit on 15-55M, hold the 130M runs out
FIT_SIZES, HELD_OUT_SIZES = ("15M", "25M", "55M"), ("130M",)
#: the plain dense sizes of the complete file, in increasing N: the dense loss is interpolated
#: between them, never across or beyond a missing one (:func:`positions`)
DENSE_SIZES = ("15M", "25M", "55M", "130M", "370M", "1.3B")
#: the router types the method reads (the plain dense baselines and :data:`ROUTERS`)
ROUTER_TYPES = ("Dense", *ROUTERS)
#: the columns :func:`position_against_size` takes for this study's cells
STUDY_COLUMNS = ("n_active", "p", "p_lo", "p_hi", "source")

#: a placeholder token count: every Clark run saw the same tokens, and the N-only forms read none
SAME_TOKENS = 1.0


class ClarkDataError(ConfigError):
    """Clark et al.'s file is missing, unreadable or lacks a column (one line naming the file)."""


def clark_file(root: Optional[Path] = None) -> Path:
    """``<root>/../shared/data/clark2022/curves.csv.gz``; ``root``: the repository (default: the
    one this package lies in)."""
    root = Path(root) if root is not None else Path(__file__).resolve().parents[4]
    return (root / CLARK_DIR / CLARK_FILE).resolve()


def load_curves(path: Optional[Path] = None, loss: str = LOSS) -> pd.DataFrame:
    """Every evaluation of every run in ``path`` (default :func:`clark_file`), checked: the file
    exists and parses, holds :data:`COLUMNS` and ``loss``, numeric where numbers are expected,
    at least one row, rows of each of :data:`ROUTER_TYPES`, and finite numbers where the method
    reads them (``hyper_id`` and ``step`` in every row, the rest at each run's last evaluation;
    the file has NaN losses one step before it). Any failure: one :class:`ClarkDataError` line
    naming the file (and the rows)."""
    path = Path(path) if path is not None else clark_file()
    if not path.is_file():
        raise ClarkDataError(f"{path}: Clark et al. 2022's curves are missing (curves.csv.gz of "
                             f"google-deepmind/scaling_laws_for_routing; expected in {CLARK_DIR}/ beside the repo)")
    try:
        df = pd.read_csv(path)
    except (OSError, EOFError, ValueError) as e:  # bad gzip, truncated file, parser or encoding error
        raise ClarkDataError(f"{path}: not a readable CSV ({type(e).__name__}: {e})") from None
    need = (*COLUMNS, loss)
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ClarkDataError(f"{path}: missing column(s) {missing}; expected the columns {list(need)}")
    wrong = [c for c in need if c not in _TEXT and not pd.api.types.is_numeric_dtype(df[c])]
    if wrong:
        raise ClarkDataError(f"{path}: column(s) {wrong} are not numeric")
    if df.empty:
        raise ClarkDataError(f"{path}: no rows")
    absent = [r for r in ROUTER_TYPES if not (df["router_type"] == r).any()]
    if absent:
        raise ClarkDataError(f"{path}: no rows with router_type {', '.join(absent)} (the method reads "
                             f"{', '.join(ROUTER_TYPES)})")
    keys = ["hyper_id", "step"]  # which row is a run's last evaluation: finite in every row
    last = df.sort_values(keys).groupby("hyper_id").tail(1).index
    rest = [c for c in need if c not in _TEXT and c not in keys]
    for cols, rows, where in ((keys, df.index, ""), (rest, last, " at the last evaluation of its run")):
        ok = np.isfinite(df.loc[rows, cols].to_numpy(float))
        bad = rows[~ok.all(axis=1)]
        if len(bad):
            which = ", ".join(c for c, good in zip(cols, ok.all(axis=0)) if not good)
            lines = ", ".join(f"line {i + 2} (hyper_id {df.at[i, 'hyper_id']:g}, step {df.at[i, 'step']:g})"
                              for i in bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            raise ClarkDataError(f"{path}: NaN or infinite {which}{where} in {len(bad)} row(s): {lines}; expected a "
                                 f"finite number")
    return df


def last_evaluations(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per run (``hyper_id``): its last evaluation (largest ``step``)."""
    return curves.sort_values(["hyper_id", "step"]).groupby("hyper_id").tail(1).reset_index(drop=True)


def _plain_dense(last: pd.DataFrame) -> pd.DataFrame:
    return last[(last["router_type"] == "Dense") & (last["flop_increase"] == 1)]


def _main_setting(last: pd.DataFrame) -> pd.Series:
    return (last["k"] == 1) & (last["routing_frequency"] == 0.5)


def dense_sizes(last: pd.DataFrame, loss: str = LOSS) -> pd.DataFrame:
    """The plain dense baselines (``flop_increase == 1``), one row per size in increasing N:
    ``size_label``, ``n_params``, ``loss`` (the mean over its runs), ``n`` (runs)."""
    d = _plain_dense(last)
    if d.empty:
        raise ClarkDataError("Clark et al.'s curves: no plain dense run (router_type Dense, flop_increase 1)")
    return (d.groupby("dense_parameter_count")
            .agg(size_label=("model_size_label", "first"), loss=(loss, "mean"), n=(loss, "size"))
            .rename_axis("n_params").reset_index().sort_values("n_params").reset_index(drop=True))


def dense_loss_at(dense: pd.DataFrame, n_params) -> np.ndarray:
    """The dense loss at ``n_params`` (:func:`dense_sizes`'s frame): linear in log10 N between
    the neighbouring sizes; NaN outside the smallest-largest range (never extrapolated)."""
    x = np.log10(dense["n_params"].to_numpy(float))
    return np.interp(np.log10(np.asarray(n_params, float)), x, dense["loss"].to_numpy(float),
                     left=math.nan, right=math.nan)


def _missing_dense(dense: pd.DataFrame, n: float) -> list:
    """The sizes of :data:`DENSE_SIZES` missing from ``dense`` (:func:`dense_sizes`) that the dense
    loss at ``n`` would be interpolated across, or that lie beyond the present sizes on ``n``'s side."""
    have = [(x, lab) for x, lab in zip(dense["n_params"], dense["size_label"]) if lab in DENSE_SIZES]
    if not have or any(x == n for x, _ in have):
        return []
    below = [DENSE_SIZES.index(lab) for x, lab in have if x < n]
    above = [DENSE_SIZES.index(lab) for x, lab in have if x > n]
    span = DENSE_SIZES[(max(below) + 1 if below else 0):(min(above) if above else len(DENSE_SIZES))]
    return [s for s in span if s not in set(dense["size_label"])]


def positions(last: pd.DataFrame, routers: Sequence[str] = ROUTERS, experts: Sequence[int] = EXPERTS,
              loss: str = LOSS) -> pd.DataFrame:
    """Where each routed config sits between its dense matches, one row per router, E and size
    (the main setting, k 1 and every other block routed): ``router``, ``experts``,
    ``size_label``, ``n_active`` (``dense_parameter_count``), ``n_total``, ``n`` (runs
    averaged), ``loss`` (their mean), ``l_dense_active`` and ``l_dense_total`` (interpolated,
    :func:`dense_loss_at`), ``p`` and ``note`` (why p is missing: a total N outside the plain
    dense sizes, or a size of :data:`DENSE_SIZES` missing where the dense loss would be read: no
    dense loss is interpolated across a hole). Sorted by router (in ``routers``' order), E and size."""
    dense = dense_sizes(last, loss)
    r = last[last["router_type"].isin(routers) & last["num_experts"].isin(experts) & _main_setting(last)]
    out = (r.groupby(["router_type", "num_experts", "model_size_label"])
           .agg(n_active=("dense_parameter_count", "mean"), n_total=("total_parameter_count", "mean"),
                n=(loss, "size"), loss=(loss, "mean"))
           .reset_index().rename(columns={"router_type": "router", "num_experts": "experts",
                                          "model_size_label": "size_label"}))
    gone = {c: [_missing_dense(dense, x) for x in out[c]] for c in ("n_active", "n_total")}
    for col, c in (("l_dense_active", "n_active"), ("l_dense_total", "n_total")):
        out[col] = np.where([bool(m) for m in gone[c]], math.nan, dense_loss_at(dense, out[c]))
    out["p"] = position(out["l_dense_active"], out["loss"], out["l_dense_total"])
    lo, hi = dense["n_params"].min(), dense["n_params"].max()

    def note(i, row) -> str:
        sides = (("active", "n_active"), ("total", "n_total"))
        missing = list(dict.fromkeys(s for _, c in sides for s in gone[c][i]))
        if missing:
            at = " and ".join(f"{k} N {row[c] / 1e6:,.0f}M" for k, c in sides if gone[c][i])
            return (f"the plain dense {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing from Clark's "
                    f"curves and the dense loss at {at} rests on {'it' if len(missing) == 1 else 'them'}: no position")
        outside = [f"{k} N {row[c] / 1e6:,.0f}M" for k, c in sides if not lo <= row[c] <= hi]
        return (f"{' and '.join(outside)} outside the plain dense sizes ({lo / 1e6:,.1f}M-{hi / 1e6:,.0f}M): "
                "not extrapolated, no position") if outside else ""

    out["note"] = [note(i, row) for i, row in out.iterrows()] if len(out) else pd.Series(dtype=str)
    order = {k: i for i, k in enumerate(routers)}
    return (out.assign(_o=out["router"].map(order)).sort_values(["_o", "experts", "n_active"])
            .drop(columns="_o").reset_index(drop=True))


def cells_from_gap_table(table: pd.DataFrame) -> pd.DataFrame:
    """The token-budget map's position table (``token_budget.gaps.gap_table``: ``moe_active``,
    ``size_label``, ``tokens_per_param``, ``position``, ``position_low``, ``position_high``,
    ``position_defined``, ``position_reason``) in :data:`STUDY_COLUMNS`' form with ``note`` (the
    reason); a cell whose position is not defined keeps NaN."""
    d = table["position_defined"].fillna(False).astype(bool)
    return pd.DataFrame({
        "n_active": table["moe_active"].astype(float),
        "p": table["position"].where(d), "p_lo": table["position_low"].where(d),
        "p_hi": table["position_high"].where(d),
        "source": [f"{s}, {x:.3g} tokens/param" for s, x in zip(table["size_label"], table["tokens_per_param"])],
        "note": table.get("position_reason", pd.Series("", index=table.index)).fillna("")})


def position_against_size(study_cells: pd.DataFrame, pos: pd.DataFrame, routers: Sequence[str] = ("S-Base", "Hash"),
                          experts: Sequence[int] = EXPERTS) -> pd.DataFrame:
    """One table, p against active parameters: this study's cells (``study_cells``, columns
    :data:`STUDY_COLUMNS`: p with its 95% CI at the MoE's active parameters; optional ``n``
    (seeds) and ``note``; :func:`cells_from_gap_table` makes it from the map's table), Clark et al.'s
    ``routers`` for ``experts`` per size (:func:`positions`; one run each: no interval) and the
    paper's 0.81 at 14.77M (Table 2 means: no interval). Columns ``kind`` ("this study", "Clark
    et al. 2022", "the paper"), ``source``, ``router``, ``experts``, ``n_active``, ``p``,
    ``p_lo``, ``p_hi``, ``n``, ``note``; sorted by kind, then N."""
    missing = [c for c in STUDY_COLUMNS if c not in study_cells.columns]
    if missing:
        raise ValueError(f"study_cells: missing column(s) {missing}; expected {list(STUDY_COLUMNS)}")
    note = study_cells["note"].fillna("") if "note" in study_cells else ""
    n = study_cells["n"] if "n" in study_cells else np.nan
    study = study_cells[list(STUDY_COLUMNS)].assign(kind="this study", router="", experts=np.nan, n=n, note=note)
    c = pos[pos["router"].isin(routers) & pos["experts"].isin(experts)]
    clark = pd.DataFrame({"kind": "Clark et al. 2022",
                          "source": [f"{r}, E = {e}, {s}"
                                     for r, e, s in zip(c["router"], c["experts"], c["size_label"])],
                          "router": c["router"], "experts": c["experts"], "n_active": c["n_active"], "p": c["p"],
                          "p_lo": np.nan, "p_hi": np.nan, "n": c["n"], "note": c["note"]})
    paper = pd.DataFrame([{"kind": "the paper", "source": "the paper (Table 2 means)", "router": "learned (top-2)",
                           "experts": 4, "n_active": PAPER_ACTIVE_PARAMS, "p": PAPER_POSITION,
                           "p_lo": np.nan, "p_hi": np.nan, "n": 3, "note": ""}])
    cols = ["kind", "source", "router", "experts", "n_active", "p", "p_lo", "p_hi", "n", "note"]
    return pd.concat([study[cols], clark[cols], paper[cols]], ignore_index=True)


def law_frame(last: pd.DataFrame, experts: Sequence[int] = EXPERTS, fit_sizes: Sequence[str] = FIT_SIZES,
              held_out: Sequence[str] = HELD_OUT_SIZES, loss: str = LOSS) -> pd.DataFrame:
    """Clark et al.'s plain dense runs and S-Base runs with ``experts`` experts (main setting: k 1,
    every other block routed) of the sizes ``fit_sizes`` and ``held_out`` (other sizes left out),
    one row per run, in the form a joint law fit takes. Columns:

    - ``run``: ``hyper_id``; ``role``: ``"dense"`` or ``"moe"``; ``router``: ``"Dense"`` or
      ``"S-Base"``; ``experts``: E (1 for dense); ``size_label``: Clark's label; ``seed``;
    - ``n_active``: parameters one token uses (``dense_parameter_count``); ``n_total``: every
      parameter, all experts counted (``total_parameter_count``; equal to ``n_active`` for dense);
    - ``loss``: ``loss`` (nats per token, their tokenizer) at the run's last evaluation; ``step``:
      that evaluation's step (249,000 for every run here);
    - ``split``: ``"fit"`` (``fit_sizes``, default 15-55M) or ``"held_out"`` (default 130M).

    Tokens seen: every run trained the same number of steps, but the file gives neither the batch
    nor the tokens per step (``flops_per_step`` is a forward-FLOPs estimate whose ratio to 2N
    varies with size, so no token count follows from it): the frame has no token column, and only
    the N part of a law can be fitted on it.

    A size of ``fit_sizes`` or ``held_out`` without its plain dense runs or its S-Base runs at each
    E of ``experts``: one :class:`ClarkDataError` line naming them (the law is not fitted around a hole)."""
    sizes = {**{s: "fit" for s in fit_sizes}, **{s: "held_out" for s in held_out}}
    dense = _plain_dense(last)
    moe = last[(last["router_type"] == "S-Base") & last["num_experts"].isin(experts) & _main_setting(last)]
    lacking = [f"dense {s}" for s in sizes if not (dense["model_size_label"] == s).any()] + [
        f"S-Base E = {e} at {s}" for s in sizes for e in experts
        if not ((moe["model_size_label"] == s) & (moe["num_experts"] == e)).any()]
    if lacking:
        raise ClarkDataError(f"Clark et al.'s curves lack the law's runs: {', '.join(lacking)} (the fit on "
                             f"{', '.join(fit_sizes)} and the held-out {', '.join(held_out)} need plain dense and "
                             f"S-Base E = {', '.join(map(str, experts))} runs at each size): the law is not fitted")
    both = pd.concat([dense.assign(role="dense"), moe.assign(role="moe")])
    both = both[both["model_size_label"].isin(sizes)]
    out = pd.DataFrame({"role": np.where(both["role"] == "dense", "dense_active", "moe"),
                        "size": both["model_size_label"], "seed": both["seed"].astype(int),
                        "active": both["dense_parameter_count"].astype(float),
                        "total": both["total_parameter_count"].astype(float), "tokens": SAME_TOKENS,
                        "unique": SAME_TOKENS, "value": both[loss].astype(float),
                        "split": both["model_size_label"].map(sizes), "experts": both["num_experts"].astype(int),
                        "router": both["router_type"], "run": both["hyper_id"], "step": both["step"]})
    return out.sort_values(["role", "experts", "active", "seed"]).reset_index(drop=True)


def clark_runs(frame: pd.DataFrame, experts: int) -> pd.DataFrame:
    """:func:`law_frame`'s dense runs and its S-Base runs with ``experts`` experts: the law's
    :data:`~studylib.study.analysis.law.fit.COLUMNS` and ``split``."""
    f = frame[(frame["role"] != "moe") | (frame["experts"] == experts)]
    if not (f["role"] == "moe").any():
        raise ValueError(f"clark law: no S-Base run with E = {experts} in the frame (E: "
                         f"{sorted(frame.loc[frame['role'] == 'moe', 'experts'].unique())})")
    return f[[*LAW_COLUMNS, "split"]].reset_index(drop=True)


__all__ = ["CLARK_DIR", "COLUMNS", "ClarkDataError", "DENSE_SIZES", "EXPERTS", "FIT_SIZES", "HELD_OUT_SIZES", "LOSS",
           "ROUTERS", "ROUTER_TYPES", "SAME_TOKENS", "STUDY_COLUMNS", "cells_from_gap_table", "clark_file",
           "clark_runs", "dense_loss_at", "dense_sizes", "last_evaluations", "law_frame", "load_curves",
           "position_against_size", "positions"]
