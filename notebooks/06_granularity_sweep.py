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
# # 06 · Granularity of an always-active soft MoE (seed 003)
#
# K complete SwiGLU experts, all evaluated for every token and mixed by a per-token softmax gate
# `g = softmax(W_r x)`, at a **fixed total FFN width** (each expert has width H/K). K = 1 is the
# dense baseline exactly (its one-logit gate is always 1). No top-k, no balance loss; the router
# starts at zero, so the gate starts exactly uniform.
#
# The seed reports (single runs, 12 layers, d = 384, FineWeb): K = 2 beats K = 1 by 0.0048 nats;
# K = 4 and K = 6 are worse by 0.0053 and 0.0197. Its diagnostics: the mean max gate at K = 2 is
# 0.762 (uniform: 0.5), and forcing layer 0's gate of the K = 4 model to uniform costs ~2.4 nats.
#
# Here: the preset's `study.granularity` models, trained with **every seed** of the preset under one
# recipe; each K is compared with K = 1 paired by seed (per-seed gaps, mean, 95% CI). The K > 1
# comparisons are one family, "06 granularity: each K − K=1" (3 comparisons with the presets' 4 K
# values): Holm-corrected together (resolved only when `p_holm` < 0.05) and tested for equivalence
# within ±`study.margin` nats (TOST, `p_tost_holm`); each verdict is "A better" (A: that K), "B
# better" (B: K = 1), "equivalent" or "inconclusive" (docs/statistics.md). Seed 003's deltas (+-0.005 for K = 2 and 4) are single runs without
# seed replication, so they come with no interval.
#
# **Budget.** The sweep may train for a shorter budget than the headline: `study.granularity_epochs`
# (default 1) times the preset's schedule, as runs of their own (own warmup and cosine); the budget
# used is printed below. (Seed 000's Table 1 ablation likewise used smaller budgets than its headline.)

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None
seeds = None  # e.g. [1, 2] or "1337-1346": replaces the preset's seeds
overrides = None  # e.g. {"train.amp": "off"}: a variant preset with a derived name

# %%
import pandas as pd
from IPython.display import Markdown, display

from studylib import config as budget
from studylib.study.analysis import frames, paper, plots, probes, routing, tables, text
from studylib.study.runner.notebooks import open_comparison

ctx, runs = open_comparison("granularity", params, jobs, seeds, overrides)  # `studylib study` trains them up front
models = list(ctx.knobs.models)
preset, study, out = ctx.preset, ctx.study, ctx.out
K = {m: preset.model_config(m).ffn.num_experts for m in models}
epochs = ctx.knobs.epochs  # study.granularity x seeds at `epochs`
seeds = runs.seeds()  # study.comparison_seeds: the first k of the preset's seeds (default all)
sweep_budget = runs.grids[0].overrides
summaries = runs.frame()
run_dirs = runs.run_dirs()  # {model: {seed: run directory}}
first = {m: by_seed[seeds[0]] for m, by_seed in run_dirs.items()}  # the probes' runs
n_probe = ctx.knobs.probe_windows
tokens = int(summaries["tokens"].iloc[0])
assert summaries["tokens"].nunique() == 1, "every K must see the same number of tokens"
assert len({budget.count_params(preset.model_config(m)).ffn_total for m in models}) == 1, "fixed total FFN width"
display(Markdown(
    f"**Budget:** {epochs:g} x the preset's schedule ({int(summaries['steps'].iloc[0]):,} optimizer steps, "
    f"{tokens:,} target tokens per run{'; overrides ' + str(sweep_budget) if sweep_budget else ''}); "
    f"K = {list(K.values())} x seeds {seeds}; probes on {n_probe} validation windows of seed {seeds[0]}'s runs."))

# %% [markdown]
# ## Validation loss vs K, each K against K = 1 (paired by seed)
#
# Best validation loss (mean ± std over seeds) and the paired gap K − (K = 1): mean, 95% CI, p,
# `p_holm`, `p_tost`, `p_tost_holm`, verdict; seed 003's single-run delta (`paper_delta`) next to it.

# %%
base = next(m for m in models if K[m] == 1) if 1 in K.values() else models[0]
gran = tables.granularity_table(summaries, models, K=K, base=base, paper=paper.PAPER_GRANULARITY,
                                margin=study.general.margin)
plots.save_table(gran, "granularity_losses", out)
display(gran)
cmp = gran.attrs["comparisons"].assign(paper=gran["paper_delta"])
cmp = tables.relabel(cmp, {m: f"K={K[m]} ({m})" for m in cmp.index})
plots.save_table(cmp, "granularity_gaps", out)
fig = plots.intervals(cmp, title=f"Best val loss minus K={K[base]} ({preset.name}, {len(seeds)} seeds; x: seed 003)",
                      xlabel="gap (nats); < 0: better than K = 1", paper="paper", outdir=out,
                      name="granularity_deltas")
print(text.comparison_sentences(gran.attrs["comparisons"]))

# %%
metrics = runs.metrics()
fig = plots.val_curves(metrics, order=models, title=f"Validation loss by K ({len(seeds)} seeds)",
                       outdir=out, name="granularity_val_loss")

# %% [markdown]
# ## Gate diagnostics per layer (last evaluation)
#
# Usage entropy (entropy of the mean gate: are experts used equally overall?), per-token gate
# entropy (is each token's mix sharp?), the mean max gate (1/K if uniform), the share of tokens
# whose max gate exceeds 0.9, and the argmax shares (which expert leads how often); one row per
# model, layer and seed.

# %%
gates = pd.concat([routing.gate_table({m: by_seed[s] for m, by_seed in run_dirs.items() if K[m] > 1}).assign(seed=s)
                   for s in seeds], ignore_index=True)
plots.save_table(gates, "granularity_gates", out, index=False)
assert (gates["mean_max_gate"] >= gates["uniform_gate"] - 1e-4).all()
assert (gates["token_entropy"] <= gates["max_entropy"] + 1e-4).all()
gates

# %%
rf = pd.concat([frames.routing_frame(rd).assign(model=m, seed=s) for m, by_seed in run_dirs.items() if K[m] > 1
                for s, rd in by_seed.items()], ignore_index=True)
fig = plots.routing_diagnostics(rf, metrics=["top1", "entropy", "usage_entropy", "max_gt_0.9"], x="tokens",
                                hue="model", title="Soft-MoE gates over training (mean ± std over layers and seeds)",
                                outdir=out, name="granularity_gates")

# %% [markdown]
# ## Do the experts differ? Cosine similarity of the expert outputs
#
# Each layer's experts are run (ungated) on the same hidden states (the layer's FFN input on the
# probe windows); the matrix holds the mean cosine similarity of their outputs per token.
# Experts that learned the same function would sit near 1. (First seed's runs: a description of
# trained models, not a comparison between them.)

# %%
cos = {m: probes.expert_cosine(rd, n_windows=n_probe) for m, rd in first.items() if K[m] > 1}
cos_summary = pd.concat({m: probes.cosine_summary(c) for m, c in cos.items()}, names=["model"])
plots.save_table(cos_summary, "granularity_expert_cosine", out)
display(cos_summary)
fig = plots.cosine_heatmaps(cos, outdir=out, name="granularity_expert_cosine")

# %% [markdown]
# ## Uniform-gate ablation
#
# For every layer of every K > 1 model: force that layer's gate to uniform (1/K each), keep
# everything else, and measure the loss change on the fixed probe subset. A large delta means the
# model relies on that layer's learned routing. As a check, the same ablation on K = 1 must change
# nothing (its gate is 1 either way). First seed's runs.

# %%
k1 = [m for m in models if K[m] == 1]
if k1:
    check = probes.uniform_gate_ablation(first[k1[0]], n_windows=n_probe)
    assert (check["delta"].abs() < 1e-6).all(), check
    print(f"{k1[0]}: uniform gate changes nothing (max |delta| {check['delta'].abs().max():.1e})")
abl = pd.concat([probes.uniform_gate_ablation(rd, n_windows=n_probe) for m, rd in first.items() if K[m] > 1],
                ignore_index=True)
plots.save_table(abl, "granularity_uniform_gate_ablation", out, index=False)
display(abl)
fig = plots.deltas(abl, x="model", y="delta", hue="layer", title="Loss change when one layer's gate is forced uniform",
                   outdir=out, name="granularity_uniform_gate_ablation")

# %%
worst = abl.loc[abl["delta"].idxmax()]
display(Markdown(
    f"**Summary** ({len(seeds)} seeds, {tokens:,} target tokens per run). Best val loss against K=1: "
    + text.comparison_sentences(gran.attrs["comparisons"])
    + " Seed 003 (single runs, 12 layers, d=384, FineWeb): K=2 −0.0048, K=4 +0.0053, K=6 +0.0197. Mean max gate: "
    + ", ".join(f"K={k} {v:.3f} (uniform {1 / k:.3f})" for k, v in gates.groupby("K")["mean_max_gate"].mean().items())
    + f". The costliest uniform-gate ablation (seed {seeds[0]}) is {worst['model']} layer {int(worst['layer'])}: "
    + f"{worst['delta']:+.4f} nats. "
    + text.limits(len(seeds), tokens, "Seed 003's deltas are a few thousandths of a nat; a sweep resolves "
                  "gaps of that size only with many seeds or much longer training.")))
