"""Exact parameter accounting from a model config (torch-free).

SPEC Table 5: ``embedding`` (tied, V*D), ``non_ffn`` (attention projections, the two
RMSNorms of each layer and the final norm), ``ffn_total`` (dense FFNs + every expert),
``router`` (D*E per routed layer, reported separately), ``total`` (everything stored) and
``active`` (embedding + non-FFN + router + the FFN path one token uses: the dense FFN, k of E
experts plus the shared experts, or all K soft experts). The aux-loss-free balancing bias is a
buffer, not a parameter: it is not counted. ``count_params(cfg)`` equals ``sum(p.numel())`` of the built model.
(also :attr:`ModelConfig.num_params <studylib.config.schema.ModelConfig.num_params>`).

Training FLOPs per token (:func:`train_flops_per_token`), forward + backward = 3 x forward:
``6 * N_mm + 6 * L * S * d_attn`` where ``N_mm`` are the parameters a token multiplies by: the
active parameters without the RMSNorm gains, with the tied embedding counted once *as the LM-head
matmul* (the lookup is free) and the router included; ``L * S * d_attn`` is causal attention
(QK^T and AV each ``2 * S/2 * d_attn`` per token and layer on average, d_attn = heads * head_dim).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the schema imports this module
    from studylib.config.schema import FFNConfig, ModelConfig

FIELDS = ("embedding", "non_ffn", "ffn_total", "router", "total", "active")


@dataclass(frozen=True)
class ParamCount:
    name: str
    embedding: int
    non_ffn: int
    ffn_total: int
    ffn_active: int
    router: int

    @property
    def total(self) -> int:
        return self.embedding + self.non_ffn + self.ffn_total + self.router

    @property
    def active(self) -> int:
        return self.embedding + self.non_ffn + self.ffn_active + self.router

    def as_dict(self) -> dict:
        return {"name": self.name, **{k: int(getattr(self, k)) for k in FIELDS}}


def ffn_params(d_model: int, f: FFNConfig) -> tuple[int, int, int]:
    """(stored FFN/expert params, params one token uses, router params) of one layer."""
    one = 3 * d_model * f.hidden  # SwiGLU: gate, up (D x H each) and down (H x D)
    if f.kind == "dense":
        return one, one, 0
    router = 0 if f.router == "hash" else d_model * f.num_experts  # the hash router has no weight
    used = f.num_experts if f.kind == "soft" else f.top_k + f.n_shared  # shared experts: always active
    return one * (f.num_experts + f.n_shared), one * used, router


def count_params(cfg: ModelConfig) -> ParamCount:
    D, L = cfg.d_model, cfg.n_layers
    attn = D * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim + cfg.n_heads * cfg.head_dim * D
    non_ffn = L * (attn + 2 * D) + D
    ffn_total = ffn_active = router = 0
    for layer in range(L):
        t, a, r = ffn_params(D, cfg.ffn_for_layer(layer))
        ffn_total, ffn_active, router = ffn_total + t, ffn_active + a, router + r
    return ParamCount(cfg.name, cfg.vocab_size * D, non_ffn, ffn_total, ffn_active, router)


def norm_params(cfg: ModelConfig) -> int:
    """RMSNorm gains: two per layer and the final norm (stored, but no matmul)."""
    return (2 * cfg.n_layers + 1) * cfg.d_model


def train_flops_per_token(cfg: ModelConfig, seq: int) -> float:
    """Analytic training FLOPs per token at sequence length ``seq`` (see the module docstring)."""
    n_mm = count_params(cfg).active - norm_params(cfg)
    return 6.0 * n_mm + 6.0 * cfg.n_layers * seq * cfg.n_heads * cfg.head_dim


def fmt_m(n: int) -> str:
    """Millions at the paper's displayed precision (two decimals)."""
    return f"{n / 1e6:.2f}M"


def ffn_label(cfg: ModelConfig) -> str:
    """Short description of a model's FFN: ``dense 1120``, ``4x1024 top-2``, ``soft 4x432``."""
    f = cfg.ffn
    if f.kind == "dense":
        return f"dense {f.hidden}"
    if f.kind == "soft":
        return f"soft {f.num_experts}x{f.hidden}"
    return (f"{f.num_experts}x{f.hidden} top-{f.top_k}" + (f" +{f.n_shared} shared" if f.n_shared else "")
            + (f" {f.router} router" if f.router != "learned" else ""))
