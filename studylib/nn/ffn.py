"""Feed-forward variants behind one interface: dense SwiGLU, sparse routed MoE, soft always-active MoE.

Every FFN is called as ``y_BSD, out = ffn(x_BSD, stats=False, aux=True, ids_BS=None)`` (``ids_BS``:
the token ids of the rows, which the hash router routes by); ``out`` is ``None`` for
the dense FFN, else a :class:`RouterOutput`: the layer's routing record
(:class:`studylib.nn.router.Routing`, made by its :class:`~studylib.nn.router.Router`), its
auxiliary losses (as tensors, so the caller adds them to the objective; no global state; zero
when ``aux=False``, which decoding uses) and, when ``stats=True``, its diagnostics.

Each module initialises its own weights (``init_weights``, called by
:meth:`studylib.nn.model.Decoder.init_weights`; each tensor keyed by its name,
:mod:`studylib.nn.init`: a dense FFN is drawn as expert 0, so it equals an expert of its shape).

Shape legend: B batch, S sequence, T = B*S tokens, D model width, H hidden width (per expert),
F = 2H (fused gate|up rows), E experts (K for the soft MoE's experts), K chosen per token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from studylib.config import FFNConfig
from studylib.nn import gemv, router_losses
from studylib.nn.init import Draw
from studylib.nn.dispatch import moe_experts, swiglu_rows
from studylib.nn.router import Router, Routing


@dataclass
class RouterOutput:
    routing: Routing  # the layer's routing decision (chosen experts, weights, counts)
    balance: torch.Tensor  # scalar, Switch balance loss of this layer (0 for soft MoE)
    z: torch.Tensor  # scalar, router z-loss of this layer (0 for soft MoE)
    seq_balance: Optional[torch.Tensor] = None  # scalar, sequence-wise balance loss (seq_balance_coef > 0)
    stats: Optional[dict] = None  # diagnostics (plain numbers) when requested


class DenseFFN(nn.Module):
    """SwiGLU: ``w_out(silu(x W_gate^T) * (x W_up^T))`` with gate|up fused into one matrix."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.w_in = gemv.Linear(d_model, 2 * hidden)  # rows: gate then up
        self.w_out = gemv.Linear(hidden, d_model)

    @torch.no_grad()
    def init_weights(self, draw: Draw, std: float, out_std: float, expert_init: str = "normal") -> None:
        """N(0, std) in, N(0, out_std) out, drawn as expert 0 (``expert_init`` is for experts: a dense
        layer keeps this)."""
        draw.normal_(self.w_in.weight, std, "w_in.0")
        draw.normal_(self.w_out.weight, out_std, "w_out.0")

    def forward(self, x_BSD, stats: bool = False, aux: bool = True, ids_BS=None):
        return self.w_out(swiglu_rows(self.w_in(x_BSD))), None


class _Experts(nn.Module):
    """Shared parts of the two MoEs: the router (:class:`~studylib.nn.router.Router`) and stacked
    expert weights."""

    def __init__(self, d_model: int, cfg: FFNConfig, soft: bool = False, vocab_size: Optional[int] = None):
        super().__init__()
        E, H = cfg.num_experts, cfg.hidden
        self.cfg = cfg
        self.router = Router(d_model, cfg, soft=soft, vocab_size=vocab_size)
        self.w_in_EFD = nn.Parameter(torch.empty(E, 2 * H, d_model))
        self.w_out_EDH = nn.Parameter(torch.empty(E, d_model, H))

    def expert_stds(self, std: float, out_std: float, expert_init: str) -> tuple[float, float]:
        """The stds of ``w_in`` and ``w_out``: ``std``/``out_std``, or with ``expert_init: fan_in``
        1/sqrt(fan-in): 1/sqrt(D) for w_in (E, 2H, D) and 1/sqrt(H) for w_out (E, D, H)."""
        if expert_init != "fan_in":
            return std, out_std
        return 1 / math.sqrt(self.w_in_EFD.shape[2]), 1 / math.sqrt(self.w_out_EDH.shape[2])

    @torch.no_grad()
    def init_weights(self, draw: Draw, std: float, out_std: float, expert_init: str = "normal") -> None:
        """Each expert e as ``w_in.<e>`` / ``w_out.<e>`` (stds: :meth:`expert_stds`), then the router
        (its own init, whatever ``expert_init``)."""
        in_std, w_out_std = self.expert_stds(std, out_std, expert_init)
        for e in range(self.w_in_EFD.shape[0]):
            draw.normal_(self.w_in_EFD[e], in_std, f"w_in.{e}")
            draw.normal_(self.w_out_EDH[e], w_out_std, f"w_out.{e}")
        self.router.init_weights(draw, std)


class SparseMoE(_Experts):
    """Top-k token-choice routed MoE (Mixtral style), dropless; with the router variants of
    :mod:`studylib.nn.router` and ``n_shared`` always-active shared experts (one SwiGLU of width
    ``n_shared * hidden``: by linearity the sum of ``n_shared`` experts of width ``hidden``).
    Aux-loss-free balancing (``bias_balance``) is the router's (:class:`~studylib.nn.router.Router`)."""

    def __init__(self, d_model: int, cfg: FFNConfig, vocab_size: Optional[int] = None):
        super().__init__(d_model, cfg, vocab_size=vocab_size)
        self.shared = DenseFFN(d_model, cfg.n_shared * cfg.hidden) if cfg.n_shared else None
        self.register_load_state_dict_pre_hook(_bias_key_into_router)

    @torch.no_grad()
    def init_weights(self, draw: Draw, std: float, out_std: float, expert_init: str = "normal") -> None:
        """As :class:`_Experts`, then the shared experts as an expert, under ``shared``."""
        super().init_weights(draw, std, out_std, expert_init)
        if self.shared is not None:
            self.shared.init_weights(draw / "shared", *self.expert_stds(std, out_std, expert_init))

    def forward(self, x_BSD, stats: bool = False, aux: bool = True, ids_BS=None):
        B, S, D = x_BSD.shape
        cfg, K = self.cfg, self.cfg.top_k
        x_TD = x_BSD.reshape(B * S, D)
        rec = self.router(x_TD, ids_BS.reshape(B * S) if ids_BS is not None else None)
        if gemv.one_row(x_TD):  # decoding: the K chosen experts against cached transposed weights
            y_TD = self._decode_one(x_TD, rec.idx_TK, rec.w_TK)
        else:
            y_TD = moe_experts(x_TD, rec.idx_TK, rec.w_TK, self.w_in_EFD, self.w_out_EDH,
                               cfg.dispatch, cfg.grouped_mm, counts_E=rec.counts_E)
        if self.shared is not None:
            y_TD = y_TD + self.shared(x_TD)[0].to(y_TD.dtype)
        aux = aux and not self.router.hashed  # the hash router has no scores: its losses are 0
        zero = rec.logits_TE.new_zeros(()) if not aux else None
        seq = None
        if aux and cfg.seq_balance_coef > 0:
            seq = router_losses.sequence_balance_loss(rec.probs_TE.view(B, S, -1), rec.idx_TK.view(B, S, K))
        out = RouterOutput(
            routing=rec,
            balance=router_losses.balance_loss(rec.probs_TE, self.router.balance_shares(rec)) if aux else zero,
            z=router_losses.z_loss(rec.logits_TE) if aux else zero,
            seq_balance=seq,
            stats=self.router.stats(rec) if stats else None,
        )
        return y_TD.to(x_BSD.dtype).reshape(B, S, D), out

    def _decode_one(self, x_1D, idx_1K, w_1K):
        """One token at inference: its K experts against cached transposed weights (studylib.nn.gemv)."""
        w_in_EDF = gemv.transposed(self, self.w_in_EFD, "w_in")
        w_out_EHD = gemv.transposed(self, self.w_out_EDH, "w_out")
        y_1D = None
        for k, e in enumerate(idx_1K[0].tolist()):
            out_1D = (swiglu_rows(x_1D @ w_in_EDF[e]) @ w_out_EHD[e]) * w_1K[:, k:k + 1]
            y_1D = out_1D if y_1D is None else y_1D + out_1D
        return y_1D


def _bias_key_into_router(module, state_dict, prefix, *args) -> None:
    """Checkpoints written before the selection bias moved into the router hold it as
    ``<layer>.expert_bias_E``: loaded as ``<layer>.router.bias_E``."""
    old = prefix + "expert_bias_E"
    if old in state_dict:
        state_dict[prefix + "router.bias_E"] = state_dict.pop(old)


class SoftMoE(_Experts):
    """K always-active SwiGLU experts mixed by a per-token softmax gate (seed 003); the gate is
    its router's (``Router(soft=True)``).

    Computed as one wide SwiGLU of width K*H whose hidden groups are scaled by the gate:
    ``sum_k g_k W_out_k act_k = W_out_wide [g_1 act_1; ...; g_K act_K]`` (exact by linearity).
    """

    def __init__(self, d_model: int, cfg: FFNConfig):
        super().__init__(d_model, cfg, soft=True)

    def forward(self, x_BSD, stats: bool = False, aux: bool = True, ids_BS=None):
        B, S, D = x_BSD.shape
        E, H = self.cfg.num_experts, self.cfg.hidden
        x_TD = x_BSD.reshape(B * S, D)
        rec = self.router(x_TD)
        gate_TE = rec.w_TK
        h_TEF = F.linear(x_TD, self.w_in_EFD.reshape(E * 2 * H, D)).view(-1, E, 2 * H)
        act_TEH = swiglu_rows(h_TEF) * gate_TE[:, :, None].to(h_TEF.dtype)
        w_out_DX = self.w_out_EDH.permute(1, 0, 2).reshape(D, E * H)
        y_TD = F.linear(act_TEH.reshape(-1, E * H), w_out_DX)
        zero = rec.logits_TE.new_zeros(())
        out = RouterOutput(routing=rec, balance=zero, z=zero, stats=self.router.stats(rec) if stats else None)
        return y_TD.to(x_BSD.dtype).reshape(B, S, D), out


def build_ffn(d_model: int, cfg: FFNConfig, vocab_size: Optional[int] = None) -> nn.Module:
    """The layer ``cfg`` describes (``vocab_size``: for the hash router's table)."""
    if cfg.kind == "dense":
        return DenseFFN(d_model, cfg.hidden)
    if cfg.kind == "moe":
        return SparseMoE(d_model, cfg, vocab_size)
    if cfg.kind == "soft":
        return SoftMoE(d_model, cfg)
    raise ValueError(f"ffn.kind must be dense, moe or soft, got {cfg.kind!r}")
