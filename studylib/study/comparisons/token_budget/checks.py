"""Two checks on the token-budget map of notebook 09 (:mod:`studylib.study.comparisons.token_budget.gaps`): what each
point takes to resolve (:func:`power_frame`, the power table of :func:`studylib.study.analysis.tables.power_rows`
against the paper's gap at its own point) and what passing over the data more than once does
(:func:`repetition_table`: validation minus training loss at the end of each run).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd

from studylib.study.analysis.tables import power_rows
from studylib.study.comparisons.token_budget.gaps import PAPER_POINT, size_label
from studylib.study.comparisons.token_budget.knobs import TrioConfig


def repetition_table(trios: Sequence[TrioConfig], summaries: pd.DataFrame, metrics: Mapping) -> pd.DataFrame:
    """What passing over the data more than once does, per size x budget x model: the passes, and
    the mean over seeds of the last training loss (the mean over the steps since the last
    evaluation) and of the final full-split validation loss, and ``val - train``. In a single pass
    every training window is new, so its loss estimates the validation loss; once windows repeat,
    a training loss below the validation loss is memorisation (the gap grows with the passes).
    Budgets under one pass are left out: their last training loss averages over most of a short
    run, steep start included, and says nothing about repetition. ``metrics``: ``{(size, epochs):
    the metrics.jsonl records of its runs with model and seed}``
    (:func:`studylib.study.comparisons.token_budget.cell_metrics`)."""
    rows = []
    by_cell = summaries.groupby(["size", "epochs"], sort=False)
    for t in trios:
        for e in t.epochs:
            d = by_cell.get_group((t.size, e))
            passes = float((d["tokens"] / d["train_targets"]).iloc[0]) if "train_targets" in d else float("nan")
            if passes < 1 - 1e-9:
                continue
            m = metrics[(t.size, e)]
            last = m.sort_values("step").groupby(["model", "seed"]).tail(1)
            for model in t.models:
                r = last[last["model"] == model]
                rows.append({"size": t.size, "epochs": e, "data_passes": passes, "model": model,
                             "n": len(r), "train_loss": float(r["train_loss"].mean()),
                             "val_loss": float(r["val_loss"].mean()),
                             "val_minus_train": float((r["val_loss"] - r["train_loss"]).mean())})
    return pd.DataFrame(rows)


def power_frame(per_seed: pd.DataFrame, active: dict, target: float = 0.05) -> pd.DataFrame:
    """What every point of the map takes to resolve (:func:`studylib.study.analysis.tables.power_rows`):
    one row per size x budget x gap, the effect being the paper's gap at its point (SPEC section 7;
    the map's question is whether the gaps reach it)."""
    groups, keys = {}, {}
    for (size, e, gap), d in per_seed.groupby(["size", "epochs", "gap"], sort=False):
        label = f"{size_label(size, active[size])}, {e:g} epochs, {gap}"
        groups[label] = d.sort_values("seed")["value"].to_numpy()
        keys[label] = {"size": size, "epochs": e, "gap": gap, "tokens_per_param": float(d["tokens_per_param"].iloc[0])}
    effects = {label: abs(PAPER_POINT[k["gap"]]) for label, k in keys.items()}
    rows = power_rows(groups, effects, target)
    return pd.concat([pd.DataFrame([keys[c] for c in rows["comparison"]]), rows], axis=1)


__all__ = ["power_frame", "repetition_table"]
