#!/usr/bin/env bash
# GPU check, ready to run on one GPU in under ~8 minutes: the paper preset's headline trio
# (dense_active, moe_top2_z, dense_total) trained for a few hundred steps (no data-order runs) on a TinyStories subset
# with two seeds, notebook 03 (the headline sweep) executed on those runs, then the training
# tokens/s of every run, the headline table and the time. A smoke test of the GPU path (bf16
# autocast, the CUDA dispatch, the study's notebook on GPU runs), not a result: the gaps of
# 200 steps mean nothing.
#
#   bash scripts/gpu_check.sh                 # with the project's .venv, or python3 if there is none
#   PY=python3 bash scripts/gpu_check.sh      # e.g. on a machine image that already has torch
#
# The data: $STUDYLIB_DATA_DIR (local TinyStories files) if set, else the preset's source. Knobs
# (environment): CHECK_PARAMS (params/paper.yaml), CHECK_STEPS (200), CHECK_STORIES (50000),
# CHECK_SEEDS ([1337, 1338]), CHECK_DEVICE (cuda), CHECK_JOBS (3 runs at a time on the one GPU),
# CHECK_NAME (gpu_check: outputs/<name>/, apart from the preset's own). tests/test_gpu_check.py
# runs it on the CPU with the ci preset and 4 steps so it cannot rot. Output: stdout and, when
# $OUT is set, $OUT/gpu_check.txt (and the executed notebook and tables under $OUT/gpu_check/).
#
# After it passes, the study's remaining GPU work is one command each: the paper preset itself
# (`python -m studylib study --params params/paper.yaml`) and the size ladder continued from the
# CPU ladder's 0.92M active parameters to the paper's 14.8M, d 64 to d 256 on the full corpus
# (`python -m studylib study --params params/paper_scale.yaml`; it shares the paper preset's runs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PARAMS=${CHECK_PARAMS:-params/paper.yaml}
STEPS=${CHECK_STEPS:-200}
STORIES=${CHECK_STORIES:-50000}
SEEDS=${CHECK_SEEDS:-[1337, 1338]}
DEVICE=${CHECK_DEVICE:-cuda}
JOBS=${CHECK_JOBS:-3}
NAME=${CHECK_NAME:-gpu_check}
EVERY=$(( STEPS / 2 > 0 ? STEPS / 2 : 1 ))
log=${OUT:-/tmp}/gpu_check.txt
mkdir -p "$(dirname "$log")"
start=$(date +%s)
{
  echo "# gpu_check: $PARAMS, headline trio, $STEPS steps, $STORIES stories, seeds $SEEDS, device $DEVICE"
  "$PY" -c "import torch; print('# torch', torch.__version__, '|',
             torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')"
  overrides="{name: $NAME, train.max_steps: $STEPS, train.eval_every: $EVERY, train.device: $DEVICE,
              data.max_stories: $STORIES, study.noise_split: null}"  # the trio only: no data-order runs
  "$PY" -m studylib study --params "$PARAMS" --notebooks 03 --jobs "$JOBS" --no-report --no-progress \
      -p seeds "$SEEDS" -p overrides "$overrides" 2>&1 | { grep -v "^precision:" || true; }
  "$PY" - "$NAME" <<'EOF'
import json, sys
from pathlib import Path

import pandas as pd

from studylib.run.layout import outputs_root

out = Path(outputs_root()) / sys.argv[1]
rows = [json.loads(p.read_text()) for p in sorted(out.glob("runs/*/seed*/summary.json"))]
runs = pd.DataFrame(rows)[["model", "seed", "device", "amp", "steps", "tokens", "train_tok_per_s", "wall_time_s",
                           "best_val_loss"]]
print("## training throughput per run (tokens/s over the training steps)")
print(runs.to_string(index=False, float_format=lambda v: f"{v:,.4f}" if v < 100 else f"{v:,.0f}"))
print("## the headline table (outputs/%s/tables/headline_gaps.csv)" % sys.argv[1])
gaps = pd.read_csv(out / "tables" / "headline_gaps.csv")
print(gaps[["comparison", "mean", "ci_low", "ci_high", "n", "resolved", "paper_mean"]].to_string(index=False))
EOF
  echo "## time: $(( $(date +%s) - start )) s"
  echo "## next on a GPU: python -m studylib study --params params/paper_scale.yaml (the size ladder to d 256)"
} 2>&1 | tee "$log"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/$NAME"
  out_root=$("$PY" -c "from studylib.run.layout import outputs_root; print(outputs_root())")
  cp -r "$out_root/$NAME/tables" "$out_root/$NAME/notebooks" "$OUT/$NAME/" 2>/dev/null || true
fi
