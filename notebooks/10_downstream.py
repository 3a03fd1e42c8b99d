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
# # 10 · Downstream: the headline models in lm-evaluation-harness
#
# Every headline run (the first `study.downstream_seeds` seeds; default every seed) is exported to
# the Hugging Face format
# (`python -m studylib export`: `LlamaForCausalLM` for the dense models, `MixtralForCausalLM`
# for the MoE; logits equal studylib's within 1e-5) and evaluated with lm-evaluation-harness on
# the project's local TinyStories suite, built from each run's own validation stories (no
# network):
#
# * **tinystories_lastword**: LAMBADA-style, the final word of each validation story given the
#   rest (accuracy: greedy decoding reproduces the whole word; perplexity of the word);
# * **tinystories_ppl**: word-level perplexity and bits per byte of the validation stories.
#
# Gaps are paired per seed (same seed = same data order): MoE − dense, with a paired-t 95% CI.
#
# **The family.** All comparisons of the MoE with the two dense baselines on the four metrics are
# one family, "10 downstream" (8 comparisons): their p values are Holm-corrected together
# (`p_holm`; a verdict names a model only when `p_holm` < 0.05, by the metric's direction), and each
# is tested for equivalence (paired TOST, Holm-corrected as `p_tost_holm`) within ±`study.margin`:
# on the difference for last-word accuracy (±0.03 = 3 points) and on the log ratio of the two
# models' values for the perplexities and bits per byte (±0.03: about ±3%). Each verdict is
# "A better" (A: the MoE), "B better", "equivalent" or "inconclusive" (docs/statistics.md).

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None
seeds = None  # e.g. [1, 2] or "1337-1346": replaces the preset's seeds
overrides = None  # e.g. {"train.amp": "off"}: a variant preset with a derived name

# %%
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the local suite needs no network
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from IPython.display import display

from studylib.study.analysis import plots
from studylib.study.comparisons.downstream import evaluate as downstream
from studylib.study.runner.notebooks import open_comparison

ctx, runs = open_comparison("downstream", params, jobs, seeds, overrides)
dense_active, moe, dense_total = headline = list(ctx.study.headline)
preset, study, out, seeds = ctx.preset, ctx.study, ctx.out, runs.seeds()  # study.downstream_seeds: the first k seeds (default all)
print(f"seeds {seeds} (study.downstream_seeds of the preset's {len(ctx.seeds)})")
df = downstream.downstream_frame(preset, headline, seeds)
assert len(df) == len(headline) * len(seeds)
plots.save_table(df, "table10_downstream_per_seed", out, index=False)
display(df)

# %% [markdown]
# ## Mean over seeds and the paired gaps

# %%
cols = [c for c, *_ in downstream.METRICS]
means = df.groupby("model")[cols].agg(["mean", "std"]).loc[list(headline)]
plots.save_table(means, "table10_downstream", out)
display(means)
gaps = downstream.metric_gaps(df, moe, [dense_active, dense_total], margin=study.general.margin)
plots.save_table(gaps, "table10_downstream_gaps", out, index=False)
display(gaps)

# %% [markdown]
# ## Figure: per-seed metrics and the paired gaps

# %%
fig = plots.downstream_metrics(df, headline, cols, outdir=out)
fig = plots.downstream_gaps(gaps, cols, outdir=out)

# %%
from IPython.display import Markdown

from studylib.study.analysis import text

display(Markdown(
    "**Outcome.** " + downstream.gap_sentences(gaps)
    + " A verdict names a model only when its Holm-adjusted p is below 0.05. " + text.limits(len(seeds))
    + " These tasks are built from the same validation stories as the validation loss, so they are"
      " not an independent benchmark: they say how the loss gaps show up as word-level accuracy."))

