"""The benchmark variant (the one type both benches time) and the models it is built from.

A :class:`Variant` is one thing a round times once: a model of the preset built one way (ours or
the transformers peer, an MoE dispatch path, eager or compiled, with or without the KV cache),
the call that runs it, and its per-round measurements. Also here: resolving which models to
benchmark from a preset, the config tweaks the benches apply (context, dropout) and building our
model with a fixed seed.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
import torch.nn as nn

from studylib.config import ConfigError, ModelConfig, Preset, load_preset, model_from_dict, preset_from_dict
from studylib.nn.model import Decoder
from studylib.run.dist import resolve_device

DISPATCHES = ("naive", "grouped", "stacked")
COMPILE_MODES = ("off", "on", "both")


@dataclass(eq=False)  # identity: a variant holds a model and its measurements
class Variant:
    """One timed variant and what the interleaved rounds recorded for it."""
    model: str
    impl: str  # "studylib" or "hf"
    dispatch: Optional[str]  # the MoE dispatch path (None: dense, or the preset's own)
    cfg: ModelConfig
    compiled: bool = False  # ours wrapped in torch.compile (train)
    cache: bool = True  # decoding with the KV cache (decode)
    net: Optional[nn.Module] = None
    opt: Any = None  # the optimizer (train)
    n_params: int = 0  # parameters stored in the built model
    call: Optional[Callable[[], Any]] = None  # what one round runs and times
    output: Any = None  # the last call's result (decode: the generated tokens)
    times: list = field(default_factory=list)  # wall seconds per timed call
    cpu: list = field(default_factory=list)  # process CPU seconds (user, sys) per timed call
    cpu_total: list = field(default_factory=list)  # process CPU seconds per timed call (ns resolution)
    faults: list = field(default_factory=list)  # minor page faults per timed call

    @property
    def label(self) -> str:
        return f"{self.model}" + (f"[{self.dispatch}]" if self.dispatch else "") + \
            ("" if self.impl == "studylib" else f" ({self.impl})") + (" +compile" if self.compiled else "")


def find(variants: Sequence[Variant], **attrs) -> Optional[Variant]:
    """The first variant whose attributes equal ``attrs``, or None."""
    return next((v for v in variants if all(getattr(v, k) == x for k, x in attrs.items())), None)


def resolve_models(preset: Any, models: Optional[Sequence[str]] = None) -> list[tuple[str, ModelConfig]]:
    """(name, config) pairs from a Preset, a preset YAML path, a raw preset dict, or a
    ``{name: ModelConfig or model dict}`` mapping. Default models: the preset's ``study.headline``
    (else all of them)."""
    if isinstance(preset, (str, os.PathLike)):
        preset = load_preset(preset)
    elif isinstance(preset, Mapping) and "models" in preset and "data" in preset:
        preset = preset_from_dict(dict(preset))
    if isinstance(preset, Preset):
        names = list(models) if models else list(preset.study.headline or preset.model_names())
        return [(n, preset.model_config(n)) for n in names]
    if isinstance(preset, Mapping):
        return _models_from_mapping(preset, models)
    raise TypeError(f"preset: expected a Preset, a path or a mapping, got {type(preset).__name__}")


def _models_from_mapping(configs: Mapping, models: Optional[Sequence[str]]) -> list[tuple[str, ModelConfig]]:
    names = list(models) if models else list(configs)
    out = []
    for n in names:
        if n not in configs:
            raise ConfigError(f"--models: no model named {n!r}; allowed: {sorted(configs)}")
        c = configs[n]
        out.append((n, c if isinstance(c, ModelConfig) else model_from_dict(dict(c), where=n)))
    return out


def with_context(cfg: ModelConfig, context: int, dropout: Optional[float] = None) -> ModelConfig:
    """``cfg`` with at least ``context`` positions and, when given, dropout ``dropout``."""
    if dropout is not None and dropout != cfg.dropout:
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"--dropout: must be in [0, 1), got {dropout}")
        cfg = dataclasses.replace(cfg, dropout=dropout)
    return cfg if cfg.context >= context else dataclasses.replace(cfg, context=context)


def build_ours(cfg: ModelConfig, dispatch: Optional[str] = None, seed: int = 0, device="cpu") -> nn.Module:
    """Our Decoder of ``cfg`` (the MoE on ``dispatch`` when given), initialised from ``seed``."""
    if dispatch is not None and cfg.ffn.kind == "moe":
        cfg = dataclasses.replace(cfg, ffn=dataclasses.replace(cfg.ffn, dispatch=dispatch))
    torch.manual_seed(seed)
    return Decoder(cfg).to(device)


def built_params(m: nn.Module) -> int:
    """Parameters stored in a built module, shared (tied) tensors once."""
    return sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())


def bench_device(preset: Preset) -> str:
    """Where the preset's runs train (``train.device``, ``auto``: CUDA when available), for the
    benchmarks to time the same device."""
    return str(resolve_device(preset.train))
