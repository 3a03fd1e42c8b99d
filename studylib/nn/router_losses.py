"""Router losses and diagnostics: pure functions of router logits / probabilities / assignment shares
(the fields of a :class:`studylib.nn.router.Routing` record).

Shape legend: T tokens, E experts (K for the soft MoE's experts), K experts chosen per token.

Balance loss (Switch style), per layer: ``E * sum_e f_e * P_e`` with ``f_e`` the share of the
T*K assignments that went to expert e (sums to 1) and ``P_e`` the mean router probability of
e. It is 1.0 at perfectly uniform routing and grows with skew (up to E). HF Mixtral instead pools
the layers and lets f sum to k; we keep the paper's per-layer form and average over layers.
"""
from __future__ import annotations

from typing import Optional

import torch


def balance_loss(probs_TE: torch.Tensor, f_E: torch.Tensor) -> torch.Tensor:
    """``E * sum_e f_e * P_e``; ``f_E``: the assignment shares (:meth:`studylib.nn.router.Routing.shares_E`,
    not differentiable, as in Switch), or the whole optimizer step's (the global-batch balance)."""
    E = probs_TE.shape[-1]
    P_E = probs_TE.float().mean(0)
    return E * torch.sum(f_E * P_E)


def sequence_balance_loss(probs_BSE: torch.Tensor, idx_BSK: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3's sequence-wise balance loss (before its coefficient alpha): per sequence
    ``sum_e f_e * P_e`` with ``f_e = E / (K * S) * (tokens of the sequence that chose e)`` and
    ``P_e`` the sequence's mean normalised affinity of e; averaged over the sequences. 1.0 at
    perfectly uniform routing, as the Switch loss."""
    B, S, E = probs_BSE.shape
    K = idx_BSK.shape[-1]
    counts_BE = torch.zeros(B, E, device=idx_BSK.device, dtype=torch.float32).scatter_add_(
        1, idx_BSK.reshape(B, S * K), torch.ones(B, S * K, device=idx_BSK.device, dtype=torch.float32))
    f_BE = counts_BE * (E / (K * S))
    P_BE = probs_BSE.float().mean(1)
    return (f_BE * P_BE).sum(-1).mean()


def z_loss(logits_TE: torch.Tensor) -> torch.Tensor:
    """ST-MoE router z-loss: mean over tokens of logsumexp(logits)^2."""
    return torch.logsumexp(logits_TE.float(), dim=-1).pow(2).mean()


def _entropy(p_TE: torch.Tensor) -> torch.Tensor:
    return -(p_TE * torch.log(p_TE.clamp_min(1e-12))).sum(-1)


def share_stats(shares_E: torch.Tensor) -> dict:
    """The one definition of ``busiest`` (max_e f_e) and ``usage_var`` (the population variance of
    f_e) of a layer's expert shares f_e: the model's per-batch statistics and the study's tables
    (over a whole evaluation's shares, :func:`studylib.study.analysis.frames.layer_stats`) both use it."""
    return {"busiest": float(shares_E.max()), "usage_var": float(shares_E.var(unbiased=False))}


#: the statistics of the router's scores (its distribution and logits): not applicable to a router
#: without scores (the hash router: :meth:`studylib.nn.router.Router.stats` gives NaN)
SCORE_STATS = ("entropy", "top1", "margin", "logz")


@torch.no_grad()
def router_stats(logits_TE: torch.Tensor, probs_TE: torch.Tensor, shares_E: Optional[torch.Tensor]) -> dict:
    """Per-layer diagnostics as plain Python numbers (sparse MoE when its assignment shares
    ``shares_E`` are given, else soft).

    Common: ``shares`` (per expert), ``busiest`` and ``usage_var`` (:func:`share_stats`),
    ``entropy`` (mean per-token entropy of the router distribution, max ln E), ``top1``
    (mean largest probability), ``margin`` (mean p1 - p2), ``logz`` (mean logsumexp of logits).
    Soft MoE (shares: the mean gate) adds ``usage_entropy`` (entropy of the mean gate),
    ``max_gt_0.9`` (share of tokens whose largest gate exceeds 0.9) and ``argmax_shares`` (share
    of tokens whose largest gate is e).
    """
    p = probs_TE.float()
    E = p.shape[-1]
    top2 = p.topk(min(2, E), dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).mean() if E > 1 else top2[:, 0].mean()
    soft = shares_E is None
    shares = p.mean(0) if soft else shares_E
    out = {
        "shares": shares.tolist(),
        **share_stats(shares),
        "entropy": float(_entropy(p).mean()),
        "top1": float(top2[:, 0].mean()),
        "margin": float(margin),
        "logz": float(torch.logsumexp(logits_TE.float(), -1).mean()),
    }
    if soft:
        out["usage_entropy"] = float(_entropy(shares[None])[0])  # of the mean gate
        out["max_gt_0.9"] = float((top2[:, 0] > 0.9).float().mean())
        out["argmax_shares"] = (torch.bincount(p.argmax(-1), minlength=E).float() / p.shape[0]).tolist()
    return out
