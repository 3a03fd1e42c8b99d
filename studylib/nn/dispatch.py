"""Sparse-MoE expert computation: ``naive``, ``grouped`` and ``stacked`` dispatch behind one function.

All three compute, for every token t and each of its K chosen experts e,
``y[t] += w[t, k] * SwiGLU_e(x[t])`` (dropless: no capacity, no dropped tokens), and agree
to fp32 rounding in outputs and gradients (tests/test_dispatch.py checks them against a
per-token reference).

Shape legend: T tokens (batch*sequence flattened), D model width, H expert hidden width,
F = 2H (gate|up fused rows), E experts, K experts per token, N = T*K assignments,
C per-expert capacity of the stacked buffer.

Expert weights are stacked: ``w_in_EFD`` (rows 0..H-1 = gate, H..2H-1 = up) and ``w_out_EDH``.
"""
from __future__ import annotations

from typing import Optional

import torch

from studylib.nn.precision import autocast_dtype
import torch.nn.functional as F

PATHS = ("naive", "grouped", "stacked")


def swiglu_rows(h_NF: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation of fused gate|up pre-activations: silu(gate) * up."""
    gate_NH, up_NH = h_NF.chunk(2, dim=-1)
    return F.silu(gate_NH) * up_NH


def expert_mlp(x_ND: torch.Tensor, w_in_FD: torch.Tensor, w_out_DH: torch.Tensor) -> torch.Tensor:
    """One SwiGLU expert on a set of rows."""
    return F.linear(swiglu_rows(F.linear(x_ND, w_in_FD)), w_out_DH)


# --------------------------------------------------------------------------------------------
# naive: loop over experts, mask the tokens that chose each
# --------------------------------------------------------------------------------------------
def _naive(x_TD, idx_TK, w_TK, w_in_EFD, w_out_EDH):
    y_TD = torch.zeros_like(x_TD, dtype=torch.promote_types(x_TD.dtype, w_TK.dtype))
    for e in range(w_in_EFD.shape[0]):
        tok_N, slot_N = torch.nonzero(idx_TK == e, as_tuple=True)
        if tok_N.numel() == 0:
            continue
        out_ND = expert_mlp(x_TD.index_select(0, tok_N), w_in_EFD[e], w_out_EDH[e])
        y_TD = y_TD.index_add(0, tok_N, out_ND * w_TK[tok_N, slot_N, None])
    return y_TD


# --------------------------------------------------------------------------------------------
# shared by grouped and stacked: sort the T*K assignments by expert once
# --------------------------------------------------------------------------------------------
def _sort_by_expert(idx_TK: torch.Tensor):
    K = idx_TK.shape[1]
    expert_N = idx_TK.reshape(-1)
    order_N = torch.argsort(expert_N, stable=True)
    tok_N = order_N // K  # token of each sorted assignment
    return order_N, tok_N, expert_N[order_N]


def grouped_mm_supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` exists and takes these dtypes/strides on this device."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if x.dtype not in (torch.float32, torch.bfloat16) or x.dtype != w.dtype:
        return False
    if x.device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(x.device)
        return major >= 9 and x.dtype == torch.bfloat16
    # CPU kernel exists in torch >= 2.8 (fp32/bf16); sizes must keep 16-byte aligned rows
    return x.device.type == "cpu" and (x.shape[-1] * x.element_size()) % 16 == 0


def _segment_matmul(x_ND, w_EFD, counts_E, use_grouped_mm: bool):
    """rows of expert e (contiguous, counts_E[e] of them) times w_EFD[e]^T -> (N, F)."""
    if use_grouped_mm:
        # torch._grouped_mm is not autocast-aware: cast by hand to what autocast would use
        dt = autocast_dtype(x_ND)
        a, b = (x_ND, w_EFD) if dt is None else (x_ND.to(dt), w_EFD.to(dt))
        offs_E = torch.cumsum(counts_E, 0).to(torch.int32)
        return torch._grouped_mm(a, b.transpose(-2, -1), offs=offs_E)
    outs = [F.linear(x_nD, w_EFD[e]) for e, x_nD in enumerate(torch.split(x_ND, counts_E.tolist()))]
    return torch.cat(outs, 0)


def _grouped(x_TD, idx_TK, w_TK, w_in_EFD, w_out_EDH, counts_E, grouped_mm="auto"):
    order_N, tok_N, _ = _sort_by_expert(idx_TK)
    x_ND = x_TD.index_select(0, tok_N)
    use = grouped_mm == "on" or (grouped_mm == "auto" and x_TD.device.type == "cuda")
    use = use and grouped_mm_supported(x_ND, w_in_EFD)
    h_NH = swiglu_rows(_segment_matmul(x_ND, w_in_EFD, counts_E, use))
    out_ND = _segment_matmul(h_NH.contiguous(), w_out_EDH, counts_E, use)
    out_ND = out_ND * w_TK.reshape(-1)[order_N, None]
    y_TD = torch.zeros_like(x_TD, dtype=out_ND.dtype)
    return y_TD.index_add(0, tok_N, out_ND)


def _stacked(x_TD, idx_TK, w_TK, w_in_EFD, w_out_EDH, counts_E):
    E = w_in_EFD.shape[0]
    order_N, tok_N, expert_N = _sort_by_expert(idx_TK)
    C = int(counts_E.max())
    start_E = torch.cumsum(counts_E, 0) - counts_E
    pos_N = torch.arange(expert_N.numel(), device=x_TD.device) - start_E[expert_N]
    buf_ECD = x_TD.new_zeros(E, C, x_TD.shape[1])
    buf_ECD = buf_ECD.index_put((expert_N, pos_N), x_TD.index_select(0, tok_N))  # padding rows stay zero
    h_ECH = swiglu_rows(torch.bmm(buf_ECD, w_in_EFD.transpose(1, 2)))  # SwiGLU(0) = 0
    out_ECD = torch.bmm(h_ECH, w_out_EDH.transpose(1, 2))
    out_ND = out_ECD[expert_N, pos_N] * w_TK.reshape(-1)[order_N, None]
    y_TD = torch.zeros_like(x_TD, dtype=out_ND.dtype)
    return y_TD.index_add(0, tok_N, out_ND)


def moe_experts(
    x_TD: torch.Tensor,
    idx_TK: torch.Tensor,
    w_TK: torch.Tensor,
    w_in_EFD: torch.Tensor,
    w_out_EDH: torch.Tensor,
    path: str = "grouped",
    grouped_mm: str = "auto",
    counts_E: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Weighted sum of each token's K experts. The one seam every dispatch path plugs into.
    ``counts_E``: the assignments per expert (the MoE layer passes its routing record's, so a
    forward counts them once); counted here when not given."""
    if path not in PATHS:
        raise ValueError(f"dispatch path must be one of {PATHS}, got {path!r}")
    if counts_E is None and path != "naive":
        counts_E = torch.bincount(idx_TK.reshape(-1), minlength=w_in_EFD.shape[0])
    if path == "grouped":
        return _grouped(x_TD, idx_TK, w_TK, w_in_EFD, w_out_EDH, counts_E, grouped_mm)
    if path == "stacked":
        return _stacked(x_TD, idx_TK, w_TK, w_in_EFD, w_out_EDH, counts_E)
    return _naive(x_TD, idx_TK, w_TK, w_in_EFD, w_out_EDH)
