"""The routing decision, in one place: router logits -> probabilities -> the experts each token
uses and their gate weights. The MoE layers, decoding's routing capture and the explorer all
call these functions; a new router variant (say a sigmoid gate) changes this file and the
config schema only.

Modes (``ffn.router_mode``, per layer; see :meth:`studylib.nn.model.Decoder.set_router_mode`):
``learned`` (normal), ``uniform`` (gate forced to 1/E; sparse layers take the fixed balanced
assignment with weights 1/K) and ``balanced`` (sparse only: token t goes to experts
``(t*K + j) mod E``, weighted by its renormalised router probabilities; for throughput runs).

Shape legend: T tokens, D model width, E experts, K experts chosen per token.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

MODES = ("learned", "uniform", "balanced")


def logits(x_TD: torch.Tensor, weight_ED: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Router logits in fp32 with autocast off: a small matmul, and the softmax needs the precision."""
    with torch.autocast(x_TD.device.type, enabled=False):
        logits_TE = F.linear(x_TD.float(), weight_ED.float())
    return logits_TE * scale if scale != 1.0 else logits_TE


def probs(logits_TE: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits_TE, dim=-1)


class Route(NamedTuple):
    probs_TE: torch.Tensor  # router probabilities (1/E everywhere in ``uniform`` mode)
    idx_TK: torch.Tensor  # chosen experts
    w_TK: torch.Tensor  # their gate weights


def sparse(logits_TE: torch.Tensor, top_k: int, renormalize: bool = True, mode: str = "learned") -> Route:
    """Top-k token-choice routing (Mixtral). With ``renormalize`` the k weights sum to 1 (so with
    k = 1 the gate is exactly 1 and the router gets no gradient from the LM loss); without it
    the gate is the router probability itself (Switch)."""
    p_TE = probs(logits_TE)
    if mode == "learned":
        w_TK, idx_TK = p_TE.topk(top_k, dim=-1)
    else:  # fixed balanced assignment: token t -> experts (t*K + j) mod E (distinct as K <= E)
        T, E = p_TE.shape
        t = torch.arange(T, device=p_TE.device)
        idx_TK = (t[:, None] * top_k + torch.arange(top_k, device=p_TE.device)) % E
        if mode == "uniform":
            p_TE = torch.full_like(p_TE, 1.0 / E)
        w_TK = p_TE.gather(1, idx_TK)
    if renormalize:
        w_TK = w_TK / w_TK.sum(-1, keepdim=True)
    return Route(p_TE, idx_TK, w_TK)


def soft(logits_TE: torch.Tensor, mode: str = "learned") -> torch.Tensor:
    """The soft MoE's gate over all E experts: the router softmax, or 1/E (``uniform``)."""
    if mode == "learned":
        return probs(logits_TE)
    return torch.full_like(logits_TE, 1.0 / logits_TE.shape[-1])
