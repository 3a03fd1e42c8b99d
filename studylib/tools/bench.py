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
``--profile`` (train)  prints torch.profiler's top-ops table of one step per variant instead of timing.

Dropout and the HF peer: SPEC puts dropout on the attention output and on the FFN path; HF's
Llama / Mixtral have no such dropout, only dropout on the attention probabilities
(``attention_dropout``), which the peer gets at the same rate. That is the closest HF config, but
not the same computation, and on the CPU HF's attention-probability dropout is expensive (its
dense active-match step is ~1.6x slower with it). ``bench train --dropout 0`` compares identical
computations (same weights, same loss) on both sides; the README gives both.

FLOPs (``flops_per_token``, analytic, per trained token, forward + backward = 3 x forward):
``6 * N_mm + 6 * L * S * d_attn`` where ``N_mm`` are the parameters a token multiplies by: the
active parameters without the RMSNorm gains, with the tied embedding counted once *as the LM-head
matmul* (the lookup is free) and the router included; ``L * S * d_attn`` is causal attention
(QK^T and AV each ``2 * S/2 * d_attn`` per token and layer on average, d_attn = heads * head_dim).
``mfu`` is achieved FLOP/s over a 2048^2 matmul peak measured in the same process, same dtype
(before the rounds and once per round; median).

Memory (``peak_mem_mb``, ``mem_delta_mb``): on CPU, each variant is rebuilt in a fresh child
process (same allocator environment) that runs ``warmup + 1`` steps; ``peak_mem_mb`` is its peak
RSS (``VmHWM``; ``ru_maxrss`` would inherit the parent's peak across fork+exec) and
``mem_delta_mb`` that minus its RSS after the imports, i.e. what the variant's weights,
gradients, AdamW state, activations and allocator slack need. In-process RSS deltas would be
meaningless (allocators keep freed memory). On CUDA:
``torch.cuda.max_memory_allocated`` per variant, in process.

bf16 means ``torch.autocast(device, torch.bfloat16)`` with fp32 weights (as the trainer does);
decode also takes ``bf16-weights``: both models (ours and the peer) cast to bf16, no autocast, the
usual way to run bf16 inference. fp16 is never used on CPU.
"""
from __future__ import annotations

import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch
import torch.nn as nn

from studylib.run.alloc import GLIBC_TUNED, TCMALLOC_PATHS
from studylib.config import ConfigError, ModelConfig, Preset, model_from_dict, preset_from_dict, to_dict

DISPATCHES = ("naive", "grouped", "stacked")
TCMALLOC = TCMALLOC_PATHS[0]
ALLOCATORS = {
    "glibc": {"STUDYLIB_ALLOCATOR": "system"},  # no re-exec into the fast allocator
    "glibc-tuned": {"GLIBC_TUNABLES": GLIBC_TUNED},
    "tcmalloc": {"LD_PRELOAD": TCMALLOC},
}


# --------------------------------------------------------------------------------------------
# environment facts
# --------------------------------------------------------------------------------------------
def allocator_info() -> str:
    """Which malloc this process uses (from /proc/self/maps) and any glibc malloc tunables."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                for name in ("tcmalloc", "jemalloc", "mimalloc"):
                    if name in line:
                        libs.add(name)
    except OSError:
        return "unknown"
    if libs:
        return "+".join(sorted(libs))
    tun = [f"GLIBC_TUNABLES={os.environ['GLIBC_TUNABLES']}"] if os.environ.get("GLIBC_TUNABLES") else []
    tun += [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_") and k.endswith("_")]
    return "glibc" + (f" ({' '.join(tun)})" if tun else "")


def _dtype(name: str) -> Optional[torch.dtype]:
    if name in ("bf16", "bfloat16"):
        return torch.bfloat16
    if name in ("fp32", "float32", "none", None):
        return None
    raise ConfigError(f"--dtype: must be bf16 or fp32, got {name!r} (fp16 is never used on CPU)")


def _autocast(device: torch.device, amp: Optional[torch.dtype]):
    if amp is None:
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=amp)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(amp: Optional[torch.dtype] = None, n: int = 2048, reps: int = 5,
                device: str | torch.device = "cpu") -> float:
    """Median GFLOP/s of an n x n x n matmul in ``amp`` (bf16) or fp32."""
    device = torch.device(device)
    dt = amp or torch.float32
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    a @ b
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times) / 1e9


def norm_params(cfg: ModelConfig) -> int:
    return (2 * cfg.n_layers + 1) * cfg.d_model


def train_flops_per_token(cfg: ModelConfig, seq: int) -> float:
    """Analytic training FLOPs per token (see the module docstring)."""
    from studylib.config import count_params

    n_mm = count_params(cfg).active - norm_params(cfg)
    return 6.0 * n_mm + 6.0 * cfg.n_layers * seq * cfg.n_heads * cfg.head_dim


# --------------------------------------------------------------------------------------------
# models: ours and the transformers peer
# --------------------------------------------------------------------------------------------
def resolve_models(preset: Any, models: Optional[Sequence[str]] = None) -> list[tuple[str, ModelConfig]]:
    """(name, config) pairs from a Preset, a preset YAML path, a raw preset dict, or a
    ``{name: ModelConfig or model dict}`` mapping. Default models: the preset's ``study.headline``
    (else all of them)."""
    if isinstance(preset, (str, os.PathLike)):
        from studylib.config import load_preset

        preset = load_preset(preset)
    elif isinstance(preset, Mapping) and "models" in preset and "data" in preset:
        preset = preset_from_dict(dict(preset))
    if isinstance(preset, Preset):
        names = list(models) if models else list(preset.study.get("headline") or preset.model_names())
        return [(n, preset.model_config(n)) for n in names]
    if isinstance(preset, Mapping):
        names = list(models) if models else list(preset)
        out = []
        for n in names:
            if n not in preset:
                raise ConfigError(f"--models: no model named {n!r}; allowed: {sorted(preset)}")
            c = preset[n]
            out.append((n, c if isinstance(c, ModelConfig) else model_from_dict(dict(c), where=n)))
        return out
    raise TypeError(f"preset: expected a Preset, a path or a mapping, got {type(preset).__name__}")


def _with_context(cfg: ModelConfig, context: int, dropout: Optional[float] = None) -> ModelConfig:
    if dropout is not None and dropout != cfg.dropout:
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"--dropout: must be in [0, 1), got {dropout}")
        cfg = dataclasses.replace(cfg, dropout=dropout)
    return cfg if cfg.context >= context else dataclasses.replace(cfg, context=context)


def build_ours(cfg: ModelConfig, dispatch: Optional[str] = None, seed: int = 0, device="cpu") -> nn.Module:
    from studylib.nn.model import Decoder

    if dispatch is not None and cfg.ffn.kind == "moe":
        cfg = dataclasses.replace(cfg, ffn=dataclasses.replace(cfg.ffn, dispatch=dispatch))
    torch.manual_seed(seed)
    return Decoder(cfg).to(device)


def hf_supported(cfg: ModelConfig) -> Optional[str]:
    """None if an HF peer exists for this config, else why not."""
    f = cfg.ffn
    if f.kind == "soft":
        return "no transformers peer for the soft MoE"
    if f.kind == "moe" and f.layers is not None and len(f.layers) != cfg.n_layers:
        return "no transformers peer for a mixed dense/MoE layer pattern"
    if f.kind == "moe" and not f.renormalize:
        return "HF Mixtral always renormalises the top-k weights (ffn.renormalize: false has no peer)"
    return None


def hf_config(cfg: ModelConfig, experts: str = "eager"):
    """The transformers config of the same architecture (Llama for dense, Mixtral for the MoE)."""
    import transformers

    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn.hidden,
                  num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                  num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, hidden_act="silu",
                  max_position_embeddings=cfg.context, rms_norm_eps=cfg.norm_eps,
                  rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
                  tie_word_embeddings=True, attention_dropout=cfg.dropout, use_cache=False,
                  bos_token_id=None, eos_token_id=None, pad_token_id=0)
    if cfg.ffn.kind == "dense":
        c = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common)
    else:
        c = transformers.MixtralConfig(num_local_experts=cfg.ffn.num_experts,
                                       num_experts_per_tok=cfg.ffn.top_k, output_router_logits=True,
                                       router_aux_loss_coef=cfg.ffn.balance_coef, router_jitter_noise=0.0,
                                       **common)
        c._experts_implementation = experts
    c._attn_implementation = "sdpa"
    return c


@torch.no_grad()
def copy_to_hf(ours: nn.Module, hf: nn.Module) -> None:
    """Load our weights into the HF peer (exact mapping; raises on any shape/name mismatch)."""
    cfg = ours.cfg
    Q, G, A = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    sd = {"model.embed_tokens.weight": ours.tok_emb.weight, "model.norm.weight": ours.norm.weight}
    for i, b in enumerate(ours.blocks):
        p = f"model.layers.{i}."
        q, k, v = b.attn.wqkv.weight.split([Q * A, G * A, G * A], 0)
        sd.update({p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                   p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": b.attn.wo.weight,
                   p + "input_layernorm.weight": b.attn_norm.weight,
                   p + "post_attention_layernorm.weight": b.ffn_norm.weight})
        f = b.ffn
        if hasattr(f, "w_in"):
            gate, up = f.w_in.weight.chunk(2, 0)
            sd.update({p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                       p + "mlp.down_proj.weight": f.w_out.weight})
        else:
            sd.update({p + "mlp.gate.weight": f.router.weight, p + "mlp.experts.gate_up_proj": f.w_in_EFD,
                       p + "mlp.experts.down_proj": f.w_out_EDH})
    own = hf.state_dict()
    missing = [k for k in own if k not in sd and k != "lm_head.weight"]
    extra = [k for k in sd if k not in own]
    if missing or extra:
        raise RuntimeError(f"HF peer layout differs: missing {missing[:4]}, unexpected {extra[:4]}")
    for k, v in sd.items():
        if own[k].shape != v.shape:
            raise RuntimeError(f"HF peer {k}: shape {tuple(own[k].shape)} != ours {tuple(v.shape)}")
        own[k].copy_(v)
    if hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("HF peer: the LM head is not tied to the embedding")


def build_hf(cfg: ModelConfig, ours: Optional[nn.Module] = None, experts: str = "eager",
             device="cpu") -> nn.Module:
    """transformers' LlamaForCausalLM / MixtralForCausalLM of ``cfg`` (with ``ours``' weights)."""
    import transformers

    why = hf_supported(cfg)
    if why:
        raise ConfigError(f"{cfg.name}: {why}")
    hc = hf_config(cfg, experts)
    cls = transformers.LlamaForCausalLM if cfg.ffn.kind == "dense" else transformers.MixtralForCausalLM
    m = cls(hc)
    if ours is not None:
        copy_to_hf(ours, m)
    return m.to(device)


def _n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW as the trainer builds it: decay on >= 2-D tensors, fused kernel where available."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    for impl in ({"fused": True}, {"foreach": True}, {}):
        try:
            return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), **impl)
        except (RuntimeError, TypeError, ValueError):
            continue
    raise RuntimeError("could not build AdamW")  # pragma: no cover


# --------------------------------------------------------------------------------------------
# training-step variants
# --------------------------------------------------------------------------------------------
@dataclass
class _Variant:
    model: str
    impl: str  # "studylib" or "hf"
    dispatch: Optional[str]
    cfg: ModelConfig
    compiled: bool = False  # ours wrapped in torch.compile
    net: Optional[nn.Module] = None
    opt: Any = None
    n_params: int = 0
    times: list = field(default_factory=list)  # wall seconds per timed step
    cpu: list = field(default_factory=list)  # process CPU seconds (user, sys) per timed step
    faults: list = field(default_factory=list)  # minor page faults per timed step

    @property
    def label(self) -> str:
        return f"{self.model}" + (f"[{self.dispatch}]" if self.dispatch else "") + \
            ("" if self.impl == "studylib" else f" ({self.impl})") + (" +compile" if self.compiled else "")


def _train_step(v: _Variant, idx, tgt, device, amp) -> None:
    with _autocast(device, amp):
        if v.impl == "hf":
            out = v.net(input_ids=idx, labels=idx, use_cache=False)  # HF shifts labels itself
            loss = out.loss  # includes router_aux_loss_coef * aux for Mixtral
        else:
            out = v.net(idx, tgt, return_logits=False)
            loss = out.loss + out.aux_loss
    loss.backward()
    v.opt.step()
    v.opt.zero_grad(set_to_none=True)


COMPILE_MODES = ("off", "on", "both")


def _make_variants(pairs, dispatches, peer, hf_experts, device, seed, compile: str = "off") -> list[_Variant]:
    if compile not in COMPILE_MODES:
        raise ConfigError(f"--compile: must be one of {list(COMPILE_MODES)}, got {compile!r}")
    flags = {"off": [False], "on": [True], "both": [False, True]}[compile]
    out = []
    for name, cfg in pairs:
        paths = list(dispatches) if (cfg.ffn.kind == "moe" and dispatches) else [None]
        for c in flags:
            for d in paths:
                out.append(_Variant(name, "studylib", d, cfg, compiled=c))
        if peer == "hf":
            if hf_supported(cfg):
                print(f"note: {name}: {hf_supported(cfg)}; skipped", file=sys.stderr)
            else:
                out.append(_Variant(name, "hf", None, cfg))
    return out


def _build(v: _Variant, device, seed, hf_experts="eager", train=True, copy=True) -> None:
    """Build the variant's model (HF peers get our weights when ``copy``) and its optimizer."""
    if v.impl == "studylib":
        v.net = build_ours(v.cfg, v.dispatch, seed, device)
    else:
        ours = build_ours(v.cfg, v.dispatch, seed, device) if copy else None
        v.net = build_hf(v.cfg, ours, hf_experts, device)
        del ours
    v.net.train(train)
    v.n_params = _n_params(v.net)
    if train:
        v.opt = _optimizer(v.net)
    if v.compiled:  # after the optimizer: it holds the module's own parameters
        v.net = torch.compile(v.net)


def _paired_ratio(num: list[float], den: list[float]) -> float:
    """median over rounds of num[r] / den[r] (times: ref/variant = variant's speed-up over ref)."""
    return statistics.median(a / b for a, b in zip(num, den))


def _status_mb(key: str = "VmRSS") -> float:
    """A /proc/self/status memory field in MB (VmRSS: now; VmHWM: peak RSS of this process image)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _memory_child(spec: dict) -> dict:
    """Run in a fresh process: build one variant, run warmup+1 steps, report peak RSS."""
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    if spec["impl"] == "hf":
        import transformers  # noqa: F401  (count its import in the baseline)
    from studylib.nn import model  # noqa: F401

    device = torch.device("cpu")
    base = _status_mb("VmRSS")
    cfg = model_from_dict(spec["cfg"])
    v = _Variant(cfg.name, spec["impl"], spec["dispatch"], cfg, compiled=spec.get("compiled", False))
    _build(v, device, spec["seed"], spec.get("hf_experts", "eager"), copy=False)
    g = torch.Generator().manual_seed(spec["seed"])
    idx = torch.randint(0, cfg.vocab_size, (spec["batch"], spec["context"] + 1), generator=g)
    for _ in range(spec["steps"]):
        _train_step(v, idx[:, :-1], idx[:, 1:], device, _dtype(spec["dtype"]))
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the forked parent's image
    peak = _status_mb("VmHWM")
    return {"peak_mem_mb": peak, "mem_delta_mb": peak - base}


def _measure_memory_subprocess(v: _Variant, batch, context, dtype, seed, steps, hf_experts) -> dict:
    spec = {"cfg": to_dict(v.cfg), "impl": v.impl, "dispatch": v.dispatch, "compiled": v.compiled,
            "batch": batch,
            "context": context, "dtype": dtype, "seed": seed, "steps": steps,
            "threads": torch.get_num_threads(), "hf_experts": hf_experts}
    code = ("import json, sys; from studylib.tools.bench import _memory_child; "
            "print('@@' + json.dumps(_memory_child(json.loads(sys.argv[1]))))")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], capture_output=True, text=True,
                       env=os.environ.copy())
    for line in r.stdout.splitlines():
        if line.startswith("@@"):
            return json.loads(line[2:])
    print(f"warning: memory probe of {v.label} failed: {r.stderr.strip()[-400:]}", file=sys.stderr)
    return {"peak_mem_mb": float("nan"), "mem_delta_mb": float("nan")}


def bench_train(preset: Any, models: Optional[Sequence[str]] = None,
                dispatches: Optional[Sequence[str]] = DISPATCHES, dtype: str = "bf16", batch: int = 16,
                context: int = 512, rounds: int = 5, warmup: int = 1, peer: Optional[str] = None,
                memory: str = "auto", device: str = "cpu", seed: int = 0, hf_experts: str = "eager",
                progress: bool = True, peak_size: int = 2048, dropout: Optional[float] = None,
                compile: str = "off"):
    """Time one training step per variant, interleaved; a pandas DataFrame, one row per variant.

    Columns: model, impl, dispatch, dtype, batch, context, params (stored, counted on the built
    model), flops_per_token, step_s (median), tok_s (median), tok_s_min, tok_s_max, tok_s_q1, tok_s_q3,
    gflops, mfu, cpu_s (process CPU seconds per step, all threads, user + sys), sys_frac (system
    share of it: page faults), minflt (minor page faults per step), peak_mem_mb, mem_delta_mb,
    ratio_ref (speed vs the first model of the same impl, its first variant), ratio_naive (MoE
    dispatch rows: speed vs `naive` of the same model), ratio_hf (ours / HF of the same model),
    allocator, dropout. ``df.attrs`` holds the matmul peak
    (``peak_gflops``, ``peak_gflops_all``), threads, allocator, torch version, and per-variant times.
    ``dropout`` overrides the preset's rate for every variant (``0`` compares identical
    computations with the HF peer: see the module docstring). ``compile``: ``off``, ``on`` (our
    variants wrapped in ``torch.compile``) or ``both`` (each of ours twice; column ``compiled``,
    ``ratio_compile`` = compiled over eager of the same variant). With compilation the warm-up is
    at least 2 rounds, so compiling and recompiling (the MoE's token counts change) is not timed.
    """
    import pandas as pd

    device = torch.device(device)
    amp = _dtype(dtype)
    dtype = "bf16" if amp is not None else "fp32"
    if peer not in (None, "hf"):
        raise ConfigError(f"--peer: must be hf, got {peer!r}")
    if dispatches:
        bad = [d for d in dispatches if d not in DISPATCHES]
        if bad:
            raise ConfigError(f"--dispatch: unknown path(s) {bad}; allowed: {list(DISPATCHES)}")
    pairs = [(n, _with_context(c, context, dropout)) for n, c in resolve_models(preset, models)]
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if progress else (lambda m: None)
    variants = _make_variants(pairs, dispatches, peer, hf_experts, device, seed, compile)
    if compile != "off":
        warmup = max(warmup, 2)
    for v in variants:
        _build(v, device, seed, hf_experts)
    for v in variants:
        if v.impl == "hf":
            ours = next(w for w in variants if w.model == v.model and w.impl == "studylib")
            ok = "match" if ours.n_params == v.n_params else "MISMATCH"
            print(f"{v.model}: parameters studylib {ours.n_params:,}, transformers {v.n_params:,} ({ok})",
                  file=sys.stderr)
    load0 = os.getloadavg()[0]
    say(f"bench train: {len(variants)} variants, batch {batch} x {context}, {dtype}, "
        f"{torch.get_num_threads()} threads, allocator {allocator_info()}, load average {load0:.1f}")
    g = torch.Generator().manual_seed(seed)
    vocab = min(c.vocab_size for _, c in pairs)
    data = torch.randint(0, vocab, (batch, context + 1), generator=g).to(device)
    idx, tgt = data[:, :-1], data[:, 1:]  # `context` input tokens and their next tokens per row
    peaks = [matmul_peak(amp, n=peak_size, device=device)]
    n = len(variants)
    for r in range(warmup + rounds):
        order = variants[r % n:] + variants[:r % n]
        for v in order:
            _sync(device)
            c0, f0 = os.times(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            _train_step(v, idx, tgt, device, amp)
            _sync(device)
            dt = time.perf_counter() - t0
            c1, f1 = os.times(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            if r >= warmup:
                v.times.append(dt)
                v.cpu.append((c1.user - c0.user, c1.system - c0.system))
                v.faults.append(f1 - f0)
        if r >= warmup:
            peaks.append(matmul_peak(amp, n=peak_size, reps=3, device=device))
            say(f"round {r - warmup + 1}/{rounds}: " + ", ".join(
                f"{v.label} {batch * context / v.times[-1]:,.0f}" for v in variants) + " tok/s")
        else:
            say(f"warm-up round {r + 1}/{warmup} done")
    peak = statistics.median(peaks)
    load1 = os.getloadavg()[0]

    mem = {}
    if memory == "auto":
        memory = "cuda" if device.type == "cuda" else "subprocess"
    if memory == "subprocess":
        for v in variants:
            say(f"memory probe: {v.label} ...")
            mem[v.label] = _measure_memory_subprocess(v, batch, context, dtype, seed, warmup + 1, hf_experts)
    elif memory == "cuda":
        for v in variants:  # peak of the whole process; delta = above what was allocated before the step
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            _train_step(v, idx, tgt, device, amp)
            peak_b = torch.cuda.max_memory_allocated(device)
            mem[v.label] = {"peak_mem_mb": peak_b / 2**20, "mem_delta_mb": (peak_b - before) / 2**20}

    ref = {}  # impl -> reference variant (first model, its first variant)
    for v in variants:
        ref.setdefault(v.impl, v)
    rows = []
    tokens = batch * context
    for v in variants:
        ts = sorted(tokens / t for t in v.times)
        q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
        fpt = train_flops_per_token(v.cfg, context)
        med_tok = statistics.median(ts)
        naive = next((w for w in variants if w.model == v.model and w.impl == v.impl
                      and w.dispatch == "naive" and w.compiled == v.compiled), None) if v.dispatch else None
        eager = next((w for w in variants if w.model == v.model and w.impl == v.impl
                      and w.dispatch == v.dispatch and not w.compiled), None) if v.compiled else None
        hf = next((w for w in variants if w.model == v.model and w.impl == "hf"), None) \
            if v.impl == "studylib" else None
        rows.append({
            "model": v.model, "impl": v.impl, "dispatch": v.dispatch or "", "dtype": dtype,
            "batch": batch, "context": context, "params": v.n_params, "flops_per_token": fpt,
            "step_s": statistics.median(v.times), "tok_s": med_tok, "tok_s_min": ts[0],
            "tok_s_max": ts[-1], "tok_s_q1": q[0], "tok_s_q3": q[2],
            "gflops": med_tok * fpt / 1e9, "mfu": med_tok * fpt / 1e9 / peak,
            "cpu_s": statistics.median(u + k for u, k in v.cpu),
            "sys_frac": statistics.median(k / max(u + k, 1e-9) for u, k in v.cpu),
            "minflt": statistics.median(v.faults),
            "peak_mem_mb": mem.get(v.label, {}).get("peak_mem_mb", float("nan")),
            "mem_delta_mb": mem.get(v.label, {}).get("mem_delta_mb", float("nan")),
            "ratio_ref": _paired_ratio(ref[v.impl].times, v.times),
            "ratio_naive": _paired_ratio(naive.times, v.times) if naive else float("nan"),
            "ratio_hf": _paired_ratio(hf.times, v.times) if hf else float("nan"),
            "allocator": allocator_info(), "dropout": v.cfg.dropout, "compiled": v.compiled,
            "ratio_compile": _paired_ratio(eager.times, v.times) if eager else float("nan"),
        })
    df = pd.DataFrame(rows)
    df.attrs.update(peak_gflops=peak, peak_gflops_all=peaks, threads=torch.get_num_threads(),
                    loadavg=(load0, load1),
                    allocator=allocator_info(), torch=torch.__version__, device=str(device),
                    times={v.label: v.times for v in variants}, rounds=rounds, warmup=warmup)
    return df


def profile_train(preset: Any, models=None, dispatches=DISPATCHES, dtype="bf16", batch=16, context=512,
                  warmup=1, peer=None, device="cpu", seed=0, rows=15, hf_experts="eager",
                  sort_by="self_cpu_time_total", dropout: Optional[float] = None) -> dict:
    """torch.profiler top-ops tables of one training step per variant: {label: table text}."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    amp = _dtype(dtype)
    pairs = [(n, _with_context(c, context, dropout)) for n, c in resolve_models(preset, models)]
    variants = _make_variants(pairs, dispatches, peer, hf_experts, device, seed)
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, min(c.vocab_size for _, c in pairs), (batch, context + 1), generator=g).to(device)
    idx, tgt = data[:, :context], data[:, 1:context + 1]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    out = {}
    for v in variants:
        _build(v, device, seed, hf_experts)
        for _ in range(warmup):
            _train_step(v, idx, tgt, device, amp)
        with profile(activities=acts) as prof:
            _train_step(v, idx, tgt, device, amp)
            _sync(device)
        out[v.label] = prof.key_averages().table(sort_by=sort_by, row_limit=rows)
        v.net = v.opt = None  # free before the next variant
    return out


# --------------------------------------------------------------------------------------------
# decoding
# --------------------------------------------------------------------------------------------
def _hf_generate(m, prompt, new_tokens, use_cache):
    ids = torch.tensor([prompt], device=next(m.parameters()).device)
    out = m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                     min_new_tokens=new_tokens, do_sample=False, use_cache=use_cache, pad_token_id=0,
                     eos_token_id=None, bos_token_id=None)
    return out[0, len(prompt):].tolist()


def bench_decode(preset: Any, models: Optional[Sequence[str]] = None, dtype: str = "fp32",
                 prompt_len: int = 32, new_tokens: int = 64, trials: int = 5, warmup: int = 2,
                 no_cache_too: bool = False, peer: Optional[str] = None, dispatch: Optional[str] = None,
                 device: str = "cpu", seed: int = 0, progress: bool = True):
    """Greedy batch-1 decoding speed (seed-002 protocol), trials interleaved across variants.

    One row per (model, impl, cache). Columns: model, impl, cache, dispatch, dtype, prompt_len,
    new_tokens, tok_s (median), tok_s_min, tok_s_max, ms_per_token, ratio_ref (vs the first model,
    same impl and cache mode), ratio_hf (ours / HF, same model and cache mode), ratio_cache
    (cache / no cache, same model and impl), same_tokens_as_ours (HF rows: identical greedy
    tokens from identical weights), allocator.
    """
    import pandas as pd

    from studylib.run.decode import generate

    device = torch.device(device)
    weights = None  # bf16-weights: both sides' weights cast to bf16, no autocast (the usual bf16 inference)
    if dtype == "bf16-weights":
        weights, amp, dtype = torch.bfloat16, None, "bf16-weights"
    else:
        amp = _dtype(dtype)
        dtype = "bf16" if amp is not None else "fp32"
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if progress else (lambda m: None)
    pairs = resolve_models(preset, models)
    caches = [True, False] if no_cache_too else [True]
    g = torch.Generator().manual_seed(seed)
    variants = []  # dicts: model, impl, cache, fn, times
    for name, cfg in pairs:
        if prompt_len + new_tokens > cfg.context:
            raise ConfigError(f"prompt_len + new_tokens = {prompt_len + new_tokens} exceeds "
                              f"{name}'s context of {cfg.context}")
        d = dispatch if cfg.ffn.kind == "moe" else None
        ours = build_ours(cfg, d, seed, device).eval()
        prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=g).tolist()
        hf = None
        if peer == "hf":
            if hf_supported(cfg):
                say(f"note: {name}: {hf_supported(cfg)}; skipped")
            else:
                hf = build_hf(cfg, ours, device=device).eval()
        if weights is not None:
            ours = ours.to(weights)
            hf = hf.to(weights) if hf is not None else None
        for c in caches:
            def f_ours(m=ours, p=prompt, c=c):
                return generate(m, p, new_tokens, temperature=0, use_cache=c, amp_dtype=amp)

            variants.append(dict(model=name, impl="studylib", cache=c, fn=f_ours, times=[], cfg=cfg,
                                 dispatch=(d or cfg.ffn.dispatch) if cfg.ffn.kind == "moe" else ""))
            if hf is not None:
                def f_hf(m=hf, p=prompt, c=c):
                    with torch.inference_mode(), _autocast(device, amp):
                        return _hf_generate(m, p, new_tokens, c)

                variants.append(dict(model=name, impl="hf", cache=c, fn=f_hf, times=[], cfg=cfg,
                                     dispatch="eager" if cfg.ffn.kind == "moe" else ""))
    load0 = os.getloadavg()[0]
    say(f"bench decode: {len(variants)} variants, prompt {prompt_len}, {new_tokens} new tokens, {dtype}, "
        f"{torch.get_num_threads()} threads, allocator {allocator_info()}, load average {load0:.1f}")
    n = len(variants)
    for r in range(warmup + trials):
        for v in variants[r % n:] + variants[:r % n]:
            _sync(device)
            t0 = time.perf_counter()
            toks = v["fn"]()
            _sync(device)
            if r >= warmup:
                v["times"].append(time.perf_counter() - t0)
            v["tokens"] = toks
        if r >= warmup:
            say(f"trial {r - warmup + 1}/{trials}: " + ", ".join(
                f"{v['model']}/{v['impl']}/{'cache' if v['cache'] else 'nocache'} "
                f"{new_tokens / v['times'][-1]:,.0f}" for v in variants) + " tok/s")
    rows = []
    for v in variants:
        ts = sorted(new_tokens / t for t in v["times"])
        ref = next(w for w in variants if w["impl"] == v["impl"] and w["cache"] == v["cache"])
        hf = next((w for w in variants if w["model"] == v["model"] and w["impl"] == "hf"
                   and w["cache"] == v["cache"]), None) if v["impl"] == "studylib" else None
        nc = next((w for w in variants if w["model"] == v["model"] and w["impl"] == v["impl"]
                   and not w["cache"]), None) if v["cache"] else None
        ours = next(w for w in variants if w["model"] == v["model"] and w["impl"] == "studylib"
                    and w["cache"] == v["cache"])
        rows.append({
            "model": v["model"], "impl": v["impl"], "cache": v["cache"], "dispatch": v["dispatch"],
            "dtype": dtype, "prompt_len": prompt_len, "new_tokens": new_tokens,
            "tok_s": statistics.median(ts), "tok_s_min": ts[0], "tok_s_max": ts[-1],
            "ms_per_token": 1e3 * statistics.median(v["times"]) / new_tokens,
            "ratio_ref": _paired_ratio(ref["times"], v["times"]),
            "ratio_hf": _paired_ratio(hf["times"], v["times"]) if hf else float("nan"),
            "ratio_cache": _paired_ratio(nc["times"], v["times"]) if nc else float("nan"),
            "same_tokens_as_ours": v["tokens"] == ours["tokens"],
            "allocator": allocator_info(),
        })
    df = pd.DataFrame(rows)
    df.attrs.update(threads=torch.get_num_threads(), allocator=allocator_info(), torch=torch.__version__,
                    device=str(device), trials=trials, warmup=warmup, loadavg=(load0, os.getloadavg()[0]))
    return df


# --------------------------------------------------------------------------------------------
# allocators: the train bench in fresh processes under each allocator, interleaved
# --------------------------------------------------------------------------------------------
def bench_allocators(argv: Sequence[str], allocators: Sequence[str] = tuple(ALLOCATORS), reps: int = 2,
                     progress: bool = True):
    """Run ``python -m studylib bench train --json <argv>`` under each allocator, ``reps`` times,
    in rotated order; a DataFrame with one row per (allocator, variant): median tok/s over reps,
    ``ratio_glibc`` (median over reps of tok/s / glibc tok/s of the same rep), and the same on
    process CPU time (``cpu_ratio_glibc``: glibc CPU s / this CPU s; less sensitive to other jobs
    on a shared machine than wall time), ``sys_frac`` and minor page faults per step."""
    import pandas as pd

    envs = {}
    for a in allocators:
        if a not in ALLOCATORS:
            raise ConfigError(f"--allocators: unknown {a!r}; allowed: {list(ALLOCATORS)}")
        if a == "tcmalloc" and not Path(TCMALLOC).exists():
            print(f"note: {TCMALLOC} missing (apt-get install libtcmalloc-minimal4); skipping tcmalloc",
                  file=sys.stderr)
            continue
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "GLIBC_TUNABLES", "STUDYLIB_ALLOCATOR") and not k.startswith("MALLOC_")}
        env.update(ALLOCATORS[a])
        envs[a] = env
    names = list(envs)
    results: dict = {a: [] for a in names}
    for r in range(reps):
        for a in names[r % len(names):] + names[:r % len(names)]:
            cmd = [sys.executable, "-m", "studylib", "bench", "train", "--json", "--memory", "none", *argv]
            t0 = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True, env=envs[a])
            if p.returncode != 0:
                raise RuntimeError(f"bench under {a} failed:\n{p.stderr[-2000:]}")
            doc = json.loads(p.stdout)
            results[a].append(doc)
            if progress:
                print(f"rep {r + 1}/{reps} {a} ({doc['allocator']}, {time.perf_counter() - t0:.0f} s): "
                      + ", ".join(f"{x['model']}{'[' + x['dispatch'] + ']' if x['dispatch'] else ''}"
                                  f"{'' if x['impl'] == 'studylib' else '(' + x['impl'] + ')'} "
                                  f"{x['tok_s']:,.0f}" for x in doc["rows"]), file=sys.stderr, flush=True)
    rows = []
    for a in names:
        for i, x in enumerate(results[a][0]["rows"]):
            def col(key, alloc=a):
                return [doc["rows"][i][key] for doc in results.get(alloc, [])]

            toks, cpu = col("tok_s"), col("cpu_s")
            nan = [float("nan")] * reps
            base, base_cpu = col("tok_s", "glibc") or nan, col("cpu_s", "glibc") or nan
            rows.append({"allocator": a, "detected": results[a][0]["allocator"], "model": x["model"],
                         "impl": x["impl"], "dispatch": x["dispatch"], "tok_s": statistics.median(toks),
                         "tok_s_all": toks,
                         "ratio_glibc": statistics.median(t / b for t, b in zip(toks, base)),
                         "cpu_s": statistics.median(cpu),
                         "cpu_ratio_glibc": statistics.median(b / c for c, b in zip(cpu, base_cpu)),
                         "sys_frac": statistics.median(col("sys_frac")),
                         "minflt": statistics.median(col("minflt"))})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def add_cli(parser) -> None:
    sub = parser.add_subparsers(dest="bench_kind", metavar="{train,decode,alloc}")

    def common(p, dtype_default):
        p.add_argument("--params", default="params/paper.yaml", help="preset YAML")
        p.add_argument("--models", nargs="+", default=None, help="model names (default: study.headline)")
        p.add_argument("--dtype", default=dtype_default, choices=["bf16", "fp32"])
        p.add_argument("--peer", default=None, choices=["hf"], help="also time transformers' Llama/Mixtral")
        p.add_argument("--device", default="cpu")
        p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--json", action="store_true", help="print the result as JSON")

    t = sub.add_parser("train", help="training-step throughput (interleaved rounds)")
    common(t, "bf16")
    t.add_argument("--dispatch", nargs="+", default=list(DISPATCHES), choices=DISPATCHES,
                   help="MoE dispatch paths to time (default: all three)")
    t.add_argument("--batch", type=int, default=16)
    t.add_argument("--context", type=int, default=512)
    t.add_argument("--rounds", type=int, default=5)
    t.add_argument("--warmup", type=int, default=1)
    t.add_argument("--memory", default="auto", choices=["auto", "subprocess", "cuda", "none"],
                   help="peak-memory measurement (auto: a fresh subprocess per variant on CPU)")
    t.add_argument("--hf-experts", default="eager", help="transformers experts implementation for Mixtral")
    t.add_argument("--compile", default="off", choices=list(COMPILE_MODES),
                   help="torch.compile our models: off, on, or both (eager and compiled side by side)")
    t.add_argument("--dropout", type=float, default=None,
                   help="override the preset's dropout for every variant (0: identical computations "
                        "on both sides; HF has attention-probability dropout only)")
    t.add_argument("--profile", action="store_true", help="print torch.profiler top ops of one step per "
                                                         "variant (no timing rounds)")
    t.add_argument("--profile-rows", type=int, default=15)

    d = sub.add_parser("decode", help="greedy batch-1 decoding speed (seed-002 protocol)")
    common(d, "fp32")
    for act in d._actions:  # decoding can also run with bf16 weights (both sides), not only autocast
        if act.dest == "dtype":
            act.choices = ["bf16", "fp32", "bf16-weights"]
            act.help = "fp32; bf16 = autocast over fp32 weights; bf16-weights = both models cast to bf16"
    d.add_argument("--prompt-len", type=int, default=32)
    d.add_argument("--new-tokens", type=int, default=64)
    d.add_argument("--trials", type=int, default=5)
    d.add_argument("--warmup", type=int, default=2)
    d.add_argument("--no-cache-too", action="store_true", help="also decode without the KV cache")
    d.add_argument("--dispatch", default=None, choices=DISPATCHES, help="MoE dispatch (default: preset's)")

    a = sub.add_parser("alloc", help="the train bench under glibc / glibc tunables / tcmalloc, interleaved",
                       description="Runs `bench train --json ARGS` in fresh processes per allocator. "
                                   "Pass train options after `--`, e.g. bench alloc --reps 2 -- --rounds 2")
    a.add_argument("--allocators", nargs="+", default=list(ALLOCATORS), choices=list(ALLOCATORS))
    a.add_argument("--reps", type=int, default=2)
    a.add_argument("--json", action="store_true")
    a.add_argument("train_args", nargs="*", help="arguments for `bench train` (after --)")


def _json_safe(obj):
    """NaN/inf -> None, so --json output is strict JSON."""
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _fmt_table(df, cols) -> str:
    def fmt(x):
        return f"{x:,.3g}" if abs(x) < 100 else f"{x:,.0f}"

    return df[cols].to_string(index=False, float_format=fmt)


def run_cli(args) -> int:
    if not getattr(args, "bench_kind", None):
        args._parser.print_help()
        return 2
    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    if args.bench_kind == "alloc":
        df = bench_allocators(args.train_args, args.allocators, args.reps)
        if args.json:
            print(json.dumps(_json_safe(df.to_dict(orient="records")), indent=1))
        else:
            print(_fmt_table(df, ["allocator", "model", "impl", "dispatch", "tok_s", "ratio_glibc", "cpu_s",
                                  "cpu_ratio_glibc", "sys_frac", "minflt"]))
            seen = dict(zip(df.allocator, df.detected))
            print("# detected: " + "; ".join(f"{a}: {d}" for a, d in seen.items()))
        return 0
    if args.peer == "hf":
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("error: --peer hf needs transformers (pip install transformers)", file=sys.stderr)
            return 2
    if args.bench_kind == "train":
        if args.profile:
            tabs = profile_train(args.params, args.models, args.dispatch, args.dtype, args.batch,
                                 args.context, max(args.warmup, 1), args.peer, args.device, args.seed,
                                 args.profile_rows, args.hf_experts, dropout=args.dropout)
            for label, tab in tabs.items():
                print(f"\n=== {label}: one training step, batch {args.batch} x {args.context}, {args.dtype}, "
                      f"allocator {allocator_info()} ===\n{tab}")
            return 0
        df = bench_train(args.params, args.models, args.dispatch, args.dtype, args.batch, args.context,
                         args.rounds, args.warmup, args.peer, args.memory, args.device, args.seed,
                         args.hf_experts, progress=True, dropout=args.dropout, compile=args.compile)
        if args.json:
            keys = ("allocator", "peak_gflops", "peak_gflops_all", "loadavg", "threads", "torch", "times")
            doc = {k: df.attrs[k] for k in keys} | {"rows": df.to_dict(orient="records")}
            print(json.dumps(_json_safe(doc), indent=1))
            return 0
        print(f"# bench train: batch {args.batch} x {args.context}, {df.attrs['rounds']} rounds after "
              f"{df.attrs['warmup']} warm-up, {args.dtype}, {df.attrs['threads']} threads, "
              f"allocator: {df.attrs['allocator']}, torch {df.attrs['torch']}, "
              f"load average {df.attrs['loadavg'][0]:.1f} -> {df.attrs['loadavg'][1]:.1f} (shared machine: "
              f"trust ratios over absolute numbers)")
        pk = df.attrs["peak_gflops_all"]
        print(f"# matmul peak 2048^2 {args.dtype}: {df.attrs['peak_gflops']:,.0f} GFLOP/s "
              f"(min {min(pk):,.0f}, max {max(pk):,.0f} over {len(pk)} probes)")
        comp = ["compiled"] if args.compile != "off" else []
        print(_fmt_table(df, ["model", "impl", "dispatch", *comp, "params", "tok_s", "tok_s_min", "tok_s_max",
                              "gflops", "mfu", "cpu_s", "sys_frac", "minflt", "peak_mem_mb", "mem_delta_mb",
                              "ratio_ref", "ratio_naive", "ratio_hf"]
                         + (["ratio_compile"] if args.compile == "both" else [])))
        print("# ratio_ref: speed vs the first model (same impl); ratio_naive: vs the naive dispatch; "
              "ratio_hf: ours / transformers" + ("; ratio_compile: compiled / eager" if args.compile == "both"
                                                 else "") + ". Ratios are medians of per-round paired ratios.")
        return 0
    df = bench_decode(args.params, args.models, args.dtype, args.prompt_len, args.new_tokens, args.trials,
                      args.warmup, args.no_cache_too, args.peer, args.dispatch, args.device, args.seed,
                      progress=True)
    if args.json:
        print(json.dumps(_json_safe({"allocator": df.attrs["allocator"], "loadavg": df.attrs["loadavg"],
                                     "threads": df.attrs["threads"], "rows": df.to_dict(orient="records")}),
                         indent=1))
        return 0
    print(f"# bench decode: batch 1 greedy, prompt {args.prompt_len}, {args.new_tokens} new tokens, "
          f"{df.attrs['trials']} trials after {df.attrs['warmup']} warm-up, {args.dtype}, "
          f"{df.attrs['threads']} threads, allocator: {df.attrs['allocator']}, load average "
          f"{df.attrs['loadavg'][0]:.1f} -> {df.attrs['loadavg'][1]:.1f}")
    print(_fmt_table(df, ["model", "impl", "cache", "dispatch", "tok_s", "tok_s_min", "tok_s_max",
                          "ms_per_token", "ratio_ref", "ratio_hf", "ratio_cache", "same_tokens_as_ours"]))
    return 0
