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
#     run_alone: true
# ---

# %% [markdown]
# # 07 · Iso-width: dense vs top-2-of-4 MoE at the same width (seed 002)
#
# The MoE keeps the dense model's `d_model` and uses 4 experts with half the dense FFN hidden
# size each, top-2 routing (plus balance and z-loss): per token it computes exactly the dense FFN's
# parameters, but stores twice the FFN. Both are trained identically, with **every seed** of the
# preset, and compared paired by seed (dense − MoE per seed: mean, 95% CI). The family,
# "07 iso-width: dense − MoE", is this one comparison (`study.iso_width` names one pair), so Holm
# changes nothing: resolved when the CI excludes 0; otherwise "equivalent" when the paired TOST
# puts the gap within ±`study.margin` nats, else "inconclusive" (docs/statistics.md). Seed 002 reports one run each: "Dense has the lower loss at every checkpoint".
#
# **Budget.** `study.iso_width_epochs` (default 1) times the preset's schedule, as runs of their own
# (their own warmup and cosine to their own end); the budget used is printed below. The `cpu`
# preset trains the pair for a quarter of its headline budget (the time limit: see its header);
# `params/cpu_full.yaml` trains it for the full budget.
#
# Seed 002 also measured greedy decoding speed: batch 1, 32-token prompt, 64 new tokens, 5 timed
# trials after 2 warm-ups, **without a KV cache**, and found the MoE 3.1x slower than dense. Here
# both cache modes are timed (knobs: `study.decode`); the models are freshly initialised, since
# speed does not depend on the weights. (Seed 002's downstream lm-evaluation-harness scores are
# out of scope offline.)

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None
seeds = None  # e.g. [1, 2] or "1337-1346": replaces the preset's seeds
overrides = None  # e.g. {"train.amp": "off"}: a variant preset with a derived name

# %%
from IPython.display import Markdown, display

from studylib.study.analysis import frames, paper, plots, tables, text
from studylib.study.runner.notebooks import open_comparison
from studylib.tools import bench

ctx, runs = open_comparison("iso_width", params, jobs, seeds, overrides)  # `studylib study` trains them up front
dense, moe = ctx.knobs.models
preset, study, out = ctx.preset, ctx.study, ctx.out
epochs = ctx.knobs.epochs  # the pair x seeds at `epochs`
seeds = runs.seeds()  # study.comparison_seeds: the first k of the preset's seeds (default all)
summaries = runs.frame()
acct = tables.accounting_frame([preset.model_config(m) for m in (dense, moe)])
assert acct.loc[moe, "d_model"] == acct.loc[dense, "d_model"]
assert acct.loc[moe, "ffn_active"] == acct.loc[dense, "ffn_total"], "the MoE's active FFN must equal the dense FFN"
tokens = int(summaries["tokens"].iloc[0])
print(f"{dense} vs {moe}, seeds {seeds}, {epochs:g} x the preset's schedule: "
      f"{int(summaries['steps'].iloc[0]):,} optimizer steps, {tokens:,} target tokens each")

# %% [markdown]
# ## Losses (mean ± std over seeds) and the paired gap

# %%
losses = tables.headline_table(summaries, [dense, moe])
for col in ("final_val_loss", "train_tok_per_s"):
    losses[col] = summaries.groupby("model")[col].mean().reindex(losses.index)
losses = losses.join(acct[["ffn", "total", "active"]])
plots.save_table(losses, "iso_width_losses", out)
display(losses[["n", "loss", "ppl", "final_val_loss", "train_tok_per_s", "ffn", "total", "active"]])
gap = tables.comparison_table(summaries, {f"{dense} - {moe}": (dense, moe)}, margin=study.general.margin,
                              family="07 iso-width: dense − MoE")
plots.save_table(gap, "iso_width_gap", out)
display(gap)
fig = plots.intervals(gap, title=f"Iso-width: best val loss, dense − MoE ({len(seeds)} seeds)",
                      xlabel="gap (nats); > 0: the MoE is better", outdir=out, name="iso_width_gap")

# %%
metrics = runs.metrics()
fig = plots.val_curves(metrics, order=[dense, moe], title=f"Iso-width: validation loss ({len(seeds)} seeds)",
                       outdir=out, name="iso_width_val_loss")

# %% [markdown]
# ## Greedy decoding speed
#
# New tokens per second (median over trials; whiskers: slowest and fastest trial), with and
# without the KV cache; ratios are against the dense model in the same cache mode.

# %%
knobs = {"prompt_len": 32, "new_tokens": 64, "trials": 5, "warmup": 2, **ctx.knobs.decode}
device = bench.bench_device(preset)
raw = bench.bench_decode(preset, [dense, moe], dtype="fp32", no_cache_too=True, device=str(device),
                         progress=False, **knobs)
plots.save_table(raw, "iso_width_decode_raw", out, index=False)
decode = tables.throughput_table(raw)
plots.save_table(decode, "iso_width_decode", out)
assert (raw["tok_s"] > 0).all()
display(decode)
fig = plots.throughput(decode.reset_index(), x="label", y="tok_per_s",
                       title=f"Greedy decoding, batch 1, prompt {knobs['prompt_len']}, {knobs['new_tokens']} new tokens ({device})",
                       outdir=out, name="iso_width_decode")

# %%
slow = {c: float(raw[(raw["model"] == dense) & (raw["cache"] == c)]["tok_s"].iloc[0]
                 / raw[(raw["model"] == moe) & (raw["cache"] == c)]["tok_s"].iloc[0]) for c in (False, True)}
display(Markdown(
    f"**Summary** ({len(seeds)} seeds, {tokens:,} target tokens per run). Best val loss: "
    + text.comparison_sentences(gap) + f" Seed 002: {paper.PAPER_ISO_WIDTH}. Decoding, dense speed / MoE speed: "
    f"{slow[False]:.2f}x without a KV cache (seed 002: 3.1x), {slow[True]:.2f}x with it (one timing "
    "session, freshly initialised models). "
    + text.limits(len(seeds), tokens)))
