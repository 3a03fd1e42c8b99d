"""The routing decision, in one place: router logits -> probabilities -> the experts each token
uses and their gate weights. The MoE layers, decoding's routing capture and the explorer all
call these functions; a new router variant (say a sigmoid gate) changes this file and the
config schema only.

Variants (``ffn`` options; the defaults are the reference router, softmax top-k):

* ``score: sigmoid``: affinities ``s = sigmoid(logits)`` instead of the softmax; the combine weights
  are the chosen ``s`` (divided by their sum with ``renormalize``). The balance loss and the
  diagnostics see ``s / sum(s)``, a distribution over experts.
* a selection bias ``bias_E`` (aux-loss-free balancing, DeepSeek-V3): top-k is taken over
  ``s + bias_E``, the combine weights use the unbiased ``s``.
* ``route_scale``: the combine weights times a constant (``routed_scaling_factor``).

Modes (``ffn.router_mode``, per layer; see :meth:`studylib.nn.model.Decoder.set_router_mode`):
``learned`` (normal), ``uniform`` (gate forced to 1/E; sparse layers take the fixed balanced
assignment with weights 1/K) and ``balanced`` (sparse only: token t goes to experts
``(t*K + j) mod E``, weighted by its renormalised router probabilities; for throughput runs).

Shape legend: T tokens, D model width, E experts, K experts chosen per token.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

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


def scores(logits_TE: torch.Tensor, score: str = "softmax") -> torch.Tensor:
    """The affinities the top-k picks from and the combine weights come from."""
    if score == "softmax":
        return probs(logits_TE)
    if score == "sigmoid":
        return torch.sigmoid(logits_TE)
    raise ValueError(f"score must be softmax or sigmoid, got {score!r}")


class Route(NamedTuple):
    probs_TE: torch.Tensor  # router probabilities (1/E everywhere in ``uniform`` mode)
    idx_TK: torch.Tensor  # chosen experts
    w_TK: torch.Tensor  # their gate weights


def distribution(logits_TE: torch.Tensor, score: str = "softmax") -> torch.Tensor:
    """The router's distribution over experts: the softmax, or the sigmoid scores normalised to
    sum to 1 (what the balance loss and the diagnostics see)."""
    return _as_distribution(scores(logits_TE, score), score)


def _as_distribution(s_TE: torch.Tensor, score: str) -> torch.Tensor:
    return s_TE if score == "softmax" else s_TE / s_TE.sum(-1, keepdim=True)


def sparse(logits_TE: torch.Tensor, top_k: int, renormalize: bool = True, mode: str = "learned",
           score: str = "softmax", bias_E: Optional[torch.Tensor] = None, scale: float = 1.0) -> Route:
    """Top-k token-choice routing (Mixtral). With ``renormalize`` the k weights sum to 1 (so with
    k = 1 the gate is exactly 1 and the router gets no gradient from the LM loss); without it
    the gate is the router probability itself (Switch). ``score``, ``bias_E`` and ``scale``: the
    variants of the module docstring. ``Route.probs_TE`` is always a distribution over experts."""
    s_TE = scores(logits_TE, score)
    p_TE = _as_distribution(s_TE, score)
    if mode == "learned" and bias_E is None:
        w_TK, idx_TK = s_TE.topk(top_k, dim=-1)
    elif mode == "learned":  # the bias picks the experts; the weights stay unbiased
        idx_TK = (s_TE + bias_E.to(s_TE.dtype)).topk(top_k, dim=-1).indices
        w_TK = s_TE.gather(1, idx_TK)
    else:  # fixed balanced assignment: token t -> experts (t*K + j) mod E (distinct as K <= E)
        T, E = p_TE.shape
        t = torch.arange(T, device=p_TE.device)
        idx_TK = (t[:, None] * top_k + torch.arange(top_k, device=p_TE.device)) % E
        if mode == "uniform":
            p_TE = s_TE = torch.full_like(p_TE, 1.0 / E)
        w_TK = s_TE.gather(1, idx_TK)
    if renormalize:
        w_TK = w_TK / w_TK.sum(-1, keepdim=True)
    if scale != 1.0:
        w_TK = w_TK * scale
    return Route(p_TE, idx_TK, w_TK)


def picked_by_bias(probs_TE: torch.Tensor, idx_TK: torch.Tensor) -> torch.Tensor:
    """(T, K) bool: which chosen experts are not among the token's K most probable ones (the
    selection bias, not the scores, picked them). All False for a router without a bias, ties
    aside."""
    best_TK = probs_TE.topk(idx_TK.shape[-1], dim=-1).indices
    return ~(idx_TK[:, :, None] == best_TK[:, None, :]).any(-1)


def soft(logits_TE: torch.Tensor, mode: str = "learned") -> torch.Tensor:
    """The soft MoE's gate over all E experts: the router softmax, or 1/E (``uniform``)."""
    if mode == "learned":
        return probs(logits_TE)
    return torch.full_like(logits_TE, 1.0 / logits_TE.shape[-1])
