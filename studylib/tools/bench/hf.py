"""The transformers peer: the same architecture as transformers' ``LlamaForCausalLM`` (dense) or
``MixtralForCausalLM`` (MoE), with our weights copied in, so both sides start from the same point
and route the same tokens. transformers is optional (``pip install studylib[bench]``) and imported
only when a peer is built.

Dropout: SPEC puts dropout on the attention output and on the FFN path; HF's Llama / Mixtral have
no such dropout, only dropout on the attention probabilities (``attention_dropout``), which the
peer gets at the same rate. That is the closest HF config, but not the same computation, and on
the CPU HF's attention-probability dropout is expensive (its dense active-match step is ~1.6x
slower with it). ``bench train --dropout 0`` compares identical computations (same weights, same
loss) on both sides; the README gives both.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn as nn

from studylib.config import ConfigError, ModelConfig


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


def _hf_state(ours: nn.Module) -> dict:
    """Our weights under the HF peer's state-dict names."""
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
    return sd


@torch.no_grad()
def copy_to_hf(ours: nn.Module, hf: nn.Module) -> None:
    """Load our weights into the HF peer (exact mapping; raises on any shape/name mismatch)."""
    sd = _hf_state(ours)
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


def hf_generate(m: nn.Module, prompt: Sequence[int], new_tokens: int, use_cache: bool) -> list[int]:
    """HF ``generate``: greedy, exactly ``new_tokens`` new tokens after ``prompt`` (batch 1)."""
    ids = torch.tensor([prompt], device=next(m.parameters()).device)
    out = m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                     min_new_tokens=new_tokens, do_sample=False, use_cache=use_cache, pad_token_id=0,
                     eos_token_id=None, bos_token_id=None)
    return out[0, len(prompt):].tolist()
