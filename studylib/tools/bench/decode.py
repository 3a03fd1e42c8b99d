"""``bench decode``: greedy batch-1 decoding speed, the seed-002 protocol.

Batch 1, greedy, a random ``prompt_len``-token prompt, ``new_tokens`` new tokens, ``trials`` timed
after ``warmup``, with the KV cache (and with ``no_cache_too`` without it); ours
(:func:`studylib.run.decode.generate`) against HF ``generate`` (:mod:`studylib.tools.bench.hf`),
trials interleaved across variants by :mod:`studylib.tools.bench.timing`.

dtypes: ``fp32``; ``bf16`` = autocast over fp32 weights (as the trainer does); ``bf16-weights`` =
both models (ours and the peer) cast to bf16, no autocast, the usual way to run bf16 inference.
"""
from __future__ import annotations

import os
import statistics
from typing import Any, Optional, Sequence

import torch

from studylib.config import ConfigError, ModelConfig
from studylib.nn.precision import autocast, parse_dtype
from studylib.run.decode import generate
from studylib.tools.bench.allocators import allocator_info
from studylib.tools.bench.hf import build_hf, hf_generate, hf_supported
from studylib.tools.bench.timing import interleaved_rounds, progress_printer, speed_stats, speedup
from studylib.tools.bench.variant import Variant, build_ours, find, resolve_models

DECODE_DTYPES = ("bf16", "fp32", "bf16-weights")


def _decode_dtypes(dtype: str) -> tuple[Optional[torch.dtype], Optional[torch.dtype], str]:
    """(weights dtype or None, autocast dtype or None, the dtype's name in the frame)."""
    if dtype == "bf16-weights":  # both sides' weights cast to bf16, no autocast
        return torch.bfloat16, None, "bf16-weights"
    amp = parse_dtype(dtype)
    return None, amp, "bf16" if amp is not None else "fp32"


def _ours_call(m, prompt, new_tokens, cache, amp):
    return lambda: generate(m, prompt, new_tokens, temperature=0, use_cache=cache, amp_dtype=amp)


def _hf_call(m, prompt, new_tokens, cache, amp, device):
    def call():
        with torch.inference_mode(), autocast(device, amp):
            return hf_generate(m, prompt, new_tokens, cache)
    return call


def _model_variants(name: str, cfg: ModelConfig, prompt: list[int], new_tokens: int, caches: Sequence[bool],
                    dispatch: Optional[str], peer: Optional[str], weights, amp, device, seed: int,
                    say) -> list[Variant]:
    """The decode variants of one model: ours (and the HF peer) per cache mode."""
    moe = cfg.ffn.kind == "moe"
    ours = build_ours(cfg, dispatch if moe else None, seed, device).eval()
    hf = None
    if peer == "hf":
        if hf_supported(cfg):
            say(f"note: {name}: {hf_supported(cfg)}; skipped")
        else:
            hf = build_hf(cfg, ours, device=device).eval()
    if weights is not None:
        ours = ours.to(weights)
        hf = hf.to(weights) if hf is not None else None
    out = []
    for c in caches:
        out.append(Variant(name, "studylib", (dispatch or cfg.ffn.dispatch) if moe else None, cfg, cache=c,
                           net=ours, call=_ours_call(ours, prompt, new_tokens, c, amp)))
        if hf is not None:
            out.append(Variant(name, "hf", "eager" if moe else None, cfg, cache=c, net=hf,
                               call=_hf_call(hf, prompt, new_tokens, c, amp, device)))
    return out


def _decode_row(v: Variant, variants: Sequence[Variant], setup: dict) -> dict:
    """The frame row of ``v``; ``setup``: its dtype, prompt_len and new_tokens."""
    new_tokens = setup["new_tokens"]
    speed = speed_stats(v.times, new_tokens)
    hf = find(variants, model=v.model, impl="hf", cache=v.cache) if v.impl == "studylib" else None
    nc = find(variants, model=v.model, impl=v.impl, cache=False) if v.cache else None
    ours = find(variants, model=v.model, impl="studylib", cache=v.cache)
    return {
        "model": v.model, "impl": v.impl, "cache": v.cache, "dispatch": v.dispatch or "", **setup,
        "tok_s": speed["tok_s"], "tok_s_min": speed["tok_s_min"], "tok_s_max": speed["tok_s_max"],
        "ms_per_token": 1e3 * statistics.median(v.times) / new_tokens,
        "ratio_ref": speedup(find(variants, impl=v.impl, cache=v.cache), v),
        "ratio_hf": speedup(hf, v), "ratio_cache": speedup(nc, v),
        "same_tokens_as_ours": v.output == ours.output, "allocator": allocator_info(),
    }


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
    import pandas as pd  # kept out of the import path: the memory probe's baseline RSS excludes it

    device = torch.device(device)
    weights, amp, dtype = _decode_dtypes(dtype)
    say = progress_printer(progress)
    caches = [True, False] if no_cache_too else [True]
    g = torch.Generator().manual_seed(seed)
    variants = []
    for name, cfg in resolve_models(preset, models):
        if prompt_len + new_tokens > cfg.context:
            raise ConfigError(f"prompt_len + new_tokens = {prompt_len + new_tokens} exceeds "
                              f"{name}'s context of {cfg.context}")
        prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=g).tolist()
        variants += _model_variants(name, cfg, prompt, new_tokens, caches, dispatch, peer, weights, amp,
                                    device, seed, say)
    load0 = os.getloadavg()[0]
    say(f"bench decode: {len(variants)} variants, prompt {prompt_len}, {new_tokens} new tokens, {dtype}, "
        f"{torch.get_num_threads()} threads, allocator {allocator_info()}, load average {load0:.1f}")
    for i, timed in interleaved_rounds(variants, warmup, trials, device):
        if timed:
            say(f"trial {i}/{trials}: " + ", ".join(
                f"{v.model}/{v.impl}/{'cache' if v.cache else 'nocache'} "
                f"{new_tokens / v.times[-1]:,.0f}" for v in variants) + " tok/s")
    setup = {"dtype": dtype, "prompt_len": prompt_len, "new_tokens": new_tokens}
    df = pd.DataFrame([_decode_row(v, variants, setup) for v in variants])
    df.attrs.update(threads=torch.get_num_threads(), allocator=allocator_info(), torch=torch.__version__,
                    device=str(device), trials=trials, warmup=warmup, loadavg=(load0, os.getloadavg()[0]))
    return df
