# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 11 · Learning rate per model: is the comparison made at each model's best lr?
#
# The headline compares three models trained with **one** learning rate, the preset's. If that lr
# suits one model better than another, the gap measures the lr as much as the architecture. This
# notebook trains every headline model (`study.headline`) at each lr of a log grid
# (`study.lr_sweep.lrs`, at least 3 values including the preset's) with the first
# `study.lr_sweep.seeds` seeds of the preset; `min_lr` keeps the preset's ratio to `lr` (1/10).
# Everything else is the preset's recipe; the budget is `study.lr_sweep.epochs` times the preset's
# schedule (at 1, the runs at the preset's own lr **are** the headline runs, reused). The `cpu`
# preset sweeps at a quarter of the headline budget (its time limit), where the best lr tends to be
# larger than at the full budget; `params/cpu_full.yaml` sweeps at the headline budget.
#
# **The rule, computed below.** A model's *best lr* is the grid lr with the lowest mean best
# validation loss. The *cost* of another lr is its loss minus the best lr's, **paired by seed**
# (mean, 95% CI; `studylib.study.analysis.stats.paired`). An lr is **within the flat optimum** of a model when
# the mean cost is below the tolerance (`study.lr_sweep.tolerance`, default 0.01 nats, about a
# seventh of the smaller headline gap measured in `cpu`). The criterion is the mean, not "the CI
# includes 0": with 2 seeds the interval has one degree of freedom (t = 12.7) and includes 0 for
# almost any cost. A cost whose whole CI lies below the tolerance is marked *shown*. Then:
#
# * the preset's lr within the flat optimum of every model → **one shared lr** (the preset's);
# * another grid lr within it for every model → one shared lr would do, but not the preset's;
# * none → **each model at its own best lr**.
#
# Fairness check: the ranking of the models with all at the preset's lr (as in the headline) against
# the ranking with each at its own best lr, and each pair's paired gap in both settings.

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None
seeds = None  # e.g. [1, 2] or "1337-1346": replaces the preset's seeds (the sweep takes the first lr_sweep.seeds)
overrides = None  # e.g. {"train.amp": "off"}: a variant preset with a derived name

# %%
from IPython.display import Markdown, display

from studylib.study.analysis import plots, text
from studylib.study.comparisons.lr_sweep import analysis as lr_sweep, plots as lr_plots, sweep_frame, sweep_spec
from studylib.study.runner.notebooks import open_comparison

ctx, sweep = open_comparison("lr_sweep", params, jobs, seeds, overrides)  # one grid per lr
spec = sweep_spec(ctx.study, ctx.knobs)
preset, study, out, models = ctx.preset, ctx.study, ctx.out, list(ctx.study.headline)
runs = sweep_frame(sweep, spec)
steps, tokens = runs["steps"].unique(), runs["tokens"].unique()
assert len(steps) == 1 and len(tokens) == 1, "every run of the sweep must train the same budget"
reused = int(runs["reused"].sum())
display(Markdown(
    f"**Grid:** lr {', '.join(f'{lr:.3g}' for lr in spec.lrs)} (preset: {spec.preset_lr:.3g}, "
    f"min_lr = lr × {preset.train.min_lr / preset.train.lr:g}) × {models} × seeds {list(spec.seeds)}: "
    f"{len(runs)} runs of {int(steps[0]):,} optimizer steps ({int(tokens[0]):,} target tokens; "
    f"{spec.epochs:g} × the preset's schedule); " + lr_sweep.reuse_sentence(spec, reused)))

# %% [markdown]
# ## Best validation loss per model and lr
#
# Mean over seeds with the t 95% confidence interval of the mean (a single model at a single lr:
# not a comparison; the comparisons follow).

# %%
table = lr_sweep.loss_table(runs, models)
plots.save_table(table, "lr_sweep_losses", out)
shown = table.assign(loss=[f"{r['mean']:.4f} [{r['ci_low']:.4f}, {r['ci_high']:.4f}]" for _, r in table.iterrows()])
display(shown["loss"].unstack("lr").rename(columns=lambda lr: f"lr {lr:.3g}"))
best = lr_sweep.best_lrs(runs, models)
fig = lr_plots.loss_vs_lr(table, best, spec.preset_lr, models, title=f"Best val loss vs lr ({preset.name})",
                          outdir=out, name="lr_sweep_loss")

# %% [markdown]
# ## The cost of each lr against the model's best (paired by seed)

# %%
costs = lr_sweep.lr_costs(runs, spec.tolerance, models)
plots.save_table(costs, "lr_sweep_costs", out)
costs[["best_lr", "mean", "ci_low", "ci_high", "n", "resolved", "within", "shown"]]

# %% [markdown]
# ## The rule, and does the ranking depend on the lr?

# %%
rule = lr_sweep.decide(costs, spec.preset_lr, spec.tolerance)
ranks = lr_sweep.ranking_check(runs, spec.preset_lr, rule.best)
plots.save_table(ranks["pairs"], "lr_sweep_ranking", out, index=False)
display(ranks["pairs"][["setting", "a", "b", "lr_a", "lr_b", "mean", "ci_low", "ci_high", "n", "resolved"]])
display(Markdown(
    lr_sweep.verdict(costs, rule, ranks) + "\n\n" + lr_sweep.budget_caveat(spec) + "\n\n"
    + text.limits(len(spec.seeds), tokens[0], "The grid has "
                  f"{len(spec.lrs)} points: the optimum between them, beyond the grid's ends, and the best lr "
                  "for another budget, warmup or batch size are not measured; the best lr's mean is the lowest "
                  "of noisy means, so the costs are if anything overstated.")))
