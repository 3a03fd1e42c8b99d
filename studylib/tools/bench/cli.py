"""``python -m studylib bench {train,decode,alloc}``: the argument parser and the printed tables
(or ``--json``) of the three benches."""
from __future__ import annotations

import json
import os
import sys

import torch

from studylib.config import args as T
from studylib.tools.bench.allocators import ALLOCATORS, allocator_info, bench_allocators
from studylib.tools.bench.decode import DECODE_DTYPES, bench_decode
from studylib.tools.bench.memory import MEMORY_MODES
from studylib.tools.bench.train import bench_train, profile_groups, profile_train
from studylib.tools.bench.variant import COMPILE_MODES, DISPATCHES


def _add_common(p, dtype_default: str, dtypes=("bf16", "fp32"), dtype_help=None) -> None:
    p.add_argument("--params", default="params/paper.yaml", help="preset YAML")
    p.add_argument("--models", nargs="+", default=None, help="model names (default: study.headline)")
    p.add_argument("--dtype", default=dtype_default, choices=list(dtypes), help=dtype_help)
    p.add_argument("--peer", default=None, choices=["hf"], help="also time transformers' Llama/Mixtral")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=T.non_negative_int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--seed", type=T.seed, default=0)
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _add_train(sub) -> None:
    t = sub.add_parser("train", help="training-step throughput (interleaved rounds)")
    _add_common(t, "bf16")
    t.add_argument("--dispatch", nargs="+", default=list(DISPATCHES), choices=DISPATCHES,
                   help="MoE dispatch paths to time (default: all three)")
    t.add_argument("--batch", type=T.positive_int, default=16)
    t.add_argument("--context", type=T.positive_int, default=512)
    t.add_argument("--rounds", type=T.positive_int, default=5)
    t.add_argument("--warmup", type=T.non_negative_int, default=1)
    t.add_argument("--memory", default="auto", choices=list(MEMORY_MODES),
                   help="peak-memory measurement (auto: a fresh subprocess per variant on CPU)")
    t.add_argument("--hf-experts", default="eager", help="transformers experts implementation for Mixtral")
    t.add_argument("--compile", default="off", choices=list(COMPILE_MODES),
                   help="torch.compile our models: off, on, or both (eager and compiled side by side)")
    t.add_argument("--dropout", type=T.dropout, default=None,
                   help="override the preset's dropout for every variant (0: identical computations "
                        "on both sides; HF has attention-probability dropout only)")
    t.add_argument("--profile", action="store_true",
                   help="each variant's step time by kind of work (matmul, attention, rotary, norms, FFN "
                        "activation, MoE router + dispatch, LM head + loss, embedding, optimizer with "
                        "clipping, data), tokens per CPU-second and fraction of the fp32/bf16 matmul "
                        "peak, then torch.profiler's top ops (no timing rounds)")
    t.add_argument("--profile-rows", type=T.non_negative_int, default=15, help="top ops rows (0: none)")


def _add_decode(sub) -> None:
    d = sub.add_parser("decode", help="greedy batch-1 decoding speed (seed-002 protocol)")
    # decoding can also run with bf16 weights (both sides), not only autocast
    _add_common(d, "fp32", DECODE_DTYPES,
                "fp32; bf16 = autocast over fp32 weights; bf16-weights = both models cast to bf16")
    d.add_argument("--prompt-len", type=T.positive_int, default=32)
    d.add_argument("--new-tokens", type=T.positive_int, default=64)
    d.add_argument("--trials", type=T.positive_int, default=5)
    d.add_argument("--warmup", type=T.non_negative_int, default=2)
    d.add_argument("--no-cache-too", action="store_true", help="also decode without the KV cache")
    d.add_argument("--dispatch", default=None, choices=DISPATCHES, help="MoE dispatch (default: preset's)")


def _add_alloc(sub) -> None:
    a = sub.add_parser("alloc", help="the train bench under glibc / glibc tunables / tcmalloc, interleaved",
                       description="Runs `bench train --json ARGS` in fresh processes per allocator. "
                                   "Pass train options after `--`, e.g. bench alloc --reps 2 -- --rounds 2")
    a.add_argument("--allocators", nargs="+", default=list(ALLOCATORS), choices=list(ALLOCATORS))
    a.add_argument("--reps", type=T.positive_int, default=2)
    a.add_argument("--json", action="store_true")
    a.add_argument("train_args", nargs="*", help="arguments for `bench train` (after --)")


def _add_paths(sub) -> None:
    p = sub.add_parser("paths", help="today's plain eager step against the preset's faster settings, "
                                     "tokens per CPU-second side by side (interleaved)")
    p.add_argument("--params", default="params/cpu.yaml", help="preset YAML")
    p.add_argument("--models", nargs="+", default=None, help="model names (default: study.headline)")
    p.add_argument("--threads", type=T.non_negative_int, default=1, help="torch threads (the study's: 1)")
    p.add_argument("--batch", type=T.positive_int, default=8)
    p.add_argument("--context", type=T.positive_int, default=128)
    p.add_argument("--rounds", type=T.positive_int, default=10)
    p.add_argument("--warmup", type=T.non_negative_int, default=2)
    p.add_argument("--seed", type=T.seed, default=0)
    p.add_argument("--fold", type=T.positive_int, nargs="+", default=None, metavar="K",
                   help="instead: each model's step at K x the batch against 1x (what K seeds stacked into one "
                        "model could gain at most), tokens per CPU-second side by side")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def add_cli(parser) -> None:
    sub = parser.add_subparsers(dest="bench_kind", metavar="{train,decode,alloc,paths}")
    _add_train(sub)
    _add_decode(sub)
    _add_alloc(sub)
    _add_paths(sub)


def json_safe(obj):
    """NaN/inf -> None, so --json output is strict JSON."""
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _print_json(doc) -> None:
    print(json.dumps(json_safe(doc), indent=1))


def fmt_table(df, cols) -> str:
    def fmt(x):
        return f"{x:,.3g}" if abs(x) < 100 else f"{x:,.0f}"

    return df[cols].to_string(index=False, float_format=fmt)


def _run_alloc(args) -> int:
    df = bench_allocators(args.train_args, args.allocators, args.reps)
    if args.json:
        _print_json(df.to_dict(orient="records"))
        return 0
    print(fmt_table(df, ["allocator", "model", "impl", "dispatch", "tok_s", "ratio_glibc", "cpu_s",
                         "cpu_ratio_glibc", "sys_frac", "minflt"]))
    seen = dict(zip(df.allocator, df.detected))
    print("# detected: " + "; ".join(f"{a}: {d}" for a, d in seen.items()))
    return 0


def _run_profile(args) -> int:
    from studylib.tools.bench.opgroups import table

    groups = profile_groups(args.params, args.models, args.dispatch, args.batch, args.context,
                            max(args.warmup, 1), device=args.device, seed=args.seed, dtype=args.dtype)
    print(f"# bench train --profile: batch {args.batch} x {args.context}, {args.dtype}, "
          f"{torch.get_num_threads()} thread(s), allocator {allocator_info()}, load average "
          f"{os.getloadavg()[0]:.1f}; times are process CPU time (tokens/s = per CPU-second)")
    for label, r in groups.items():
        print(f"\n=== {label}: {r['params']:,} parameters, step {r['step_ms']:.1f} ms CPU "
              f"(fastest of 10 unprofiled), {r['flops_per_token'] * args.batch * args.context / 1e9:.3f} GFLOP ===")
        print(table(r["groups"], args.batch * args.context, r["flops_per_token"] * args.batch * args.context,
                    r["peak_gflops"]))
    if args.profile_rows:
        tabs = profile_train(args.params, args.models, args.dispatch, args.dtype, args.batch,
                             args.context, max(args.warmup, 1), args.peer, args.device, args.seed,
                             args.profile_rows, args.hf_experts, dropout=args.dropout)
        for label, tab in tabs.items():
            print(f"\n=== {label}: top ops of one training step ===\n{tab}")
    return 0


def _print_train(df, args) -> None:
    print(f"# bench train: batch {args.batch} x {args.context}, {df.attrs['rounds']} rounds after "
          f"{df.attrs['warmup']} warm-up, {args.dtype}, {df.attrs['threads']} threads, "
          f"allocator: {df.attrs['allocator']}, torch {df.attrs['torch']}, "
          f"load average {df.attrs['loadavg'][0]:.1f} -> {df.attrs['loadavg'][1]:.1f} (shared machine: "
          f"trust ratios over absolute numbers)")
    pk = df.attrs["peak_gflops_all"]
    n = df.attrs['peak_size']
    print(f"# matmul peak {n}^2 {args.dtype}: {df.attrs['peak_gflops']:,.0f} GFLOP/s "
          f"(min {min(pk):,.0f}, max {max(pk):,.0f} over {len(pk)} probes)")
    comp = ["compiled"] if args.compile != "off" else []
    both = args.compile == "both"
    print(fmt_table(df, ["model", "impl", "dispatch", *comp, "params", "tok_s", "tok_s_min", "tok_s_max",
                         "gflops", "mfu", "cpu_s", "sys_frac", "minflt", "peak_mem_mb", "mem_delta_mb",
                         "ratio_ref", "ratio_naive", "ratio_hf"] + (["ratio_compile"] if both else [])))
    print("# ratio_ref: speed vs the first model (same impl); ratio_naive: vs the naive dispatch; "
          "ratio_hf: ours / transformers" + ("; ratio_compile: compiled / eager" if both else "")
          + ". Ratios are medians of per-round paired ratios.")


def _run_train(args) -> int:
    if args.profile:
        return _run_profile(args)
    df = bench_train(args.params, args.models, args.dispatch, args.dtype, args.batch, args.context,
                     args.rounds, args.warmup, args.peer, args.memory, args.device, args.seed,
                     args.hf_experts, progress=True, dropout=args.dropout, compile=args.compile)
    if args.json:
        keys = ("allocator", "peak_gflops", "peak_gflops_all", "loadavg", "threads", "torch", "times")
        _print_json({k: df.attrs[k] for k in keys} | {"rows": df.to_dict(orient="records")})
        return 0
    _print_train(df, args)
    return 0


def _run_decode(args) -> int:
    df = bench_decode(args.params, args.models, args.dtype, args.prompt_len, args.new_tokens, args.trials,
                      args.warmup, args.no_cache_too, args.peer, args.dispatch, args.device, args.seed,
                      progress=True)
    if args.json:
        _print_json({"allocator": df.attrs["allocator"], "loadavg": df.attrs["loadavg"],
                     "threads": df.attrs["threads"], "rows": df.to_dict(orient="records")})
        return 0
    print(f"# bench decode: batch 1 greedy, prompt {args.prompt_len}, {args.new_tokens} new tokens, "
          f"{df.attrs['trials']} trials after {df.attrs['warmup']} warm-up, {args.dtype}, "
          f"{df.attrs['threads']} threads, allocator: {df.attrs['allocator']}, load average "
          f"{df.attrs['loadavg'][0]:.1f} -> {df.attrs['loadavg'][1]:.1f}")
    print(fmt_table(df, ["model", "impl", "cache", "dispatch", "tok_s", "tok_s_min", "tok_s_max",
                         "ms_per_token", "ratio_ref", "ratio_hf", "ratio_cache", "same_tokens_as_ours"]))
    return 0


def _run_paths(args) -> int:
    from studylib.tools.bench.paths import bench_fold, bench_paths

    if args.fold:
        df = bench_fold(args.params, args.fold, args.models, args.batch, args.context, args.rounds, args.warmup,
                        args.seed)
    else:
        df = bench_paths(args.params, args.models, args.batch, args.context, args.rounds, args.warmup, args.seed)
    if args.json:
        _print_json({"attrs": df.attrs, "rows": df.to_dict(orient="records")})
        return 0
    a = df.attrs
    print(f"# bench paths: batch {a['batch']} x {a['context']}, fp32, {a['threads']} thread(s), {a['rounds']} rounds "
          f"after {a['warmup']} warm-up, allocator {allocator_info()}, load average {a['loadavg'][0]:.1f} -> "
          f"{a['loadavg'][1]:.1f}; tokens per CPU-second (fastest round); "
          + ("gain: median paired per-token CPU time at 1x / at fold x" if args.fold else
             "ratio: median paired plain / preset"))
    print(fmt_table(df, ["model", "params", "fold", "tok_s", "gain"] if args.fold else
                    ["model", "params", "tok_s_plain", "tok_s_preset", "ratio", "ratio_min", "differs"]))
    return 0


def run_cli(args) -> int:
    if not getattr(args, "bench_kind", None):
        args._parser.print_help()
        return 2
    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    if args.bench_kind == "alloc":
        return _run_alloc(args)
    if args.bench_kind == "paths":
        return _run_paths(args)
    if args.peer == "hf":
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("error: --peer hf needs transformers (pip install transformers)", file=sys.stderr)
            return 2
    return _run_train(args) if args.bench_kind == "train" else _run_decode(args)
