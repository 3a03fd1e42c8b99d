"""The ladder's measurements against size (issue #55): the MoE's position p at the headline's data at
every size (:func:`positions`, from notebook 09's map table), the learned router's worth over a hash
at every size (:func:`router_worth`, from notebook 13's tables), each one's slope per decade of
active parameters (:func:`slope`: a weighted least-squares line through the sizes' estimates, each
weighted by its interval, statsmodels), Clark et al.'s S-Base and Hash beside them
(:func:`clark_worth`), the figure and the words."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd
from scipy import stats

from studylib.study.analysis.stats import holm
from studylib.study.comparisons.controls.analysis import ROLE_LABELS  # 13's words for its roles
from studylib.study.analysis.paper import PAPER_ACTIVE_PARAMS, PAPER_POSITION

#: the tables notebook 14 writes (names under ``tables/``, the figure's under ``figures/``)
POSITIONS, WORTH, SLOPES, SCORES, VERDICTS, CARRIED = ("ladder_positions", "ladder_router_worth", "ladder_slopes",
                                                        "ladder_prediction_scores", "ladder_form_verdicts",
                                                        "ladder_carried")
FIGURE = "ladder_against_size"


def positions(map_table: pd.DataFrame, epochs: float = 1.0) -> pd.DataFrame:
    """The map's cells at ``epochs`` of the preset's schedule from all the stories (the headline's
    data: the same target tokens at every size; a cell from a fraction of the stories, fewer unique
    tokens, is left out), smallest MoE first: ``size``, ``moe_active``,
    ``tokens_per_param``, ``data_passes``, ``n`` (seeds), p and its 95% CI, the matched-active and
    matched-total gaps (nats, dense − MoE) and the trio's dense spread ``den`` (L_active − L_total)."""
    t = map_table[np.isclose(map_table["epochs"], epochs)]
    t = t.sort_values("unique").drop_duplicates("size", keep="last").sort_values("moe_active")  # all the stories
    defined = t["position_defined"].astype(bool)
    return pd.DataFrame({"size": t["size"], "moe_active": t["moe_active"].astype(float),
                         "tokens_per_param": t["tokens_per_param"], "data_passes": t["data_passes"],
                         "n": t["active_n"].astype(int), "p": t["position"].where(defined), "p_low": t["position_low"],
                         "p_high": t["position_high"], "p_defined": defined,
                         "p_reason": t["position_reason"].fillna("") if "position_reason" in t else "",
                         "gap_active": t["active_mean"], "gap_active_low": t["active_ci_low"],
                         "gap_active_high": t["active_ci_high"], "gap_total": t["total_mean"],
                         "den": t["active_mean"] - t["total_mean"]}).reset_index(drop=True)


def size_text(n: float) -> str:
    """An active-parameter count as the sentences print it: 59k, 0.52M."""
    return f"{n / 1e3:.0f}k" if n < 1e6 * 0.5 else f"{n / 1e6:.2f}M"


def listed(words) -> str:
    w = list(words)
    return ", ".join(w[:-1]) + " and " + w[-1] if len(w) > 1 else (w[0] if w else "")


def router_worth(gaps: pd.DataFrame, control_positions: pd.DataFrame, ladder: pd.DataFrame) -> pd.DataFrame:
    """Per size of ``ladder`` (:func:`positions`) whose controls notebook 13 measured at the same
    cell: the hash router − the learned router (paired by seed, nats; > 0: the learned router is
    better), its CI, Holm-adjusted verdict as 13 gave it, the same for the frozen router, and the
    position of each (``p_learned``, ``p_hash``) with ``dp_hash`` = p_learned − p_hash and its CI
    (the paired gap's, over the trio's dense spread; only where p is defined: the dense pair apart)."""
    rows = []
    for r in ladder.itertuples():
        cell = f"{r.size} @ 1 epochs"  # 13's name of the cell at the preset's own schedule
        g = gaps[(gaps["b"] == r.size) & gaps["family"].str.contains(f"({cell})", regex=False)]
        pos = control_positions[control_positions["cell"] == cell].set_index("role")
        row = {"size": r.size, "moe_active": r.moe_active}
        for role in ("hash", "frozen"):
            words = ROLE_LABELS[role]
            h = g[g["a"].isin(pos.loc[pos.index == words, "model"])] if words in pos.index else g.iloc[:0]
            if len(h):
                h = h.iloc[0]
                row.update({f"{role}_gap": h["mean"], f"{role}_low": h["ci_low"], f"{role}_high": h["ci_high"],
                            f"{role}_n": int(h["n"]), f"{role}_verdict": h["verdict"], f"{role}_p_holm": h["p_holm"]})
        learned, hashed = ROLE_LABELS["moe"], ROLE_LABELS["hash"]
        if "hash_gap" in row and bool(r.p_defined) and learned in pos.index and hashed in pos.index:
            # p, and so a p difference, needs the dense pair apart
            row["p_learned"] = float(pos.loc[learned, "position"])
            row["p_hash"] = float(pos.loc[hashed, "position"])
            row["dp_hash"] = row["hash_gap"] / r.den
            row["dp_hash_low"], row["dp_hash_high"] = sorted((row["hash_low"] / r.den, row["hash_high"] / r.den))
        rows.append(row)
    return pd.DataFrame(rows)


def slope(x_active, y, low, high, level: float = 0.95) -> dict:
    """The line of ``y`` against log10 ``x_active`` through points with 95% intervals [low, high]
    (standard error: the interval's half-width / 1.96), weighted least squares with those known
    variances (statsmodels, scale fixed at 1): ``slope`` per decade with its CI and p value,
    ``intercept`` at the smallest x, ``points``, and the residuals' chi-square (``chi2``, ``chi2_p``:
    whether the sizes scatter about the line more than their intervals allow). Fewer than three
    points with intervals: NaNs and the reason."""
    import statsmodels.api as sm

    x, y = np.log10(np.asarray(x_active, float)), np.asarray(y, float)
    se = (np.asarray(high, float) - np.asarray(low, float)) / (2 * stats.norm.ppf(0.5 + level / 2))
    ok = np.isfinite(x) & np.isfinite(y) & np.isfinite(se) & (se > 0)
    out = {"points": int(ok.sum()), "slope": math.nan, "ci_low": math.nan, "ci_high": math.nan, "p": math.nan,
           "chi2": math.nan, "chi2_p": math.nan, "span_decades": float(np.ptp(x[ok])) if ok.any() else math.nan,
           "reason": ""}
    if ok.sum() < 3:
        return {**out, "reason": f"{int(ok.sum())} sizes with an interval: a line needs at least three"}
    X = sm.add_constant(x[ok] - x[ok].min())
    fit = sm.WLS(y[ok], X, weights=1.0 / se[ok] ** 2).fit(cov_type="fixed scale")
    lo, hi = fit.conf_int(alpha=1 - level)[1]
    chi2 = float(np.sum(fit.resid ** 2 / se[ok] ** 2))
    return {**out, "slope": float(fit.params[1]), "ci_low": float(lo), "ci_high": float(hi), "p": float(fit.pvalues[1]),
            "intercept": float(fit.params[0]), "x0": float(x[ok].min()), "chi2": chi2,
            "chi2_p": float(stats.chi2.sf(chi2, ok.sum() - 2))}


def slopes(ladder: pd.DataFrame, worth: pd.DataFrame) -> pd.DataFrame:
    """The two slopes per decade (:func:`slope`), one family (Holm): p, and the hash − learned gap."""
    rows = [{"quantity": "position p", **slope(ladder["moe_active"], ladder["p"], ladder["p_low"], ladder["p_high"])}]
    if "hash_gap" in worth:
        rows.append({"quantity": "hash − learned (nats)",
                     **slope(worth["moe_active"], worth["hash_gap"], worth["hash_low"], worth["hash_high"])})
    t = pd.DataFrame(rows)
    ok = t["p"].notna()  # a slope without a fit is left out of the family
    t["p_holm"] = math.nan
    if ok.any():
        t.loc[ok, "p_holm"] = holm(list(t.loc[ok, "p"]))
    return t


def clark_worth(clark_positions: pd.DataFrame, experts: int = 4) -> pd.DataFrame:
    """Clark et al.'s S-Base and Hash p per size at ``experts`` experts, and S-Base − Hash (one run
    per model and size: no interval)."""
    c = clark_positions[clark_positions["experts"] == experts]
    w = c.pivot_table(index="n_active", columns="router", values="p").reset_index()
    if {"S-Base", "Hash"} <= set(w):
        w["dp_hash"] = w["S-Base"] - w["Hash"]
    return w


def _line(ax, r, x_max: float, fmt: str) -> None:
    """A :func:`slope` row's line over its fitted range (from its smallest x to ``x_max``)."""
    xs = np.linspace(r["x0"], math.log10(x_max), 50)
    ax.plot(10 ** xs, r["intercept"] + r["slope"] * (xs - r["x0"]), color="black", lw=1,
            label=f"line: {r['slope']:{fmt}} [{r['ci_low']:{fmt}}, {r['ci_high']:{fmt}}] per decade")


def figure(ladder: pd.DataFrame, worth: pd.DataFrame, clark: Optional[pd.DataFrame], slope_rows: pd.DataFrame,
           outdir=None, name: str = FIGURE):
    """Three panels against active parameters (log x): p at every size where it is defined, with its
    95% CI and the fitted line, Clark et al.'s S-Base and Hash (E = 4) and the paper's 0.81 (the
    sizes where p is undefined marked); the hash router's loss minus the learned one's at every
    size (paired, nats) with its line; and the learned router's p minus the hash router's beside
    Clark's S-Base − Hash."""
    import matplotlib.pyplot as plt

    from studylib.study.analysis.plots import save_figure

    fig, (a, g, b) = plt.subplots(1, 3, figsize=(16, 4.8))
    ok = ladder[ladder["p_defined"].astype(bool)] if "p_defined" in ladder else ladder
    yerr = np.vstack([ok["p"] - ok["p_low"], ok["p_high"] - ok["p"]]).clip(min=0)
    a.errorbar(ok["moe_active"], ok["p"], yerr=yerr, fmt="o", color="black", capsize=3,
               label="this study, learned router (95% CI)")
    s = slope_rows.set_index("quantity")
    if "position p" in s.index and np.isfinite(s.loc["position p", "slope"]):
        _line(a, s.loc["position p"], ok["moe_active"].max(), "+.2f")
    undefined = ladder.loc[~ladder["p_defined"].astype(bool), "moe_active"] if "p_defined" in ladder else []
    for k, n in enumerate(undefined):
        a.axvline(n, color="grey", ls="--", lw=0.8, label="p undefined (the dense pair tied)" if k == 0 else None)
    if clark is not None and len(clark):
        for router, colour in (("S-Base", "tab:blue"), ("Hash", "tab:orange")):
            if router in clark:
                a.plot(clark["n_active"], clark[router], "o-", color=colour, ms=5, label=f"Clark et al. {router} (E = 4)")
        if "dp_hash" in clark:
            b.plot(clark["n_active"], clark["dp_hash"], "o-", color="tab:blue", label="Clark et al. S-Base − Hash (E = 4)")
    a.scatter([PAPER_ACTIVE_PARAMS], [PAPER_POSITION], marker="*", s=200, color="crimson", edgecolor="black",
              label=f"the paper ({PAPER_POSITION:.2f})", zorder=5)
    if "hash_gap" in worth:
        w = worth.dropna(subset=["hash_gap"])
        err = np.vstack([w["hash_gap"] - w["hash_low"], w["hash_high"] - w["hash_gap"]]).clip(min=0)
        g.errorbar(w["moe_active"], w["hash_gap"], yerr=err, fmt="o", color="black", capsize=3,
                   label="hash − learned, paired (95% CI)")
        if "hash − learned (nats)" in s.index and np.isfinite(s.loc["hash − learned (nats)", "slope"]):
            _line(g, s.loc["hash − learned (nats)"], w["moe_active"].max(), "+.3f")
    if "dp_hash" in worth:
        w = worth.dropna(subset=["dp_hash"])
        err = np.vstack([w["dp_hash"] - w["dp_hash_low"], w["dp_hash_high"] - w["dp_hash"]]).clip(min=0)
        b.errorbar(w["moe_active"], w["dp_hash"], yerr=err, fmt="o", color="black", capsize=3,
                   label="this study, learned − hash (95% CI)")
    for ax, title in ((a, "Position p at the headline's data"),
                      (g, "Hash router's loss − the learned router's (> 0: learned better)"),
                      (b, "The learned router's p minus the hash router's")):
        ax.axhline(0, color="grey", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("active parameters N (log scale)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="best")
    a.set_ylabel("p (0: active match, 1: total match)")
    g.set_ylabel("nats")
    b.set_ylabel("p difference")
    fig.tight_layout()
    save_figure(fig, name, outdir)
    return fig


def _trend(r, up: str, down: str, none: str, alpha: float = 0.05) -> str:
    """A slope's word: ``up`` / ``down`` where its Holm-adjusted p (the family of two slopes) is
    below ``alpha``, else ``none`` (its unadjusted interval is printed beside it)."""
    if not r["p_holm"] < alpha:
        return none
    return up if r["slope"] > 0 else down


def _ci(x: float, lo: float, hi: float, f: str = "+.2f") -> str:
    return f"{x:{f}} [{lo:{f}}, {hi:{f}}]"


def ladder_sentences(ladder: pd.DataFrame, worth: pd.DataFrame, slope_rows: pd.DataFrame) -> list[str]:
    """The ladder in short sentences, each built from the tables (the folded detail)."""
    out = []
    lo, hi = ladder["moe_active"].min(), ladder["moe_active"].max()
    tokens = float(ladder["tokens_per_param"].iloc[0] * ladder["moe_active"].iloc[0])
    out.append(f"The ladder measured {len(ladder)} sizes, {size_text(lo)} to {size_text(hi)} active parameters "
               f"({math.log10(hi / lo):.1f} decades), each at the same {tokens / 1e6:.2f}M training tokens.")
    parts = [f"{r.size} {_ci(r.p, r.p_low, r.p_high)}" if r.p_defined else f"{r.size} undefined ({r.p_reason})"
             for r in ladder.itertuples()]
    out.append("The MoE's position p per size: " + "; ".join(parts) + ".")
    s = slope_rows.set_index("quantity")
    if "position p" in s.index:
        r = s.loc["position p"]
        if not np.isfinite(r["slope"]):
            out.append(f"No slope of p against size: {r['reason']}.")
        else:
            trend = _trend(r, "rises", "falls", "has no resolved trend")
            out.append(f"Over the {int(r['points'])} sizes where it is defined, p {trend} with size: "
                       f"{_ci(r['slope'], r['ci_low'], r['ci_high'])} per decade (unadjusted 95% CI; Holm p = "
                       f"{r['p_holm']:.2g} over the two slopes; the residuals' chi-square p = {r['chi2_p']:.2g}, "
                       f"{'the sizes scatter about the line beyond their intervals' if r['chi2_p'] < 0.05 else 'no excess scatter'}).")
    if "hash_gap" in worth:
        w = worth.dropna(subset=["hash_gap"])
        gaps = "; ".join(f"{r.size} {_ci(r.hash_gap, r.hash_low, r.hash_high, '+.4f')} ({r.hash_verdict})"
                         for r in w.itertuples())
        out.append(f"Hash − learned router, nats (> 0: the learned router better; Holm within each size): {gaps}.")
        if "hash − learned (nats)" in s.index:
            r = s.loc["hash − learned (nats)"]
            if np.isfinite(r["slope"]):
                trend = _trend(r, "grows", "shrinks", "has no resolved trend")
                out.append(f"The learned router's worth over a hash {trend} with size: "
                           f"{_ci(r['slope'], r['ci_low'], r['ci_high'], '+.4f')} nats per decade (Holm p = "
                           f"{r['p_holm']:.2g}).")
    return out


def lead_sentences(ladder: pd.DataFrame, worth: pd.DataFrame, slope_rows: pd.DataFrame) -> list[str]:
    """The first screen's plain sentences on p and the router against size (the law's: the
    comparison's :func:`~studylib.study.comparisons.ladder.law_lead`)."""
    out = []
    tokens = float(ladder["tokens_per_param"].iloc[0] * ladder["moe_active"].iloc[0])
    ok, bad = ladder[ladder["p_defined"].astype(bool)], ladder[~ladder["p_defined"].astype(bool)]
    s = slope_rows.set_index("quantity")
    if len(ok):
        span = f"from {size_text(ok['moe_active'].min())} to {size_text(ok['moe_active'].max())} active parameters"
        r = s.loc["position p"] if "position p" in s.index else None
        if r is not None and np.isfinite(r["slope"]):
            how = _trend(r, "rises", "falls", "shows no resolved trend")
            out.append(f"At {tokens / 1e6:.2f}M training tokens, p is defined {span}; it {how} "
                       f"({_ci(r['slope'], r['ci_low'], r['ci_high'])} per decade, Holm p = {r['p_holm']:.2g}).")
        else:
            out.append(f"At {tokens / 1e6:.2f}M training tokens, p is defined {span}, too few sizes for a slope.")
    if len(bad):
        out.append(f"At {listed(size_text(n) for n in bad['moe_active'])}, the dense models matched to the MoE's total "
                   f"and active parameters are not told apart, so p is undefined.")
    if "hash_verdict" in worth:
        w = worth.dropna(subset=["hash_gap"])
        hash_wins, learned_wins = w[w["hash_verdict"] == "A better"], w[w["hash_verdict"] == "B better"]
        said = []
        for t, who in ((learned_wins, "The learned router beats a router hashing the token id"),
                       (hash_wins, "A router hashing the token id beats the learned router")):
            if len(t) == 1:
                r = t.iloc[0]
                g = (r["hash_gap"], r["hash_low"], r["hash_high"]) if t is learned_wins else \
                    (-r["hash_gap"], -r["hash_high"], -r["hash_low"])
                said.append(f"{who} at {size_text(r['moe_active'])} by {_ci(*g, '.3f')} nats")
            elif len(t):
                said.append(f"{who} at {listed(size_text(n) for n in t['moe_active'])}")
        said = "; ".join(said) if said else "no size resolves the learned router from a router hashing the token id"
        out.append(f"Of {len(w)} sizes, {said[0].lower()}{said[1:]}.")
    return out


__all__ = ["POSITIONS", "WORTH", "SLOPES", "SCORES", "VERDICTS", "CARRIED", "FIGURE", "positions", "router_worth",
           "slope", "slopes", "clark_worth", "figure", "ladder_sentences", "lead_sentences", "size_text", "listed"]
