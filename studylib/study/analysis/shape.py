"""The dimensionless shape of a preset's headline trio, to set a scaled-down preset beside the paper.

A scaled-down study is only a model of the paper's if the *ratios* that decide the comparison
survive the scaling: how much of each model is embedding (the part a wider dense model pays for
again), how many more non-embedding active parameters the MoE has than its active-matched dense
baseline, how much wider the solved dense baselines are, the expert shape and the depth. This
module computes them from the configs alone (no data, no torch): :func:`shape_frame` gives one
column per preset.
"""
from __future__ import annotations

from typing import Mapping

import pandas as pd

from studylib.config import Preset, count_params
from studylib.config.accounting import train_flops_per_token
from studylib.study.analysis.paper import PAPER_TABLE3, PAPER_TABLE5, paper_millions

# (row label, what it is): the rows of shape_frame, in order
ROWS = {
    "vocab": "vocabulary size",
    "context": "training window (tokens)",
    "n_layers": "depth",
    "moe_d_model": "MoE d_model",
    "moe_heads": "MoE query / kv heads",
    "moe_head_dim": "MoE head dim",
    "expert_hidden_over_d": "expert hidden / d_model",
    "routing": "experts, top-k",
    "moe_active": "MoE active parameters",
    "moe_total": "MoE total parameters",
    "moe_nonemb_active": "MoE non-embedding active parameters",
    "dense_active_nonemb": "active-match dense non-embedding parameters",
    "emb_share_moe": "embedding share of MoE active parameters",
    "emb_share_dense_active": "embedding share of the active-match dense model",
    "nonemb_ratio": "MoE / active-match dense, non-embedding active parameters",
    "width_active": "active-match dense d_model / MoE d_model",
    "width_total": "total-match dense d_model / MoE d_model",
    "ffn_over_d_active": "active-match dense FFN hidden / d_model",
    "ffn_over_d_total": "total-match dense FFN hidden / d_model",
    "vocab_over_d": "vocabulary / MoE d_model",
    "flops_moe": "MoE training FLOPs per token",
    "flops_ratio_active": "active-match dense / MoE training FLOPs per token",
    "flops_ratio_total": "total-match dense / MoE training FLOPs per token",
}


def trio_shape(da, moe, dt, context: int) -> dict:
    """The quantities of :data:`ROWS` for one trio of model configs (active-match dense, MoE,
    total-match dense) trained on windows of ``context`` tokens, plus each dense model's FFN /
    width (``ffn_over_d_active``, ``ffn_over_d_total``)."""
    cm, ca = count_params(moe), count_params(da)
    f_moe = train_flops_per_token(moe, context)
    return {
        "vocab": moe.vocab_size, "context": context, "n_layers": moe.n_layers, "moe_d_model": moe.d_model,
        "moe_heads": f"{moe.n_heads}/{moe.n_kv_heads}", "moe_head_dim": moe.head_dim,
        "expert_hidden_over_d": moe.ffn.hidden / moe.d_model,
        "routing": f"{moe.ffn.num_experts}, top-{moe.ffn.top_k}",
        "moe_active": cm.active, "moe_total": cm.total,
        "moe_nonemb_active": cm.active - cm.embedding, "dense_active_nonemb": ca.active - ca.embedding,
        "emb_share_moe": cm.embedding / cm.active, "emb_share_dense_active": ca.embedding / ca.active,
        "nonemb_ratio": (cm.active - cm.embedding) / (ca.active - ca.embedding),
        "width_active": da.d_model / moe.d_model, "width_total": dt.d_model / moe.d_model,
        "ffn_over_d_active": da.ffn.hidden / da.d_model, "ffn_over_d_total": dt.ffn.hidden / dt.d_model,
        "vocab_over_d": moe.vocab_size / moe.d_model,
        "flops_moe": f_moe, "flops_ratio_active": train_flops_per_token(da, context) / f_moe,
        "flops_ratio_total": train_flops_per_token(dt, context) / f_moe,
    }


def shape(preset: Preset, trio=None) -> dict:
    """:func:`trio_shape` of ``trio`` (three model names; default ``study.headline``: [active-match
    dense, MoE, total-match dense]) of ``preset``."""
    names = trio or preset.study.headline
    return trio_shape(*(preset.model_config(m) for m in names), preset.data.context)


def shape_frame(presets: Mapping[str, Preset]) -> pd.DataFrame:
    """One column per preset (in the given order), one row per quantity of :data:`ROWS`, with
    a ``quantity`` column that says what each row is."""
    cols = {name: shape(p) for name, p in presets.items()}
    df = pd.DataFrame(cols).loc[list(ROWS)]
    df.insert(0, "quantity", [ROWS[k] for k in df.index])
    return df


def paper_shape() -> dict:
    """The paper's trio in the quantities the check compares (Tables 3 and 5)."""
    share = {m: paper_millions(v[0]) / paper_millions(v[4]) for m, v in PAPER_TABLE5.items()}
    (da_d, da_f), (moe_d, _), (dt_d, dt_f) = (PAPER_TABLE3[m] for m in ("dense_active", "moe_top2_z", "dense_total"))
    return {"emb_share_moe": share["moe_top2_z"], "emb_share_dense_active": share["dense_active"],
            "ffn_over_d_active": da_f / da_d, "ffn_over_d_total": dt_f / dt_d,
            "width_active": da_d / moe_d, "width_total": dt_d / moe_d}


def paper_vocab_per_d() -> float:
    """The paper's vocabulary per unit of the MoE's d_model (30,008 / 256)."""
    return paper_millions(PAPER_TABLE5["moe_top2_z"][0]) / PAPER_TABLE3["moe_top2_z"][0] ** 2


def trio_frame(preset: Preset, trios) -> pd.DataFrame:
    """One column per trio of ``preset`` (three model names each; named by its MoE), one row per
    quantity of :data:`ROWS`, and the paper's own trio beside them (the quantities its Tables 3 and
    5 give: :func:`paper_shape`)."""
    cols = {t[1]: shape(preset, t) for t in trios}
    cols["paper"] = {**paper_shape(), "vocab_over_d": paper_vocab_per_d()}
    df = pd.DataFrame(cols).reindex(list(ROWS))
    df.insert(0, "quantity", [ROWS[k] for k in df.index])
    return df


def display_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``shape_frame`` formatted for reading: counts with thousands separators, ratios to 3 places."""
    out = df.copy().astype(object)
    for key in df.index:
        for col in df.columns[1:]:
            v = df.loc[key, col]
            if isinstance(v, str) or v != v:
                out.loc[key, col] = "" if not isinstance(v, str) else v
                continue
            if key in ("moe_active", "moe_total", "moe_nonemb_active", "dense_active_nonemb", "flops_moe",
                       "vocab", "context", "n_layers", "moe_d_model", "moe_head_dim"):
                out.loc[key, col] = f"{v:,.0f}"
            else:
                out.loc[key, col] = f"{v:.3f}"
    return out


__all__ = ["ROWS", "display_frame", "paper_shape", "paper_vocab_per_d", "shape", "shape_frame", "trio_frame",
           "trio_shape"]
