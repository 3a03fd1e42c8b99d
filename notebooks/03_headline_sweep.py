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
# # 03 · Headline sweep: dense vs MoE at matched active and matched total parameters
#
# SPEC Tables 2 and 6, Figures 2 and 3. The three headline models (matched-active dense,
# the top-2-of-4 MoE with balance and z-loss, matched-total dense) are trained with every seed of
# the preset under one recipe. Headline numbers use each run's **best** validation loss: the
# lowest over training on the preset's fixed validation subset (`train.eval_windows`, the same
# windows for every model and seed; the last step included). The full-validation-set loss at the
# end is in each run's summary as `final_val_loss`.
#
# * **matched-active gap** = dense_active − MoE (positive: the MoE beats a dense model that
#   computes as much per token);
# * **matched-total gap** = MoE − dense_total (positive: a dense model storing as many
#   parameters beats the MoE).
#
# Gaps are computed per seed (same seed = same data order) and then averaged; their std is the
# sample std (ddof=1) of the per-seed gaps. The paper reports 0.0758 ± 0.0021 and 0.0180 ± 0.0020,
# i.e. dense_active > MoE > dense_total.

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None

# %%
import math

import pandas as pd
from IPython.display import Markdown, display

from studylib.run.rundir import RunDir
from studylib.study import frames, paper, plots, probes, tables, text
from studylib.study.notebooks import notebook_context
from studylib.study.sweep import ensure_runs

ctx = notebook_context(params, jobs)
preset, study, out, seeds = ctx.preset, ctx.study, ctx.out, ctx.seeds
dense_active, moe, dense_total = headline = study["headline"]
summaries = ensure_runs(preset, headline, seeds, jobs=ctx.jobs)
assert len(summaries) == len(headline) * len(seeds)
assert summaries["tokens"].nunique() == 1, "all headline runs must see the same number of tokens"
print(f"{len(summaries)} runs: {headline} x seeds {seeds}; {int(summaries['tokens'].iloc[0]):,} target tokens each")

# %% [markdown]
# ## Table 2: best validation loss and perplexity (mean ± std over seeds)

# %%
table2 = tables.headline_table(summaries, headline)
plots.save_table(table2, "table2_headline", out)
display(table2[["n", "loss", "ppl", "params_total", "params_active"]])
print("paper (full TinyStories, 26k steps):")
display(paper.PAPER_TABLE2)

# %% [markdown]
# ## Table 6: per-seed breakdown and the paired gaps

# %%
table6 = tables.seed_table(summaries, dense_active, moe, dense_total)
plots.save_table(table6, "table6_per_seed", out)
display(table6)
g = tables.gaps(summaries, dense_active, moe, dense_total)
for k in ("active", "total"):  # invariant: the table's gap statistics are the paired per-seed gaps
    assert math.isclose(table6.loc["mean", f"{k}_gap"], g[k]["mean"], rel_tol=1e-9, abs_tol=1e-12)
    if len(seeds) > 1:
        assert math.isclose(table6.loc["std", f"{k}_gap"], g[k]["std"], rel_tol=1e-9, abs_tol=1e-12)
gap_summary = pd.DataFrame(
    {"gap": [tables.pm(g[k]["mean"], g[k]["std"]) for k in ("active", "total")],
     "paper": [tables.pm(*paper.PAPER_GAPS[k]) for k in ("active", "total")],
     "n_seeds": [g[k]["n"] for k in ("active", "total")]},
    index=[f"matched-active ({dense_active} - {moe})", f"matched-total ({moe} - {dense_total})"])
plots.save_table(gap_summary, "headline_gaps", out)
gap_summary

# %% [markdown]
# ## Figure 2: validation loss vs target tokens (mean ± 1 std over seeds)
#
# During training the loss is measured on a fixed validation subset; the last point of each run
# is the full validation split.

# %%
metrics = frames.collect_metrics(preset, headline, seeds)
fig = plots.val_curves(metrics, order=headline, title=f"Validation loss ({preset.name}, {len(seeds)} seeds)",
                       outdir=out, name="fig2_val_loss")

# %% [markdown]
# ## Figure 3: the gaps over training
#
# Per seed and evaluation step, then mean ± 1 std over seeds. A gap above zero favours the
# second model of the pair.

# %%
gap_curves = tables.gap_curves(metrics, {
    f"matched-active: {dense_active} - {moe}": (dense_active, moe),
    f"matched-total: {moe} - {dense_total}": (moe, dense_total),
})
plots.save_table(gap_curves, "fig3_gap_curves", out, index=False)
fig = plots.gap_curves(gap_curves, title="Loss gaps over training (mean ± 1 std over seeds)",
                       outdir=out, name="fig3_gap_curves")

# %% [markdown]
# ## Does the paper's ordering hold here?

# %%
order = tables.ordering(summaries, dense_active, moe, dense_total)
sentence = text.verdict(order, preset.name)
print(sentence)
display(Markdown(f"**Verdict.** {sentence}"))

# %% [markdown]
# ## Qualitative samples
#
# Greedy continuations (temperature 0) of the same prompts by each headline model (first seed).
# Anecdotal only: at this scale they show what the loss numbers mean, nothing more.

# %%
prompts = study.get("prompts", ["Once upon a time", "Tom and Lily went to the park", "The little dog was sad because"])
gens = probes.generations({m: RunDir.of(preset, m, ctx.first_seed) for m in headline}, prompts,
                            max_new_tokens=study.get("sample_tokens", 40))
plots.save_table(gens, "generations", out, index=False)
print(text.format_generations(gens))
