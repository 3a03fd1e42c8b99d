"""The transformers peer: the same architecture as transformers' ``LlamaForCausalLM`` (dense) or
``MixtralForCausalLM`` (MoE), with our weights copied in, so both sides start from the same point
and route the same tokens. transformers is optional (``pip install studylib[bench]``) and imported
only when a peer is built. The config and weight mapping is :mod:`studylib.run.hf.format`
(shared with ``python -m studylib export``).

Dropout: SPEC puts dropout on the attention output and on the FFN path; HF's Llama / Mixtral have
no such dropout, only dropout on the attention probabilities (``attention_dropout``), which the
peer gets at the same rate. That is the closest HF config, but not the same computation, and on
the CPU HF's attention-probability dropout is expensive (its dense active-match step is ~1.6x
slower with it). ``bench train --dropout 0`` compares identical computations (same weights, same
loss) on both sides; docs/measurements.md gives both.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn as nn

from studylib.config import ModelConfig
from studylib.run.hf import format as hf_format


def hf_supported(cfg: ModelConfig) -> Optional[str]:
    """None if an HF peer exists for this config, else why not (:func:`studylib.run.hf.format.refusal`)."""
    return hf_format.refusal(cfg)


def hf_config(cfg: ModelConfig, experts: str = "eager"):
    """The transformers config of the peer: the export's mapping, with the attention-probability
    dropout at the run's rate and the router logits returned (HF adds the balance loss)."""
    c = hf_format.hf_config(cfg, experts, attention_dropout=cfg.dropout)
    c.use_cache = False
    if cfg.ffn.kind == "moe":
        c.output_router_logits = True
    return c


copy_to_hf = hf_format.copy_to_hf


def build_hf(cfg: ModelConfig, ours: Optional[nn.Module] = None, experts: str = "eager",
             device="cpu") -> nn.Module:
    """transformers' LlamaForCausalLM / MixtralForCausalLM of ``cfg`` (with ``ours``' weights);
    ConfigError naming the reason when transformers cannot represent ``cfg``."""
    import transformers

    m = getattr(transformers, hf_format.architecture(cfg))(hf_config(cfg, experts))
    if ours is not None:
        copy_to_hf(ours, m)
    return m.to(device)


def hf_generate(m: nn.Module, prompt: Sequence[int], new_tokens: int, use_cache: bool) -> list[int]:
    """HF ``generate``: greedy, exactly ``new_tokens`` new tokens after ``prompt`` (batch 1)."""
    ids = torch.tensor([prompt], device=next(m.parameters()).device)
    out = m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                     min_new_tokens=new_tokens, do_sample=False, use_cache=use_cache, pad_token_id=0,
                     eos_token_id=None, bos_token_id=None)
    return out[0, len(prompt):].tolist()
