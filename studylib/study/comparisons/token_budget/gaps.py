"""Where the MoE starts to win (issues #11, #31, #39): both headline gaps and the MoE's position
between its two dense matches at every point of the map (size x tokens per active parameter):
:func:`gap_frame` (per seed), :func:`gap_table` (per cell: paired statistics, each gap's points one
family for Holm and TOST, the position) and their words.

Sign convention (both gaps): ``dense - MoE`` in best validation loss (nats, within a trio, one
tokenizer), so **positive = the MoE is better**. The matched-total gap is therefore the negative of
notebook 03's ``MoE - dense_total``. The position ``p = (L_active - L_MoE) / (L_active -
L_total)`` is where the MoE sits between its matches: 0 at its active match, 1 at its total match
(the paper: 0.81); it is free of the loss scale and the tokenizer.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from studylib.study.analysis.frames import seed_pairs
from studylib.study.analysis.law.checks import close_groups
from studylib.study.analysis.paper import (PAPER_ACTIVE_PARAMS, PAPER_BUDGET_TOKENS, PAPER_GAPS, PAPER_POSITION,
                                           PAPER_TOKENS_PER_PARAM)
from studylib.study.analysis.position import position_row, position_text
from studylib.study.analysis.stats import MARGIN, family, paired
from studylib.study.analysis.tables import fmt_count
from studylib.study.comparisons.token_budget.knobs import TrioConfig

VALUE = "best_val_loss"
#: the two gaps: name -> (trio role of the dense model, label)
GAPS = {"active": ("dense_active", "matched-active gap (dense_active - MoE)"),
        "total": ("dense_total", "matched-total gap (dense_total - MoE)")}

# The paper's headline point (paper.py) in this module's sign convention (dense - MoE).
PAPER_POINT = {"tokens_per_param": PAPER_TOKENS_PER_PARAM,
               "active": +PAPER_GAPS["active"][0],   # +0.0758: the MoE beats dense_active
               "total": -PAPER_GAPS["total"][0]}     # -0.0180: dense_total beats the MoE
#: a cell: (size, epochs, fraction of the training stories)
CELL = ["size", "epochs", "stories"]


def gap_frame(summaries: pd.DataFrame, trios: Sequence[TrioConfig], active: dict, value: str = VALUE) -> pd.DataFrame:
    """One row per cell x seed x gap (seeds with both runs): the dense and the MoE ``value`` (also
    in bits per byte), the gap ``dense - moe`` (``value``, nats; ``value_bpb``), tokens,
    tokens_per_param (of the size's MoE), ``data_passes`` and ``unique`` tokens."""
    by_size = {t.size: t for t in trios}
    rows = []
    s = summaries if "stories" in summaries else summaries.assign(stories=1.0)
    for (size, e, f), d in s.groupby(CELL, sort=False):
        t = by_size[size]
        toks = d.groupby("model")["tokens"].unique()
        if any(len(v) != 1 for v in toks) or toks.map(lambda v: v[0]).nunique() != 1:
            raise ValueError(f"gap_frame: size {size}, {e} epochs: the trio's runs saw different "
                             f"numbers of tokens ({toks.to_dict()}); they must share one budget")
        tokens = float(d["tokens"].iloc[0])
        passes = tokens / float(d["train_targets"].iloc[0]) if "train_targets" in d else math.nan
        unique = min(tokens, float(d["train_targets"].iloc[0])) if "train_targets" in d else math.nan
        bpb = d.set_index(["model", "seed"])["bytes_per_token"] if "bytes_per_token" in d else None
        for gap, (role, _) in GAPS.items():
            dense = getattr(t, role)
            try:
                pair = seed_pairs(d, dense, t.moe, value)
            except KeyError:  # a model of the trio without runs at this budget
                continue
            for seed, (a, b) in pair.iterrows():
                to_bits = (lambda m, v: v / math.log(2) / bpb[(m, seed)]) if bpb is not None else (lambda m, v: math.nan)
                da, mb = to_bits(dense, a), to_bits(t.moe, b)
                rows.append({"size": size, "epochs": e, "stories": f, "seed": seed, "gap": gap, "dense": a, "moe": b,
                             "value": a - b, "dense_bpb": da, "moe_bpb": mb, "value_bpb": da - mb,
                             "tokens": tokens, "tokens_per_param": tokens / active[size], "data_passes": passes,
                             "unique": unique})
    return pd.DataFrame(rows, columns=["size", "epochs", "stories", "seed", "gap", "dense", "moe", "value", "dense_bpb",
                                       "moe_bpb", "value_bpb", "tokens", "tokens_per_param", "data_passes", "unique"])


def size_label(size: str, active: int) -> str:
    """A trio's name in the map's tables and figures: its MoE and its active parameters."""
    return f"{size} ({fmt_count(active)} active)"


def gap_table(per_seed: pd.DataFrame, active: dict, margin: float = MARGIN) -> pd.DataFrame:
    """One row per cell from all the training stories (the map's points): tokens, tokens/param,
    epochs, passes (``repeats``, ``max_views``), unique tokens, each role's mean bits per byte, per
    gap the paired statistics of ``dense - moe`` (nats, and ``_bpb_``) with
    :func:`~studylib.study.analysis.stats.family`'s verdict over that gap's points (Holm, TOST within
    ``margin``), and the MoE's position between its matches beside the paper's."""
    rows = []
    ps = per_seed if "stories" in per_seed else per_seed.assign(stories=1.0)
    for (size, e, f), d in ps[ps["stories"] == 1.0].groupby(CELL, sort=False):
        first = d.iloc[0]
        passes = float(first["data_passes"])
        row = {"size": size, "size_label": size_label(size, active[size]), "moe_active": active[size],
               "epochs": e, "tokens": int(first["tokens"]), "tokens_per_param": float(first["tokens_per_param"]),
               "data_passes": passes, "repeats": bool(passes > 1 + 1e-9),
               "max_views": int(math.ceil(passes - 1e-9)) if passes == passes else np.nan,
               "unique": float(first.get("unique", math.nan))}
        gaps = {}
        for gap, (role, _) in GAPS.items():
            g = d[d["gap"] == gap].sort_values("seed")
            if g.empty:
                continue
            p = paired(g["dense"].to_numpy(), g["moe"].to_numpy())
            row.update({f"{gap}_{k}": v for k, v in p.as_dict().items() if k not in ("level", "resolved")})
            row[f"{gap}_fmt"] = p.fmt()
            row[f"{gap}_values"] = g["value"].to_numpy()
            row[f"{role}_bpb"], row["moe_bpb"] = float(g["dense_bpb"].mean()), float(g["moe_bpb"].mean())
            k = float((g["dense_bpb"] / g["dense"]).mean())  # nats -> bits per byte of this trio's tokenizer
            row.update({f"{gap}_bpb_mean": p.mean * k, f"{gap}_bpb_ci_low": p.ci_low * k,
                        f"{gap}_bpb_ci_high": p.ci_high * k})
            gaps[gap] = g.set_index("seed")["value"]
        if len(gaps) == 2:
            both = pd.concat(gaps, axis=1).dropna()
            row.update(position_row(both["active"].to_numpy(), both["total"].to_numpy()))
            row["paper_position"] = PAPER_POSITION
        rows.append(row)
    out = pd.DataFrame(rows)
    for gap in GAPS:
        if f"{gap}_values" not in out:
            continue
        have = out[f"{gap}_values"].notna()
        fam = family({i: v for i, v in out.loc[have, f"{gap}_values"].items()}, margin=margin).reindex(out.index)
        for k in ("p_holm", "p_tost", "p_tost_holm", "resolved", "equivalent", "verdict", "family_size", "margin"):
            out[f"{gap}_{k}"] = fam[k]
        out = out.drop(columns=f"{gap}_values")
    order = {s: i for i, s in enumerate(dict.fromkeys(out["size"]))}  # sizes in trio order
    return (out.assign(_o=out["size"].map(order)).sort_values(["_o", "tokens_per_param"], kind="stable")
            .drop(columns="_o").reset_index(drop=True))


def shared_budgets(table: pd.DataFrame, rel: float = 0.02) -> list[tuple[float, list[str]]]:
    """``[(tokens/param, sizes)]``: the tokens-per-parameter values (:func:`close_groups`) that two
    or more sizes share, each with the sizes measured there."""
    t = table.sort_values("tokens_per_param")
    out = [(float(g[0]), list(dict.fromkeys(t.loc[t["tokens_per_param"].isin(g), "size"])))
           for g in close_groups(t["tokens_per_param"], rel)]
    return [(x, s) for x, s in out if len(s) > 1]


# --------------------------------------------------------------------------------------------
# sentences
# --------------------------------------------------------------------------------------------
def _x(v: float) -> str:
    return f"{v:.3g}"


#: a map point's verdict ("A better": the dense model, "B better": the MoE) in the map's words
VERDICT_WORDS = {"A better": "dense better", "B better": "MoE better", "equivalent": "equivalent",
                 "inconclusive": "inconclusive"}


def point_sentences(table: pd.DataFrame, gap: str) -> str:
    """One gap's map points by verdict (Holm over the gap's points; equivalence within the margin)."""
    label = GAPS[gap][1]
    t = table[table[f"{gap}_verdict"].notna()]
    if t.empty:
        return f"{label[0].upper()}{label[1:]}: no map point has both models."
    m, margin = int(t[f"{gap}_family_size"].iloc[0]), float(t[f"{gap}_margin"].iloc[0])
    parts = []
    for v in ("B better", "A better", "equivalent", "inconclusive"):
        r = t[t[f"{gap}_verdict"] == v]
        if len(r):
            what = {"equivalent": f"equivalent within ±{margin:g} nats"}.get(v, VERDICT_WORDS[v])
            pts = ", ".join(f"{size} at {_x(x)} ({fmt}" + ("" if p != p else f"; Holm p={p:.2g}") + ")"
                            for size, x, fmt, p in
                            zip(r["size"], r["tokens_per_param"], r[f"{gap}_fmt"], r[f"{gap}_p_holm"]))
            parts.append(f"{what} at {len(r)}: {pts}")
    return (f"{label[0].upper()}{label[1:]} (> 0: the MoE is better), {len(t)} map points, Holm over {m}: "
            + "; ".join(parts) + ".")


def position_sentence(table: pd.DataFrame) -> str:
    """The MoE's position between its matches at every map point, beside the paper's."""
    if "position_defined" not in table:
        return "The MoE's position between its matches: no map point has all three models."
    parts = [f"{r['size']} at {_x(r['tokens_per_param'])} tokens/param ({r['data_passes']:.2f} passes): "
             f"{position_text(r)}" for _, r in table.iterrows()]
    return (f"The MoE's position between its matches, (L_active - L_MoE) / (L_active - L_total), 0 at its active "
            f"match and 1 at its total match (bootstrap 95% CI over seeds; not defined where the two dense models "
            f"are not resolved apart): " + "; ".join(parts) + f". The paper's: {PAPER_POSITION:.2f} "
            f"({PAPER_POINT['active']:.4f} / {PAPER_POINT['active'] - PAPER_POINT['total']:.4f}, at "
            f"{_x(PAPER_TOKENS_PER_PARAM)} tokens/param, one pass).")


def paper_sentence(table: pd.DataFrame) -> str:
    """Where the measured range lies against the paper's point and budgets."""
    x = table["tokens_per_param"]
    lo, hi = float(x.min()), float(x.max())
    decades = math.log10(hi / lo) if lo > 0 else float("nan")
    paper_x = [t / PAPER_ACTIVE_PARAMS for t in PAPER_BUDGET_TOKENS]
    inside = "inside" if lo <= PAPER_TOKENS_PER_PARAM <= hi else "outside"
    return (f"Measured range: {_x(lo)}-{_x(hi)} tokens per active parameter ({decades:.2f} decades). "
            f"The paper's headline point ({_x(PAPER_TOKENS_PER_PARAM)} tokens/param: "
            f"{PAPER_POINT['active']:+.4f} at matched active, {PAPER_POINT['total']:+.4f} at matched total) "
            f"is {inside} it. The `paper` preset adds, on a GPU, the paper's budgets "
            f"{', '.join(f'{t / 1e6:g}M' for t in PAPER_BUDGET_TOKENS)} target tokens for its "
            f"{PAPER_ACTIVE_PARAMS / 1e6:.2f}M-active MoE: "
            f"{', '.join(_x(v) for v in paper_x)} tokens/param.")


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the notebook shows it (passes and unique tokens, each model's loss in bits per
    byte, formatted gaps with CIs, Holm-adjusted p, verdicts, the position)."""
    out = pd.DataFrame({
        "size": table["size_label"], "epochs": table["epochs"].map(lambda v: f"{v:.3g}"),
        "target tokens": table["tokens"], "tokens/param": table["tokens_per_param"].map(lambda v: f"{v:.3g}"),
        "data passes": table["data_passes"].map(lambda v: f"{v:.2f}"),
        "unique tokens": table["unique"].map(lambda v: f"{v:,.0f}") if "unique" in table else "",
    })
    for role in ("dense_active", "moe", "dense_total"):
        if f"{role}_bpb" in table:
            out[f"{role} (bits/byte)"] = table[f"{role}_bpb"].map(lambda v: f"{v:.4f}")
    for gap, col in (("active", "matched active (dense_active - MoE)"),
                     ("total", "matched total (dense_total - MoE)")):
        if f"{gap}_fmt" in table:
            out[col] = table[f"{gap}_fmt"]
            out[f"{gap} p / Holm"] = [f"{p:.2g} / {q:.2g}" for p, q in zip(table[f"{gap}_p"], table[f"{gap}_p_holm"])]
            out[f"{gap} verdict"] = table[f"{gap}_verdict"].map(VERDICT_WORDS)
            out[f"{gap} std"] = table[f"{gap}_std"].map(lambda v: f"{v:.4f}")
    if "position_defined" in table:
        out[f"position (paper {PAPER_POSITION:.2f})"] = [position_text(r) for _, r in table.iterrows()]
    return out.reset_index(drop=True)


__all__ = ["CELL", "GAPS", "PAPER_POINT", "VERDICT_WORDS", "display_table", "gap_frame", "gap_table",
           "paper_sentence", "point_sentences", "position_sentence", "shared_budgets",
           "size_label"]
