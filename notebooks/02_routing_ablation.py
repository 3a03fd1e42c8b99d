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
# # 02 · Routing ablation (SPEC Table 1)
#
# Routed variants of the same MoE shape, trained with the first seed at one equal token budget
# (the preset's training schedule):
#
# | variant | balance loss | z-loss | the paper's observation |
# |---|---|---|---|
# | top-1 | no | no | collapses within ~100 steps: most layers send nearly all tokens to one expert |
# | top-1, Switch gate | no | no | (added here; see below) |
# | top-1 | yes | no | stable; busiest-expert fraction about 0.45 |
# | top-2 | yes | no | the main quality gain over top-1 |
# | top-2 | yes | yes | same loss, lower router log-z, milder late-layer sharpness |
#
# **Why a second top-1 variant.** SPEC (like Mixtral) renormalises the top-k gate weights to sum
# to 1. With k = 1 the gate is then exactly 1 for every token, so the router gets *no gradient*
# from the language-model loss (tests/test_model.py checks it: ~1e-11 against ~1e-3 for the
# experts). Without a balance or z-loss that router only decays under weight decay, and any
# collapse can only come from the hidden states drifting. `moe_top1_switch` uses the Switch
# Transformer's gate instead (`ffn.renormalize: false`: the token's output is scaled by its
# router probability), so its router learns from the loss and can run away to one expert.
#
# *Collapse* here means one expert receives at least 90 % of a layer's token assignments.
# Tiny presets train far fewer steps than the paper, so collapse may or may not appear; the
# notebook reports what happened rather than asserting it.

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None

# %%
import pandas as pd
from IPython.display import Markdown, display

from studylib.run.rundir import RunDir
from studylib.study import frames, plots, routing, text
from studylib.study.notebooks import notebook_context
from studylib.study.sweep import ensure_runs

ctx = notebook_context(params, jobs)
preset, study, out, seed = ctx.preset, ctx.study, ctx.out, ctx.first_seed
variants = study["ablation"]
summaries = ensure_runs(preset, variants, [seed], jobs=ctx.jobs)
run_dirs = {m: RunDir.of(preset, m, seed) for m in variants}
assert summaries["tokens"].nunique() == 1, "every variant must see the same number of tokens"
print(f"{len(variants)} variants, seed {seed}, {int(summaries['tokens'].iloc[0]):,} target tokens each")

# %% [markdown]
# ## Table 1: loss and routing at the end of training
#
# Final and best validation loss, the busiest-expert fraction of each layer at the last
# evaluation (0.25 is perfect balance with 4 experts; 1.0 is total collapse), the mean router
# log-z over layers, and how many layers ended collapsed.

# %%
table1 = routing.ablation_table(summaries, run_dirs)
plots.save_table(table1, "table1_routing_ablation", out)
table1

# %% [markdown]
# ## Collapse detection
#
# Per variant and layer: the busiest-expert fraction at the end and its maximum over training,
# and the first evaluation at which the layer was collapsed.

# %%
collapse = routing.collapse_table(run_dirs, threshold=0.9)
plots.save_table(collapse, "routing_collapse", out, index=False)
display(collapse)
print(text.collapse_sentence(collapse))

# %%
shares = {m: frames.shares_frame(rd) for m, rd in run_dirs.items()}
for m, sh in shares.items():  # invariant: assignment shares are a distribution at every evaluation
    assert ((sh.groupby(["step", "layer"])["share"].sum() - 1.0).abs() < 1e-4).all(), m
fig = plots.collapse_shares(shares, threshold=0.9, x="tokens",
                            title="Per-layer assignment shares over training (one row per variant)", outdir=out)

# %% [markdown]
# ## Loss curves and router log-z
#
# The z-loss keeps router logits small: compare the log-z of `top-2 + balance` with and without it.

# %%
metrics = frames.collect_metrics(preset, variants, [seed])
fig = plots.val_curves(metrics, order=variants, title="Validation loss, routing variants",
                       outdir=out, name="ablation_val_loss")

# %%
rf = pd.concat([frames.routing_frame(rd).assign(model=m) for m, rd in run_dirs.items()], ignore_index=True)
plots.save_table(rf, "ablation_routing_long", out, index=False)
fig = plots.routing_diagnostics(rf, metrics=["logz", "busiest"], x="tokens", hue="model",
                                title="Router log-z and busiest-expert fraction (mean ± std over layers)",
                                outdir=out, name="ablation_logz")

# %%
best = table1["best_val_loss"]
display(Markdown(
    f"**Outcome in preset `{preset.name}`.** Best validation loss: "
    + ", ".join(f"`{m}` {v:.4f}" for m, v in best.items())
    + f". Lowest: `{best.idxmin()}`. Mean router log-z at the end: "
    + ", ".join(f"`{m}` {v:.3f}" for m, v in table1["logz_mean"].items()) + ". "
    + text.collapse_sentence(collapse)))
