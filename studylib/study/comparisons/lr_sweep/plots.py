"""The figure of notebook 11 (issue #10, item 5): best validation loss against the learning rate.

Saved through :func:`studylib.study.analysis.plots.save_figure` (``<outdir>/figures/<name>.png``), in the
look :func:`studylib.study.analysis.plots.setup` gives every figure.
"""
from __future__ import annotations

from typing import Optional, Sequence

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from studylib.study.analysis.plots import save_figure


def loss_vs_lr(table: pd.DataFrame, best: pd.DataFrame, preset_lr: float, models: Optional[Sequence[str]] = None,
               title: str = "Best validation loss vs learning rate", outdir=None,
               name: str = "lr_sweep_loss") -> plt.Figure:
    """Per model, the mean best val loss at each lr of the grid (log x) with its 95% CI over seeds
    (error bars; :func:`studylib.study.comparisons.lr_sweep.analysis.loss_table`), a star at the model's best grid lr
    (``best``: :func:`studylib.study.comparisons.lr_sweep.analysis.best_lrs`) and a dashed line at the preset's lr. Models
    are offset a little along x so that their bars do not hide each other."""
    models = list(models) if models else list(dict.fromkeys(table.index.get_level_values("model")))
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    colors = sns.color_palette()
    k = len(models)
    for i, m in enumerate(models):
        t = table.loc[m].sort_index()
        shift = 1.0 + 0.025 * (i - (k - 1) / 2)  # multiplicative: equal on a log axis
        x = t.index.to_numpy(dtype=float) * shift
        c = colors[i % len(colors)]
        err = [(t["mean"] - t["ci_low"]).fillna(0).clip(lower=0), (t["ci_high"] - t["mean"]).fillna(0).clip(lower=0)]
        ax.errorbar(x, t["mean"], yerr=err, fmt="o-", color=c, capsize=3, lw=1.5, ms=5,
                    label=f"{m} (n={int(t['n'].min())})")
        b = best.loc[m]
        ax.scatter([b["best_lr"] * shift], [b["best_mean"]], marker="*", s=180, color=c, edgecolor="black",
                   zorder=4)
    ax.axvline(preset_lr, color="0.4", ls="--", lw=1, label=f"preset lr {preset_lr:.3g}")
    ax.set_xscale("log")
    ax.set(xlabel="peak learning rate (min_lr = the preset's ratio)", ylabel="best val loss (nats)",
           title=f"{title} (mean, 95% CI over seeds; star: best on the grid)")
    ax.legend(fontsize=9, frameon=False)
    fig.tight_layout()
    save_figure(fig, name, outdir)
    return fig


__all__ = ["loss_vs_lr"]
