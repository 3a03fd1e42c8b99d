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
# How an MoE's routers behave, per layer, over training: by default the reference MoE of the
# headline; `model` picks any sparse MoE of the preset, e.g. a router variant of notebook 12
# (`papermill ... -p model moe_sigmoid_bias`, or `studylib study --notebooks 04 -p model ...`).
# The statistics are measured at every evaluation on the validation subset (so they describe
# held-out tokens):
#
# * **busiest-expert fraction** `max_e f_e` (f_e: share of the T·k assignments that went to expert e;
#   1/E is perfect balance);
# * **expert-usage variance** of f_e over the experts;
# * **router entropy**: mean per-token entropy of the router's distribution over E (the softmax;
#   for a sigmoid router its scores normalised to sum to 1), at most ln E;
# * **top-1 gate**: mean largest router probability, and the **top-1 − top-2 margin**;
# * **router log-z**: mean logsumexp of the router logits (what the z-loss pushes down), and its
#   trend from the first to the last evaluation;
# * for a router with a selection bias (aux-loss-free balancing), the **share picked by the bias**:
#   the assignments whose expert is not among the token's k most probable (the bias, not the
#   scores, chose it), and the bias b_e itself over training.
#
# This notebook reads the runs of notebook 03 (or 12 for a router variant; no retraining; if they
# are missing, it trains them and later notebooks reuse them). Values are means over the seeds;
# bands are ±1 std.

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None
seeds = None  # e.g. [1, 2] or "1337-1346": replaces the preset's seeds
overrides = None  # e.g. {"train.amp": "off"}: a variant preset with a derived name
model = None  # a sparse MoE of the preset, e.g. "moe_sigmoid_bias"; None: the reference MoE

# %%
import math

from IPython.display import Markdown, display

from studylib.study.analysis import frames, paper, plots, routing
from studylib.study.comparisons.router_variants import variants as V
from studylib.study.runner.notebooks import open_comparison

ctx, runs = open_comparison("routing", params, jobs, seeds, overrides, model=model)  # notebook 03's (or 12's) runs
(moe, run_dirs), = runs.run_dirs().items()
preset, study, out = ctx.preset, ctx.study, ctx.out
tag = "" if moe == study.reference_moe else f"_{moe}"  # a variant's outputs beside the reference's
seeds = list(run_dirs)
cfg = preset.model_config(moe)
E, k = cfg.ffn.num_experts, cfg.ffn.top_k
rf = frames.routing_frames(run_dirs)
shares = frames.shares_frames(run_dirs)
plots.save_table(rf, f"routing_diagnostics_long{tag}", out, index=False)
print(f"{moe}: {E} experts, top-{k}, {cfg.ffn.score} scores{', selection bias' if cfg.ffn.bias_balance else ''}, "
      f"{cfg.n_layers} layers; {rf['step'].nunique()} evaluations x {len(seeds)} seeds")

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
plots.save_table(table7, f"table7_routing{tag}", out)
display(table7)
print("paper (its top-2 softmax MoE, 150M tokens, 4 layers), for orientation:")
display(paper.PAPER_TABLE7)

# %% [markdown]
# ## Router log-z: first → last evaluation

# %%
logz = routing.routing_trend({s: rf[rf["seed"] == s] for s in seeds}, "logz")
plots.save_table(logz, f"table7_logz_trend{tag}", out)
logz

# %% [markdown]
# ## Figure 4: the diagnostics over training, one line per layer

# %%
fig = plots.routing_diagnostics(rf, x="tokens", title=f"Routing diagnostics of {moe} per layer (mean ± std over seeds)",
                                outdir=out, name=f"fig4_routing_diagnostics{tag}")

# %% [markdown]
# ## Figure 5: expert shares by layer at the end of training
#
# Mean over seeds of f_e at the last evaluation (each row sums to 1; 1/E = balanced).

# %%
fig = plots.share_heatmap(shares, title=f"{moe}: expert shares by layer (last evaluation, mean over seeds)",
                          outdir=out, name=f"fig5_expert_shares{tag}")

# %% [markdown]
# ## The selection bias over training (routers with aux-loss-free balancing only)
#
# One line per expert (mean over seeds, band: min to max), per layer; with rate u the bias moves
# by exactly u per optimizer step.

# %%
bias = V.bias_frame({moe: run_dirs})
if len(bias):
    plots.save_table(bias, f"routing_bias{tag}", out, index=False)
    fig = plots.bias_trajectory(bias, title=f"{moe}: selection bias b_e over training (mean over seeds)",
                                outdir=out, name=f"routing_bias{tag}")
else:
    print(f"{moe} has no selection bias (ffn.bias_balance: false)")

# %%
last = table7
display(Markdown(
    f"**Summary.** At the end of training the busiest expert takes "
    + ", ".join(f"{v:.2f}" for v in last["busiest"]) + f" of the assignments in layers "
    + ", ".join(str(i) for i in last.index) + f" (balanced: {1 / E:.2f}); router entropy is "
    + ", ".join(f"{v:.3f}" for v in last["entropy"]) + f" nats (max {math.log(E):.3f}); the top-1 gate is "
    + ", ".join(f"{v:.3f}" for v in last["top1"]) + ". Router log-z "
    + ", ".join(f"L{i} {r.trend} ({r.change:+.3f})" for i, r in logz.iterrows()) + " from the first to the last evaluation."
    + ("" if "bias_picked" not in last else " The selection bias picked "
       + ", ".join(f"{v:.1%}" for v in last["bias_picked"]) + " of the assignments.")
    + f" Mean over {len(seeds)} seeds of `{moe}` in preset `{preset.name}`; one budget, one size: what the "
    "statistics would be at other budgets or widths is not shown."))
