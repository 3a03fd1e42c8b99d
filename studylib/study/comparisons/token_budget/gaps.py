"""Where the MoE starts to win (issues #11, #31): both headline gaps over a map of model size x
tokens per active parameter.

The preset's ``study.token_budget`` lists model-size trios (active-matched dense, reference MoE,
total-matched dense) and, per trio, token budgets in *epochs* of the preset's own schedule and/or
in *tokens per active parameter* of the trio's MoE (so that sizes share budgets: a map in two
dimensions). Each budget is trained as a run of its own (its own warmup and cosine to its own end;
see :func:`studylib.run.spec.budget_overrides`): ``epochs: 1.0`` is the preset's own run (the
headline notebook's, reused), ``epochs: e`` trains ``round(e * S)`` optimizer steps, where S is one
epoch of the training windows, or ``train.max_steps`` when the preset sets it (then the "epoch" is
``max_steps`` steps, not a pass over the data; the table's ``data_passes`` column says what the runs
actually saw); ``tokens_per_param: x`` trains ``round(x * A / tokens_per_step)`` steps.

This module holds the map's runs and points (the fits over them are
:mod:`.report`):

* :func:`budget_trios` reads the knob (budgets in epochs); :func:`run_plan` says which
  (model, budget) runs are the preset's own (reused) and which are budget runs of their own;
* :func:`studylib.study.comparisons.token_budget.grids` plans every run (the study trains the
  missing ones) and :func:`studylib.study.comparisons.token_budget.summaries` reads them;
  :func:`paper_preset_points` finds the ``paper`` preset's runs when they exist (it never trains);
* :func:`gap_frame` (per-seed gaps) and :func:`gap_table` (per size x budget: paired statistics
  and, over each gap's map points as one family, Holm-adjusted p values, the equivalence test
  and a verdict: :func:`studylib.study.analysis.stats.family`); :func:`shared_budgets` (the
  tokens/param values several sizes share) and :func:`point_sentences`.

Sign convention (both gaps): ``dense - MoE`` in best validation loss, so **positive = the MoE is
better**. The matched-total gap is therefore the negative of notebook 03's ``MoE - dense_total``.
"""
from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from studylib.config import ConfigError, Preset, load_preset
from studylib.run.rundir import RunDir
from studylib.run.spec import RunSpec, budget_overrides, epoch_steps
from studylib.study.analysis.frames import collect_runs, seed_pairs
from studylib.study.analysis.paper import PAPER_ACTIVE_PARAMS, PAPER_BUDGET_TOKENS, PAPER_GAPS, PAPER_TOKENS_PER_PARAM
from studylib.study.analysis.stats import MARGIN, family, paired
from studylib.study.analysis.tables import fmt_count
from studylib.study.comparisons.knobs import Context, Study
from studylib.study.comparisons.token_budget.knobs import TOKEN_BUDGET_SHAPE, TokenBudgetKnobs, TrioConfig

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
#: the longest budget, in units of the preset's own schedule (one pass over the training windows,
#: or ``train.max_steps`` when set): past ~40 passes, repeated data is worth almost nothing
#: (Muennighoff et al. 2023); more is a typo that would queue a run of billions of steps
MAX_EPOCHS = 100


def budget_trios(preset: Preset, knobs: TokenBudgetKnobs, epoch: Optional[int] = None) -> list[TrioConfig]:
    """The trios of ``study.token_budget`` (:class:`TrioConfig`, checked when the study loaded the
    preset) with every budget in epochs: a ``tokens_per_param`` budget ``x`` becomes
    ``round(x * A / tokens_per_step)`` optimizer steps (``A``: the trio's MoE's active parameters;
    :func:`tokens_per_step`), i.e. that many steps over one epoch's ``S`` steps (``epoch``; default
    :func:`studylib.run.spec.epoch_steps` of the preset, which may load the data), and ``1.0``
    exactly when the steps are ``S`` (the preset's own run). Absent: one ConfigError line naming
    the knob. Each budget is checked (:func:`check_budgets`) unless ``epoch`` is given (the
    ``paper`` preset's runs read without its data)."""
    if knobs.trios is None:
        raise ConfigError(f"{KEY}: missing from preset {preset.name!r}; expected {TOKEN_BUDGET_SHAPE}")
    trios = list(knobs.trios)
    s, per_step = (epoch_steps(preset) if epoch is None else epoch), tokens_per_step(preset)
    if epoch is None:
        check_budgets(preset, trios, s)
    if not any(t.tokens_per_param for t in trios):
        return trios
    out = []
    for t in trios:
        a = int(preset.model_config(t.moe).num_params.active)
        by_steps = {max(1, round(e * s)): e for e in t.epochs}
        for x in t.tokens_per_param:
            n = max(1, round(x * a / per_step))
            by_steps.setdefault(n, 1.0 if n == s else n / s)
        out.append(replace(t, epochs=tuple(sorted(by_steps.values())), tokens_per_param=()))
    return out


def check_budgets(preset: Preset, trios: Sequence[TrioConfig], epoch: int) -> None:
    """Every budget of every trio, in optimizer steps, must be at least one step and at least the
    warm-up of the preset's own schedule (``epoch`` steps; a shorter run only ramps its learning
    rate), differ from the trio's other budgets (two that round to one step count would be one map
    point, silently) and be at most :data:`MAX_EPOCHS` times the preset's schedule; else one
    ConfigError line naming the budget, what it comes to and the limit."""
    from studylib.run.optim import warmup_steps

    per_step, warmup = tokens_per_step(preset), max(1, warmup_steps(epoch, preset.train))
    unit = ("passes over the training windows" if preset.train.max_steps is None else
            f"times the preset's train.max_steps = {epoch:,}")
    for i, t in enumerate(trios):
        a = int(preset.model_config(t.moe).num_params.active)
        seen: dict[int, str] = {}
        given = [("epochs", e * epoch, f"{e:g} epochs") for e in t.epochs]
        given += [("tokens_per_param", x * a / per_step, f"{x:g} tokens per active parameter")
                  for x in t.tokens_per_param]
        for key, exact, what in given:
            where, n = f"{KEY}.trios[{i}].{key}", round(exact)
            if n > MAX_EPOCHS * epoch:
                raise ConfigError(f"{where}: {what} is {n:,} optimizer steps, {n / epoch:,.0f} {unit}; at most "
                                  f"{MAX_EPOCHS} (repeated data is worth almost nothing long before that)")
            if n < warmup:
                raise ConfigError(f"{where}: {what} is {exact:.3g} optimizer steps, fewer than the preset's warm-up "
                                  f"of {warmup} (a shorter run only ramps its learning rate); give a larger budget")
            if n in seen:
                raise ConfigError(f"{where}: {what} rounds to {n:,} optimizer steps, as {seen[n]} does; "
                                  f"two budgets of one trio must differ by at least one step")
            seen[n] = what


def tokens_per_step(preset: Preset) -> int:
    """Target tokens of one optimizer step: windows per step times ``data.context - 1`` targets."""
    return preset.train.batch_size * preset.train.grad_accum * (preset.data.context - 1)


def active_params(preset: Preset, trios: Sequence[TrioConfig]) -> dict:
    """``{size: active parameters of its reference MoE}`` (exact accounting)."""
    return {t.size: int(preset.model_config(t.moe).num_params.active) for t in trios}


def size_label(size: str, active: int) -> str:
    return f"{size} ({fmt_count(active)} active)"


def budgets(preset: Preset, trios: Sequence[TrioConfig], epoch: Optional[int] = None) -> dict:
    """``{epochs: overrides}`` for every budget of the trios (:func:`studylib.run.spec.budget_overrides`
    over one epoch of ``epoch`` steps; default the preset's, counted once)."""
    epoch = epoch_steps(preset) if epoch is None else epoch
    return {e: budget_overrides(preset, e, epoch) for e in sorted({e for t in trios for e in t.epochs})}


# --------------------------------------------------------------------------------------------
# which runs
# --------------------------------------------------------------------------------------------
def run_plan(study: Study, trios: Sequence[TrioConfig], specs: Sequence[Sequence[RunSpec]]) -> pd.DataFrame:
    """One row per size x budget x model of the runs the sweep resolved (``specs``: one sequence of
    :class:`~studylib.run.spec.RunSpec` per trio x budget, trio order then epochs, as
    :func:`studylib.study.comparisons.token_budget.grids` plans them; nothing is resolved again): its
    ``max_steps``, whether it is the preset's own run (``preset_run``: it lives in the preset's run
    directory and is trained once for every notebook that uses it; ``also_in`` names the other
    ``study`` lists that hold it, e.g. ``headline``: notebook 03's run, reused here) or a budget
    run of its own (``runs/<model>/<tag>/``), its run directory (seed placeholder) and how many
    seeds are finished."""
    cells = [(t, e) for t in trios for e in t.epochs]
    if len(cells) != len(specs):
        raise ValueError(f"run_plan: {len(cells)} trio x budget cells but {len(specs)} groups of runs")
    preset, rows = study.preset, []
    for (t, e), group in zip(cells, specs):
        for m in t.models:
            mine = [s for s in group if s.model == m]
            own = mine[0].run_dir == Path(os.path.abspath(RunDir.of(preset, m, mine[0].seed).path))
            rows.append({"size": t.size, "epochs": e, "model": m, "role": t.role(m),
                         "max_steps": mine[0].preset.train.max_steps,
                         "preset_run": own, "also_in": ", ".join(study.lists_naming(m)) if own else "",
                         "run_dir": str(mine[0].run_dir.parent / "seed*"),
                         "finished": sum(s.rundir.finished() for s in mine), "seeds": len(mine)})
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
    knobs = TokenBudgetKnobs.parse(paper_p.study.comparisons,
                                   Context(paper_p.models, lambda m: paper_p.model_config(m).ffn.kind))
    if knobs.trios is None:
        return None, f"The paper preset lists no {KEY}."
    trios, frames = [], []
    for t in knobs.trios:
        one = collect_runs(paper_p, list(t.models), list(paper_p.seeds))
        if one.empty or "steps" not in one:
            continue
        steps = int(one["steps"].iloc[0])  # its one epoch, without loading data
        t = next(r for r in budget_trios(paper_p, knobs, steps) if r.moe == t.moe) if t.tokens_per_param else t
        trios.append(t)
        for e in t.epochs:
            ov = budget_overrides(paper_p, e, steps)
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


def gap_table(per_seed: pd.DataFrame, active: dict, margin: float = MARGIN) -> pd.DataFrame:
    """One row per size x budget: tokens, tokens per active parameter, epochs, passes over the
    data (``repeats``: more than one, so some windows are seen twice or more; ``max_views``: the
    most times one window is seen) and, per gap, the paired statistics of ``dense - moe`` (mean,
    std, n, 95% CI, p, ``fmt``) with the verdict of :func:`studylib.study.analysis.stats.family`
    over the map's points of that gap (the notebook's family: one per gap): ``p_holm`` beside the
    raw ``p``, the equivalence test within ``±margin`` (``p_tost``, ``p_tost_holm``), ``resolved``
    (after Holm), ``equivalent`` and ``verdict`` ("A better": the dense model is better, "B
    better": the MoE is, "equivalent", "inconclusive")."""
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
            row.update({f"{gap}_{k}": v for k, v in p.as_dict().items() if k not in ("level", "resolved")})
            row[f"{gap}_fmt"] = p.fmt()
            row[f"{gap}_values"] = g["value"].to_numpy()
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
    """``[(tokens/param, sizes)]``: the tokens-per-parameter values that two or more sizes share
    (within ``rel``, relative), each with the sizes measured there."""
    pts = table.sort_values("tokens_per_param")[["tokens_per_param", "size"]].to_numpy()
    groups: list[list] = []
    for x, size in pts:
        if groups and x <= groups[-1][0] * (1 + rel):
            groups[-1][1].append(size)
        else:
            groups.append([x, [size]])
    return [(float(x), list(dict.fromkeys(s))) for x, s in groups if len(set(s)) > 1]


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
            pts = ", ".join(f"{size} at {_x(x)} ({fmt}; Holm p={p:.2g})" for size, x, fmt, p in
                            zip(r["size"], r["tokens_per_param"], r[f"{gap}_fmt"], r[f"{gap}_p_holm"]))
            parts.append(f"{what} at {len(r)}: {pts}")
    return (f"{label[0].upper()}{label[1:]} (> 0: the MoE is better), {len(t)} map points, Holm over {m}: "
            + "; ".join(parts) + ".")


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
    """The table as the notebook shows it (formatted gaps with CIs, Holm-adjusted p, verdicts)."""
    out = pd.DataFrame({
        "size": table["size_label"], "epochs": table["epochs"].map(lambda v: f"{v:.3g}"),
        "target tokens": table["tokens"], "tokens/param": table["tokens_per_param"].map(lambda v: f"{v:.3g}"),
        "data passes": table["data_passes"].map(lambda v: f"{v:.2f}"),
    })
    for gap, col in (("active", "matched active (dense_active - MoE)"),
                     ("total", "matched total (dense_total - MoE)")):
        if f"{gap}_fmt" in table:
            out[col] = table[f"{gap}_fmt"]
            out[f"{gap} p / Holm"] = [f"{p:.2g} / {q:.2g}" for p, q in zip(table[f"{gap}_p"], table[f"{gap}_p_holm"])]
            out[f"{gap} verdict"] = table[f"{gap}_verdict"].map(VERDICT_WORDS)
            out[f"{gap} std"] = table[f"{gap}_std"].map(lambda v: f"{v:.4f}")
    return out.reset_index(drop=True)


__all__ = ["KEY", "GAPS", "PAPER_POINT", "VERDICT_WORDS", "budget_trios", "tokens_per_step", "active_params",
           "size_label", "budgets", "run_plan", "budget_columns", "paper_preset_points", "gap_frame", "gap_table",
           "shared_budgets", "point_sentences", "paper_sentence", "display_table"]
