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
# Routed variants of the same MoE shape, trained with **every seed** of the preset at one equal
# token budget, each compared with the reference MoE (top-2 + balance + z-loss) paired by seed:
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
#
# **Budget.** The ablation may train for a shorter budget than the headline: `study.ablation_epochs`
# (default 1) times the preset's schedule, as runs of their own (their own warmup and cosine to
# their own end); the budget used is printed below. The paper's Table 1 also used smaller budgets
# than its headline: 100-step and 1.64M-token smoke runs and 40.5M-token runs (one seed each)
# against 426.3M tokens for the headline, and calls them diagnostic recipe-selection runs, not a
# budget-matched sweep.

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None
seeds = None  # e.g. [1, 2] or "1337-1346": replaces the preset's seeds
overrides = None  # e.g. {"train.amp": "off"}: a variant preset with a derived name

# %%
import pandas as pd
from IPython.display import Markdown, display

from studylib.study.analysis import frames, paper, plots, routing, text
from studylib.study.runner.notebooks import open_comparison

ctx, runs = open_comparison("ablation", params, jobs, seeds, overrides)  # `studylib study` trains them up front
preset, study, out = ctx.preset, ctx.study, ctx.out
variants = list(ctx.knobs.models)
reference = study.reference_moe
assert reference in variants, f"study.ablation must include the reference MoE {reference!r}"
epochs = ctx.knobs.epochs  # study.ablation x seeds at `epochs`
seeds = runs.seeds()  # study.comparison_seeds: the first k of the preset's seeds (default all)
budget = runs.grids[0].overrides
summaries = runs.frame()
run_dirs = runs.run_dirs()  # {model: {seed: run directory}}
assert summaries["tokens"].nunique() == 1, "every variant must see the same number of tokens"
tokens = int(summaries["tokens"].iloc[0])
display(Markdown(
    f"**Budget:** {epochs:g} x the preset's schedule ({int(summaries['steps'].iloc[0]):,} optimizer steps, "
    f"{tokens:,} target tokens per run{'; overrides ' + str(budget) if budget else ''}), "
    f"{len(variants)} variants x {len(seeds)} seeds {seeds}. The paper's Table 1 runs were one seed each, at "
    f"{paper.PAPER_ABLATION_TOKENS / 1e6:.1f}M tokens (and smoke runs) against "
    f"{paper.PAPER_HEADLINE_TOKENS / 1e6:.1f}M for its headline."))

# %% [markdown]
# ## Table 1: loss and routing at the end of training, every variant against the reference
#
# Per variant over the seeds: best validation loss (mean ± std) and the final one (mean), the
# paired gap to the reference MoE (variant − reference per seed: mean, 95% CI, p), the busiest-expert fraction of each layer at the last evaluation (mean over
# seeds; 0.25 is perfect balance with 4 experts, 1.0 total collapse), the mean router log-z, how
# many runs ended with a collapsed layer, and the paper's Table 1 row of the same routing recipe
# (one run each; its `paper_delta` is its final loss minus the reference recipe's).
#
# **The family.** The comparisons of every variant with the reference are one family,
# "02 routing ablation: each variant − the reference" (4 comparisons with the presets' 5 variants):
# their p values are Holm-corrected together (`p_holm`; *resolved* means `p_holm` < 0.05), and each
# is also tested for equivalence within ±`study.margin` nats (paired TOST, `p_tost`, Holm-corrected
# as `p_tost_holm`). Each verdict is one of "A better" / "B better" (A: the variant, B: the
# reference), "equivalent" or "inconclusive" (docs/statistics.md).

# %%
table1 = routing.ablation_table(summaries, run_dirs, reference, configs={m: preset.model_config(m) for m in variants},
                                margin=study.general.margin)
plots.save_table(table1, "table1_routing_ablation", out)
display(table1)
gaps = table1.attrs["comparisons"].assign(paper=table1["paper_delta"])
plots.save_table(gaps, "table1_gaps_vs_reference", out)
fig = plots.intervals(gaps, title=f"Best val loss, variant − {reference} ({len(seeds)} seeds; x: paper)",
                      xlabel="gap (nats); > 0: the reference is better", paper="paper",
                      outdir=out, name="ablation_gaps")
print(text.comparison_sentences(table1.attrs["comparisons"]))

# %% [markdown]
# ## Collapse detection
#
# Per variant, seed and layer: the busiest-expert fraction at the end and its maximum over
# training, and the first evaluation at which the layer was collapsed.

# %%
collapse = pd.concat([routing.collapse_table({m: rd}).assign(seed=s) for m, by_seed in run_dirs.items()
                      for s, rd in by_seed.items()], ignore_index=True)
plots.save_table(collapse, "routing_collapse", out, index=False)
display(collapse)
print(text.collapse_sentence(collapse))

# %% [markdown]
# Assignment shares over training, first seed (one row per variant, one column per layer):

# %%
first = seeds[0]
shares = {m: frames.shares_frame(by_seed[first]) for m, by_seed in run_dirs.items()}
for m, sh in shares.items():  # invariant: assignment shares are a distribution at every evaluation
    assert ((sh.groupby(["step", "layer"])["share"].sum() - 1.0).abs() < 1e-4).all(), m
fig = plots.collapse_shares(shares, threshold=0.9, x="tokens",
                            title=f"Per-layer assignment shares over training (seed {first}; one row per variant)",
                            outdir=out)

# %% [markdown]
# ## Loss curves and router log-z
#
# Validation loss on the fixed subset (mean and 95% CI over seeds; diamonds: the full split at
# the end). The z-loss keeps router logits small: compare the log-z of `top-2 + balance` with and
# without it.

# %%
metrics = runs.metrics()
fig = plots.val_curves(metrics, order=variants, title=f"Validation loss, routing variants ({len(seeds)} seeds)",
                       outdir=out, name="ablation_val_loss")

# %%
rf = pd.concat([frames.routing_frame(rd).assign(model=m, seed=s) for m, by_seed in run_dirs.items()
                for s, rd in by_seed.items()], ignore_index=True)
plots.save_table(rf, "ablation_routing_long", out, index=False)
fig = plots.routing_diagnostics(rf, metrics=["logz", "busiest"], x="tokens", hue="model",
                                title="Router log-z and busiest-expert fraction (mean ± std over layers and seeds)",
                                outdir=out, name="ablation_logz")

# %%
display(Markdown(
    f"**Outcome in preset `{preset.name}`** ({len(seeds)} seeds, {tokens:,} target tokens per run). Against "
    f"`{reference}`: " + text.comparison_sentences(table1.attrs["comparisons"]) + " Mean router log-z at the end: "
    + ", ".join(f"`{m}` {v:.3f}" for m, v in table1["logz_mean"].items()) + ". "
    + text.collapse_sentence(collapse) + " "
    + text.limits(len(seeds), tokens, "The paper's Table 1 is one run per recipe, so its differences have no "
                  "interval either.")))
