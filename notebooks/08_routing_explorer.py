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
# # 08 · Routing explorer: where the router sends which token, and what the models write
#
# An interactive look, token by token, at the routers of a trained model. For a prompt, every
# token is run through the model and, in every layer, we read which expert(s) the router chose
# and with what weight:
#
# * **sparse MoE** (top-k token choice): the k chosen experts and their renormalised weights;
# * **soft MoE** (always active): the gate over all K experts;
# * **dense** models have nothing to route: the explorer says so and still shows what they write.
#
# **How to read the grid.** Rows are tokens (top to bottom, as SentencePiece pieces; `▁` marks a
# word start; the grey `</s>` first is the end-of-story token every story follows in training),
# columns are layers. A cell's colour is the token's top expert in that layer; its shade and
# number are that expert's weight (pale = no more decisive than uniform over the chosen experts,
# full = weight 1). Generated tokens have red labels below a red line. When a second run or
# checkpoint is compared, cells whose top expert differs are outlined.
#
# **What to look for.** Whether similar tokens (word starts, punctuation, names) share experts;
# whether later layers are more decisive than early ones (SPEC Table 7: the gate and margin grow
# with depth); collapse (one colour everywhere, the top-1 ablation without a balance loss); how
# the picture sharpens between early and late checkpoints (the checkpoint slider walks the
# `step_<N>.pt` snapshots a run keeps with `train.keep_checkpoints=true`); and, with *generate*,
# how the continuation reads and how its tokens are routed.
#
# The widgets need a live kernel (JupyterLab). Run headless (papermill, the HTML report), the
# explorer shows as a line of text, so the same views follow below as static figures.

# %% tags=["parameters"]
params = "params/ci.yaml"
run = None
prompt = "Once upon a time"
jobs = None
seeds = None  # e.g. [1, 2] or "1337-1346": replaces the preset's seeds
overrides = None  # e.g. {"train.amp": "off"}: a variant preset with a derived name

# %%
import pandas as pd
from IPython.display import Image, Markdown, display

from studylib.study.analysis import plots
from studylib.study.runner.notebooks import open_comparison
from studylib.tools import explorer as explore

ctx, runs = open_comparison("explorer", params, jobs, seeds, overrides, run=run)  # trains the default run if missing
out = ctx.out

# %% [markdown]
# ## A run to explore
#
# With `run = None` this is the preset's reference MoE (`study.reference_moe`, else the headline's
# MoE), first seed. If it does not exist yet it is trained here (with a snapshot at every
# evaluation, for the checkpoint slider); a finished run is reused as it is.

# %%
if run is None:
    run = runs.specs[0][0].run_dir
run = (ctx.root / run).resolve()  # a relative `run` is relative to the repository root
info = explore.run_info(run)  # a folder without config.yaml: an error naming it
explore_root = info.preset_folder  # <outputs>/<preset>: every run of this preset (variants too)
available = explore.list_runs(explore_root)
steps = info.steps()
display(explore.runs_table(available))
print(f"exploring {run} (checkpoints at steps {steps}); {len(available)} runs under {explore_root}")

# %% [markdown]
# ## The explorer
#
# *run* and *checkpoint* pick the model; type a story start into *prompt* (or pick one) and press
# Enter; *generate* continues the prompt (greedy at temperature 0) and routes the continuation
# too. *compare* puts a second model on the same tokens beside the first: another checkpoint of
# the same run (how routing moved during training) or another run (expert numbers of different
# runs are arbitrary, so the table also gives the agreement after the best relabelling). Below,
# the router diagnostics of the run over training, with their own step selector.

# %%
explorer = explore.build_explorer(explore_root, run=run, prompt=prompt)
explorer

# %% [markdown]
# ## Static views (for the report)
#
# The prompt through the final checkpoint, and the share of the prompt's tokens each expert got
# per layer (sparse MoE: share of the token→expert assignments; soft MoE: mean gate weight).

# %%
final = info.load()
model, tok, cfg = final.model, final.tokenizer, final.config
label = info.short_label
view = explore.route_text(model, tok, prompt, label=label, step=final.step)
print(view.status if not view.routed else
      f"{view.kind} routing: {view.num_experts} experts, {view.top_k} per token, layers {view.routed_layers}")
fig = explore.routing_grid_figure(view, title=f"Routing of {prompt!r}")
plots.save_figure(fig, "explorer_routing_grid", out)
display(Image(explore.figure_png(fig)))
display(explore.expert_shares(view).round(3))

# %% [markdown]
# ### Early vs final checkpoint
#
# The same tokens through the first saved checkpoint (left) and the final one (right); outlined
# cells changed their top expert. The table gives, per layer, the top-1 agreement, the overlap of
# the chosen expert sets and the distance between the weight vectors.

# %%
if len(steps) > 1:
    first = info.load(step=steps[0])
    early = explore.route_ids(first.model, tok, view.ids, text=view.text, n_prefix=view.n_prefix, label=label,
                              step=first.step)
    fig = explore.routing_grid_figure(early, view, title=f"Step {steps[0]} vs step {steps[-1]}")
    plots.save_figure(fig, "explorer_early_vs_final", out)
    display(Image(explore.figure_png(fig)))
    display(explore.compare_views(early, view).round(3))
else:
    print(f"only one checkpoint (step {steps[0] if steps else None}): the run was trained without "
          f"train.keep_checkpoints=true, so there is nothing earlier to compare with")

# %% [markdown]
# ### Router diagnostics over training
#
# The per-layer statistics the trainer measured on the validation subset at every evaluation
# (notebook 04 averages them over seeds); the dashed line marks the last evaluation.

# %%
diag = explore.diagnostics_over_training(run)
last = diag.attrs["steps"][-1] if diag.attrs["steps"] else None
fig = explore.diagnostics_figure(diag, step=last)
plots.save_figure(fig, "explorer_diagnostics", out)
display(Image(explore.figure_png(fig)))
cols = ["layer", "kind", "val_loss", *explore.ROUTER_METRICS]
display(explore.diagnostics_over_training(run, step=last)[cols].set_index("layer").round(4))

# %% [markdown]
# ## What the models write
#
# The prompt continued by the explored run, with the routing of every generated token, then one
# continuation per model of the preset (first finished seed of each), dense ones included. Samples
# are drawn at temperature 0.8 with a fixed seed (reproducible; greedy decoding of briefly trained
# models tends to repeat one token). These are tiny models trained briefly on the `ci`/`cpu`
# presets: expect TinyStories-flavoured fragments, not stories.

# %%
n_new = min(32, cfg.context // 2)
gen = explore.generate_and_route(model, tok, prompt, n_new, temperature=0.8, seed=0, label=label,
                                 step=final.step)
display(Markdown(f"**{label}:** {prompt}<span style='color:#b2182b'>{gen.continuation}</span>"))
fig = explore.routing_grid_figure(gen, title="Prompt and generated tokens (red)")
plots.save_figure(fig, "explorer_generation", out)
display(Image(explore.figure_png(fig)))

# %%
samples = explore.samples_per_model(available, prompt)  # the first finished run of each model
plots.save_table(samples, "explorer_generations", out, index=False)
with pd.option_context("display.max_colwidth", 200):
    display(samples)
