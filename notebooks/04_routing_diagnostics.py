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
# # 04 · Routing diagnostics of the headline MoE (SPEC Table 7, Figures 4 and 5)
#
# How the reference MoE's routers behave, per layer, over training. The statistics are measured
# at every evaluation on the validation subset (so they describe held-out tokens):
#
# * **busiest-expert fraction** `max_e f_e` (f_e: share of the T·k assignments that went to expert e;
#   1/E is perfect balance);
# * **expert-usage variance** of f_e over the experts;
# * **router entropy**: mean per-token entropy of the softmax over E (at most ln E);
# * **top-1 gate**: mean largest router probability, and the **top-1 − top-2 margin**;
# * **router log-z**: mean logsumexp of the router logits (what the z-loss pushes down), and its
#   trend from the first to the last evaluation.
#
# This notebook reads the runs of notebook 03 (no retraining; if they are missing, the sweep
# trains them and later notebooks reuse them). Values are means over the seeds; bands are ±1 std.

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None
seeds = None  # e.g. [1, 2] or "1337-1346": replaces the preset's seeds
overrides = None  # e.g. {"train.amp": "off"}: a variant preset with a derived name

# %%
import math

from IPython.display import Markdown, display

from studylib.study.analysis import frames, paper, plots, routing
from studylib.study.orchestration import plan
from studylib.study.orchestration.sweep import ensure_grid
from studylib.study.runner.notebooks import notebook_context

ctx = notebook_context(params, jobs, seeds, overrides)
preset, study, out, seeds = ctx.preset, ctx.study, ctx.out, ctx.seeds
moe = plan.reference_moe(preset)
ensure_grid(preset, plan.reference_grid(preset), jobs=ctx.jobs)  # reuses notebook 03's runs
cfg = preset.model_config(moe)
E, k = cfg.ffn.num_experts, cfg.ffn.top_k
rf = frames.routing_frames(preset, moe, seeds)
shares = frames.shares_frames(preset, moe, seeds)
plots.save_table(rf, "routing_diagnostics_long", out, index=False)
print(f"{moe}: {E} experts, top-{k}, {cfg.n_layers} layers; {rf['step'].nunique()} evaluations x {len(seeds)} seeds")

# %% [markdown]
# Sanity bounds every router must satisfy (checked on every layer, evaluation and seed):

# %%
val = rf.pivot_table(index=["seed", "step", "layer"], columns="metric", values="value")
assert (val["entropy"] <= math.log(E) + 1e-4).all() and (val["entropy"] >= -1e-6).all()
assert (val["top1"] >= 1 / E - 1e-4).all() and (val["top1"] <= 1 + 1e-6).all()
assert (val["margin"] >= -1e-6).all()
assert (val["busiest"] >= 1 / E - 1e-6).all() and (val["busiest"] <= 1 + 1e-6).all()
assert ((shares.groupby(["seed", "step", "layer"])["share"].sum() - 1).abs() < 1e-4).all()
print(f"bounds hold: entropy <= ln {E} = {math.log(E):.3f}, top-1 gate >= 1/{E}, margin >= 0, shares sum to 1")

# %% [markdown]
# ## Table 7: router statistics per layer at the end of training

# %%
table7 = routing.diagnostics_table(rf)
plots.save_table(table7, "table7_routing", out)
display(table7)
print("paper (150M tokens, 4 layers), for orientation:")
display(paper.PAPER_TABLE7)

# %% [markdown]
# ## Router log-z: first → last evaluation

# %%
logz = routing.routing_trend({s: rf[rf["seed"] == s] for s in seeds}, "logz")
plots.save_table(logz, "table7_logz_trend", out)
logz

# %% [markdown]
# ## Figure 4: the diagnostics over training, one line per layer

# %%
fig = plots.routing_diagnostics(rf, x="tokens", title=f"Routing diagnostics of {moe} per layer (mean ± std over seeds)",
                                outdir=out, name="fig4_routing_diagnostics")

# %% [markdown]
# ## Figure 5: expert shares by layer at the end of training
#
# Mean over seeds of f_e at the last evaluation (each row sums to 1; 1/E = balanced).

# %%
fig = plots.share_heatmap(shares, title=f"{moe}: expert shares by layer (last evaluation, mean over seeds)",
                          outdir=out, name="fig5_expert_shares")

# %%
last = table7
display(Markdown(
    f"**Summary.** At the end of training the busiest expert takes "
    + ", ".join(f"{v:.2f}" for v in last["busiest"]) + f" of the assignments in layers "
    + ", ".join(str(i) for i in last.index) + f" (balanced: {1 / E:.2f}); router entropy is "
    + ", ".join(f"{v:.3f}" for v in last["entropy"]) + f" nats (max {math.log(E):.3f}); the top-1 gate is "
    + ", ".join(f"{v:.3f}" for v in last["top1"]) + ". Router log-z "
    + ", ".join(f"L{i} {r.trend} ({r.change:+.3f})" for i, r in logz.iterrows()) + " from the first to the last evaluation."))
