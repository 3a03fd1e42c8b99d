"""The seaborn figures the notebooks share, and saving figures / tables.

Every plotting function returns its matplotlib Figure; given ``outdir`` (the preset's output
folder ``outputs/<preset>``, ``notebook_context().out``) it also saves the figure as
``<outdir>/figures/<name>.png``. :func:`save_table` writes ``<outdir>/tables/<name>.csv``. Both
write through :mod:`studylib.storage.files` (temporary file + rename): a file is whole or absent.
Figures are made through pyplot, so a notebook shows them inline at the end of the cell.

Importing this module changes nothing global: :func:`setup` sets the style. The backend is
matplotlib's own choice (inline in Jupyter / papermill, Agg when there is no display).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from studylib.storage.files import atomic_open, write_atomic
from studylib.study.analysis.frames import TABLE7_METRICS, eval_curves
from studylib.study.analysis.stats import paired

DPI = 110


def setup(context: str = "notebook") -> None:
    """One look for every figure of the study."""
    sns.set_theme(context=context, style="whitegrid", palette="colorblind")
    plt.rcParams.update({"figure.dpi": DPI, "savefig.dpi": DPI, "savefig.bbox": "tight",
                         "figure.max_open_warning": 0})


def _output_file(outdir, folder: str, filename: str) -> Path:
    path = Path(outdir) / folder / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def save_figure(fig, name: str, outdir=None) -> Optional[Path]:
    """Save ``fig`` as ``<outdir>/figures/<name>.png`` (no-op without ``outdir``); returns the path."""
    if outdir is None:
        return None
    path = _output_file(outdir, "figures", f"{name}.png")
    with atomic_open(path, "wb") as f:  # whole or not at all (a kill, a full disk: the previous file stays)
        fig.savefig(f, format="png")
    return path


def save_table(df: pd.DataFrame, name: str, outdir=None, index: bool = True) -> Optional[Path]:
    """Write ``df`` as ``<outdir>/tables/<name>.csv`` (no-op without ``outdir``); returns the path."""
    if outdir is None:
        return None
    path = _output_file(outdir, "tables", f"{name}.csv")
    write_atomic(path, df.to_csv(index=index))
    return path


def _finish(fig, name: str, outdir) -> plt.Figure:
    fig.tight_layout()
    save_figure(fig, name, outdir)
    return fig


def _signed(v: float) -> str:
    return f"{v:+.4f}" if abs(v) >= 1e-3 or v == 0 else f"{v:+.1e}"


def _order(df: pd.DataFrame, col: str, order: Optional[Sequence]) -> list:
    seen = list(dict.fromkeys(df[col]))
    return [m for m in order if m in seen] if order else seen


# --------------------------------------------------------------------------------------------
# training curves and gaps (Figs 2, 3)
# --------------------------------------------------------------------------------------------
def t_interval(values) -> tuple[float, float]:
    """The paired-t 95% interval of the mean of ``values`` (:func:`studylib.study.analysis.stats.paired`),
    as seaborn's ``errorbar`` callable wants it; one value: a zero-width band at it."""
    p = paired(np.asarray(values, dtype=float))
    return (p.ci_low, p.ci_high) if p.n > 1 else (p.mean, p.mean)


FULL_MARKER = {"marker": "D", "markersize": 7, "markeredgecolor": "black", "linestyle": "none"}


def val_curves(metrics: pd.DataFrame, x: str = "tokens", y: str = "val_loss",
               order: Optional[Sequence[str]] = None, title: str = "Validation loss",
               outdir=None, name: str = "val_loss_curves", logy: bool = False) -> plt.Figure:
    """``y`` vs ``x`` per model on the fixed validation subset (:func:`studylib.study.analysis.frames.eval_curves`):
    the mean over seeds with its 95% CI band (paired t). The final full-split loss is not on the
    curve (another sample of windows): it is marked separately (diamond, mean with 95% CI)."""
    ev = eval_curves(metrics)
    hue_order = _order(ev, "model", order)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sns.lineplot(data=ev.dropna(subset=[y]), x=x, y=y, hue="model", hue_order=hue_order,
                 errorbar=t_interval, marker="o", markersize=3, ax=ax)
    colors = dict(zip(hue_order, sns.color_palette(n_colors=len(hue_order))))
    if y == "val_loss" and ev["full_val_loss"].notna().any():
        fin = ev.dropna(subset=["full_val_loss"])
        for i, m in enumerate(hue_order):
            d = fin[fin["model"] == m]
            if d.empty:
                continue
            lo, hi = t_interval(d["full_val_loss"])
            mean = float(d["full_val_loss"].mean())
            ax.errorbar([d[x].mean()], [mean], yerr=[[mean - lo], [hi - mean]], color=colors[m], capsize=3,
                        label="full validation split, end" if i == 0 else None, **FULL_MARKER)
        ax.legend()
    ax.set(title=title, xlabel="target tokens" if x == "tokens" else x,
           ylabel=y.replace("_", " ") + (" (validation subset)" if y == "val_loss" else ""))
    if logy:
        ax.set_yscale("log")
    return _finish(fig, name, outdir)


def gap_curves(gaps: pd.DataFrame, x: str = "tokens", title: str = "Loss gaps over training",
               outdir=None, name: str = "gap_curves") -> plt.Figure:
    """Gap curves from :func:`studylib.study.analysis.tables.gap_curves` (validation subset): per gap the
    mean over seeds with its 95% CI band, and each seed's gap as a thin line."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    per_seed = gaps.attrs.get("per_seed")
    for i, (g, d) in enumerate(gaps.groupby("gap", sort=False)):
        d = d.sort_values(x)
        c = sns.color_palette()[i]
        if per_seed is not None and len(per_seed):
            for _, ps in per_seed[per_seed["gap"] == g].groupby("seed"):
                ps = ps.sort_values(x)
                ax.plot(ps[x], ps["value"], color=c, lw=0.7, alpha=0.35)
        ax.plot(d[x], d["mean"], marker="o", markersize=3, color=c, label=g)
        ax.fill_between(d[x], d["ci_low"].fillna(d["mean"]), d["ci_high"].fillna(d["mean"]), color=c, alpha=0.2)
    ax.axhline(0.0, color="0.4", lw=1, ls="--")
    ax.set(title=title, xlabel="target tokens" if x == "tokens" else x, ylabel="gap (nats, validation subset)")
    ax.legend()
    return _finish(fig, name, outdir)


def intervals(table: pd.DataFrame, title: str = "Paired gaps (95% CI)", xlabel: str = "gap (nats)",
              paper: Optional[str] = None, outdir=None, name: str = "paired_gaps") -> plt.Figure:
    """Paired gaps of a :func:`studylib.study.analysis.tables.comparison_table` (or any frame with ``mean``,
    ``ci_low``, ``ci_high``, ``resolved`` and the per-seed gaps in ``attrs["per_seed"]``): one row
    per comparison, the mean with its 95% CI (filled: resolved, after Holm where the table is a
    family; open: not resolved), each
    seed's gap as a dot, and the ``paper`` column's value as a red cross where it is given."""
    t = table
    labels = [str(i) for i in t.index]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(t) + 2.2))
    per_seed = table.attrs.get("per_seed")
    for y, (label, r) in enumerate(t.iterrows()):
        lo, hi = r["ci_low"], r["ci_high"]
        err = None if pd.isna(lo) else [[r["mean"] - lo], [hi - r["mean"]]]
        ax.errorbar([r["mean"]], [y], xerr=err, fmt="o", color="C0", capsize=4,
                    markerfacecolor="C0" if bool(r.get("resolved", False)) else "white")
        if per_seed is not None and len(per_seed):
            v = per_seed.loc[per_seed["comparison"] == label, "gap"]
            ax.scatter(v, np.full(len(v), y + 0.18), s=12, color="0.35", zorder=3)
        if paper is not None and paper in t and pd.notna(r[paper]):
            ax.scatter([r[paper]], [y], marker="x", color="C3", s=40, zorder=4)
    ax.axvline(0.0, color="0.4", lw=1, ls="--")
    ax.set_yticks(range(len(t)), labels)
    ax.invert_yaxis()
    ax.set(title=title, xlabel=xlabel)
    open_ = "not resolved after Holm" if "p_holm" in t else "includes 0"
    handles = [plt.Line2D([], [], marker="o", color="C0", label=f"mean, 95% CI (open: {open_})"),
               plt.Line2D([], [], marker="o", color="0.35", ls="none", markersize=4, label="per seed")]
    if paper is not None and paper in t and t[paper].notna().any():
        handles.append(plt.Line2D([], [], marker="x", color="C3", ls="none", label="paper"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22 - 0.3 / max(len(t), 1)),
              ncol=len(handles), fontsize=8, frameon=False)
    return _finish(fig, name, outdir)


# --------------------------------------------------------------------------------------------
# routing (Table 1, Figs 4, 5)
# --------------------------------------------------------------------------------------------
METRIC_LABELS = {"busiest": "busiest-expert fraction", "usage_var": "expert-usage variance",
                 "entropy": "router entropy (nats)", "top1": "top-1 gate", "margin": "top1 - top2 margin",
                 "logz": "router log-z", "usage_entropy": "usage entropy", "max_gt_0.9": "share max gate > 0.9",
                 "bias_picked": "share picked by the bias"}


def routing_diagnostics(rf: pd.DataFrame, metrics: Sequence[str] = TABLE7_METRICS, x: str = "step",
                        title: str = "Routing diagnostics per layer",
                        outdir=None, name: str = "routing_diagnostics", hue: str = "layer") -> plt.Figure:
    """One panel per metric of a :func:`studylib.study.analysis.frames.routing_frame` (optionally with a
    ``seed`` column: mean ± std band over seeds), one line per layer (or per ``hue`` value;
    rows sharing an x and hue value are averaged with a ±1 std band)."""
    metrics = [m for m in metrics if m in set(rf["metric"])]
    n = len(metrics)
    cols = min(3, max(n, 1))
    rows = max(1, int(np.ceil(n / cols)))
    fig, axes = plt.subplots(rows, cols, figsize=(4.3 * cols + (1.5 if n == 1 else 0), 3.2 * rows), squeeze=False)
    for ax, m in zip(axes.flat, metrics):
        d = rf[rf["metric"] == m]
        sns.lineplot(data=d, x=x, y="value", hue=hue, palette="viridis" if hue == "layer" else None,
                     errorbar="sd",
                     marker="o", markersize=3, ax=ax, legend=ax is axes.flat[0])
        ax.set(title=METRIC_LABELS.get(m, m), xlabel=x, ylabel="")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    first = axes.flat[0]
    if first.get_legend() is not None:
        handles, labels = first.get_legend_handles_labels()
        first.get_legend().remove()
        fig.legend(handles, labels, title=hue, loc="upper left", bbox_to_anchor=(1.0, 0.92), frameon=False)
    fig.suptitle(title)
    return _finish(fig, name, outdir)


def share_heatmap(shares: pd.DataFrame, title: str = "Expert shares by layer (last evaluation)",
                  outdir=None, name: str = "expert_share_heatmap", value: str = "share") -> plt.Figure:
    """Heatmap layer x expert of the (mean) share at the last eval step of a shares frame."""
    last = shares[shares["step"] == shares["step"].max()]
    grid = last.pivot_table(index="layer", columns="expert", values=value, aggfunc="mean")
    fig, ax = plt.subplots(figsize=(1.2 * grid.shape[1] + 2.5, 0.7 * grid.shape[0] + 1.8))
    sns.heatmap(grid, annot=True, fmt=".2f", cmap="mako", vmin=0,
                vmax=max(2.0 / grid.shape[1], 0.5, float(np.nanmax(grid.to_numpy()))),
                cbar_kws={"label": value}, ax=ax)
    ax.set(title=title)
    return _finish(fig, name, outdir)


def _per_expert_grid(df: pd.DataFrame, models: Sequence[str], y: str, x: str, hline: tuple, title: str,
                     errorbar=None, ylim=None) -> plt.Figure:
    """One row per model, one column per layer, one line per expert of ``y``; ``hline``: (y,
    matplotlib line style kwargs)."""
    layers = sorted(df["layer"].unique())
    fig, axes = plt.subplots(len(models), len(layers), figsize=(3.2 * len(layers), 2.4 * len(models)),
                             squeeze=False, sharex=True, sharey=True)
    for r, m in enumerate(models):
        for c, layer in enumerate(layers):
            ax = axes[r, c]
            d = df[(df["model"] == m) & (df["layer"] == layer)]
            sns.lineplot(data=d, x=x, y=y, hue="expert", palette="tab10", ax=ax,
                         legend=(r == 0 and c == len(layers) - 1), errorbar=errorbar)
            ax.axhline(hline[0], **hline[1])
            if ylim is not None:
                ax.set_ylim(*ylim)
            ax.set(xlabel=x if r == len(models) - 1 else "", ylabel=m if c == 0 else "",
                   title=f"layer {layer}" if r == 0 else "")
    fig.suptitle(title)
    return fig


def collapse_shares(shares_by_model: dict, threshold: float = 0.9, x: str = "step",
                    title: str = "Per-layer assignment shares over training",
                    outdir=None, name: str = "routing_collapse") -> plt.Figure:
    """Grid: one row per variant, one column per layer, one line per expert share; the dashed
    line marks the collapse threshold."""
    df = pd.concat([d.assign(model=m) for m, d in shares_by_model.items() if len(d)], ignore_index=True)
    fig = _per_expert_grid(df, list(shares_by_model), "share", x, (threshold, dict(color="red", ls="--", lw=1)),
                           title, ylim=(0, 1.02))
    return _finish(fig, name, outdir)


def bias_trajectory(bias: pd.DataFrame, x: str = "tokens", title: str = "Selection bias over training",
                    outdir=None, name: str = "router_bias") -> plt.Figure:
    """Grid: one row per variant with a selection bias, one column per layer, one line per expert
    (mean over seeds with its spread) of a :func:`studylib.study.comparisons.router_variants.variants.bias_frame`."""
    fig = _per_expert_grid(bias, list(dict.fromkeys(bias["model"])), "bias", x, (0.0, dict(color="grey", lw=0.8)),
                           title, errorbar=("pi", 100))
    return _finish(fig, name, outdir)


# --------------------------------------------------------------------------------------------
# budgets, throughput, granularity
# --------------------------------------------------------------------------------------------
SPLIT_COLORS = {"embedding": "#4c72b0", "non_ffn": "#8172b3", "ffn_active": "#55a868",
                "ffn_inactive": "#c7e9c0", "router": "#c44e52"}


def param_split(split: pd.DataFrame, title: str = "Parameter split", outdir=None,
                name: str = "param_split") -> plt.Figure:
    """Stacked horizontal bars (millions) of :func:`studylib.study.analysis.tables.param_split`."""
    d = split[[c for c in SPLIT_COLORS if c in split]] / 1e6
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(d) + 1.6))
    left = np.zeros(len(d))
    for col in d.columns:
        ax.barh(d.index, d[col], left=left, color=SPLIT_COLORS[col], label=col.replace("_", " "))
        left += d[col].to_numpy()
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.2f}M", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, left.max() * 1.15)
    ax.set(title=title, xlabel="parameters (millions)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return _finish(fig, name, outdir)


def throughput(df: pd.DataFrame, x: str = "label", y: str = "tok_per_s", hue: Optional[str] = None,
               title: str = "Training throughput", ylabel: str = "tokens / s", outdir=None,
               name: str = "throughput") -> plt.Figure:
    """Bars of tokens/s (one bar per model / dispatch path), value labels on top; whiskers from
    ``lo`` to ``hi`` (e.g. min and max over the timed rounds) when those columns exist."""
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * df[x].nunique() + 2), 4))
    sns.barplot(data=df, x=x, y=y, hue=hue, ax=ax, errorbar=None)
    for cont in ax.containers:
        ax.bar_label(cont, fmt="{:,.0f}", fontsize=8, padding=2)
    if hue is None and {"lo", "hi"} <= set(df.columns):
        yv = df[y].to_numpy(dtype=float)
        err = np.vstack([np.clip(yv - df["lo"].to_numpy(dtype=float), 0, None),
                         np.clip(df["hi"].to_numpy(dtype=float) - yv, 0, None)])
        ax.errorbar(np.arange(len(df)), yv, yerr=err, fmt="none", ecolor="0.25", capsize=4, lw=1)
    ax.set(title=title, xlabel="", ylabel=ylabel)
    ax.tick_params(axis="x", rotation=20)
    return _finish(fig, name, outdir)


def deltas(df: pd.DataFrame, y: str, x: str = "model", title: str = "Loss change vs K=1",
           ylabel: str = "delta val loss (nats)", outdir=None, name: str = "granularity_deltas",
           hue: Optional[str] = None) -> plt.Figure:
    """Bars of a delta column (e.g. val-loss change vs K=1, or the uniform-gate ablation)."""
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(df) + 2), 3.8))
    sns.barplot(data=df.reset_index(), x=x, y=y, hue=hue, ax=ax, errorbar=None)
    for cont in ax.containers:
        ax.bar_label(cont, labels=[_signed(b.get_height()) for b in cont], fontsize=8)
    ax.axhline(0, color="0.3", lw=1)
    ax.set(title=title, xlabel="", ylabel=ylabel)
    return _finish(fig, name, outdir)


def cosine_heatmaps(mats_by_model: dict, title: str = "Expert-output cosine similarity",
                    outdir=None, name: str = "expert_cosine") -> plt.Figure:
    """Grid of K x K heatmaps: one row per model, one column per layer."""
    models = [m for m, v in mats_by_model.items() if v]
    layers = sorted({layer for m in models for layer in mats_by_model[m]})
    fig, axes = plt.subplots(max(1, len(models)), max(1, len(layers)),
                             figsize=(2.8 * max(1, len(layers)), 2.6 * max(1, len(models))), squeeze=False)
    for r, m in enumerate(models):
        for c, layer in enumerate(layers):
            ax = axes[r, c]
            mat = mats_by_model[m].get(layer)
            if mat is None:
                ax.set_visible(False)
                continue
            sns.heatmap(mat, vmin=-1, vmax=1, cmap="vlag", annot=mat.shape[0] <= 4, fmt=".2f",
                        cbar=False, square=True, ax=ax)
            ax.set(title=f"{m} L{layer}")
    fig.suptitle(title)
    return _finish(fig, name, outdir)


def downstream_metrics(df: pd.DataFrame, models: Sequence[str], cols: Sequence[str],
                       title: str = "Downstream metrics per seed (bar: mean ± std)", outdir=None,
                       name: str = "fig10_downstream") -> plt.Figure:
    """One panel per metric column of ``df`` (one row per model x seed): the per-seed values of each
    model as dots, their mean ± sample std as a bar."""
    fig, axes = plt.subplots(1, len(cols), figsize=(4 * len(cols), 3.6), squeeze=False)
    for ax, col in zip(axes[0], cols):
        for i, m in enumerate(models):
            y = df[df.model == m][col].to_numpy()
            ax.scatter(np.full(len(y), i), y, alpha=0.7)
            ax.errorbar(i, y.mean(), yerr=y.std(ddof=1) if len(y) > 1 else 0, fmt="_k", capsize=6)
        ax.set_xticks(range(len(models)), models, rotation=20)
        ax.set_title(col)
    fig.suptitle(title)
    return _finish(fig, name, outdir)


def downstream_gaps(gaps: pd.DataFrame, cols: Sequence[str], outdir=None,
                    name: str = "fig10_downstream_gaps") -> plt.Figure:
    """One panel per metric: each comparison's paired gap with its 95% CI (open marker: not
    resolved, the CI includes 0)."""
    fig, axes = plt.subplots(1, len(cols), figsize=(4 * len(cols), 2.8), squeeze=False)
    for ax, col in zip(axes[0], cols):
        g = gaps[gaps.metric == col].reset_index(drop=True)
        for i, r in g.iterrows():
            ax.errorbar(r.gap, i, xerr=[[r.gap - r.ci_low], [r.ci_high - r.gap]], fmt="o", capsize=4, color="C0",
                        mfc="C0" if r.resolved else "white")
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(range(len(g)), g.comparison)
        ax.set_title(f"{col} (95% CI)")
    return _finish(fig, name, outdir)

