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
# # 09 · Token budget: where does the MoE start to win?
#
# The paper (seed 000) trains 426.3M target tokens for a 14.77M-active MoE (28.9 tokens per
# active parameter) and finds it ahead of its active-matched dense model by 0.0758, an advantage
# that "grows across training budgets from 40.5M to 426.3M tokens", while the total-matched dense
# model's lead "narrows sharply". MoE-Study (seed 002, ~40.7M tokens) finds the dense model ahead
# at matched active compute. This notebook measures both gaps against **tokens per active
# parameter**, each budget a **separately trained run** (its own warmup and cosine decay to its own
# end: not a checkpoint inside a longer schedule, whose learning rate has not annealed), at two or
# more model sizes (a smaller trio, solved by the budget solver like the headline one, reaches more
# tokens per parameter on the same data).
#
# * Both gaps are **dense − MoE** in best validation loss, so **positive = the MoE is better**:
#   matched-active = dense_active − MoE, matched-total = dense_total − MoE (the paper: +0.0758 and
#   −0.0180; notebook 03 shows the matched-total gap with the opposite sign, MoE − dense_total).
# * A budget of `e` epochs is `round(e × S)` optimizer steps, S = one epoch of the preset's training
#   windows, or `train.max_steps` when the preset sets it (the `ci` preset: then an "epoch" is
#   `max_steps` steps, not a pass over the data). The table's `data passes` column says how often the
#   runs actually went over the training windows; above 1 the data repeats (hollow markers).
# * `epochs: 1.0` is the preset's own run (for the headline trio: notebook 03's runs, reused, not
#   retrained).
# * A budget is given in epochs or in **tokens per active parameter** of the trio's MoE, so that
#   model sizes share budgets: the map has two dimensions (size x tokens/param), and the study asks
#   which of the two moves each gap.
# * Gaps are paired by seed: per-seed gaps, then mean, sample std, n and a paired-t 95% CI
#   (`studylib.study.analysis.stats`). **One family per gap: the map's points.** Over it, Holm's
#   correction (the adjusted p beside the raw one) and an equivalence test (paired TOST) against the
#   margin `study.margin` (default the power target, ±0.03 nats): every point is "MoE better",
#   "dense better", "equivalent within ±margin" or "inconclusive".
# * **The gap model** (`studylib.study.comparisons.token_budget.plane.gap_model`): each gap as a plane in log10
#   tokens/param and log10 size (their interaction only where the grid supports it), fitted to every
#   seed's gap, with intervals from a bootstrap that resamples seeds within each map point. Its two
#   slopes are the tokens/param effect at fixed size and the size effect at fixed tokens/param (a
#   family of their own per gap: Holm over the bootstrap p values). Where the fitted gap is zero is a
#   **crossing line** in (size, tokens/param) with a band; every point is also predicted with itself
#   left out.
# * **One law for the three models** (`token_budget.law_fit`): L = E + A/N_eff^alpha + B/D_eff^beta in
#   bits per byte over every run, the dense baselines sharing every parameter, the MoE one more
#   (lambda: N_eff = N_active^(1-lambda) N_total^lambda, Clark et al. 2022), repeated data through
#   Muennighoff et al.'s D_eff (R*); checked on the largest size and on each budget it never saw,
#   then carried to the paper's point (an extrapolation, labelled, with its distance in decades).
#   The per-model loss laws (Hoffmann et al. 2022, approach 3) stay as a check. Where the grid
#   does not identify a parameter it says so instead of printing a number.
# * The gap plane describes the grid only: it is never carried outside it.

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None
seeds = None  # e.g. [1, 2] or "1337-1346": replaces the preset's seeds
overrides = None  # e.g. {"train.amp": "off"}: a variant preset with a derived name

# %%
import time

t_start = time.perf_counter()

import pandas as pd
from IPython.display import Markdown, display

from studylib.study.analysis import plots, text
from studylib.study.comparisons import token_budget
from studylib.study.analysis import shape
from studylib.study.analysis.law import checks as law_checks, fit as law_fit, size as law_size, words as law_words
from studylib.study.comparisons.token_budget import budgets, gaps, law_roles, plane, repetition
from studylib.study.comparisons.token_budget.plots import crossing_line, gap_map
from studylib.study.runner.notebooks import open_comparison

ctx, runs = open_comparison("token_budget", params, jobs, seeds, overrides)  # every trio x cell x seed
trios = budgets.budget_trios(ctx.preset, ctx.knobs)
preset, study, out, seeds = ctx.preset, ctx.study, ctx.out, ctx.seeds
active = budgets.active_params(preset, trios)
epoch_unit = (f"train.max_steps = {preset.train.max_steps} steps (not a pass over the data)"
              if preset.train.max_steps is not None else "one pass over the training windows")
print(f"preset {preset.name!r}, seeds {seeds}; one epoch = {epoch_unit}")
for t in trios:
    print(f"  size {gaps.size_label(t.size, active[t.size])}: {t.models}, vocabulary "
          f"{preset.model_config(t.moe).vocab_size:,}, epochs {[float(f'{e:.4g}') for e in t.epochs]}"
          + (f", repeated {[float(f'{e:.4g}') for e in t.repeat]} from {list(t.stories)} of the stories" if t.repeat else "")
          + f", seeds {t.seeds_of(seeds)}"
          + "".join(f" ({len(t.seeds_of(seeds, (e, 1.0)))} at {e:.4g} epochs)" for e, _ in t.seeds_at))

# %% [markdown]
# ## Every trio a scaled copy of the paper's
#
# Each trio's shape beside the paper's (Tables 3 and 5): the vocabulary per unit of the MoE's
# width, the expert shape, the dense baselines' widths and FFN / width, and the embedding shares
# that decide what a wider dense model pays for again. With `shape: paper` (the default) a preset
# whose trio leaves the paper's family is refused when the study loads it.

# %%
trio_shapes = shape.trio_frame(preset, [t.models for t in trios])
plots.save_table(trio_shapes, token_budget.SHAPES, out)
display(shape.display_frame(trio_shapes))

# %% [markdown]
# ## The runs: which are the preset's own (reused), which are budgets of their own

# %%
runs_table = budgets.run_plan(study, trios, runs.specs)
plots.save_table(runs_table, token_budget.PLAN, out, index=False)
display(runs_table)
own, shared = runs_table["preset_run"], runs_table["also_in"] != ""
print(f"{len(runs_table)} (model, budget) pairs, {int(runs_table['seeds'].sum())} runs: {int(own.sum())} pairs are the preset's own runs "
      f"({int(shared.sum())} of them other notebooks' runs too, named in 'also_in': trained once, reused), "
      f"{int((~own).sum())} are budget runs of their own; {int(runs_table['finished'].sum())} of "
      f"{int(runs_table['seeds'].sum())} runs already exist.")

# %%
summaries = token_budget.summaries(runs, trios)
assert len(summaries) == sum(3 * len(t.seeds_of(seeds, c)) for t in trios for c in t.cells())
print(f"{len(summaries)} runs ready")

# %% [markdown]
# ## The table: every size x budget, both gaps with their 95% CIs and verdicts, the MoE's position
#
# Gaps in nats within a trio (one tokenizer); each model's loss in bits per byte of the validation
# text (one scale across the trios' tokenizers); the position `p = (L_active - L_MoE) / (L_active -
# L_total)` with its bootstrap CI over seeds, or "not defined" where the two dense baselines are not
# resolved apart. Each point's passes over its training data and unique tokens beside its budget.

# %%
margin = study.general.margin
per_seed = gaps.gap_frame(summaries, trios, active)
table = gaps.gap_table(per_seed, active, margin=margin)
plots.save_table(table, token_budget.MAP, out, index=False)
plots.save_table(per_seed, token_budget.PER_SEED, out, index=False)
display(gaps.display_table(table))
repeated = table[table["repeats"]]
if len(repeated):
    print("Data repetition: " + "; ".join(
        f"{r.size_label} at {r.tokens_per_param:.3g} tokens/param passes {r.data_passes:.2f} times over its "
        f"{r.unique:,.0f} unique training tokens" for r in repeated.itertuples()) + ".")
else:
    print("No budget passes over the training data more than once (no repeated windows).")
shared = gaps.shared_budgets(table)
print("Sizes that share a tokens/param: " + ("; ".join(f"{x:.3g}: {', '.join(s)}" for x, s in shared) or "none")
      + ".")
for gap in gaps.GAPS:
    print(gaps.point_sentences(table, gap))
print(gaps.position_sentence(table))

# %% [markdown]
# ### What repetition does, measured
#
# A budget trained again from only a fraction of the training stories (the same size, the same
# tokens, the validation split and the tokenizer unchanged): the passes vary and nothing else.
# Per cell each model's loss and each gap with their 95% CIs; per gap the slope in log passes with
# its bootstrap CI (Holm over the two gaps), and per model the slope of its loss.

# %%
repeated_cells = repetition.repetition_table(per_seed, active)
repetition_fit = repetition.repetition_fit(per_seed)
plots.save_table(repeated_cells, token_budget.REPETITION, out, index=False)
plots.save_table(repetition_fit, token_budget.REPETITION_FIT, out, index=False)
display(repeated_cells)
display(repetition_fit)
for line in repetition.repetition_sentences(repetition_fit, repeated_cells):
    print(line)

# %% [markdown]
# Per cell and model: the last training loss (the mean since the previous evaluation) and the final
# full-split validation loss, means over seeds. In one pass every training window is new, so the two
# estimate the same thing; once windows repeat, validation minus training grows with memorisation.
# Cells under one pass are left out (their last training loss averages over the steep start of a
# short run).

# %%
memorisation = repetition.memorisation_table(trios, summaries, token_budget.cell_metrics(runs, trios))
plots.save_table(memorisation, token_budget.MEMORISATION, out, index=False)
display(memorisation)

# %% [markdown]
# ### What each point takes to resolve: the power table
#
# Per size, budget and gap: the per-seed std of the gap (and its one-sided 95% upper bound), the
# 95% CI half-width at this and other seed counts, the seeds a half-width of
# `study.map_power_target` (default ±0.05 nats) needs, and the seeds that resolve the paper's gap at
# its own point with 80% power if the true gap here were that large.

# %%
power = repetition.power_frame(per_seed, active, target=ctx.knobs.power_target)
plots.save_table(power, token_budget.POWER, out, index=False)
display(power[["size", "epochs", "stories", "tokens_per_param", "gap", "n", "std", "half_width", "hw@10",
               "seeds_target", "seeds_effect", "seeds_effect_high"]])
print(text.power_sentences(power.set_index("comparison")))

# %% [markdown]
# ## The fits: the gap model, the crossing line, every point left out, the loss laws (each point left out too)

# %%
models = plane.gap_models(per_seed)
coefs = plane.coefficient_table(models)
crossing = plane.crossing_table(models)
loo = plane.loo_table(per_seed)
losses = budgets.loss_frame(preset, trios, summaries)
fitted_laws = law_roles.role_laws(losses)
laws = law_roles.role_law_table(fitted_laws)
loss_loo = law_roles.role_loo_table(losses, fitted_laws)
extrapolation = law_roles.extrapolation_table(models, fitted_laws)
for name, t in ((token_budget.FIT, coefs), (token_budget.CROSSING, crossing), (token_budget.LOO, loo),
                (token_budget.LOSSES, losses), (token_budget.LOSS_LAW, laws), (token_budget.LOSS_LOO, loss_loo),
                (token_budget.EXTRAPOLATION, extrapolation)):
    plots.save_table(t, name, out, index=False)
for gap in gaps.GAPS:
    print(plane.what_moves(coefs, gap))
display(coefs[["gap", "term", "estimate", "ci_low", "ci_high", "p_boot", "p_holm", "verdict", "reason"]])

# %% [markdown]
# ### Every point predicted with itself left out
#
# `inside`: the measured mean lies in the prediction interval (the refit's bootstrap plus the noise
# of a mean of that many seeds); `extrapolated`: the point lies outside the other points' ranges.

# %%
display(loo)

# %% [markdown]
# ### The loss law per model, and the paper's point (extrapolation)

# %%
display(laws[["role", "parameter", "estimate", "ci_low", "ci_high", "identified", "reason", "cells"]])
display(loss_loo)  # each point left out of its role's law; checked: the refit identifies every parameter
display(extrapolation)

# %% [markdown]
# ## One law for the three models, checked where it matters, carried to the paper's point
#
# Every run of the map in bits per byte. The form (lambda, a multiplier m x N_active, or lambda(N)) and R*
# (shared or one per role) are chosen by leaving out each map cell in turn; the parameters carry
# two 95% intervals (seeds resampled within cells; whole map cells resampled within each size).
# Then the law refitted without the largest size, and without each budget in turn, predicts what
# it never saw (each role's loss, both gaps, the position; the interval adds the noise of a mean
# of that cell's seeds). Then the law at the paper's N and 426.3M fresh tokens beside the paper. Last,
# the runs that move it: each run's standardised residual (a robust sd: 1.4826 x the median absolute
# deviation) and the paper-point position refitted without it; a run beyond 4 sd is named.

# %%
law_runs = losses.rename(columns={"params": "active"})
n_boot = ctx.knobs.law_boot  # study.map_law_boot: replicates of each interval
choice = law_checks.choose(law_runs)
joint = law_fit.fit_law(law_runs, choice.form, choice.per_role_rstar, n_boot=n_boot)
law_table = law_words.law_table(joint)
held = pd.concat([law_checks.held_out(law_runs, by, choice.form, choice.per_role_rstar, n_boot=n_boot)
                  for by in ("size", "budget")], ignore_index=True)
at_paper = law_checks.paper_point(joint)
influence = law_checks.influence(law_runs, joint)
for name, t in ((token_budget.LAW, law_table), (token_budget.LAW_CHOICE, choice.errors),
                (token_budget.LAW_HELD_OUT, held), (token_budget.LAW_PAPER, at_paper),
                (token_budget.LAW_INFLUENCE, influence)):
    plots.save_table(t, name, out, index=False)
display(choice.errors)
display(law_table[["parameter", "estimate", "ci_low", "ci_high", "cell_ci_low", "cell_ci_high", "identified",
                   "reason"]])
display(held)
display(at_paper)
display(influence[influence["beyond"]] if influence["beyond"].any() else
        influence.loc[influence["position_change"].abs().nlargest(3).index])
for s in law_words.law_sentences(law_table, choice.errors, held, at_paper, runs=influence):
    print(s, "\n")

# %% [markdown]
# ### A law whose MoE worth may change with size
#
# Beside one lambda, lambda(N) = lambda_0 + lambda_1 log10(N_active / 1.2e5) kept in [0, 1] (a
# candidate of the choice above). Both forms at the paper's point; the size form's p there is not
# identified where lambda at 14.8M has an interval covering all of [0, 1], and `span_needed` says
# what span of sizes would pin it.

# %%
form_laws = law_size.fit_forms(law_runs, choice.per_role_rstar, n_boot=n_boot, fitted={choice.form: joint})
forms_table = pd.concat([law_words.law_table(law) for law in form_laws.values()], ignore_index=True)
forms_paper = law_size.paper_points(form_laws, choice.form, law_runs.loc[law_runs["role"] == "moe", "active"])
for name, t in ((token_budget.LAW_FORMS, forms_table), (token_budget.LAW_FORMS_PAPER, forms_paper)):
    plots.save_table(t, name, out, index=False)
display(forms_table[["form", "parameter", "estimate", "ci_low", "ci_high", "identified", "reason"]])
display(forms_paper)
for s in law_size.size_form_sentences(forms_paper, forms_table):
    print(s, "\n")

# %% [markdown]
# ## The figures: the map (one line per size, fitted lines dashed) and the crossing line
#
# Mean over seeds with the 95% CI band, one line per model size; hollow markers: the budget repeats
# data; dashed: the gap model at that size. The star is the paper's headline point; diamonds are the
# `paper` preset's own runs when they exist on this machine (a GPU study).

# %%
paper_table, paper_note = budgets.paper_preset_points(ctx.root, preset)
print(paper_note)
if paper_table is not None:
    plots.save_table(paper_table, token_budget.PAPER_PRESET, out, index=False)
    display(gaps.display_table(paper_table))
fig = gap_map(table, paper_table=paper_table, models=models,
              title=f"Gaps against tokens per active parameter ({preset.name}; seeds per size in the table)",
              outdir=out, name=token_budget.MAP)
fig2 = crossing_line(crossing, table, outdir=out, name=token_budget.CROSSING)

# %% [markdown]
# ## In words

# %%
lines = [gaps.point_sentences(table, gap) for gap in gaps.GAPS] + [gaps.position_sentence(table)]
lines += repetition.repetition_sentences(repetition_fit, repeated_cells)
lines += plane.plane_sentences(coefs, crossing, loo)
lines += law_roles.role_law_sentences(laws, loss_loo) + law_roles.extrapolation_sentences(extrapolation)
lines += law_words.law_sentences(law_table, choice.errors, held, at_paper, runs=influence)
lines += law_size.size_form_sentences(forms_paper, forms_table)
lines.append(gaps.paper_sentence(table))
for s in lines:
    print(s, "\n")
display(Markdown("\n\n".join(f"* {s}" for s in lines)))

# %% [markdown]
# ## What this does not show
#
# The map has few points and a handful of seeds per point; the gap model is a plane in log
# tokens/param and log size, so a curved dependence (a gap that rises, then falls) shows up only as
# misses in the leave-one-out table. Its intervals are bootstrap intervals over seeds within each
# point, which say nothing about a model the grid does not span. The coefficients hold at the
# grid's centre; the crossing line is where the fitted plane is zero, and its band is pointwise.
# Larger budgets repeat data (marked; Muennighoff et al. 2023 find up to ~4 passes cost little),
# which can favour the model that memorises better. A loss law with five parameters is identified
# only by a grid with several sizes *and* several budgets per size; with fewer points it names the
# parameters it cannot pin down. The joint law's prediction at the paper's point assumes the same
# law holds far beyond the largest size measured here (the distance in decades is printed with it): the held-out-size check is
# the only evidence that it carries across sizes at all, and one held-out size is little. The
# preset's scale (tiny widths, a 3.5 MB subset, a short context) is far from the paper's; only the
# `paper` preset on a GPU measures the paper's own regime.

# %%
elapsed = time.perf_counter() - t_start
train_s = summaries.drop_duplicates(["model", "seed", "tokens"])["wall_time_s"].sum() \
    if "wall_time_s" in summaries else float("nan")
print(f"This notebook: {elapsed:.1f} s wall (training included only for runs it had to train); "
      f"the {len(summaries.drop_duplicates(['model', 'seed', 'tokens']))} runs it shows took {train_s:.1f} s "
      f"of training wall time when they were trained (per run, summed; parallel jobs overlap).")
