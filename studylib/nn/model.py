"""LLaMA-style decoder: RoPE, pre-RMSNorm, GQA attention (SDPA, causal), SwiGLU/MoE FFN, tied embeddings.

No biases anywhere; dropout on the attention output and on the FFN path; final RMSNorm.
``Decoder.forward`` returns the loss and the router outputs (no global state): see ModelOutput.
With ``stats=True`` it also returns per-layer diagnostics and each token's expert weights.

Shape legend: B batch, S sequence, D model width, V vocab, Q query heads, G kv heads, A head dim.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from studylib.nn import gemv
from studylib.config import ModelConfig
from studylib.nn.ffn import DenseFFN, RouterOutput, SoftMoE, SparseMoE, _Experts, build_ffn
from studylib.nn.lm_loss import linear_cross_entropy


@dataclass
class ModelOutput:
    logits: Optional[torch.Tensor]  # (B, S, V) ((B, 1, V) with last_only); None when targets are given
    loss: Optional[torch.Tensor]  # mean next-token cross-entropy (targets already shifted)
    balance_loss: torch.Tensor  # mean over MoE layers of the Switch balance loss (0 if none)
    z_loss: torch.Tensor  # mean over MoE layers of the router z-loss (0 if none)
    aux_loss: torch.Tensor  # balance_coef * balance_loss + z_coef * z_loss (+ seq_balance_coef *
    # the mean sequence-wise balance loss) (add it to `loss`)
    router_stats: list = field(default_factory=list)  # per layer: dict of diagnostics or None
    token_routing: list = field(default_factory=list)  # per layer: (B, S, E) combine weights or None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(head_dim: int, length: int, theta: float, device=None):
    """cos/sin tables (S, A/2) for rotary embeddings (rotate-half convention)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def apply_rope(x_BHSA, cos_SA, sin_SA):
    """Rotate-half RoPE on the last dim; cos/sin broadcast against the other dims (S, A/2)."""
    x1, x2 = x_BHSA.chunk(2, dim=-1)
    cos, sin = cos_SA.to(x_BHSA.dtype), sin_SA.to(x_BHSA.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class KVCache:
    """Per-layer key/value buffers for incremental decoding (B, G, S_max, A)."""

    def __init__(self, cfg: ModelConfig, batch: int, device, dtype=torch.float32):
        shape = (batch, cfg.n_kv_heads, cfg.context, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)]
        self.pos = 0  # tokens already in the cache


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.Q, self.G, self.A = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wqkv = gemv.Linear(cfg.d_model, (self.Q + 2 * self.G) * self.A)
        self.wo = gemv.Linear(self.Q * self.A, cfg.d_model)

    def forward(self, x_BSD, cos, sin, cache: Optional[KVCache] = None, layer: int = 0):
        B, S, _ = x_BSD.shape
        qkv_BSXA = self.wqkv(x_BSD).view(B, S, self.Q + 2 * self.G, self.A)
        # one RoPE call for the query and key heads together (half the elementwise ops)
        qk_BSXA = apply_rope(qkv_BSXA[:, :, :self.Q + self.G], cos[:, None], sin[:, None])
        q = qk_BSXA[:, :, :self.Q].transpose(1, 2)
        k = qk_BSXA[:, :, self.Q:].transpose(1, 2)
        v = qkv_BSXA[:, :, self.Q + self.G:].transpose(1, 2)
        causal = True
        if cache is not None:
            p = cache.pos
            if p > 0 and S > 1:
                raise ValueError("KV cache: feed one token at a time after the prefill")
            cache.k[layer][:, :, p:p + S] = k
            cache.v[layer][:, :, p:p + S] = v
            k, v = cache.k[layer][:, :, :p + S], cache.v[layer][:, :, :p + S]
            causal = p == 0  # prefill is causal; a single new token sees the whole cache
        if q.device.type == "cpu" and self.A < 64:
            # measured: CPU flash attention in bf16 is ~2.5x slower than fp32 at head dim 32
            q, k, v = q.float(), k.float(), v.float()
        y = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), is_causal=causal,
                                           enable_gqa=self.G != self.Q)
        return self.wo(y.transpose(1, 2).reshape(B, S, self.Q * self.A).to(x_BSD.dtype))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = build_ffn(cfg.d_model, cfg.ffn_for_layer(layer))
        self.drop = nn.Dropout(cfg.dropout)
        self.layer = layer

    def forward(self, x, cos, sin, stats=False, cache=None, aux=True):
        x = x + self.drop(self.attn(self.attn_norm(x), cos, sin, cache, self.layer))
        h, router = self.ffn(self.ffn_norm(x), stats=stats, aux=aux)
        return x + self.drop(h), router


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        cos, sin = rope_tables(cfg.head_dim, cfg.context, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    # ---- initialisation -------------------------------------------------------------------
    @torch.no_grad()
    def reset_parameters(self):
        """N(0, init_std) everywhere; residual output projections scaled by 1/sqrt(2L);
        norms at 1; the soft-MoE router at 0, so its gate starts exactly uniform.

        ``cfg.expert_init == "fan_in"`` (seed 003, SPEC section 4: "experts use fan-in init")
        instead draws each expert's weights, in soft and routed MoE layers, with std 1/sqrt(fan_in):
        the gate/up projection ``w_in`` (2H x D, fan-in D = d_model) with std 1/sqrt(D), the down
        projection ``w_out`` (D x H, fan-in H = the expert's hidden size) with std 1/sqrt(H), no
        1/sqrt(2L) residual scaling (seed 003 section 5.4: all its reported runs use fan-in expert
        init; the "scaled" variant of its section 3.4 is not reproduced). Routers keep their init
        (soft: 0, so the gate starts uniform; routed: N(0, init_std)), as do dense FFN layers,
        attention and embeddings. With a uniform soft gate the layer's output is then 1/K of the wide dense
        SwiGLU's (seed 003's step-0 residual ratio ~1/K). The default ``"normal"`` draws exactly
        what it drew before the option existed (same RNG calls in the same order).
        """
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        fan_in = self.cfg.expert_init == "fan_in"
        nn.init.normal_(self.tok_emb.weight, std=std)
        for blk in self.blocks:
            nn.init.normal_(blk.attn.wqkv.weight, std=std)
            nn.init.normal_(blk.attn.wo.weight, std=out_std)
            f = blk.ffn
            if isinstance(f, DenseFFN):
                nn.init.normal_(f.w_in.weight, std=std)
                nn.init.normal_(f.w_out.weight, std=out_std)
            else:
                D, H = f.w_in_EFD.shape[2], f.w_out_EDH.shape[2]  # fan-ins of w_in (E,2H,D), w_out (E,D,H)
                nn.init.normal_(f.w_in_EFD, std=1 / math.sqrt(D) if fan_in else std)
                nn.init.normal_(f.w_out_EDH, std=1 / math.sqrt(H) if fan_in else out_std)
                if isinstance(f, SoftMoE):
                    nn.init.zeros_(f.router.weight)
                else:
                    nn.init.normal_(f.router.weight, std=std)
                if getattr(f, "shared", None) is not None:  # shared experts: as an expert (after the
                    nn.init.normal_(f.shared.w_in.weight, std=1 / math.sqrt(D) if fan_in else std)  # draws
                    nn.init.normal_(f.shared.w_out.weight,  # of models without them, unchanged)
                                    std=1 / math.sqrt(f.shared.hidden // f.cfg.n_shared) if fan_in else out_std)
            blk.attn_norm.weight.fill_(1.0)
            blk.ffn_norm.weight.fill_(1.0)
        self.norm.weight.fill_(1.0)

    # ---- routing switches -----------------------------------------------------------------
    def set_router_mode(self, mode: str, layers: Optional[list[int]] = None) -> None:
        """Force routers to ``uniform`` / ``balanced`` (or back to ``learned``) on some layers."""
        if mode not in ("learned", "uniform", "balanced"):
            raise ValueError(f"router mode must be learned, uniform or balanced, got {mode!r}")
        for i, blk in enumerate(self.blocks):
            if isinstance(blk.ffn, _Experts) and (layers is None or i in layers):
                if mode == "balanced" and isinstance(blk.ffn, SoftMoE):
                    raise ValueError(f"layer {i}: 'balanced' applies to the sparse MoE only")
                blk.ffn.router_mode = mode

    def update_router_biases(self, all_reduce=None) -> None:
        """Aux-loss-free balancing: one bias update per MoE layer with ``bias_balance``, from the
        assignments counted since the last update (the trainer calls this once per optimizer step;
        ``all_reduce`` sums the counts over DDP ranks in place)."""
        layers = [b.ffn for b in self.blocks if isinstance(b.ffn, SparseMoE) and b.ffn.cfg.bias_balance]
        if not layers:
            return
        E = layers[0].cfg.num_experts
        ref = layers[0].expert_bias_E
        loads = torch.stack([f.load_E if f.load_E is not None else torch.zeros(E, dtype=torch.long, device=ref.device)
                             for f in layers]).to(torch.float64)
        if all_reduce is not None:
            all_reduce(loads)
        for f, load_E in zip(layers, loads):
            f.update_bias(load_E)

    def global_balance_layers(self) -> list:
        """The MoE layers whose balance loss counts the loads of the whole optimizer step."""
        return [b.ffn for b in self.blocks if isinstance(b.ffn, SparseMoE) and b.ffn.cfg.balance_scope == "global"]

    @torch.no_grad()
    def set_global_loads(self, inputs: list, all_reduce=None) -> None:
        """The global-batch balance loss (``balance_scope: global``): route every micro-batch of
        the coming optimizer step once (``inputs``: this rank's input windows, B x S each; eval
        mode, so no dropout and no RNG draw), sum the assignments over them and over the ranks
        (``all_reduce``), and give each layer those shares as the f of its balance loss until
        :meth:`clear_global_loads`. With dropout 0 the routing is the training forward's exactly,
        so with one micro-batch and one rank the loss equals the micro-batch loss."""
        layers = self.global_balance_layers()
        if not layers:
            return
        was = self.training
        self.eval()
        try:
            for f in layers:
                f.tally_E = torch.zeros(f.cfg.num_experts, dtype=torch.float64, device=f.router.weight.device)
            for x in inputs:
                self(x, aux_losses=False, return_logits=True, last_only=True)
            counts = torch.stack([f.tally_E for f in layers])
        finally:
            for f in layers:
                f.tally_E = None
            self.train(was)
        if all_reduce is not None:
            all_reduce(counts)
        for f, c in zip(layers, counts):
            f.global_share_E = (c / c.sum().clamp_min(1)).to(torch.float32)

    def clear_global_loads(self) -> None:
        for f in self.global_balance_layers():
            f.global_share_E = None

    def routed_layers(self) -> list[int]:
        return [i for i, b in enumerate(self.blocks) if isinstance(b.ffn, _Experts)]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---- forward --------------------------------------------------------------------------
    def forward(self, idx_BS, targets_BS=None, *, stats: bool = False, cache: Optional[KVCache] = None,
                return_logits: bool = False, last_only: bool = False,
                aux_losses: bool = True) -> ModelOutput:
        """``aux_losses=False`` skips the router losses (they come back as zeros): for decoding."""
        B, S = idx_BS.shape
        p = cache.pos if cache is not None else 0
        if p + S > self.cfg.context:
            raise ValueError(f"sequence of {p + S} tokens exceeds the model context {self.cfg.context}")
        cos, sin = self.rope_cos[p:p + S], self.rope_sin[p:p + S]
        x = self.tok_emb(idx_BS)
        routers: list[Optional[RouterOutput]] = []
        for blk in self.blocks:
            x, r = blk(x, cos, sin, stats=stats, cache=cache, aux=aux_losses)
            routers.append(r)
        if cache is not None:
            cache.pos += S
        h = self.norm(x)
        logits = loss = None
        if targets_BS is not None and not return_logits:  # fused chunked LM head + CE (no logits kept)
            loss = linear_cross_entropy(h.reshape(B * S, -1), self.tok_emb.weight, targets_BS.reshape(-1))
        else:
            if last_only:  # decoding needs the next-token logits only (S-fold less LM-head work)
                h = h[:, -1:]
            if last_only and gemv.one_row(h):
                logits = h @ gemv.transposed(self, self.tok_emb.weight, "head")  # see studylib.nn.gemv
            else:
                logits = F.linear(h, self.tok_emb.weight)  # tied output embedding
            if targets_BS is not None:
                loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets_BS.reshape(-1))
        moe = [r for blk, r in zip(self.blocks, routers) if isinstance(blk.ffn, SparseMoE)] if aux_losses else []
        zero = x.new_zeros((), dtype=torch.float32)
        bal = torch.stack([r.balance for r in moe]).mean() if moe else zero
        z = torch.stack([r.z for r in moe]).mean() if moe else zero
        f = self.cfg.ffn
        aux = f.balance_coef * bal + f.z_coef * z if moe else zero
        seq = [r.seq_balance for r in moe if r.seq_balance is not None]
        if seq:
            aux = aux + f.seq_balance_coef * torch.stack(seq).mean()
        return ModelOutput(
            logits=logits, loss=loss, balance_loss=bal, z_loss=z, aux_loss=aux,
            router_stats=[r.stats if r is not None else None for r in routers],
            token_routing=[r.token_weights.view(B, S, -1) if r is not None and r.token_weights is not None
                           else None for r in routers],
        )
