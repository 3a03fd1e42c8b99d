"""LLaMA-style decoder: RoPE, pre-RMSNorm, GQA attention (SDPA, causal), SwiGLU/MoE FFN, tied embeddings.

No biases anywhere; dropout on the attention output and on the FFN path; final RMSNorm.
``Decoder.forward`` returns the loss, the router losses and each routed layer's routing record
(no global state): see ModelOutput. With ``stats=True`` it also returns per-layer diagnostics.
Each module initialises its own weights (``init_weights``), each tensor from its own generator
keyed by the model's init key and the tensor's name (:mod:`studylib.nn.init`): models built under
one seed hold equal values in every tensor they share.

Shape legend: B batch, S sequence, D model width, V vocab, Q query heads, G kv heads, A head dim.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from studylib.nn import gemv, router
from studylib.nn.init import Draw, draw_key
from studylib.config import ModelConfig
from studylib.nn.ffn import RouterOutput, SoftMoE, SparseMoE, _Experts, build_ffn
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
    routing: list = field(default_factory=list)  # per layer: its studylib.nn.router.Routing record
    # (detached; the B*S tokens in order) or None (dense)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    @torch.no_grad()
    def init_weights(self) -> None:
        self.weight.fill_(1.0)

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

    @torch.no_grad()
    def init_weights(self, draw: Draw, std: float, out_std: float) -> None:
        draw.normal_(self.wqkv.weight, std, "wqkv")
        draw.normal_(self.wo.weight, out_std, "wo")

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
        self.ffn = build_ffn(cfg.d_model, cfg.ffn_for_layer(layer), cfg.vocab_size)
        self.drop = nn.Dropout(cfg.dropout)
        self.layer = layer

    def init_weights(self, draw: Draw, std: float, out_std: float, expert_init: str) -> None:
        self.attn.init_weights(draw / "attn", std, out_std)
        self.ffn.init_weights(draw / "ffn", std, out_std, expert_init)
        self.attn_norm.init_weights()
        self.ffn_norm.init_weights()

    def forward(self, x, cos, sin, stats=False, cache=None, aux=True, ids=None):
        x = x + self.drop(self.attn(self.attn_norm(x), cos, sin, cache, self.layer))
        h, out = self.ffn(self.ffn_norm(x), stats=stats, aux=aux, ids_BS=ids)
        return x + self.drop(h), out


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.init_key = draw_key()  # first, so no construction draw moves it (studylib.nn.init)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        cos, sin = rope_tables(cfg.head_dim, cfg.context, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    # ---- initialisation -------------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self):
        """N(0, init_std) everywhere; residual output projections scaled by 1/sqrt(2L);
        norms at 1; the soft-MoE router at 0, so its gate starts exactly uniform. Each module
        draws its own (``init_weights``), each tensor by its name from ``self.init_key``
        (:class:`~studylib.nn.init.Draw`): ``tok_emb``, ``blocks.<i>.attn.wqkv`` / ``.wo``,
        ``blocks.<i>.ffn.w_in.<e>`` / ``.w_out.<e>`` per expert e (a dense FFN is expert 0),
        ``blocks.<i>.ffn.router``, ``blocks.<i>.ffn.shared.w_in.0`` / ``.w_out.0``.

        ``cfg.expert_init == "fan_in"`` (seed 003, SPEC section 4: "experts use fan-in init")
        instead draws each expert's weights, in soft and routed MoE layers, with std 1/sqrt(fan_in):
        the gate/up projection ``w_in`` (2H x D, fan-in D = d_model) with std 1/sqrt(D), the down
        projection ``w_out`` (D x H, fan-in H = the expert's hidden size) with std 1/sqrt(H), no
        1/sqrt(2L) residual scaling (seed 003 section 5.4: all its reported runs use fan-in expert
        init; the "scaled" variant of its section 3.4 is not reproduced). Routers keep their init
        (soft: 0, so the gate starts uniform; routed: N(0, init_std)), as do dense FFN layers,
        attention and embeddings. With a uniform soft gate the layer's output is then 1/K of the wide dense
        SwiGLU's (seed 003's step-0 residual ratio ~1/K).
        """
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        draw = Draw(self.init_key)
        draw.normal_(self.tok_emb.weight, std, "tok_emb")
        for i, blk in enumerate(self.blocks):
            blk.init_weights(draw / f"blocks.{i}", std, out_std, self.cfg.expert_init)
        self.norm.init_weights()

    # ---- routing switches -----------------------------------------------------------------
    def set_router_mode(self, mode: str, layers: Optional[list[int]] = None) -> None:
        """Force routers to ``uniform`` / ``balanced`` (or back to ``learned``) on some layers."""
        if mode not in router.MODES:
            raise ValueError(f"router mode must be learned, uniform or balanced, got {mode!r}")
        for i, blk in enumerate(self.blocks):
            if isinstance(blk.ffn, _Experts) and (layers is None or i in layers):
                if mode == "balanced" and isinstance(blk.ffn, SoftMoE):
                    raise ValueError(f"layer {i}: 'balanced' applies to the sparse MoE only")
                blk.ffn.router.mode = mode

    def routers(self) -> list[router.Router]:
        """The routed layers' routers, in layer order."""
        return [b.ffn.router for b in self.blocks if isinstance(b.ffn, _Experts)]

    @contextlib.contextmanager
    def routing_step(self, inputs: Callable[[], Iterable[torch.Tensor]],
                     all_reduce: Optional[Callable[[torch.Tensor], None]] = None,
                     amp=None) -> Iterator[None]:
        """The routing state around one optimizer step (:func:`studylib.nn.router.optimizer_step`;
        the trainer's one routing call): ``with model.routing_step(inputs, all_reduce): <forwards,
        backwards, optimizer step>``. The global-batch balance (``balance_scope: global``) first
        routes every micro-batch of the step once (``inputs()``: this rank's input windows, B x S
        each; eval mode, so no dropout and no RNG draw; under ``amp``, an autocast context) and
        uses the step's loads, summed over the micro-batches and the ranks (``all_reduce``), as
        the f of its balance loss; with dropout 0 the routing is the training forward's exactly,
        so with one micro-batch and one rank the loss equals the micro-batch loss. Aux-loss-free
        balancing moves each bias once when the body has finished, from the assignments of the
        step's forwards."""
        def prepass() -> None:
            was = self.training
            self.eval()
            try:
                with torch.no_grad(), amp if amp is not None else contextlib.nullcontext():
                    for x in inputs():
                        self(x, aux_losses=False, return_logits=True, last_only=True)
            finally:
                self.train(was)

        with router.optimizer_step(self.routers(), prepass, all_reduce):
            yield

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
            x, r = blk(x, cos, sin, stats=stats, cache=cache, aux=aux_losses, ids=idx_BS)
            routers.append(r)
        if cache is not None:
            cache.pos += S
        h = self.norm(x)
        logits = loss = None
        if targets_BS is not None and not return_logits:  # fused chunked LM head + CE (no logits kept)
            loss = linear_cross_entropy(h.reshape(B * S, -1), self.tok_emb.weight, targets_BS.reshape(-1),
                                        chunk=self.cfg.lm_head_chunk)
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
            routing=[r.routing.detach() if r is not None else None for r in routers],
        )
