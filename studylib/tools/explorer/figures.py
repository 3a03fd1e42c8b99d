"""Figures of the explorer: the tokens x layers routing grid and the diagnostics small multiples.

Matplotlib :class:`~matplotlib.figure.Figure` objects, not pyplot: no global state, nothing shown
by accident. Matplotlib and seaborn are imported where a figure is drawn (optional, heavy).
"""
from __future__ import annotations

import io
import math
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from studylib.tools.explorer.view import RoutingView, shared_prefix

DIAG_PLOT_METRICS = ("val_loss", "entropy", "busiest", "top1", "margin", "logz")
METRIC_TITLES = {
    "val_loss": "validation loss", "train_loss": "train loss", "entropy": "router entropy",
    "busiest": "busiest-expert share", "usage_var": "expert-usage variance",
    "top1": "gate (mean top-1 prob)", "margin": "top1 - top2 margin", "logz": "router log-z",
    "usage_entropy": "usage entropy", "max_gt_0.9": "share of tokens with gate > 0.9",
}
GENERATED_RED = "#b2182b"


def _palette(n: int) -> list:
    import seaborn as sns

    return list(sns.color_palette("tab10" if n <= 10 else "husl", max(n, 1)))


def _show_piece(piece: str) -> str:
    return piece.replace("\n", "\\n") if piece else "''"


# --------------------------------------------------------------------------------------------
# the routing grid
# --------------------------------------------------------------------------------------------
def _cell_colours(view: RoutingView, rows: slice, palette) -> np.ndarray:
    """(S, L, 4) RGBA: the top expert's colour, shaded by its weight (pale = uniform over the
    chosen experts, full = 1); dense layers light grey."""
    S, L = len(view.ids[rows]), view.n_layers
    rgba = np.ones((S, L, 4))
    top, topw = view.top_expert[rows], view.top_weight[rows]
    for layer in range(L):
        if view.weights[layer] is None:
            rgba[:, layer, :3] = 0.88
            continue
        k = view.top_k if view.kinds[layer] == "moe" else view.num_experts
        lo = 1.0 / max(k, 1)  # the top weight is at least 1/k
        for t in range(S):
            c = np.asarray(palette[top[t, layer] % len(palette)])
            shade = 1.0 if lo >= 1.0 else 0.2 + 0.8 * float(np.clip((topw[t, layer] - lo) / (1 - lo), 0, 1))
            rgba[t, layer, :3] = 1 - shade * (1 - c)
    return rgba


def _cell_texts(ax, view: RoutingView, rows: slice, annotate: bool, fontsize: int) -> None:
    """``e<expert> <weight>`` in every routed cell, ``dense`` in dense ones."""
    top, topw = view.top_expert[rows], view.top_weight[rows]
    for t in range(len(view.ids[rows])):
        for layer in range(view.n_layers):
            if view.weights[layer] is None:
                txt = "dense" if annotate else ""
            else:
                w = topw[t, layer]
                txt = f"e{top[t, layer]} " + (f"{w:.2f}".lstrip("0") if w < 0.995 else "1.0") if annotate else ""
            if txt:
                ax.text(layer, t, txt, ha="center", va="center", fontsize=fontsize, color="0.15")


def _outline_changes(ax, view: RoutingView, rows: slice, other: RoutingView) -> None:
    """Outline the cells whose top expert differs from ``other``'s on the same token."""
    from matplotlib.patches import Rectangle

    n = shared_prefix(view, other)
    top, otop = view.top_expert[rows], other.top_expert
    start = rows.start or 0
    for t in range(len(view.ids[rows])):
        g = start + t
        if g >= n:
            break
        for layer in range(min(view.n_layers, other.n_layers)):
            if view.weights[layer] is not None and other.weights[layer] is not None \
                    and top[t, layer] != otop[g, layer]:
                ax.add_patch(Rectangle((layer - 0.5, t - 0.5), 1, 1, fill=False, lw=1.2, ec="black"))


def _label_axes(ax, view: RoutingView, rows: slice, fontsize: int) -> None:
    """Token pieces down the side (prefix grey, generated red, a red line before them), layers on top."""
    S, L = len(view.ids[rows]), view.n_layers
    start = rows.start or 0
    ax.set_yticks(range(S))
    labels = ax.set_yticklabels([_show_piece(p) for p in view.tokens[rows]], fontsize=fontsize + 1)
    for t, lab in enumerate(labels):
        g = start + t
        if g < view.n_prefix:
            lab.set_color("0.5")
        elif view.n_prompt is not None and g >= view.n_prompt:
            lab.set_color(GENERATED_RED)
    if view.n_prompt is not None and start <= view.n_prompt - 0.5 < start + S and view.n_prompt > start:
        ax.axhline(view.n_prompt - start - 0.5, color=GENERATED_RED, lw=1.5)
    ax.set_xticks(range(L))
    ax.set_xticklabels([f"L{i}\n{k}" for i, k in enumerate(view.kinds)], fontsize=8)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    ax.set_xticks(np.arange(-0.5, L, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, S, 1), minor=True)
    ax.grid(which="minor", color="white", lw=0.6)
    ax.grid(which="major", visible=False)
    for s in ax.spines.values():
        s.set_visible(False)


def _draw_grid(ax, view: RoutingView, rows: slice, palette, other: Optional[RoutingView] = None,
               annotate: bool = True) -> None:
    fs = 8 if len(view.ids[rows]) <= 48 else 6
    ax.imshow(_cell_colours(view, rows, palette), aspect="auto", interpolation="nearest")
    _cell_texts(ax, view, rows, annotate, fs)
    if other is not None:
        _outline_changes(ax, view, rows, other)
    _label_axes(ax, view, rows, fs)


def _draw_nothing_to_route(ax, view: RoutingView) -> None:
    ax.set_axis_off()
    ax.text(0.5, 0.5, "nothing to route:\nthis model is dense\n(no router in any layer)", ha="center",
            va="center", fontsize=11, transform=ax.transAxes, wrap=True)
    ax.set_title(view.title, fontsize=10)


def routing_grid_figure(view: RoutingView, other: Optional[RoutingView] = None, *, annotate: bool = True,
                        max_tokens: int = 96, title: Optional[str] = None):
    """Tokens (rows, top to bottom) x layers (columns) grid of ``view``: colour = the token's top
    expert at that layer, shade = its weight (pale: no more than uniform over the chosen
    experts; full: 1), text = expert and weight; dense layers grey. With ``other`` the two are
    drawn side by side and cells whose top expert differs from the other view's are outlined.
    Generated tokens (``generate_and_route``) have red labels below a red line; the end-of-story
    prefix is grey. A view without routed layers gives a figure saying "nothing to route".
    Returns a :class:`matplotlib.figure.Figure` (not registered with pyplot).
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    views = [view] if other is None else [view, other]
    S = max(min(len(v.ids), max_tokens) for v in views)
    L = max(v.n_layers for v in views)
    E = max([v.num_experts for v in views] + [1])
    palette = _palette(E)
    width = max(4.2, 1.6 + 1.0 * L) * len(views) + 0.6
    height = 1.6 + 0.24 * S
    fig = Figure(figsize=(width, height), dpi=100)
    axes = fig.subplots(1, len(views), squeeze=False)[0]
    for i, (ax, v) in enumerate(zip(axes, views)):
        if not v.routed:
            _draw_nothing_to_route(ax, v)
            continue
        partner = views[1 - i] if len(views) == 2 else None
        _draw_grid(ax, v, slice(0, min(len(v.ids), max_tokens)), palette, partner, annotate)
        note = f" (first {max_tokens} of {len(v.ids)} tokens)" if len(v.ids) > max_tokens else ""
        ax.set_title(v.title + note, fontsize=10, pad=28)
    routed = any(v.routed for v in views)
    if routed:
        handles = [Patch(color=palette[e], label=f"e{e}") for e in range(E)]
        fig.legend(handles=handles, loc="lower center", ncol=min(E, 8), fontsize=8, frameon=False,
                   title="top expert (shade = its weight)", title_fontsize=8)
    fig.suptitle(title if title is not None else "Routing by token and layer", fontsize=11)
    fig.tight_layout(rect=(0, 0.6 / height if routed else 0, 1, 1))
    return fig


# --------------------------------------------------------------------------------------------
# diagnostics over training
# --------------------------------------------------------------------------------------------
def _plot_losses(ax, df: pd.DataFrame, routed: pd.DataFrame) -> None:
    per = df.drop_duplicates("step")[["step", "val_loss", "train_loss"]] if len(df) else df
    for col, ls in (("val_loss", "-"), ("train_loss", ":")):
        if len(per) and per[col].notna().any():
            ax.plot(per["step"], per[col], ls, marker="o", ms=3, label=col.replace("_", " "))
    ax.legend(fontsize=7)
    if not len(routed) and len(df):
        ax.text(0.5, 0.92, "dense: no router statistics", transform=ax.transAxes, ha="center",
                fontsize=8, color="0.3")


def _plot_router_metric(ax, routed: pd.DataFrame, metric: str, with_legend: bool):
    """One router statistic per layer over the eval steps; returns the layer legend's handles if
    this axis drew it (it is moved to the figure), else None."""
    import seaborn as sns

    sns.lineplot(data=routed, x="step", y=metric, hue="layer", marker="o", ax=ax, palette="viridis",
                 legend=with_legend)
    handles = None
    if with_legend and ax.get_legend() is not None:
        handles = ax.get_legend_handles_labels()
        ax.get_legend().remove()
    if metric == "entropy" and len(routed) and routed["shares"].notna().any():
        E = len(next(s for s in routed["shares"] if isinstance(s, list)))
        ax.axhline(math.log(E), color="0.6", lw=0.8, ls="--")  # the entropy of a uniform router
    return handles


def _metrics_to_plot(df: pd.DataFrame, routed: pd.DataFrame, metrics: Sequence[str]) -> list[str]:
    ms = [m for m in metrics if m in ("val_loss", "train_loss") or (len(routed) and routed[m].notna().any())]
    return ms or ["val_loss"]


def diagnostics_figure(df: pd.DataFrame, step: Optional[int] = None,
                       metrics: Sequence[str] = DIAG_PLOT_METRICS):
    """Small multiples of :func:`diagnostics_over_training` (all steps): losses, then each router
    statistic per layer over the eval steps; a dashed line marks ``step``. Returns a Figure."""
    from matplotlib.figure import Figure

    routed = df[df["kind"] != "dense"] if len(df) else df
    ms = _metrics_to_plot(df, routed, metrics)
    ncol = min(3, len(ms))
    nrow = math.ceil(len(ms) / ncol)
    fig = Figure(figsize=(4.0 * ncol, 2.8 * nrow + 0.4), dpi=100)
    axes = fig.subplots(nrow, ncol, squeeze=False).ravel()
    for ax in axes[len(ms):]:
        ax.set_axis_off()
    layer_handles = None
    for ax, m in zip(axes, ms):
        if m in ("val_loss", "train_loss"):
            _plot_losses(ax, df, routed)
        else:
            layer_handles = _plot_router_metric(ax, routed, m, not layer_handles) or layer_handles
        ax.set_title(METRIC_TITLES.get(m, m), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("")
        ax.tick_params(labelsize=7)
        if step is not None:
            ax.axvline(step, color=GENERATED_RED, ls="--", lw=1)
    fig.suptitle("Router diagnostics over training" + (f" (selected step {step})" if step is not None else ""),
                 fontsize=10)
    if layer_handles:
        fig.legend(*layer_handles, title="layer", loc="upper right", fontsize=7, title_fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.94 if layer_handles else 1, 1))
    return fig


def figure_png(fig, dpi: Optional[int] = None) -> bytes:
    """PNG bytes of a Figure (for an ipywidgets.Image or IPython.display.Image)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi or fig.dpi)
    return buf.getvalue()
