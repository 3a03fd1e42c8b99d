# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     notebook_metadata_filter: studylib
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
#   studylib:
#     after: ["09"]
# ---

# %% [markdown]
# # 13 · Controls: does the tiny MoE learn to route, and does its machinery cost anything?
#
# The router variants (12) all land near the reference MoE, which is also what a router that does
# not matter would give. Per cell of `study.controls` (the headline's cell, its runs shared, and a
# fresh-data cell of the smallest size), beside the reference trio:
#
# | control | what it is | what it tells |
# |---|---|---|
# | hash router (`ffn.router: hash`) | a fixed, parameter-free table maps a token's id to its top-2 of 4 experts, equal gates (Clark et al. 2022's Hash layer, top-k); no balance or z loss (it has no scores) | experts worth their parameters without learning to route |
# | frozen router (`ffn.router: frozen`) | the learned router's weight kept at its initial value (out of the optimizer) | what learning the router adds |
# | one-expert MoE (E = 1, k = 1, balance and z losses on) | the reference's expert shape, gate exactly 1 | the MoE machinery (router, losses, dispatch) without routing |
# | its dense twin | a dense FFN of the same hidden size | the one-expert MoE's exact twin (tested bit for bit, forward and gradient) |
#
# Each model's **position** p = (L_active − L) / (L_active − L_total) between the trio's dense
# matches (0: worth its active parameters, 1: its total; bootstrap 95% CI over seeds), each
# control's **paired loss gap** to the reference MoE (mean, sample std, n, 95% CI; one family per
# cell, Holm over its controls, TOST within ±`study.margin`), and the one-expert MoE against its
# dense twin (TOST within ±`study.margin`). If the learned router is not resolvably better than
# both fixed routers, the tiny MoE is not shown to learn to route. Then **what the routers learn**,
# per layer on the validation split at the end of training: the share of tokens whose experts
# differ from the initial router's choice, the expert loads, and the entropy of the expert choice
# given the token id (0 for the hash router).

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None
seeds = None  # e.g. [1, 2] or "1337-1346": replaces the preset's seeds
overrides = None  # e.g. {"train.amp": "off"}: a variant preset with a derived name

# %%
from IPython.display import Markdown, display

from studylib.study.analysis import plots, tables, text
from studylib.study.comparisons import controls as C
from studylib.study.comparisons.controls import analysis as A
from studylib.study.comparisons.controls import routers as R
from studylib.study.runner.notebooks import open_comparison

ctx, runs = open_comparison("controls", params, jobs, seeds, overrides)  # `studylib study` trains them up front
preset, study, out = ctx.preset, ctx.study, ctx.out
cells = ctx.knobs.cells
summaries = [runs.frame(i) for i in range(len(cells))]
for c, s in zip(cells, summaries):
    display(Markdown(f"**{c.name}**: {', '.join(f'`{m}`' for m in c.models)} x seeds {sorted(s['seed'].unique().tolist())}, "
                     f"{int(s['steps'].iloc[0]):,} optimizer steps, {int(s['tokens'].iloc[0]):,} target tokens per run."))
display(tables.accounting_frame([preset.model_config(m) for m in dict.fromkeys(m for c in cells for m in c.models)]))

# %% [markdown]
# ## Positions and gaps to the reference MoE

# %%
tabs = A.cell_tables(summaries, cells, study.general.margin)
table = A.control_table(tabs["positions"], tabs["gaps"])
plots.save_table(table, C.CONTROLS, out, index=False)
plots.save_table(tabs["positions"], C.POSITIONS, out, index=False)
plots.save_table(tabs["gaps"], C.GAPS, out)
display(table)
fig = plots.intervals(tabs["gaps"], title="Each control − the reference MoE (paired by seed)",
                      xlabel="gap (nats; > 0: the reference is better)", outdir=out, name=C.GAPS)
pos = A.position_intervals(tabs["positions"])
if len(pos):
    fig = plots.intervals(pos, title="Position between the dense matches (0: active match, 1: total match)",
                          xlabel="position p", outdir=out, name=C.POSITIONS)

# %% [markdown]
# ## The one-expert MoE against its dense twin

# %%
if len(tabs["twin"]):
    plots.save_table(tabs["twin"], C.TWIN, out)
    display(tabs["twin"])
else:
    print("no cell names a one-expert MoE and its dense twin")

# %% [markdown]
# ## What the routers learn
#
# Per routed layer, mean ± std over seeds: `changed` (share of validation tokens whose experts
# differ from the initial router weights' choice for the same input: what the router's weights
# learned; 0 for the hash and frozen routers by construction), `changed_model` (the same against
# the initial model's own forward: the router's input moved too), `busiest` (E x the largest expert
# share; 1 = balanced), `entropy` (H of the expert set, bits) and `entropy_given_id` (H of the expert
# set given the token id, bits; 0 for the hash router).

# %%
per_run = R.measures(R.routed_specs(runs, cells))
plots.save_table(per_run, C.ROUTER_RUNS, out, index=False)
learned = R.summary(per_run)
plots.save_table(learned, C.ROUTERS, out, index=False)
display(learned)

# %% [markdown]
# ## The MoE's recipe
#
# The paper took 16x the tokens per step that `cpu` takes. At one cell (`study.controls_recipe`)
# the same tokens in fewer, larger steps, each model of the trio at every lr of a sweep, and the
# MoE's router at a fraction of the lr: the MoE's position with each model at its best lr, beside
# its position under the preset's recipe.

# %%
recipe = ctx.knobs.recipe
recipe_words = ""
if recipe is not None:
    rcell = cells[recipe.cell]
    rt = A.recipe_tables(A.recipe_runs(runs, len(cells)), summaries[recipe.cell], rcell)
    plots.save_table(rt["lrs"], C.RECIPE_LRS, out, index=False)
    plots.save_table(rt["position"], C.RECIPE, out, index=False)
    display(rt["lrs"], rt["position"])
    recipe_words = A.recipe_sentence(rt["position"], len(recipe.lrs), recipe.batch_scale, recipe.router_lr_scale)
    display(Markdown(recipe_words))
else:
    print("no study.controls_recipe in this preset")

# %%
display(Markdown(f"**Outcome in preset `{preset.name}`.** " + A.sentences(tabs, cells) + " " + recipe_words + " "
                 + text.limits(len(summaries[0]["seed"].unique()), None,
                               "The controls share the reference's recipe (lr, batch).")))

# %% [markdown]
# ## Beside public data: Clark et al. 2022's routed models, and the law's fitter on their runs
#
# Clark et al. 2022's public curves (`../shared/data/clark2022/`, CC-BY 4.0; docs/statistics.md,
# "Clark et al.'s position against size"): each routed model's position p between its dense
# matches, per router, E and size (last evaluation of each run; the dense loss interpolated in
# log N between the plain dense sizes), their trend in log10 N read at this study's MoE sizes and
# the paper's (every readout outside Clark's 15M-1.3B labelled with its distance in decades), and
# one table and figure of p against active parameters: this study's map cells (notebook 09's
# position table, where it ran in this study), Clark's S-Base and Hash (E = 4, 8) and the paper's
# 0.81. Then the joint law's fitter on their dense and S-Base runs (N-only forms: every run saw the
# same tokens), fitted on 15-55M: its p per size against the direct one, and the 130M runs
# predicted (one run per model and size: no interval).

# %%
from studylib.study.comparisons import token_budget
from studylib.study.comparisons.controls import clark_tables as clark

clark_tables, clark_note = clark.clark_section(out, token_budget.MAP)
print(clark_note)
if clark_tables is not None:
    for name in clark.TABLES:
        plots.save_table(clark_tables[name], name, out, index=False)
    display(clark_tables[clark.CLARK_POSITIONS])
    display(clark_tables[clark.POSITION_AGAINST_SIZE])
    display(clark_tables[clark.CLARK_TREND])
    fig = clark.position_against_size_figure(clark_tables[clark.POSITION_AGAINST_SIZE], clark_tables["trends"],
                                             outdir=out, name=clark.POSITION_AGAINST_SIZE)
    display(clark_tables[clark.CLARK_LAW_FIT], clark_tables[clark.CLARK_LAW_POSITIONS],
            clark_tables[clark.CLARK_LAW_HELD_OUT])
    for s in clark.clark_law_sentences(clark_tables[clark.CLARK_LAW_FIT],
                                           clark_tables[clark.CLARK_LAW_POSITIONS],
                                           clark_tables[clark.CLARK_LAW_HELD_OUT]):
        print(s, "\n")
