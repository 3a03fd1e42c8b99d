"""Feed-forward variants behind one interface: dense SwiGLU, sparse routed MoE, soft always-active MoE.

Every FFN is called as ``y_BSD, router = ffn(x_BSD, stats=False, aux=True)``; ``router`` is ``None``
for the dense FFN, else a :class:`RouterOutput` carrying the layer's auxiliary losses (as tensors, so
the caller adds them to the objective; no global state; zero when ``aux=False``, which decoding
uses) and, when ``stats=True``, its diagnostics.

The routing decision itself (softmax, top-k, renormalisation, router modes) is
:mod:`studylib.nn.router`.

Shape legend: B batch, S sequence, T = B*S tokens, D model width, H hidden width (per expert),
F = 2H (fused gate|up rows), E experts (K for the soft MoE's experts), K chosen per token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from studylib.config import FFNConfig
from studylib.nn import gemv, router, router_losses
from studylib.nn.dispatch import moe_experts, swiglu_rows


@dataclass
class RouterOutput:
    balance: torch.Tensor  # scalar, Switch balance loss of this layer (0 for soft MoE)
    z: torch.Tensor  # scalar, router z-loss of this layer (0 for soft MoE)
    seq_balance: Optional[torch.Tensor] = None  # scalar, sequence-wise balance loss (seq_balance_coef > 0)
    stats: Optional[dict] = None  # diagnostics (plain numbers) when requested
    token_weights: Optional[torch.Tensor] = None  # (T, E) combine weight of each expert per token
    # (0 for experts a token did not choose; the gate for the soft MoE), detached, when requested


class DenseFFN(nn.Module):
    """SwiGLU: ``w_out(silu(x W_gate^T) * (x W_up^T))`` with gate|up fused into one matrix."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.w_in = gemv.Linear(d_model, 2 * hidden)  # rows: gate then up
        self.w_out = gemv.Linear(hidden, d_model)

    def forward(self, x_BSD, stats: bool = False, aux: bool = True):
        return self.w_out(swiglu_rows(self.w_in(x_BSD))), None


class _Experts(nn.Module):
    """Shared parts of the two MoEs: a bias-free router and stacked expert weights."""

    def __init__(self, d_model: int, cfg: FFNConfig):
        super().__init__()
        E, H = cfg.num_experts, cfg.hidden
        self.cfg = cfg
        self.router = nn.Linear(d_model, E, bias=False)
        self.w_in_EFD = nn.Parameter(torch.empty(E, 2 * H, d_model))
        self.w_out_EDH = nn.Parameter(torch.empty(E, d_model, H))
        self.router_mode = "learned"

    def router_logits(self, x_TD: torch.Tensor) -> torch.Tensor:
        return router.logits(x_TD, self.router.weight, self.cfg.router_scale)

    def router_probs(self, logits_TE: torch.Tensor) -> torch.Tensor:
        """This layer's distribution over experts (:func:`studylib.nn.router.distribution`)."""
        return router.distribution(logits_TE, self.cfg.score)


class SparseMoE(_Experts):
    """Top-k token-choice routed MoE (Mixtral style), dropless; with the router variants of
    :mod:`studylib.nn.router` and ``n_shared`` always-active shared experts (one SwiGLU of width
    ``n_shared * hidden``: by linearity the sum of ``n_shared`` experts of width ``hidden``).

    Aux-loss-free balancing (``bias_balance``): the buffer ``expert_bias_E`` (saved with the
    weights, no gradient, no weight decay) shifts the selection; training forwards count each
    expert's assignments, and :meth:`update_bias` (the trainer, once per optimizer step, with
    the counts summed over the step's micro-batches and the ranks) moves it by
    ``bias_rate * sign(mean load - load)``. Evaluation and decoding (eval mode) count nothing."""

    def __init__(self, d_model: int, cfg: FFNConfig):
        super().__init__(d_model, cfg)
        self.shared = DenseFFN(d_model, cfg.n_shared * cfg.hidden) if cfg.n_shared else None
        if cfg.bias_balance:
            self.register_buffer("expert_bias_E", torch.zeros(cfg.num_experts))
        self.load_E: Optional[torch.Tensor] = None  # this step's counts (a plain tensor: DDP's
        # buffer broadcast would overwrite other ranks' counts with rank 0's)
        self.tally_E: Optional[torch.Tensor] = None  # counts of a global-balance pre-pass, while it runs
        self.global_share_E: Optional[torch.Tensor] = None  # the step's loads f (balance_scope: global)

    def forward(self, x_BSD, stats: bool = False, aux: bool = True):
        B, S, D = x_BSD.shape
        cfg, K = self.cfg, self.cfg.top_k
        x_TD = x_BSD.reshape(B * S, D)
        logits_TE = self.router_logits(x_TD)
        probs_TE, idx_TK, w_TK = self.route(logits_TE)
        if cfg.bias_balance and self.training:
            counts_E = torch.bincount(idx_TK.reshape(-1), minlength=cfg.num_experts)
            self.load_E = counts_E if self.load_E is None else self.load_E + counts_E
        if self.tally_E is not None:
            self.tally_E += torch.bincount(idx_TK.reshape(-1), minlength=cfg.num_experts)
        if gemv.one_row(x_TD):  # decoding: the K chosen experts against cached transposed weights
            y_TD = self._decode_one(x_TD, idx_TK, w_TK)
        else:
            y_TD = moe_experts(x_TD, idx_TK, w_TK, self.w_in_EFD, self.w_out_EDH,
                               cfg.dispatch, cfg.grouped_mm)
        if self.shared is not None:
            y_TD = y_TD + self.shared(x_TD)[0].to(y_TD.dtype)
        zero = logits_TE.new_zeros(()) if not aux else None
        seq = None
        if aux and cfg.seq_balance_coef > 0:
            seq = router_losses.sequence_balance_loss(probs_TE.view(B, S, -1), idx_TK.view(B, S, K))
        out = RouterOutput(
            balance=router_losses.balance_loss(probs_TE, idx_TK, self.global_share_E) if aux else zero,
            z=router_losses.z_loss(logits_TE) if aux else zero,
            seq_balance=seq,
            stats=self._stats(logits_TE, probs_TE, idx_TK) if stats else None,
            token_weights=probs_TE.new_zeros(probs_TE.shape).scatter(1, idx_TK, w_TK).detach()
            if stats else None,
        )
        return y_TD.to(x_BSD.dtype).reshape(B, S, D), out

    def route(self, logits_TE: torch.Tensor) -> router.Route:
        """This layer's routing decision for ``logits_TE`` (its options and selection bias): what
        its forward uses, and what decoding's routing capture reconstructs."""
        cfg = self.cfg
        bias_E = self.expert_bias_E if cfg.bias_balance else None
        return router.sparse(logits_TE, cfg.top_k, cfg.renormalize, self.router_mode, cfg.score, bias_E, cfg.route_scale)

    def _stats(self, logits_TE, probs_TE, idx_TK) -> dict:
        out = router_losses.router_stats(logits_TE, probs_TE, idx_TK)
        if self.cfg.bias_balance:
            out["bias"] = self.expert_bias_E.tolist()
            out["bias_picked"] = float(router.picked_by_bias(probs_TE, idx_TK).float().mean())
        return out

    @torch.no_grad()
    def update_bias(self, load_E: torch.Tensor) -> None:
        """One aux-loss-free step: ``b_e += bias_rate * sign(mean(load) - load_e)`` with the loads
        counted over a whole optimizer step; the counts are reset."""
        load_E = load_E.to(torch.float64)
        step_E = torch.sign(load_E.mean() - load_E) * self.cfg.bias_rate
        self.expert_bias_E += step_E.to(self.expert_bias_E.dtype)
        self.load_E = None

    def _decode_one(self, x_1D, idx_1K, w_1K):
        """One token at inference: its K experts against cached transposed weights (studylib.nn.gemv)."""
        w_in_EDF = gemv.transposed(self, self.w_in_EFD, "w_in")
        w_out_EHD = gemv.transposed(self, self.w_out_EDH, "w_out")
        y_1D = None
        for k, e in enumerate(idx_1K[0].tolist()):
            out_1D = (swiglu_rows(x_1D @ w_in_EDF[e]) @ w_out_EHD[e]) * w_1K[:, k:k + 1]
            y_1D = out_1D if y_1D is None else y_1D + out_1D
        return y_1D


class SoftMoE(_Experts):
    """K always-active SwiGLU experts mixed by a per-token softmax gate (seed 003).

    Computed as one wide SwiGLU of width K*H whose hidden groups are scaled by the gate:
    ``sum_k g_k W_out_k act_k = W_out_wide [g_1 act_1; ...; g_K act_K]`` (exact by linearity).
    """

    def forward(self, x_BSD, stats: bool = False, aux: bool = True):
        B, S, D = x_BSD.shape
        E, H = self.cfg.num_experts, self.cfg.hidden
        x_TD = x_BSD.reshape(B * S, D)
        logits_TE = self.router_logits(x_TD)
        gate_TE = router.soft(logits_TE, self.router_mode)
        h_TEF = F.linear(x_TD, self.w_in_EFD.reshape(E * 2 * H, D)).view(-1, E, 2 * H)
        act_TEH = swiglu_rows(h_TEF) * gate_TE[:, :, None].to(h_TEF.dtype)
        w_out_DX = self.w_out_EDH.permute(1, 0, 2).reshape(D, E * H)
        y_TD = F.linear(act_TEH.reshape(-1, E * H), w_out_DX)
        zero = logits_TE.new_zeros(())
        out = RouterOutput(balance=zero, z=zero,
                           stats=router_losses.router_stats(logits_TE, gate_TE, None) if stats else None,
                           token_weights=gate_TE.detach() if stats else None)
        return y_TD.to(x_BSD.dtype).reshape(B, S, D), out


def build_ffn(d_model: int, cfg: FFNConfig) -> nn.Module:
    if cfg.kind == "dense":
        return DenseFFN(d_model, cfg.hidden)
    if cfg.kind == "moe":
        return SparseMoE(d_model, cfg)
    if cfg.kind == "soft":
        return SoftMoE(d_model, cfg)
    raise ValueError(f"ffn.kind must be dense, moe or soft, got {cfg.kind!r}")
