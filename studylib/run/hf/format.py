"""The ONE mapping between a studylib decoder and transformers' ``LlamaForCausalLM`` (dense) /
``MixtralForCausalLM`` (softmax top-k MoE) / ``Qwen2MoeForCausalLM`` (softmax top-k with shared
experts or the router probability as the weight) / ``Glm4MoeForCausalLM`` (sigmoid-scored MoE: the
router variants of issue #21): which configs it can represent, the HF config, and the weights
under HF's names. Used by the export (:mod:`studylib.run.hf.export`) and by the benchmark's HF peer.

Why Glm4Moe for the sigmoid variants: it keeps standard grouped-query attention (with
``use_qk_norm: false``, ``attention_bias: false`` and ``partial_rotary_factor: 1.0`` it is this
decoder's attention exactly) and holds sigmoid scores, the selection bias
(``e_score_correction_bias``), shared experts (one MLP of ``n_shared * hidden``),
``norm_topk_prob`` and ``routed_scaling_factor``; ``first_k_dense_replace: 0`` makes every layer an
MoE. Dots1 holds the same router but always normalises q and k (qk-norm), and DeepseekV3 uses
multi-head latent attention: neither holds this attention. Qwen2Moe holds softmax routing with
``norm_topk_prob`` either way and a shared expert (``qkv_bias: false``); it gates the shared expert
with ``sigmoid(x w)``: exported with ``w = 0`` (a gate of exactly 0.5) and the shared expert's down
projection doubled (exact in floating point), its output is the shared expert's. No class selects
top-k over *softmax* scores plus a bias or scales softmax weights: those variants are refused.
The router controls: a frozen router is a learned one whose weight stayed at its initial value
(exported as any router); the hash router (experts by token id, no weight) is refused.

Numerically the models are LLaMA / Mixtral: rotate-half RoPE, SwiGLU (our fused ``w_in`` rows are
gate then up), RMSNorm, GQA (our ``wqkv`` rows are the Q heads, then K, then V), tied embeddings and
Mixtral's renormalised top-k gate. ``ffn.router_scale`` is folded into the gate weight.

Two transformers layouts are supported: 4.x keeps the Mixtral experts as separate modules
(``block_sparse_moe.experts.N.w1|w2|w3``) and reads ``rope_theta``; 5.x fuses them
(``mlp.experts.gate_up_proj`` / ``down_proj``) and reads ``rope_parameters``. Files on disk use the
4.x names (5.x converts them when loading), and config.json carries both rope fields, so one export
loads in either. torch and transformers are imported inside functions only.
"""
from __future__ import annotations

from typing import Optional

from studylib.config import ConfigError, ModelConfig

LEGACY, FUSED = "legacy", "fused"


def refusal(cfg: ModelConfig) -> Optional[str]:
    """None if transformers can represent ``cfg`` exactly, else the reason it cannot."""
    f = cfg.ffn
    if f.kind == "soft":
        return "ffn.kind=soft: the soft (always-active) MoE has no transformers architecture"
    if f.kind == "moe" and f.layers is not None and set(f.layers) != set(range(cfg.n_layers)):
        return (f"ffn.layers={list(f.layers)}: mixed FFN kinds across layers (dense and MoE) have no "
                f"transformers architecture")
    if f.kind == "moe" and f.router == "hash":
        return "ffn.router=hash: no transformers class routes by token id (the hash router has no weight)"
    if f.kind == "moe" and f.score == "sigmoid":
        return None  # Glm4Moe holds every sigmoid variant (bias, shared experts, scale, normalisation)
    if f.kind == "moe" and f.bias_balance:
        return ("ffn.bias_balance with softmax scores: no transformers class selects the top-k over softmax "
                "scores plus a bias (Glm4Moe, Dots1 and DeepseekV3 score with a sigmoid: use ffn.score=sigmoid)")
    if f.kind == "moe" and f.route_scale != 1.0:
        return ("ffn.route_scale with softmax scores: neither Mixtral nor Qwen2Moe has a routed scaling "
                "factor (Glm4Moe has, with ffn.score=sigmoid)")
    return None


def check(cfg: ModelConfig) -> None:
    """Raise ConfigError naming the reason when ``cfg`` cannot be written in the HF format."""
    why = refusal(cfg)
    if why:
        raise ConfigError(f"{cfg.name}: cannot be written in the Hugging Face format: {why}")


#: family -> (architecture, config class, model_type)
FAMILIES = {"llama": ("LlamaForCausalLM", "LlamaConfig", "llama"),
            "mixtral": ("MixtralForCausalLM", "MixtralConfig", "mixtral"),
            "qwen2_moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", "qwen2_moe"),
            "glm4_moe": ("Glm4MoeForCausalLM", "Glm4MoeConfig", "glm4_moe")}


def family(cfg: ModelConfig) -> str:
    if cfg.ffn.kind == "dense":
        return "llama"
    f = cfg.ffn
    if f.score == "sigmoid":
        return "glm4_moe"
    return "qwen2_moe" if f.n_shared or not f.renormalize else "mixtral"


def architecture(cfg: ModelConfig) -> str:
    return FAMILIES[family(cfg)][0]


def transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def hf_aux_coef(cfg: ModelConfig) -> float:
    """HF Mixtral's ``router_aux_loss_coef`` meaning our ``balance_coef``: HF's per-layer balance
    loss counts the k assignments of a token (its f sums to k), ours normalises f to 1."""
    return cfg.ffn.balance_coef / cfg.ffn.top_k


def config_kwargs(cfg: ModelConfig, attention_dropout: float = 0.0, bos_id=None, eos_id=None,
                  pad_id=0) -> dict:
    """Keyword arguments of the HF config (plain values, both rope fields)."""
    kw = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn.hidden,
              num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
              num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, hidden_act="silu",
              max_position_embeddings=cfg.context, rms_norm_eps=cfg.norm_eps,
              tie_word_embeddings=True, attention_dropout=attention_dropout,
              bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    f = cfg.ffn
    if cfg.ffn.kind == "dense":
        kw.update(attention_bias=False, mlp_bias=False)
    elif family(cfg) == "glm4_moe":
        kw.update(moe_intermediate_size=f.hidden, n_routed_experts=f.num_experts, num_experts_per_tok=f.top_k,
                  n_shared_experts=f.n_shared, first_k_dense_replace=0, norm_topk_prob=f.renormalize,
                  routed_scaling_factor=f.route_scale, n_group=1, topk_group=1, use_qk_norm=False,
                  attention_bias=False, partial_rotary_factor=1.0)
    elif family(cfg) == "qwen2_moe":
        kw.update(moe_intermediate_size=f.hidden, shared_expert_intermediate_size=f.n_shared * f.hidden,
                  num_experts=f.num_experts, num_experts_per_tok=f.top_k, norm_topk_prob=f.renormalize,
                  decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=False, use_sliding_window=False,
                  router_aux_loss_coef=hf_aux_coef(cfg), output_router_logits=f.balance_coef > 0)
    else:
        kw.update(num_local_experts=cfg.ffn.num_experts, num_experts_per_tok=cfg.ffn.top_k,
                  router_aux_loss_coef=hf_aux_coef(cfg), router_jitter_noise=0.0,
                  output_router_logits=cfg.ffn.balance_coef > 0)
    return kw


def hf_config(cfg: ModelConfig, experts: str = "eager", attention_dropout: float = 0.0, **ids):
    """The transformers config of the same architecture, for the installed transformers."""
    import transformers

    check(cfg)
    kw = config_kwargs(cfg, attention_dropout, **ids)
    if transformers_major() >= 5:
        kw["rope_parameters"] = rope_parameters(cfg)
    else:
        kw["rope_theta"] = cfg.rope_theta
    c = getattr(transformers, FAMILIES[family(cfg)][1])(**kw)
    if cfg.ffn.kind != "dense":
        c._experts_implementation = experts
    c._attn_implementation = "sdpa"
    got = (c.rope_parameters or {}).get("rope_theta") if hasattr(c, "rope_parameters") else c.rope_theta
    if got is not None and float(got) != float(cfg.rope_theta):
        raise ConfigError(f"{cfg.name}: transformers kept rope_theta={got}, expected {cfg.rope_theta}")
    return c


def rope_parameters(cfg: ModelConfig) -> dict:
    out = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if family(cfg) == "glm4_moe":
        out["partial_rotary_factor"] = 1.0  # Glm4Moe's default rotates half of each head
    return out


def state_dict(model, layout: str = LEGACY) -> dict:
    """Our weights under HF's state-dict names (``layout``: LEGACY = 4.x / on-disk, FUSED = 5.x)."""
    import torch

    cfg = model.cfg
    check(cfg)
    Q, G, A = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    sd = {"model.embed_tokens.weight": model.tok_emb.weight, "model.norm.weight": model.norm.weight}
    for i, b in enumerate(model.blocks):
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
            continue
        router = f.router.weight * f.cfg.router_scale if f.cfg.router_scale != 1.0 else f.router.weight
        if family(cfg) in ("glm4_moe", "qwen2_moe"):
            sd.update(_shared_moe(family(cfg), p, f, router, layout))
            continue
        if layout == FUSED:
            sd.update({p + "mlp.gate.weight": router, p + "mlp.experts.gate_up_proj": f.w_in_EFD,
                       p + "mlp.experts.down_proj": f.w_out_EDH})
        else:
            m = p + "block_sparse_moe."
            sd[m + "gate.weight"] = router
            for e in range(f.w_in_EFD.shape[0]):
                gate, up = f.w_in_EFD[e].chunk(2, 0)
                sd.update({f"{m}experts.{e}.w1.weight": gate, f"{m}experts.{e}.w3.weight": up,
                           f"{m}experts.{e}.w2.weight": f.w_out_EDH[e]})
    return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in sd.items()}


def _shared_moe(fam: str, p: str, f, router, layout: str) -> dict:
    """One Glm4Moe / Qwen2Moe MoE layer: router (Glm4Moe: and its selection bias, zeros without
    bias balancing), experts (fused in 5.x, per expert on disk, as save_pretrained writes them) and
    the shared experts' one MLP (width 0 without them; Qwen2Moe: gate 0.5, down projection x 2)."""
    import torch

    m = p + "mlp."
    sd = {m + "gate.weight": router}
    if fam == "glm4_moe":
        sd[m + "gate.e_score_correction_bias"] = (f.router.bias_E if f.cfg.bias_balance
                                                  else torch.zeros(f.cfg.num_experts))
    if layout == FUSED:
        sd.update({m + "experts.gate_up_proj": f.w_in_EFD, m + "experts.down_proj": f.w_out_EDH})
    else:
        for e in range(f.w_in_EFD.shape[0]):
            gate, up = f.w_in_EFD[e].chunk(2, 0)
            sd.update({f"{m}experts.{e}.gate_proj.weight": gate, f"{m}experts.{e}.up_proj.weight": up,
                       f"{m}experts.{e}.down_proj.weight": f.w_out_EDH[e]})
    D = f.w_in_EFD.shape[2]
    if f.shared is not None:
        gate, up = f.shared.w_in.weight.chunk(2, 0)
        down = f.shared.w_out.weight
    else:
        gate = up = f.w_in_EFD.new_zeros(0, D)
        down = f.w_in_EFD.new_zeros(D, 0)
    shared = m + ("shared_experts." if fam == "glm4_moe" else "shared_expert.")
    if fam == "qwen2_moe":
        down = down * 2  # sigmoid(0) = 0.5 halves it back, exactly
        sd[m + "shared_expert_gate.weight"] = f.w_in_EFD.new_zeros(1, D)
    sd.update({shared + "gate_proj.weight": gate, shared + "up_proj.weight": up, shared + "down_proj.weight": down})
    return sd


def layout_of(hf_model) -> str:
    """FUSED if the HF model keeps fused expert tensors (transformers 5.x), else LEGACY."""
    return FUSED if any(k.endswith("experts.gate_up_proj") for k in hf_model.state_dict()) else LEGACY


def copy_to_hf(ours, hf) -> None:
    """Load our weights into an HF model (exact mapping; raises on any name or shape mismatch)."""
    import torch

    sd = state_dict(ours, layout_of(hf))
    own = hf.state_dict()
    missing = [k for k in own if k not in sd and k != "lm_head.weight"]
    extra = [k for k in sd if k not in own]
    if missing or extra:
        raise RuntimeError(f"HF layout differs: missing {missing[:4]}, unexpected {extra[:4]}")
    with torch.no_grad():
        for k, v in sd.items():
            if own[k].shape != v.shape:
                raise RuntimeError(f"HF {k}: shape {tuple(own[k].shape)} != ours {tuple(v.shape)}")
            own[k].copy_(v)
    if hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("HF model: the LM head is not tied to the embedding")


def build_hf(cfg: ModelConfig, ours=None, experts: str = "eager", device="cpu",
             attention_dropout: float = 0.0, use_cache: bool = True):
    """transformers' LlamaForCausalLM / MixtralForCausalLM of ``cfg`` (with ``ours``' weights)."""
    import transformers

    hc = hf_config(cfg, experts, attention_dropout)
    hc.use_cache = use_cache
    m = getattr(transformers, architecture(cfg))(hc)
    if ours is not None:
        copy_to_hf(ours, m)
    return m.to(device)


def config_dict(cfg: ModelConfig, **ids) -> dict:
    """config.json for an export: both rope fields, so transformers 4.x and 5.x read the same."""
    kw = config_kwargs(cfg, 0.0, **ids)
    kw.update(architectures=[architecture(cfg)], model_type=FAMILIES[family(cfg)][2],
              rope_theta=cfg.rope_theta, rope_parameters=rope_parameters(cfg),
              torch_dtype="float32", dtype="float32", use_cache=True)
    return kw
