#!/usr/bin/env bash
# GPU training throughput of the paper's models (SPEC Table 8), bf16 autocast, batch 16 x 512,
# eager and torch.compile side by side, next to the paper's RTX 3060 figures. At most ~5 minutes.
#
#   bash scripts/gpu_throughput.sh            # with the project's .venv, or python3 if there is none
#   PY=python3 bash scripts/gpu_throughput.sh # e.g. on a machine image that already has torch
#
# Needs only torch, numpy, pandas and pyyaml (no install: runs from the checkout). Tables go to
# stdout and, when $OUT is set, to $OUT/gpu_throughput.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
log=${OUT:-/tmp}/gpu_throughput.txt
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "error: gpu_throughput.sh: no CUDA device here (torch.cuda.is_available() is False with $PY); run it on a machine with an NVIDIA GPU" >&2
  exit 2
fi
{
  echo "# paper (seed 000, Table 8, one RTX 3060, bf16 AMP): dense active-match 58.1k tok/s, MoE 54.7k,"
  echo "#   dense total-match 59.3k; MoE dispatch naive 42.8-48.4k, grouped 54.4-57.6k, stacked 61.0-61.7k"
  "$PY" -c "import torch; print('# torch', torch.__version__, '|', torch.cuda.get_device_name(0))"
  echo "## eager, all three dispatch paths"
  timeout 120 "$PY" -m studylib bench train --params params/paper.yaml --device cuda --dtype bf16 \
      --rounds 10 --warmup 3 2>&1 | grep -v '^round'
  echo "## torch.compile vs eager (grouped dispatch)"
  timeout 170 "$PY" -m studylib bench train --params params/paper.yaml --device cuda --dtype bf16 \
      --dispatch grouped --compile both --rounds 10 --warmup 3 2>&1 | grep -v '^round'
} | tee "$log"
