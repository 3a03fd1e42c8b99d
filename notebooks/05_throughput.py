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
# # 05 · Training throughput (SPEC Table 8, Figure 6)
#
# One full training step (forward with targets, loss + auxiliary loss, backward, AdamW step) per
# variant on random tokens: the three headline models, and the MoE once per dispatch path
#
# * **naive**: loop over experts, mask the tokens that chose each;
# * **grouped**: sort the token-assignments by expert, one matmul per contiguous segment
#   (`torch._grouped_mm` where the build supports it);
# * **stacked**: pad each expert's tokens to a common length, one batched matmul over experts.
#
# All variants live in one process and are timed **interleaved** (round r runs every variant once,
# in an order rotated by r), so drifts of a shared machine hit all of them alike; the table reports
# medians over rounds, and ratios are medians of per-round paired ratios. Sizes come from the
# preset's `study.bench` (batch, context, rounds, dtype); without it the paper's batch 16 x 512.
# The paper's numbers are from an RTX 3060; on a CPU only the ratios are comparable.

# %% tags=["parameters"]
params = "params/cpu.yaml"
jobs = None
seeds = None  # e.g. [1, 2] or "1337-1346": replaces the preset's seeds
overrides = None  # e.g. {"train.amp": "off"}: a variant preset with a derived name

# %%
import math

from IPython.display import Markdown, display

from studylib.study.analysis import paper, plots, tables
from studylib.study.runner.notebooks import open_comparison
from studylib.tools import bench

ctx, _ = open_comparison("throughput", params, jobs, seeds, overrides)  # it benchmarks, it trains nothing
headline = list(ctx.study.headline)
preset, study, out = ctx.preset, ctx.study, ctx.out
knobs = {"batch": 16, "context": 512, "rounds": 5, "warmup": 1, "dtype": "bf16", "memory": "none",
         **ctx.knobs.bench}
device = bench.bench_device(preset)
print(f"device {device}; knobs {knobs}")

# %%
raw = bench.bench_train(preset, headline, bench.DISPATCHES, device=str(device), progress=False, **knobs)
plots.save_table(raw, "table8_throughput_raw", out, index=False)
table8 = tables.throughput_table(raw, ref=headline[0])
plots.save_table(table8, "table8_throughput", out)
assert len(raw) == len(headline) - 1 + len(bench.DISPATCHES), "one row per dense model and per MoE dispatch path"
assert all(math.isfinite(v) and v > 0 for v in raw["tok_s"])
assert math.isclose(table8["ratio_to_" + headline[0]].iloc[0], 1.0)
print(f"{raw.attrs.get('threads')} threads, {raw.attrs.get('rounds')} timed rounds, "
      f"allocator {raw.attrs.get('allocator')}, torch {raw.attrs.get('torch')}")
table8

# %% [markdown]
# The paper's Table 8 for comparison (RTX 3060, batch 16 x 512, bf16):

# %%
paper.PAPER_TABLE8

# %% [markdown]
# ## Figure 6: tokens per second per variant
#
# Bars: median over the timed rounds; whiskers: the slowest and the fastest round.

# %%
fig = plots.throughput(table8.reset_index(), x="label", y="tok_per_s",
                       title=f"Training throughput ({device}, batch {knobs['batch']} x {knobs['context']}, {knobs['dtype']})",
                       outdir=out, name="fig6_throughput")

# %%
moe_rows = table8[table8["model"] == headline[1]]
fastest = moe_rows["tok_per_s"].idxmax()
display(Markdown(
    f"**Summary.** Relative to `{headline[0]}` (1.00): "
    + ", ".join(f"`{label}` {r}" for label, r in table8["ratio_to_" + headline[0]].map("{:.2f}".format).items())
    + f". The fastest MoE dispatch path here is `{fastest}`"
    + f" (paper: stacked > grouped > naive on an RTX 3060)."))
