"""Router diagnostics over training: the eval records of a run's ``metrics.jsonl`` (read through
:meth:`studylib.run.rundir.RunDir.read_metrics`) as one row per (eval step, layer)."""
from __future__ import annotations

import os
from typing import Optional

import numpy as np
import pandas as pd

from studylib.run.rundir import RunDir
from studylib.study.analysis.frames import layer_stats

ROUTER_METRICS = ("busiest", "usage_var", "entropy", "top1", "margin", "logz")
SOFT_METRICS = ("usage_entropy", "max_gt_0.9")
COLUMNS = ("step", "tokens", "layer", "kind", "val_loss", "train_loss", *ROUTER_METRICS, *SOFT_METRICS, "shares",
           "note")


def _layer_kinds(rd: RunDir) -> Optional[list[str]]:
    """The FFN kind of every layer from the run's model config (None if it cannot be read)."""
    try:
        mcfg = rd.model_config()
    except Exception:
        return None
    return [mcfg.ffn_for_layer(i).kind for i in range(mcfg.n_layers)]


def _eval_rows(rec: dict, layer_kinds: Optional[list[str]]) -> list[dict]:
    """One row per layer of one eval record."""
    router = rec.get("router")
    n_layers = len(router) if isinstance(router, list) else (len(layer_kinds) if layer_kinds else 1)
    rows = []
    for layer in range(n_layers):
        st = router[layer] if isinstance(router, list) else None
        stats = st if isinstance(st, dict) else {}
        kind = layer_kinds[layer] if layer_kinds and layer < len(layer_kinds) else \
            ("dense" if not isinstance(st, dict) else ("soft" if "usage_entropy" in st else "moe"))
        row = {"step": rec.get("step"), "tokens": rec.get("tokens"), "layer": layer, "kind": kind,
               "val_loss": rec.get("val_loss"), "train_loss": rec.get("train_loss")}
        values = layer_stats(stats, (*ROUTER_METRICS, *SOFT_METRICS))
        for m in (*ROUTER_METRICS, *SOFT_METRICS):
            row[m] = values.get(m, np.nan)
        row["shares"] = list(stats["shares"]) if isinstance(stats.get("shares"), list) else None
        row["note"] = stats.get("note", "")  # why statistics are NaN (the hash router: no scores)
        rows.append(row)
    return rows


def diagnostics_over_training(run_dir: str | os.PathLike, step: Optional[int] = None) -> pd.DataFrame:
    """The eval records of ``metrics.jsonl`` as one row per (eval step, layer): ``step``,
    ``tokens``, ``layer``, ``kind``, ``val_loss``, ``train_loss`` and the layer's router
    statistics (``busiest``, ``usage_var``, ``entropy``, ``top1``, ``margin``, ``logz``; soft
    MoE also ``usage_entropy`` and ``max_gt_0.9``; ``shares`` as a list; ``note``: why a routed
    layer's statistics are NaN, e.g. "hash router: no scores"), read as the notebooks
    read them (:func:`studylib.study.analysis.frames.layer_stats`: ``busiest`` and ``usage_var`` from the
    eval set's shares). Dense layers have NaN router statistics.

    ``step`` selects one evaluation: the last one at or before ``step`` (the first one if
    ``step`` is earlier). ``attrs["steps"]`` lists all eval steps, ``attrs["selected_step"]`` the
    chosen one (None without a selector).
    """
    rd = RunDir(run_dir)
    kinds = _layer_kinds(rd)
    rows = [row for rec in rd.read_metrics("eval") for row in _eval_rows(rec, kinds)]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for c in ("val_loss", "train_loss", *ROUTER_METRICS, *SOFT_METRICS):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    steps = sorted({int(s) for s in df["step"].dropna()})
    selected = None
    if step is not None and steps:
        selected = nearest_step_at_or_before(steps, step)
        df = df[df["step"] == selected].reset_index(drop=True)
    df.attrs["steps"] = steps
    df.attrs["selected_step"] = selected
    df.attrs["run"] = str(rd.path)
    return df


def nearest_step_at_or_before(steps: list[int], step: int) -> int:
    """The last of the ascending ``steps`` at or before ``step`` (the first one if it is earlier)."""
    before = [s for s in steps if s <= int(step)]
    return before[-1] if before else steps[0]
