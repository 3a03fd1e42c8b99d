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
# Here: the preset's `study.granularity` models, first seed, one training recipe.

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None

# %%
import pandas as pd
from IPython.display import Markdown, display

from studylib import config as budget
from studylib.run.rundir import RunDir
from studylib.study import frames, paper, plots, probes, routing, tables
from studylib.study.notebooks import notebook_context
from studylib.study.sweep import ensure_runs

ctx = notebook_context(params, jobs)
preset, study, out, seed = ctx.preset, ctx.study, ctx.out, ctx.first_seed
models = study["granularity"]
K = {m: preset.model_config(m).ffn.num_experts for m in models}
summaries = ensure_runs(preset, models, [seed], jobs=ctx.jobs)
run_dirs = {m: RunDir.of(preset, m, seed) for m in models}
n_probe = study.get("probe_windows", 64)
assert len({budget.count_params(preset.model_config(m)).ffn_total for m in models}) == 1, "fixed total FFN width"
print(f"K = {list(K.values())}, seed {seed}, {int(summaries['tokens'].iloc[0]):,} target tokens each; "
      f"probes on {n_probe} validation windows")

# %% [markdown]
# ## Validation loss vs K (delta against K = 1)

# %%
gran = tables.granularity_table(summaries, models)
gran.insert(0, "K", [K[m] for m in gran.index])
gran["final_val_loss"] = summaries.set_index("model").loc[gran.index, "final_val_loss"]
plots.save_table(gran, "granularity_losses", out)
display(gran)
print("seed 003 (12 layers, d=384, FineWeb), delta vs K=1:")
display(paper.PAPER_GRANULARITY.T)

# %%
fig = plots.deltas(gran.assign(label=[f"K={K[m]}" for m in gran.index]), x="label", y=gran.columns[2],
                   title=f"Best val loss minus K=1 ({preset.name})", outdir=out, name="granularity_deltas")

# %%
metrics = frames.collect_metrics(preset, models, [seed])
fig = plots.val_curves(metrics, order=models, title="Validation loss by K", outdir=out, name="granularity_val_loss")

# %% [markdown]
# ## Gate diagnostics per layer (last evaluation)
#
# Usage entropy (entropy of the mean gate: are experts used equally overall?), per-token gate
# entropy (is each token's mix sharp?), the mean max gate (1/K if uniform), the share of tokens
# whose max gate exceeds 0.9, and the argmax shares (which expert leads how often).

# %%
gates = routing.gate_table({m: rd for m, rd in run_dirs.items() if K[m] > 1})
plots.save_table(gates, "granularity_gates", out, index=False)
assert (gates["mean_max_gate"] >= gates["uniform_gate"] - 1e-4).all()
assert (gates["token_entropy"] <= gates["max_entropy"] + 1e-4).all()
gates

# %%
rf = pd.concat([frames.routing_frame(rd).assign(model=m) for m, rd in run_dirs.items() if K[m] > 1],
               ignore_index=True)
fig = plots.routing_diagnostics(rf, metrics=["top1", "entropy", "usage_entropy", "max_gt_0.9"], x="tokens",
                                hue="model", title="Soft-MoE gates over training (mean ± std over layers)",
                                outdir=out, name="granularity_gates")

# %% [markdown]
# ## Do the experts differ? Cosine similarity of the expert outputs
#
# Each layer's experts are run (ungated) on the same hidden states (the layer's FFN input on the
# probe windows); the matrix holds the mean cosine similarity of their outputs per token.
# Experts that learned the same function would sit near 1.

# %%
cos = {m: probes.expert_cosine(rd, n_windows=n_probe) for m, rd in run_dirs.items() if K[m] > 1}
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
# nothing (its gate is 1 either way).

# %%
k1 = [m for m in models if K[m] == 1]
if k1:
    check = probes.uniform_gate_ablation(run_dirs[k1[0]], n_windows=n_probe)
    assert (check["delta"].abs() < 1e-6).all(), check
    print(f"{k1[0]}: uniform gate changes nothing (max |delta| {check['delta'].abs().max():.1e})")
abl = pd.concat([probes.uniform_gate_ablation(rd, n_windows=n_probe) for m, rd in run_dirs.items() if K[m] > 1],
                ignore_index=True)
plots.save_table(abl, "granularity_uniform_gate_ablation", out, index=False)
display(abl)
fig = plots.deltas(abl, x="model", y="delta", hue="layer", title="Loss change when one layer's gate is forced uniform",
                   outdir=out, name="granularity_uniform_gate_ablation")

# %%
best = gran[gran.columns[2]]
worst = abl.loc[abl["delta"].idxmax()]
display(Markdown(
    f"**Summary.** Best val loss minus K=1: "
    + ", ".join(f"K={K[m]} {v:+.4f}" for m, v in best.items())
    + f" (seed 003: K=2 -0.0048, K=4 +0.0053, K=6 +0.0197). Mean max gate: "
    + ", ".join(f"K={k} {v:.3f} (uniform {1 / k:.3f})" for k, v in gates.groupby("K")["mean_max_gate"].mean().items())
    + f". The costliest uniform-gate ablation is {worst['model']} layer {int(worst['layer'])}: "
    + f"{worst['delta']:+.4f} nats."))
