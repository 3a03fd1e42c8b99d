"""The learning-rate check of notebook 11 (issue #10, item 5): does every headline model train at
(or near) its own best learning rate, and does the comparison between them depend on the lr?

Every headline model (``study.headline``) is trained at each lr of a log grid with the first
``seeds`` seeds of the preset; ``min_lr`` keeps the preset's ratio to ``lr`` (1/10 in the
shipped presets). The preset knob is ``study.lr_sweep`` (:class:`~studylib.study.comparisons.lr_sweep.knobs.LrSweep`, resolved
against the preset's ``train.lr`` and seeds)::

    lr_sweep: {lrs: [1.0e-3, 3.0e-3, 1.0e-2], seeds: 2, epochs: 1.0, tolerance: 0.01}

``epochs`` is the budget in units of the preset's schedule (:func:`studylib.run.spec.budget_overrides`);
at 1 epoch the runs at the preset's own lr ARE the headline runs (reused, not retrained).

**The rule.** For each model, its best lr is the grid lr with the lowest mean best validation loss
over seeds. The *cost* of training it at another lr is that lr's loss minus the best lr's, paired
by seed (:func:`studylib.study.analysis.stats.paired`). An lr is **within the flat optimum** of a model when
the mean cost is below ``tolerance`` (default 0.01 nats, a seventh of the smaller headline gap
measured in ``cpu``). The criterion is the mean, not "the CI includes 0": with 2 seeds the paired t
interval has one degree of freedom (t = 12.7) and includes 0 for almost any cost, so it would call
nearly every lr flat; the CI is reported next to the mean, and a cost whose whole CI lies below
the tolerance is marked ``shown``. (The best lr's mean is the minimum of noisy means, so the
cost is, if anything, overstated: the rule errs towards "not flat".)

Then: if the preset's lr is within the flat optimum of every model, the rule is **one shared lr**
(the preset's); if another grid lr is, one shared lr would do but not the preset's; if none is,
**each model at its own best lr**. Fairness check: the ranking of the models (mean best val loss)
all at the preset's lr (the headline's setting) against the ranking with each model at its own
best lr, and each pair's paired gap in both settings (:func:`ranking_check`).

What it does not show: the optimum between grid points or beyond the grid's ends (a best lr at
an end of the grid is flagged), other schedules (warmup, min_lr, batch size), or other budgets.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import pandas as pd

from studylib.config import Preset
from studylib.study.analysis.frames import seed_gaps
from studylib.study.analysis.stats import paired
from studylib.study.analysis.text import gap_phrase
from studylib.study.comparisons.lr_sweep.knobs import DEFAULT_TOLERANCE, SweepSpec

VALUE = "best_val_loss"


def lr_overrides(preset: Preset, lr: float) -> dict:
    """``train.lr`` and ``train.min_lr`` for one grid lr (``min_lr`` keeps the preset's ratio to
    ``lr``); none at the preset's own lr, so the runs there are the preset's own runs at the
    sweep's budget, in the same directories as every other grid's at that budget (the headline
    runs at one epoch; at a shorter budget, e.g. the routing ablation's reference MoE)."""
    t = preset.train
    if lr == t.lr:
        return {}
    return {"train.lr": lr, "train.min_lr": lr * (t.min_lr / t.lr)}


def run_overrides(preset: Preset, lr: float, budget: dict) -> dict:
    """The overrides of the runs at ``lr``: :func:`lr_overrides` plus the budget's
    (:func:`studylib.run.spec.budget_overrides`, computed once for every lr)."""
    return {**lr_overrides(preset, lr), **budget}


# --------------------------------------------------------------------------------------------
# analysis (pure functions of a frame with columns model, seed, lr and the value)
# --------------------------------------------------------------------------------------------
def _check_frame(df: pd.DataFrame, value: str) -> None:
    missing = [c for c in ("model", "seed", "lr", value) if c not in df]
    if missing:
        raise KeyError(f"lr sweep frame: missing column(s) {missing}")
    dup = df.duplicated(["model", "lr", "seed"])
    if dup.any():
        raise ValueError(f"lr sweep frame: {int(dup.sum())} duplicate (model, lr, seed) rows")


def _order(df: pd.DataFrame, models: Optional[Sequence[str]]) -> list:
    seen = list(dict.fromkeys(df["model"]))
    return [m for m in models if m in seen] if models else seen


def loss_table(df: pd.DataFrame, models: Optional[Sequence[str]] = None, value: str = VALUE) -> pd.DataFrame:
    """One row per (model, lr): n seeds, mean, sample std and the t 95% CI of the mean of ``value``."""
    _check_frame(df, value)
    rows = []
    for m in _order(df, models):
        for lr, g in df[df["model"] == m].groupby("lr", sort=True):
            p = paired(g[value].to_numpy())
            rows.append({"model": m, "lr": lr, "n": p.n, "mean": p.mean, "std": p.std,
                         "ci_low": p.ci_low, "ci_high": p.ci_high})
    return pd.DataFrame(rows).set_index(["model", "lr"])


def best_lrs(df: pd.DataFrame, models: Optional[Sequence[str]] = None, value: str = VALUE) -> pd.DataFrame:
    """Per model: the grid lr with the lowest mean ``value`` (``best_lr``), its mean, and whether it
    is an end of the grid (``at_edge``: the optimum may lie beyond the grid)."""
    table = loss_table(df, models, value)
    grid = sorted(df["lr"].unique())
    rows = []
    for m in _order(df, models):
        t = table.loc[m]
        lr = float(t["mean"].idxmin())
        rows.append({"model": m, "best_lr": lr, "best_mean": float(t.loc[lr, "mean"]),
                     "at_edge": len(grid) > 1 and lr in (grid[0], grid[-1])})
    return pd.DataFrame(rows).set_index("model")


def lr_costs(df: pd.DataFrame, tolerance: float = DEFAULT_TOLERANCE, models: Optional[Sequence[str]] = None,
             value: str = VALUE) -> pd.DataFrame:
    """One row per (model, lr): the cost of training the model at ``lr`` instead of its best grid
    lr, ``value(lr) - value(best lr)`` paired by seed (mean, std, n, CI, p, resolved), and
    ``within`` (mean cost < ``tolerance``: inside the flat optimum; see the module docstring) and
    ``shown`` (the whole 95% CI < ``tolerance``). The best lr itself costs 0 (within)."""
    best = best_lrs(df, models, value)
    rows = []
    for m in best.index:
        runs = df[df["model"] == m]
        b = best.loc[m, "best_lr"]
        for lr in sorted(runs["lr"].unique()):
            d = seed_gaps(runs, lr, b, value, column="lr")
            p = paired(d.to_numpy())
            rows.append({"model": m, "lr": float(lr), "best_lr": b, **p.as_dict(),
                         "within": bool(p.mean < tolerance),
                         "shown": bool(p.n > 1 and p.ci_high < tolerance) or lr == b})
    return pd.DataFrame(rows).set_index(["model", "lr"])


@dataclass(frozen=True)
class Rule:
    """The lr rule the data supports (see :func:`decide`)."""

    kind: str  # "preset_shared" | "other_shared" | "per_model"
    preset_lr: float
    shared_lrs: tuple[float, ...]  # grid lrs within the flat optimum of every model
    best: dict  # model -> its best grid lr
    at_edge: dict  # model -> its best lr is an end of the grid
    tolerance: float

    @property
    def lr_of(self) -> dict:
        """The lr each model should train at under the rule."""
        if self.kind == "preset_shared":
            return {m: self.preset_lr for m in self.best}
        if self.kind == "other_shared":
            return {m: self.shared_lrs[0] for m in self.best}
        return dict(self.best)


def decide(costs: pd.DataFrame, preset_lr: float, tolerance: float = DEFAULT_TOLERANCE) -> Rule:
    """The rule from :func:`lr_costs`: ``preset_shared`` when the preset's lr is within the flat
    optimum of every model; else ``other_shared`` when another grid lr is (the listed ones, the one
    with the lowest worst-case cost first); else ``per_model`` (each at its own best lr)."""
    models = list(dict.fromkeys(costs.index.get_level_values("model")))
    within = costs["within"].unstack("model")[models]  # lr x model
    worst = costs["mean"].unstack("model")[models].max(axis=1)
    shared = [float(lr) for lr in worst.sort_values().index if within.loc[lr].all()]
    best = {m: float(costs.loc[m, "best_lr"].iloc[0]) for m in models}
    grid = sorted(within.index)
    edge = {m: len(grid) > 1 and best[m] in (grid[0], grid[-1]) for m in models}
    if preset_lr in shared:
        kind = "preset_shared"
    elif shared:
        kind = "other_shared"
    else:
        kind = "per_model"
    return Rule(kind, preset_lr, tuple(shared), best, edge, tolerance)


def _setting_values(df: pd.DataFrame, lr_of: Mapping[str, float], value: str) -> pd.DataFrame:
    """seed x model: each model's ``value`` at its lr in ``lr_of``."""
    parts = {m: df[(df["model"] == m) & (df["lr"] == lr)].set_index("seed")[value] for m, lr in lr_of.items()}
    return pd.DataFrame(parts)


def ranking_check(df: pd.DataFrame, shared_lr: float, best: Mapping[str, float], value: str = VALUE) -> dict:
    """Does the comparison of the models depend on the lr? The models ordered by mean ``value`` (best
    first) with all at ``shared_lr`` (``shared_order``) and each at its own best lr (``best_order``),
    ``changed`` (the orders differ), and ``pairs``: one row per pair (a, b) and setting ("shared",
    "best") with the paired gap a - b (:func:`studylib.study.analysis.stats.paired`) and ``flips``: pairs whose
    gap is resolved in both settings with opposite signs."""
    models = list(best)
    settings = {"shared": {m: shared_lr for m in models}, "best": dict(best)}
    orders, rows = {}, []
    for name, lr_of in settings.items():
        wide = _setting_values(df, lr_of, value)
        orders[name] = list(wide.mean().sort_values().index)
        for a, b in itertools.combinations(models, 2):
            d = (wide[a] - wide[b]).dropna()
            rows.append({"setting": name, "a": a, "b": b, "lr_a": lr_of[a], "lr_b": lr_of[b],
                         **paired(d.to_numpy()).as_dict()})
    pairs = pd.DataFrame(rows)
    flips = []
    for (a, b), g in pairs.groupby(["a", "b"], sort=False):
        s, o = g.set_index("setting").loc["shared"], g.set_index("setting").loc["best"]
        if s["resolved"] and o["resolved"] and (s["mean"] > 0) != (o["mean"] > 0):
            flips.append((a, b))
    return {"shared_order": orders["shared"], "best_order": orders["best"],
            "changed": orders["shared"] != orders["best"], "pairs": pairs, "flips": flips}


# --------------------------------------------------------------------------------------------
# the verdict in words
# --------------------------------------------------------------------------------------------
def _lr(x: float) -> str:
    return f"{x:.3g}"


def _cost_phrase(row, tolerance: float) -> str:
    ci = (f" [{row['ci_low']:+.4f}, {row['ci_high']:+.4f}] (n={int(row['n'])})" if row["n"] > 1
          else f" (n={int(row['n'])}, no interval)")
    if row["within"]:
        where = "within the flat optimum" + (", the whole CI below the tolerance" if row["shown"] else
                                             ", though the CI reaches above the tolerance")
    else:
        where = "outside the flat optimum" + (", the cost resolved (CI excludes 0)" if row["resolved"] else
                                              " by its mean; the cost is not resolved (CI includes 0)")
    return f"{row['mean']:+.4f}{ci}: {where} (tolerance {tolerance:g} nats)"


def budget_caveat(spec: SweepSpec) -> str:
    """What a sweep at a budget other than the headline's (``spec.epochs != 1``) does not show;
    empty at the headline budget."""
    if spec.epochs == 1:
        return ""
    way = "lower" if spec.epochs < 1 else "higher"
    return (f"**Budget:** this sweep trained {spec.epochs:g} × the headline budget, so its rule is the rule at "
            f"that budget. The headline budget is {1 / spec.epochs:g} times this one, and the best lr of a "
            f"schedule tends to fall as the schedule gets longer, so the headline budget's best lr may be {way} "
            "than the best here: this sweep does not measure it. A preset with `study.lr_sweep.epochs: 1` "
            "sweeps at the headline budget (for `cpu`: `params/cpu_full.yaml`).")


def reuse_sentence(spec: SweepSpec, reused: int) -> str:
    """Which of the sweep's runs are other notebooks' runs: ``reused`` headline runs at the
    headline budget; at another budget, the preset-lr runs of that budget."""
    if spec.epochs == 1:
        return f"{reused} of them are the preset's own runs, reused."
    return ("the runs at the preset's lr are the preset's runs at this budget, shared with any other notebook's "
            "runs of that budget (e.g. the routing ablation's reference MoE).")


def verdict(costs: pd.DataFrame, rule: Rule, ranks: dict) -> str:
    """The rule and the fairness check in sentences, computed from :func:`lr_costs`,
    :func:`decide` and :func:`ranking_check`."""
    tol = rule.tolerance
    out = []
    for m, b in rule.best.items():
        s = f"**{m}**: best lr on the grid {_lr(b)}"
        if rule.at_edge[m]:
            s += " (an end of the grid: its optimum may lie beyond it)"
        if b == rule.preset_lr:
            s += "; that is the preset's lr."
        else:
            s += (f"; the preset's lr {_lr(rule.preset_lr)} costs "
                  f"{_cost_phrase(costs.loc[(m, rule.preset_lr)], tol)}.")
        out.append(s)
    if rule.kind == "preset_shared":
        out.append(f"**Rule: one shared lr, the preset's {_lr(rule.preset_lr)}**: it is within the flat "
                   f"optimum (mean cost < {tol:g} nats against the model's best grid lr) of every headline model.")
    elif rule.kind == "other_shared":
        alt = rule.shared_lrs[0]
        bad = [m for m in rule.best if not costs.loc[(m, rule.preset_lr), "within"]]
        out.append(f"**Rule: one shared lr would do, but not the preset's**: {_lr(alt)} is within the flat "
                   f"optimum of every headline model; the preset's {_lr(rule.preset_lr)} is not for "
                   f"{', '.join(bad)}. Train all at {_lr(alt)}.")
    else:
        out.append("**Rule: each model at its own best lr** ("
                   + ", ".join(f"{m} {_lr(lr)}" for m, lr in rule.best.items())
                   + f"): no lr on the grid is within {tol:g} nats of every model's best.")
    chosen = set(rule.lr_of.values())
    edge = [m for m, e in rule.at_edge.items() if e and rule.best[m] in chosen]
    if edge:
        out[-1] += (f" The lr it picks is an end of the grid for {', '.join(edge)}: extend the grid past it "
                    f"before adopting it.")
    shared = rule.preset_lr
    s = (f"**Ranking** by mean best val loss (best first) all at the preset's (headline) lr {_lr(shared)}: "
         f"{' < '.join(ranks['shared_order'])}; each at its own best lr: {' < '.join(ranks['best_order'])} "
         f"({'changed' if ranks['changed'] else 'unchanged'}). ")
    if ranks["flips"]:
        s += ("A resolved gap reverses between the two settings for "
              + ", ".join(f"{a} vs {b}" for a, b in ranks["flips"])
              + ": the comparison depends on the lr, so it must be made at each model's best lr.")
    else:
        s += "No gap is resolved in opposite directions in the two settings."
    out.append(s + " Paired gaps (a − b, by seed):")
    lines = []
    for _, r in ranks["pairs"].iterrows():
        setting = f"both at {_lr(shared)}" if r["setting"] == "shared" else \
            f"at their best lrs ({_lr(r['lr_a'])}, {_lr(r['lr_b'])})"
        lines.append(f"- {r['a']} vs {r['b']}, {setting}: {gap_phrase(r, r['a'], r['b'])}")
    return "\n\n".join(out) + "\n\n" + "\n".join(lines)


__all__ = ["Rule", "budget_caveat", "reuse_sentence", "lr_overrides", "run_overrides",
           "loss_table", "best_lrs", "lr_costs", "decide", "ranking_check", "verdict"]
