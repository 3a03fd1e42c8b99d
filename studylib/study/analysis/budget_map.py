"""Where the MoE starts to win (issue #11): both headline gaps against tokens per active parameter.

The preset's ``study.token_budget`` lists model-size trios (active-matched dense, reference MoE,
total-matched dense) and, per trio, token budgets in *epochs* of the preset's own schedule. Each
budget is trained as a run of its own (its own warmup and cosine to its own end; see
:func:`studylib.run.spec.budget_overrides`): ``epochs: 1.0`` is the preset's own run (the
headline notebook's, reused), ``epochs: e`` trains ``round(e * S)`` optimizer steps, where S is one
epoch of the training windows, or ``train.max_steps`` when the preset sets it (then the "epoch" is
``max_steps`` steps, not a pass over the data; the table's ``data_passes`` column says what the runs
actually saw).

This module holds all the logic of notebook 09:

* :func:`budget_trios` reads and validates the knob; :func:`run_plan` says which (model, budget)
  runs are the preset's own (reused) and which are budget runs of their own;
* :mod:`studylib.study.comparisons.token_budget` ensures every run exists (training only the missing ones) and returns the
  summaries; :func:`paper_preset_points` finds the ``paper`` preset's runs when they exist (it
  never trains);
* :func:`gap_frame` (per-seed gaps) and :func:`gap_table` (per size x budget, through
  :func:`studylib.study.analysis.stats.paired`, the one statistics function);
* :func:`studylib.study.analysis.crossing.crossings` (where a gap changes sign, interpolated linearly in log10 tokens/param between
  the two bracketing budgets, with the range where the 95% CI band includes zero as its
  uncertainty), :func:`studylib.study.analysis.crossing.trend` (the slope per decade, fitted per seed and summarised with
  :func:`~studylib.study.analysis.stats.paired` over the per-seed slopes) and :func:`gap_sentences`.

Sign convention (both gaps): ``dense - MoE`` in best validation loss, so **positive = the MoE is
better**. The matched-total gap is therefore the negative of notebook 03's ``MoE - dense_total``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd

from studylib.config import ConfigError, Preset, load_preset, override
from studylib.config.study import MODEL_LISTS, TOKEN_BUDGET_SHAPE, TrioConfig
from studylib.run.rundir import RunDir
from studylib.study.analysis.crossing import Crossing, Trend, crossings, trend
from studylib.study.analysis.frames import collect_runs, seed_pairs
from studylib.study.analysis.paper import PAPER_ACTIVE_PARAMS, PAPER_BUDGET_TOKENS, PAPER_GAPS, PAPER_TOKENS_PER_PARAM
from studylib.study.analysis.stats import Paired, paired
from studylib.run.spec import budget_overrides
from studylib.study.analysis.tables import fmt_count

KEY = "study.token_budget"
VALUE = "best_val_loss"
#: the two gaps: name -> (trio role of the dense model, label)
GAPS = {"active": ("dense_active", "matched-active gap (dense_active - MoE)"),
        "total": ("dense_total", "matched-total gap (dense_total - MoE)")}

# The paper's headline point (paper.py) in this module's sign convention (dense - MoE).
PAPER_POINT = {"tokens_per_param": PAPER_TOKENS_PER_PARAM,
               "active": +PAPER_GAPS["active"][0],   # +0.0758: the MoE beats dense_active
               "total": -PAPER_GAPS["total"][0]}     # -0.0180: dense_total beats the MoE


# --------------------------------------------------------------------------------------------
# the knob
# --------------------------------------------------------------------------------------------
def budget_trios(preset: Preset) -> list[TrioConfig]:
    """The trios of ``study.token_budget`` (checked when the preset loaded:
    :class:`studylib.config.TrioConfig`); absent: one ConfigError line naming the knob."""
    tb = preset.study.token_budget
    if tb is None:
        raise ConfigError(f"{KEY}: missing from preset {preset.name!r}; expected {TOKEN_BUDGET_SHAPE}")
    return list(tb.trios)


def active_params(preset: Preset, trios: Sequence[TrioConfig]) -> dict:
    """``{size: active parameters of its reference MoE}`` (exact accounting)."""
    return {t.size: int(preset.model_config(t.moe).num_params.active) for t in trios}


def size_label(size: str, active: int) -> str:
    return f"{size} ({fmt_count(active)} active)"


def budgets(preset: Preset, trios: Sequence[TrioConfig],
            overrides_for: Callable[[Preset, float], dict] = budget_overrides) -> dict:
    """``{epochs: overrides}`` for every budget of the trios (each computed once: counting one
    epoch's steps may load the data)."""
    return {e: overrides_for(preset, e) for e in sorted({e for t in trios for e in t.epochs})}


# --------------------------------------------------------------------------------------------
# which runs
# --------------------------------------------------------------------------------------------
def _study_lists(preset: Preset, model: str) -> list[str]:
    """The other ``study`` lists that name ``model`` (e.g. ``headline``: notebook 03 trains it)."""
    return [k for k in MODEL_LISTS if model in (getattr(preset.study, k) or ())]


def run_plan(preset: Preset, trios: Sequence[TrioConfig], seeds: Sequence[int], budget_map: dict) -> pd.DataFrame:
    """One row per size x budget x model: its ``max_steps``, whether it is the preset's own run
    (``preset_run``: its run identity equals the preset's, so it lives in the preset's run directory
    and is trained once for every notebook that uses it; ``also_in`` names the other ``study`` lists
    that hold it, e.g. ``headline``: notebook 03's run, reused here) or a budget run of its own
    (``runs/<model>/<tag>/``), its run directory (seed placeholder) and how many seeds are
    already finished."""
    rows = []
    for t in trios:
        for e in t.epochs:
            ov = budget_map[e]
            mine = t.seeds_of(seeds)
            for m in t.models:
                dirs = [RunDir.variant(preset, m, s, ov) for s in mine]
                base = RunDir.of(preset, m, mine[0]).path
                own = dirs[0].path == base
                rows.append({"size": t.size, "epochs": e, "model": m, "role": t.role(m),
                             "max_steps": ov.get("train.max_steps", preset.train.max_steps),
                             "preset_run": own, "also_in": ", ".join(_study_lists(preset, m)) if own else "",
                             "run_dir": str(dirs[0].path.parent / "seed*"),
                             "finished": sum(d.finished() for d in dirs), "seeds": len(mine)})
    return pd.DataFrame(rows)


def budget_columns(df: pd.DataFrame, trio: TrioConfig, e: float) -> pd.DataFrame:
    """Run summaries of one trio at one budget with ``size``, ``epochs`` and ``train_targets``."""
    df = df.copy()
    df["size"], df["epochs"] = trio.size, e
    # target tokens of one pass over the training windows, from each run's summary
    df["train_targets"] = df["data_train_targets"].astype(float) if "data_train_targets" in df else float("nan")
    return df


def paper_preset_points(root, current: Preset) -> tuple[Optional[pd.DataFrame], str]:
    """(a :func:`gap_table` of the ``paper`` preset's budget runs under ``<root>/params/paper.yaml``,
    or None; a sentence saying what was found). Never trains and never loads data: one epoch's step
    count is read from the paper preset's own one-epoch runs (``epochs: 1.0``), which are therefore
    required. None when ``current`` is the paper preset (its points are the main ones)."""
    path = Path(root) / "params" / "paper.yaml"
    if current.name == "paper":
        return None, "This is the paper preset: its budgets are the measured points."
    if not path.is_file():
        return None, f"No paper preset ({path})."
    paper_p = load_preset(path)
    if paper_p.study.token_budget is None:
        return None, f"The paper preset lists no {KEY}."
    trios, frames = budget_trios(paper_p), []
    for t in trios:
        one = collect_runs(paper_p, list(t.models), list(paper_p.seeds))
        if one.empty or "steps" not in one:
            continue
        steps = int(one["steps"].iloc[0])
        fixed = override(paper_p, {"train.max_steps": steps})  # its one epoch, without loading data
        for e in t.epochs:
            ov = budget_overrides(fixed, e)
            df = collect_runs(paper_p, list(t.models), list(paper_p.seeds), overrides=ov)
            if not df.empty:
                frames.append(budget_columns(df, t, e))
    if not frames:
        return None, ("The paper preset's runs do not exist here (they need a GPU: "
                      "`python -m studylib study --params params/paper.yaml --notebooks 09`).")
    df = pd.concat(frames, ignore_index=True)
    act = active_params(paper_p, trios)
    table = gap_table(gap_frame(df, trios, act), act)
    return table, f"The paper preset's own runs: {len(df)} finished runs found under outputs/paper."


# --------------------------------------------------------------------------------------------
# gaps
# --------------------------------------------------------------------------------------------
def gap_frame(summaries: pd.DataFrame, trios: Sequence[TrioConfig], active: dict, value: str = VALUE) -> pd.DataFrame:
    """Per seed and gap: one row per size x budget x seed x gap with the dense and the MoE
    ``value`` (seeds without both runs are left out), the gap ``dense - moe``, the target tokens,
    tokens per active parameter of the size's MoE and the passes over the training data."""
    by_size = {t.size: t for t in trios}
    rows = []
    for (size, e), d in summaries.groupby(["size", "epochs"], sort=False):
        t = by_size[size]
        toks = d.groupby("model")["tokens"].unique()
        if any(len(v) != 1 for v in toks) or toks.map(lambda v: v[0]).nunique() != 1:
            raise ValueError(f"gap_frame: size {size}, {e} epochs: the trio's runs saw different "
                             f"numbers of tokens ({toks.to_dict()}); they must share one budget")
        tokens = float(d["tokens"].iloc[0])
        passes = tokens / float(d["train_targets"].iloc[0]) if "train_targets" in d else float("nan")
        for gap, (role, _) in GAPS.items():
            dense = getattr(t, role)
            try:
                pair = seed_pairs(d, dense, t.moe, value)
            except KeyError:  # a model of the trio without runs at this budget
                continue
            for seed, (a, b) in pair.iterrows():
                rows.append({"size": size, "epochs": e, "seed": seed, "gap": gap, "dense": a, "moe": b,
                             "value": a - b, "tokens": tokens, "tokens_per_param": tokens / active[size],
                             "data_passes": passes})
    return pd.DataFrame(rows, columns=["size", "epochs", "seed", "gap", "dense", "moe", "value", "tokens",
                                       "tokens_per_param", "data_passes"])


def gap_table(per_seed: pd.DataFrame, active: dict) -> pd.DataFrame:
    """One row per size x budget: tokens, tokens per active parameter, epochs, passes over the
    data (``repeats``: more than one, so some windows are seen twice or more; ``max_views``: the
    most times one window is seen) and, per gap, the paired statistics of ``dense - moe``
    (:func:`studylib.study.analysis.stats.paired`: mean, std, n, 95% CI, p, resolved) and its ``fmt``."""
    rows = []
    for (size, e), d in per_seed.groupby(["size", "epochs"], sort=False):
        first = d.iloc[0]
        passes = float(first["data_passes"])
        row = {"size": size, "size_label": size_label(size, active[size]), "moe_active": active[size],
               "epochs": e, "tokens": int(first["tokens"]), "tokens_per_param": float(first["tokens_per_param"]),
               "data_passes": passes, "repeats": bool(passes > 1 + 1e-9),
               "max_views": int(math.ceil(passes - 1e-9)) if passes == passes else np.nan}
        for gap in GAPS:
            g = d[d["gap"] == gap].sort_values("seed")
            if g.empty:
                continue
            p = paired(g["dense"].to_numpy(), g["moe"].to_numpy())
            row.update({f"{gap}_{k}": v for k, v in p.as_dict().items() if k != "level"})
            row[f"{gap}_fmt"] = p.fmt()
        rows.append(row)
    out = pd.DataFrame(rows)
    order = {s: i for i, s in enumerate(dict.fromkeys(out["size"]))}  # sizes in trio order
    return (out.assign(_o=out["size"].map(order)).sort_values(["_o", "tokens_per_param"], kind="stable")
            .drop(columns="_o").reset_index(drop=True))


# --------------------------------------------------------------------------------------------
# sentences
# --------------------------------------------------------------------------------------------
def _x(v: float) -> str:
    return f"{v:.3g}"


def _ci(p: Paired) -> str:
    return f"[{p.ci_low:+.4f}, {p.ci_high:+.4f}]"


def _crossing_text(c: Crossing, band: bool = True) -> str:
    """One crossing in words; ``band=False``: its CI band was already given (a band that holds
    two crossings is named once)."""
    how = "the MoE overtakes the dense model" if c.rising else "the dense model overtakes the MoE"
    s = (f"crosses zero at {_x(c.x)} tokens/param ({how} going up in tokens; interpolated in "
         f"log10 tokens/param between the budgets at {_x(c.between[0])} and {_x(c.between[1])})")
    if math.isnan(c.x_low):
        return s + "; no uncertainty with fewer than two seeds"
    if not band:
        return s + ", inside the same 95% CI band"
    lo = f"{_x(c.x_low)}" + (" (the lower edge of the measured range: it may lie below)" if c.low_open else "")
    hi = f"{_x(c.x_high)}" + (" (the upper edge of the measured range: it may lie above)" if c.high_open else "")
    return s + f"; the 95% CI band includes zero from {lo} to {hi}"


def _trend_text(tr: Optional[Trend], crossed: bool) -> str:
    if tr is None:
        return "No trend: fewer than two budgets per seed."
    p = tr.slope
    if p.n < 2:
        return f"Trend: {p.mean:+.4f} per decade of tokens/param (one seed: no interval)."
    way = "the gap grows (towards the MoE)" if p.mean > 0 else "the gap falls (towards the dense model)"
    s = (f"Trend: {p.mean:+.4f} per decade of tokens/param, 95% CI {_ci(p)} over {p.n} per-seed fits "
         f"({tr.n_points} budgets): ")
    if not p.resolved:
        return s + "not resolved (the CI includes 0), so no extrapolation is made."
    s += f"resolved, {way} with more tokens per parameter."
    if not crossed:
        z = tr.zero()
        lo, hi = tr.x_range
        if z == z and z > hi:
            s += (f" Extrapolation (beyond the measured {_x(lo)}-{_x(hi)} tokens/param, assuming the line "
                  f"continues): the mean line would reach zero at ~{_x(z)} tokens/param.")
        elif z == z and z < lo:
            s += (f" Extrapolation (assuming the line continues): with more tokens it moves away from zero; "
                  f"it reaches zero only below the measured range (~{_x(z)} tokens/param).")
    return s


def gap_sentences(table: pd.DataFrame, per_seed: pd.DataFrame, gap: str, pooled: bool = True) -> list[str]:
    """Sentences for one gap: per size (and, with ``pooled`` and several sizes, over all points,
    which assumes the gap depends on tokens/param alone), where the mean crosses zero (or that it
    does not within the measured range), how many budgets are resolved, and the trend."""
    label = GAPS[gap][1].replace(" (", " (> 0: the MoE is better; ", 1)
    scopes = [(f"size {lbl}", table[table["size"] == s],
               per_seed[(per_seed["size"] == s) & (per_seed["gap"] == gap)])
              for s, lbl in dict(zip(table["size"], table["size_label"])).items()]
    if pooled and table["size"].nunique() > 1:
        scopes.append(("all sizes pooled (assumes the gap depends on tokens/param alone)", table,
                       per_seed[per_seed["gap"] == gap]))
    out = []
    for name, t, ps in scopes:
        t = t.sort_values("tokens_per_param")
        x = t["tokens_per_param"].to_numpy(dtype=float)
        mean = t[f"{gap}_mean"].to_numpy(dtype=float)
        cs = crossings(x, mean, t[f"{gap}_ci_low"], t[f"{gap}_ci_high"])
        res = int(t[f"{gap}_resolved"].sum())
        head = (f"{label[0].upper()}{label[1:]}, {name}, {len(t)} budgets over "
                f"{_x(x.min())}-{_x(x.max())} tokens/param: ")
        if cs:
            bands = [(c.x_low, c.x_high) for c in cs]
            s = head + "it " + "; it also ".join(_crossing_text(c, band=b not in bands[:i])
                                                  for i, (c, b) in enumerate(zip(cs, bands))) + "."
        else:
            sign = "positive (the MoE is better)" if mean[0] > 0 else "negative (the dense model is better)"
            s = head + f"it does not cross zero within the measured range; every budget's mean is {sign}."
        s += f" {res} of {len(t)} budgets resolved (CI excludes 0). " + _trend_text(trend(ps), bool(cs))
        out.append(s)
    return out


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
    """The table as the notebook shows it (formatted gaps with CIs, seeds, resolved)."""
    out = pd.DataFrame({
        "size": table["size_label"], "epochs": table["epochs"], "target tokens": table["tokens"],
        "tokens/param": table["tokens_per_param"].map(lambda v: f"{v:.3g}"),
        "data passes": table["data_passes"].map(lambda v: f"{v:.2f}"),
    })
    for gap, col in (("active", "matched active (dense_active - MoE)"),
                     ("total", "matched total (dense_total - MoE)")):
        if f"{gap}_fmt" in table:
            out[col] = table[f"{gap}_fmt"] + np.where(table[f"{gap}_resolved"], " resolved", " not resolved")
            out[f"{gap} std"] = table[f"{gap}_std"].map(lambda v: f"{v:.4f}")
    return out.reset_index(drop=True)


__all__ = ["KEY", "GAPS", "PAPER_POINT", "budget_trios", "active_params", "size_label", "budgets", "run_plan",
           "budget_columns", "paper_preset_points", "gap_frame", "gap_table", "gap_sentences", "paper_sentence",
           "display_table"]
