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
# * Gaps are paired by seed: per-seed gaps, then mean, sample std, n and a paired-t 95% CI
#   (`studylib.study.analysis.stats.paired`); a gap is **resolved** only when its CI excludes zero.
# * The trend is the slope of the gap per decade of tokens/param, fitted per seed by least squares
#   and summarised with the same paired statistics over the per-seed slopes. A zero crossing is
#   interpolated linearly in log10(tokens/param) between the two budgets whose means bracket it;
#   its uncertainty is the stretch of tokens/param where the 95% CI band (interpolated the same way)
#   includes zero. Anything beyond the measured range is labelled extrapolation.

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None
seeds = None  # e.g. [1, 2] or "1337-1346": replaces the preset's seeds
overrides = None  # e.g. {"train.amp": "off"}: a variant preset with a derived name

# %%
import time

t_start = time.perf_counter()

from IPython.display import Markdown, display

from studylib.study.analysis import budget_checks, budget_plots, plots, text
from studylib.study.analysis import budget_map as bm
from studylib.study.comparisons import token_budget
from studylib.study.runner.notebooks import open_comparison

ctx, runs = open_comparison("token_budget", params, jobs, seeds, overrides)  # every trio x budget x seed
trios = bm.budget_trios(ctx.preset)
preset, study, out, seeds = ctx.preset, ctx.study, ctx.out, ctx.seeds
active = bm.active_params(preset, trios)
budget_map = bm.budgets(preset, trios)
epoch_unit = (f"train.max_steps = {preset.train.max_steps} steps (not a pass over the data)"
              if preset.train.max_steps is not None else "one pass over the training windows")
print(f"preset {preset.name!r}, seeds {seeds}; one epoch = {epoch_unit}")
for t in trios:
    print(f"  size {bm.size_label(t.size, active[t.size])}: {t.models}, epochs {list(t.epochs)}, "
          f"seeds {t.seeds_of(seeds)}")

# %% [markdown]
# ## The runs: which are the preset's own (reused), which are budgets of their own

# %%
runs_table = bm.run_plan(preset, trios, seeds, budget_map)
plots.save_table(runs_table, "token_budget_plan", out, index=False)
display(runs_table)
own, shared = runs_table["preset_run"], runs_table["also_in"] != ""
print(f"{len(runs_table)} (model, budget) pairs, {int(runs_table['seeds'].sum())} runs: {int(own.sum())} pairs are the preset's own runs "
      f"({int(shared.sum())} of them other notebooks' runs too, named in 'also_in': trained once, reused), "
      f"{int((~own).sum())} are budget runs of their own; {int(runs_table['finished'].sum())} of "
      f"{int(runs_table['seeds'].sum())} runs already exist.")

# %%
summaries = token_budget.summaries(runs, trios)
assert len(summaries) == sum(len(t.epochs) * 3 * len(t.seeds_of(seeds)) for t in trios)
print(f"{len(summaries)} runs ready")

# %% [markdown]
# ## The table: every size x budget, both gaps with their 95% CIs

# %%
per_seed = bm.gap_frame(summaries, trios, active)
table = bm.gap_table(per_seed, active)
plots.save_table(table, "token_budget_gaps", out, index=False)
plots.save_table(per_seed, "token_budget_per_seed", out, index=False)
display(bm.display_table(table))
repeated = table[table["repeats"]]
if len(repeated):
    print("Data repetition: " + "; ".join(
        f"{r.size_label} at {r.epochs:g} epochs passes {r.data_passes:.2f} times over the training windows "
        f"(each window seen up to {r.max_views} times)" for r in repeated.itertuples()) + ".")
else:
    print("No budget passes over the training data more than once (no repeated windows).")

# %% [markdown]
# ### What repetition does
#
# Per size, budget and model: the last training loss (the mean since the previous evaluation) and
# the final full-split validation loss, means over seeds. In one pass every training window is
# new, so the two estimate the same thing; once windows repeat, validation minus training grows with
# memorisation. Budgets under one pass are left out (their last training loss averages over the
# steep start of a short run).

# %%
repetition = budget_checks.repetition_table(trios, summaries, token_budget.cell_metrics(runs, trios))
plots.save_table(repetition, "token_budget_repetition", out, index=False)
display(repetition)

# %% [markdown]
# ### What each point takes to resolve: the power table
#
# Per size, budget and gap: the per-seed std of the gap (and its one-sided 95% upper bound), the
# 95% CI half-width at this and other seed counts, the seeds a half-width of
# `study.map_power_target` (default ±0.05 nats) needs, and the seeds that resolve the paper's gap at
# its own point with 80% power if the true gap here were that large.

# %%
power = budget_checks.power_frame(per_seed, active, target=study.map_power_target)
plots.save_table(power, "token_budget_power", out, index=False)
display(power[["size", "epochs", "tokens_per_param", "gap", "n", "std", "half_width", "hw@10",
               "seeds_target", "seeds_effect", "seeds_effect_high"]])
print(text.power_sentences(power.set_index("comparison")))

# %% [markdown]
# ## The figure: both gaps against tokens per active parameter
#
# Mean over seeds with the 95% CI band, one line per model size; hollow markers: the budget repeats
# data. The star is the paper's headline point; diamonds are the `paper` preset's own runs when they
# exist on this machine (a GPU study).

# %%
paper_table, paper_note = bm.paper_preset_points(ctx.root, preset)
print(paper_note)
if paper_table is not None:
    plots.save_table(paper_table, "token_budget_gaps_paper_preset", out, index=False)
    display(bm.display_table(paper_table))
fig = budget_plots.gap_map(table, paper_table=paper_table,
                           title=f"Gaps against tokens per active parameter ({preset.name}; seeds per size in the table)",
                           outdir=out, name="token_budget_gaps")

# %% [markdown]
# ## Where each gap crosses zero, and its trend

# %%
lines = []
for gap in bm.GAPS:
    lines += bm.gap_sentences(table, per_seed, gap)
lines.append(bm.paper_sentence(table))
for s in lines:
    print(s, "\n")
display(Markdown("\n\n".join(f"* {s}" for s in lines)))

# %% [markdown]
# ## What this does not show
#
# The points are few budgets per size and a handful of seeds; a crossing is a linear interpolation
# between two measured budgets, and the CI band's stretch is a pointwise statement, not a confidence
# interval for the crossing itself. Pooling the sizes assumes the gaps depend on tokens per
# parameter alone, which the per-size lines test only where they overlap. Larger budgets repeat data
# (marked), which can favour the model that memorises better. The preset's scale (tiny widths, a
# 3.5 MB subset, a short context) is far from the paper's; only the `paper` preset on a GPU measures
# the paper's own regime.

# %%
elapsed = time.perf_counter() - t_start
train_s = summaries.drop_duplicates(["model", "seed", "tokens"])["wall_time_s"].sum() \
    if "wall_time_s" in summaries else float("nan")
print(f"This notebook: {elapsed:.1f} s wall (training included only for runs it had to train); "
      f"the {len(summaries.drop_duplicates(['model', 'seed', 'tokens']))} runs it shows took {train_s:.1f} s "
      f"of training wall time when they were trained (per run, summed; parallel jobs overlap).")
