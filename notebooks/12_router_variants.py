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
# # 12 · The routers people train today
#
# The reference MoE routes with a softmax top-k, the Switch balance loss and the z-loss. The MoE
# codebases researchers start from today train other routers; here each is a model of the preset
# (`study.router_variants`), trained with **every seed** at the headline budget (unless the preset
# says otherwise, printed below), and compared paired by seed with the reference MoE and with the
# two dense baselines of the headline (95% CI, paired t).
#
# **Three families** (docs/statistics.md), each Holm-corrected over its own comparisons and tested
# for equivalence within ±`study.margin` nats (paired TOST, Holm-corrected too): "12 router
# variants: each variant − the reference MoE" (6 comparisons in `cpu`: the question this notebook
# asks), "the active-match dense model − each MoE" and "each MoE − the total-match dense model"
# (7 each, the reference MoE included). Vs the dense baselines are families of their own because
# they answer other questions (does any router beat / trail a dense model?), not the variant
# ranking. A gap is resolved only when its Holm-adjusted p is below 0.05; otherwise it is
# "equivalent" (TOST) or "inconclusive".
#
# | option (`ffn.`) | what it does | from |
# |---|---|---|
# | `bias_balance: true`, `bias_rate: u` | a per-expert bias b is added to the scores for the top-k *selection* only; after each optimizer step `b_e += u * sign(mean load - load_e)`, loads counted over the whole step (every micro-batch, every rank) | DeepSeek-V3 (auxiliary-loss-free balancing) |
# | `seq_balance_coef: alpha` | the sequence-wise balance loss kept beside the bias | DeepSeek-V3 |
# | `score: sigmoid` | `s = sigmoid(x W)`, top-k on s (+ b), weights `s_topk / sum(s_topk)` | DeepSeek-V3, GLM-4.5 |
# | `route_scale` | the routed weights times a constant | `routed_scaling_factor` |
# | `n_shared: n` | n always-active experts added to the routed output; counted as active parameters (the presets pair 1 shared expert with top-1 routing weighted by the router probability, `renormalize: false`, as DeepSeekMoE: renormalised, one routed weight is exactly 1 and the router learns from the balance loss only) | DeepSeekMoE, Qwen-MoE |
# | `balance_scope: global` | the balance loss's loads f counted over the whole optimizer step (every micro-batch, every rank; a routing pre-pass without dropout) instead of the micro-batch | Qwen ("Demons in the detail") |
# | `num_experts: E*G, hidden: h/G, top_k: k*G` | fine-grained experts at the same active and total parameters | DeepSeekMoE, OLMoE |
#
# **Not here.** *Expert-choice* routing lets each expert pick its tokens across the whole sequence,
# so a token's output depends on later tokens: it is not causal and does not fit an autoregressive
# decoder without changes. The global-batch balance loss differs from the micro-batch one only when a
# step has several micro-batches or ranks: with one (the `cpu` preset) it is the same loss exactly,
# so `cpu` does not list it (`ci` and `paper` accumulate two micro-batches and do).

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None
seeds = None  # e.g. [1, 2] or "1337-1346": replaces the preset's seeds
overrides = None  # e.g. {"train.amp": "off"}: a variant preset with a derived name

# %%
import time

from IPython.display import Markdown, display

from studylib.study.analysis import frames, plots, text
from studylib.study.comparisons.router_variants import variants as V
from studylib.study.runner.notebooks import open_comparison

t0 = time.perf_counter()
ctx, runs = open_comparison("router_variants", params, jobs, seeds, overrides)  # `studylib study` trains them up front
trained_s = time.perf_counter() - t0
preset, study, out = ctx.preset, ctx.study, ctx.out
dense_active, _, dense_total = study.headline
reference = study.reference_moe
grid = runs.grids[0]
moes = [m for m in grid.models if m not in (dense_active, dense_total)]
seeds = runs.seeds()
epochs = ctx.knobs.epochs
summaries = runs.frame()
run_dirs = runs.run_dirs()
assert summaries["tokens"].nunique() == 1, "every model must see the same number of tokens"
tokens = int(summaries["tokens"].iloc[0])
configs = {m: preset.model_config(m) for m in grid.models}
display(Markdown(
    f"**Budget:** {epochs:g} x the preset's schedule ({int(summaries['steps'].iloc[0]):,} optimizer steps, "
    f"{tokens:,} target tokens per run){' = the headline budget: its runs are reused' if epochs == 1 else ''}; "
    f"{len(moes)} MoEs and the two dense baselines x {len(seeds)} seeds {seeds}. Getting the runs took "
    f"{trained_s:.0f} s here (0 when `studylib study` trained them up front)."))

# %% [markdown]
# ## The table: every router against the reference MoE and the dense baselines
#
# Per MoE: its router, best validation loss (mean ± std over seeds) and three paired gaps with their
# 95% CIs: `vs_ref` = variant − reference (> 0: the reference is better), `vs_active` =
# dense_active − variant (> 0: the variant beats the active-match dense model), `vs_total` =
# variant − dense_total (> 0: the total-match dense model is better), each with its Holm-adjusted p
# (`_p_holm`), TOST p (`_p_tost`, `_p_tost_holm`) and verdict (`_verdict`). Router diagnostics at the last
# evaluation over the evaluation subset: `imbalance` = max/mean expert load (1 = balanced; mean
# over layers and seeds, `worst_imbalance` its largest layer), `dead_experts` (share < 0.1%, summed
# over layers), `entropy` (per-token router entropy / ln E), `bias_picked` (the share of assignments
# the selection bias picked: the chosen expert was not among the token's k most probable; empty for
# routers without a bias).

# %%
table = V.variant_table(summaries, moes, reference, dense_active, dense_total, configs, run_dirs,
                        margin=study.general.margin)
plots.save_table(table, "router_variants", out)
display(table)
cmp = table.attrs["comparisons"]
plots.save_table(cmp, "router_variants_gaps", out)
fig = plots.intervals(cmp, title=f"Paired gaps, router variants ({len(seeds)} seeds)",
                      xlabel="gap (nats)", outdir=out, name="router_variants_gaps")

# %% [markdown]
# ## Validation curves

# %%
metrics = runs.metrics()
fig = plots.val_curves(metrics, order=list(grid.models),
                       title=f"Validation loss, router variants and dense baselines ({len(seeds)} seeds)",
                       outdir=out, name="router_variants_val_loss")

# %% [markdown]
# ## The selection bias over training
#
# Each line is one expert's bias b_e (mean over seeds, band: min to max), per layer. With u per
# step the bias moves at most u x steps; a bias that keeps drifting in one direction marks an
# expert the router keeps over- or under-loading.

# %%
bias = V.bias_frame({m: run_dirs[m] for m in moes if configs[m].ffn.bias_balance})
if len(bias):
    plots.save_table(bias, "router_bias", out, index=False)
    fig = plots.bias_trajectory(bias, title="Selection bias b_e over training (mean over seeds)", outdir=out)
else:
    print("no variant with a selection bias in this preset")

# %%
vs_ref = cmp.loc[[f"{m} − {reference}" for m in moes if m != reference]]
vs_active = cmp.loc[[f"{dense_active} − {m}" for m in moes]]
vs_total = cmp.loc[[f"{m} − {dense_total}" for m in moes]]
display(Markdown(
    f"**Outcome in preset `{preset.name}`** ({len(seeds)} seeds, {tokens:,} target tokens per run). "
    f"Against the reference `{reference}`: " + text.comparison_sentences(vs_ref) + " Against the active-match "
    "dense model: " + text.comparison_sentences(vs_active) + " Against the total-match dense model: "
    + text.family_lead(vs_total) + " Most balanced router (mean max/mean load): "
    f"`{table['imbalance'].idxmin()}` ({table['imbalance'].min():.2f}); least: `{table['imbalance'].idxmax()}` "
    f"({table['imbalance'].max():.2f}). " + text.limits(len(seeds), tokens,
    "The variants share the reference's learning rate and the papers' default coefficients (u, alpha): "
    "tuned per router, the ranking may change.")))
