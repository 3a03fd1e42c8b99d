"""The figure of notebook 09 (issue #11): both headline gaps against tokens per active parameter.

Saved through :func:`studylib.study.analysis.plots.save_figure` (``<outdir>/figures/<name>.png``), in the
look :func:`studylib.study.analysis.plots.setup` gives every figure.
"""
from __future__ import annotations

from typing import Mapping, Optional

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D

from studylib.study.analysis.plots import save_figure
from studylib.study.comparisons.token_budget.gaps import GAPS, PAPER_POINT

TITLES = {"active": "matched active: dense_active - MoE", "total": "matched total: dense_total - MoE"}


def gap_map(table: pd.DataFrame, paper_table: Optional[pd.DataFrame] = None, paper_point: dict = PAPER_POINT,
            title: str = "Gaps against tokens per active parameter", outdir=None,
            name: str = "token_budget_gaps", models: Optional[Mapping] = None) -> plt.Figure:
    """Two panels (matched active, matched total) of a :func:`~.gaps.gap_table`: per size the mean
    gap against tokens per active parameter with its 95% CI (band and bars; hollow markers: more
    than one pass), given ``models`` each size's fitted plane, given ``paper_table`` the ``paper``
    preset's points; in bits per byte where the table has them (the paper's point, in its own
    nats, then left out), else in nats with the paper's headline point."""
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.3), sharex=True)
    colors = sns.color_palette()
    sizes = list(dict.fromkeys(table["size"]))
    bits = "active_bpb_mean" in table and table["active_bpb_mean"].notna().all()
    unit = "bits per byte" if bits else "nats"
    for ax, gap in zip(axes, GAPS):
        col = f"{gap}_bpb" if bits else gap
        for i, size in enumerate(sizes):
            d = table[table["size"] == size].sort_values("tokens_per_param")
            c = colors[i % len(colors)]
            x = d["tokens_per_param"]
            ax.plot(x, d[f"{col}_mean"], color=c, lw=1.5, label=d["size_label"].iloc[0])
            ax.fill_between(x, d[f"{col}_ci_low"], d[f"{col}_ci_high"], color=c, alpha=0.2, lw=0)
            # the same CI as a bar at every point: a size with one budget has no band
            ax.errorbar(x, d[f"{col}_mean"], yerr=[d[f"{col}_mean"] - d[f"{col}_ci_low"],
                                                   d[f"{col}_ci_high"] - d[f"{col}_mean"]],
                        fmt="none", ecolor=c, elinewidth=1.2, capsize=3)
            if models is not None and gap in models:
                n = float(d["moe_active"].iloc[0])
                grid = np.logspace(np.log10(table["tokens_per_param"].min()), np.log10(table["tokens_per_param"].max()), 50)
                ax.plot(grid, models[gap].predict(np.full_like(grid, n), grid)["gap"], color=c, lw=1, ls="--")
            for rep, face in ((False, c), (True, "white")):
                r = d[d["repeats"] == rep]
                ax.scatter(r["tokens_per_param"], r[f"{col}_mean"], s=36, facecolors=face, edgecolors=c,
                           linewidths=1.5, zorder=3)
        if paper_table is not None and len(paper_table) and f"{col}_mean" in paper_table:
            p = paper_table.sort_values("tokens_per_param")
            ax.errorbar(p["tokens_per_param"], p[f"{col}_mean"],
                        yerr=[p[f"{col}_mean"] - p[f"{col}_ci_low"], p[f"{col}_ci_high"] - p[f"{col}_mean"]],
                        fmt="D", color="0.25", ms=5, capsize=3, label="paper preset (own runs, 95% CI)")
        if not bits:
            ax.scatter([paper_point["tokens_per_param"]], [paper_point[gap]], marker="*", s=160, color="black",
                       zorder=4, label=f"paper headline ({paper_point['tokens_per_param']:.1f} tok/param)")
        ax.axhline(0.0, color="0.4", lw=1, ls="--")
        ax.set_xscale("log")
        ax.set(title=TITLES[gap], xlabel="target tokens per active parameter (MoE)",
               ylabel=f"gap in best val loss\n({unit}; > 0: MoE better)")
    extra = []
    if models is not None:
        extra.append((Line2D([], [], color="0.3", lw=1, ls="--"), "gap model (fitted over every point)"))
    if table["repeats"].any():
        extra.append((Line2D([], [], ls="", marker="o", mfc="white", mec="0.3", mew=1.5),
                      "> 1 pass over the data (repeated windows)"))
    return _finish(fig, axes, f"{title} (mean, 95% CI band over seeds)", name, outdir, 2, extra)


def _finish(fig, axes, title: str, name: str, outdir, ncol: int, extra=()) -> plt.Figure:
    """The first panel's legend (and ``extra`` (handle, label) pairs) under the panels, the title, saved."""
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles + [h for h, _ in extra], labels + [x for _, x in extra], loc="upper center",
               bbox_to_anchor=(0.5, 0.0), ncol=ncol, frameon=False, fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, name, outdir)
    return fig


def crossing_line(crossing: pd.DataFrame, table: pd.DataFrame, title: str = "Where each fitted gap is zero",
                  outdir=None, name: str = "token_budget_crossing") -> plt.Figure:
    """Two panels of :func:`~.plane.crossing_table`: the fitted gap's zero in (tokens/param, size)
    with the band where its 95% interval includes zero, and the measured points."""
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.0), sharey=True)
    for ax, gap in zip(axes, GAPS):
        c = crossing[crossing["gap"] == gap].sort_values("params") if len(crossing) else crossing
        if len(c):
            ax.fill_betweenx(c["params"], c["low"], c["high"], color="C0", alpha=0.2, lw=0,
                             label="band: the gap's 95% interval includes zero")
            ax.plot(c["tokens_per_param"], c["params"], color="C0", lw=1.8, label="fitted gap = 0")
        if f"{gap}_mean" in table:
            better = table[f"{gap}_mean"] > 0
            for flag, face, lab in ((True, "C1", "MoE better (mean)"), (False, "white", "dense better (mean)")):
                r = table[better == flag]
                ax.scatter(r["tokens_per_param"], r["moe_active"], s=40, facecolors=face, edgecolors="C1",
                           linewidths=1.5, zorder=3, label=lab)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set(title=TITLES[gap], xlabel="target tokens per active parameter (MoE)",
               ylabel="MoE active parameters")
    return _finish(fig, axes, f"{title} (gap model; measured map points as markers)", name, outdir, 4)


__all__ = ["gap_map", "crossing_line"]
