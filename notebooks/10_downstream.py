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
# Every headline run (every seed) is exported to the Hugging Face format
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

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None

# %%
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the local suite needs no network
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from IPython.display import display

from studylib.study import downstream, plots
from studylib.study.notebooks import notebook_context
from studylib.study.sweep import ensure_runs

ctx = notebook_context(params, jobs)
preset, out, seeds = ctx.preset, ctx.out, ctx.seeds
dense_active, moe, dense_total = headline = ctx.study["headline"]
ensure_runs(preset, headline, seeds, jobs=ctx.jobs)
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
gaps = downstream.paired_gaps(df, moe, [dense_active, dense_total])
plots.save_table(gaps, "table10_downstream_gaps", out, index=False)
display(gaps)

# %% [markdown]
# ## Figure: per-seed metrics and the paired gaps

# %%
import matplotlib.pyplot as plt
import numpy as np

fig, axes = plt.subplots(1, len(cols), figsize=(4 * len(cols), 3.6))
for ax, col in zip(axes, cols):
    for i, m in enumerate(headline):
        y = df[df.model == m][col].to_numpy()
        ax.scatter(np.full(len(y), i), y, alpha=0.7)
        ax.errorbar(i, y.mean(), yerr=y.std(ddof=1) if len(y) > 1 else 0, fmt="_k", capsize=6)
    ax.set_xticks(range(len(headline)), headline, rotation=20)
    ax.set_title(col)
fig.tight_layout()
plots.save_figure(fig, "fig10_downstream", out)

fig, axes = plt.subplots(1, len(cols), figsize=(4 * len(cols), 2.8))
for ax, col in zip(axes, cols):
    g = gaps[gaps.metric == col].reset_index(drop=True)
    ax.errorbar(g.gap, range(len(g)), xerr=[g.gap - g.ci_low, g.ci_high - g.gap], fmt="o", capsize=4)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(range(len(g)), g.comparison)
    ax.set_title(f"{col}: MoE − dense (95% CI)")
fig.tight_layout()
plots.save_figure(fig, "fig10_downstream_gaps", out)
