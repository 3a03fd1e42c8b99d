"""Throughput benchmarks: training steps, greedy decoding, a transformers peer, allocators.

``python -m studylib bench train``  one full training step per variant (forward with targets,
  loss + aux loss, backward, AdamW step, zero_grad) on random tokens. Variants: each model of the
  preset, the MoE ones once per dispatch path, and with ``--peer hf`` the same models built as
  transformers' ``LlamaForCausalLM`` / ``MixtralForCausalLM`` (our weights copied in, so both
  start from the same point and route the same tokens). Every variant is built once and kept;
  after ``--warmup`` untimed rounds, round r times every variant once, in an order rotated by r,
  so slow drifts of a shared machine hit all variants alike. Ratios are medians of per-round
  paired ratios (``t_ref / t_variant`` of the same round), which cancel most of that drift.
``python -m studylib bench decode``  the seed-002 protocol: batch 1, greedy, random 32-token
  prompt, 64 new tokens, ``--trials`` timed after ``--warmup``, with the KV cache (and with
  ``--no-cache-too`` without it), ours (:func:`studylib.run.decode.generate`) against HF
  ``generate``; trials interleaved across variants.
``python -m studylib bench alloc``  the train bench in fresh processes under different memory
  allocators (glibc default, glibc tunables, tcmalloc via ``LD_PRELOAD``), interleaved.
``--profile`` (train)  instead of timing: each variant's step by kind of work
  (:mod:`studylib.tools.bench.opgroups`), tokens per CPU-second and fraction of the matmul peak,
  then torch.profiler's top-ops table.
``python -m studylib bench paths``  the plain eager step against the preset's faster execution
  settings, side by side (:mod:`studylib.tools.bench.paths`).

One module per job: ``variant`` (the one :class:`Variant` type, model resolution, building ours),
``timing`` (the one interleaved-rounds harness), ``flops`` (analytic FLOPs, matmul peak, MFU),
``hf`` (the transformers peer), ``step`` (the benchmarked training step and its optimizer),
``memory`` (peak memory), ``train`` / ``decode`` / ``paths`` (the benches), ``opgroups`` (the
profile's groups), ``allocators``, ``cli``.
"""
from studylib.tools.bench.allocators import ALLOCATORS, allocator_info, bench_allocators
from studylib.tools.bench.cli import add_cli, run_cli
from studylib.tools.bench.decode import bench_decode
from studylib.tools.bench.flops import matmul_peak, train_flops_per_token
from studylib.tools.bench.hf import build_hf, copy_to_hf, hf_config, hf_supported
from studylib.tools.bench.train import bench_train, profile_train
from studylib.tools.bench.variant import COMPILE_MODES, DISPATCHES, Variant, bench_device, build_ours, resolve_models

__all__ = [
    "ALLOCATORS", "COMPILE_MODES", "DISPATCHES", "Variant", "add_cli", "bench_device", "allocator_info", "bench_allocators",
    "bench_decode", "bench_train", "build_hf", "build_ours", "copy_to_hf", "hf_config", "hf_supported",
    "matmul_peak", "profile_train", "resolve_models", "run_cli", "train_flops_per_token",
]
