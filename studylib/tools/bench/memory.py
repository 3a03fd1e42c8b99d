"""Peak memory of a training variant (``peak_mem_mb``, ``mem_delta_mb``).

On CPU each variant is rebuilt in a fresh child process (same allocator environment) that runs
``warmup + 1`` steps; ``peak_mem_mb`` is its peak RSS (``VmHWM``; ``ru_maxrss`` would inherit the
parent's peak across fork+exec) and ``mem_delta_mb`` that minus its RSS after the imports, i.e.
what the variant's weights, gradients, AdamW state, activations and allocator slack need.
In-process RSS deltas would be meaningless (allocators keep freed memory). On CUDA:
``torch.cuda.max_memory_allocated`` per variant, in process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable, Optional, Sequence

import torch

from studylib.config import model_from_dict, to_dict
from studylib.nn.precision import parse_dtype
from studylib.tools.bench.step import build_variant, random_batch, train_step
from studylib.tools.bench.variant import Variant

MEMORY_MODES = ("auto", "subprocess", "cuda", "none")
NO_MEMORY = {"peak_mem_mb": float("nan"), "mem_delta_mb": float("nan")}


def _status_mb(key: str = "VmRSS") -> float:
    """A /proc/self/status memory field in MB (VmRSS: now; VmHWM: peak RSS of this process image)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def memory_child(spec: dict) -> dict:
    """Run in a fresh process: build one variant, run ``spec["steps"]`` steps, report peak RSS."""
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    if spec["impl"] == "hf":
        import transformers  # noqa: F401  (count its import in the baseline)
    device = torch.device("cpu")
    base = _status_mb("VmRSS")
    cfg = model_from_dict(spec["cfg"])
    v = Variant(cfg.name, spec["impl"], spec["dispatch"], cfg, compiled=spec.get("compiled", False))
    build_variant(v, device, spec["seed"], spec.get("hf_experts", "eager"), copy=False)
    idx, tgt = random_batch(cfg.vocab_size, spec["batch"], spec["context"], spec["seed"])
    for _ in range(spec["steps"]):
        train_step(v, idx, tgt, device, parse_dtype(spec["dtype"]))
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the forked parent's image
    peak = _status_mb("VmHWM")
    return {"peak_mem_mb": peak, "mem_delta_mb": peak - base}


def memory_subprocess(v: Variant, batch: int, context: int, dtype: str, seed: int, steps: int,
                      hf_experts: str) -> dict:
    """:func:`memory_child` of ``v`` in a fresh Python process (NaNs, with a warning, if it fails)."""
    spec = {"cfg": to_dict(v.cfg), "impl": v.impl, "dispatch": v.dispatch, "compiled": v.compiled,
            "batch": batch, "context": context, "dtype": dtype, "seed": seed, "steps": steps,
            "threads": torch.get_num_threads(), "hf_experts": hf_experts}
    code = ("import json, sys; from studylib.tools.bench.memory import memory_child; "
            "print('@@' + json.dumps(memory_child(json.loads(sys.argv[1]))))")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], capture_output=True, text=True,
                       env=os.environ.copy())
    for line in r.stdout.splitlines():
        if line.startswith("@@"):
            return json.loads(line[2:])
    print(f"warning: memory probe of {v.label} failed: {r.stderr.strip()[-400:]}", file=sys.stderr)
    return dict(NO_MEMORY)


def memory_cuda(v: Variant, idx: torch.Tensor, tgt: torch.Tensor, device: torch.device,
                amp: Optional[torch.dtype]) -> dict:
    """Peak CUDA memory of one more step of ``v``; delta = above what was allocated before it."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    train_step(v, idx, tgt, device, amp)
    peak_b = torch.cuda.max_memory_allocated(device)
    return {"peak_mem_mb": peak_b / 2**20, "mem_delta_mb": (peak_b - before) / 2**20}


def measure_memory(variants: Sequence[Variant], mode: str, device: torch.device, idx: torch.Tensor,
                   tgt: torch.Tensor, amp: Optional[torch.dtype], dtype: str, seed: int, steps: int,
                   hf_experts: str, say: Callable[[str], None]) -> dict:
    """{variant label: {peak_mem_mb, mem_delta_mb}} by ``mode`` (auto: cuda on CUDA, else
    subprocess; none: empty)."""
    if mode == "auto":
        mode = "cuda" if device.type == "cuda" else "subprocess"
    mem = {}
    for v in variants if mode in ("subprocess", "cuda") else ():
        if mode == "subprocess":
            say(f"memory probe: {v.label} ...")
            mem[v.label] = memory_subprocess(v, idx.shape[0], idx.shape[1], dtype, seed, steps, hf_experts)
        else:
            mem[v.label] = memory_cuda(v, idx, tgt, device, amp)
    return mem
