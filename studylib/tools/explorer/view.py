"""The routing view: how one model routed one token sequence (:class:`RoutingView`), as data.

Built by :mod:`studylib.tools.explorer.routing`; read by the tables, figures and widgets.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd
import torch

from studylib.nn import router


@dataclass
class RoutingView:
    """How one model routed one token sequence. S tokens, L layers, E experts.

    ``weights[l]``: (S, E) combine weights of layer ``l`` (the renormalised top-k weights, 0 for
    experts a token did not choose; the soft MoE's gate) or ``None`` for a dense layer;
    ``probs[l]``: the router's distribution over all E experts (the softmax, or a sigmoid router's
    scores normalised; equal to ``weights[l]`` for the soft MoE; NaN for the hash router, which has
    no scores);
    ``experts[l][t]``: the experts token ``t`` used at layer ``l``, by weight (descending).
    A routed expert is *picked by the bias* (aux-loss-free balancing) when it is not among the k
    experts with the highest router probability: the selection bias, not the scores, chose it.
    """

    text: str
    ids: list[int]
    tokens: list[str]  # SentencePiece pieces
    kinds: list[str]  # per layer: "dense" | "moe" | "soft"
    weights: list  # per layer: (S, E) ndarray or None
    probs: list  # per layer: (S, E) ndarray or None
    experts: list  # per layer: list of per-token expert lists, or None
    num_experts: int = 0
    top_k: int = 0  # experts per token (K for the soft MoE)
    nll: Optional[np.ndarray] = None  # (S,) -log p(token | previous tokens); NaN at position 0
    n_prefix: int = 0  # leading tokens that are not the text (the end-of-story token)
    n_prompt: Optional[int] = None  # positions >= n_prompt were generated (generate_and_route)
    truncated: int = 0  # tokens cut to fit the model context
    continuation: str = ""  # generated text (generate_and_route)
    label: str = ""
    step: Optional[int] = None  # optimizer step of the weights (LoadedRun.step), if known
    model_name: str = ""
    router_stats: list = field(default_factory=list)  # per layer, the model's stats on this text
    generation: object = None  # the studylib.run.decode.Generation (generate_and_route)

    @property
    def n_layers(self) -> int:
        return len(self.kinds)

    @property
    def routed_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k != "dense"]

    @property
    def routed(self) -> bool:
        return bool(self.routed_layers)

    @property
    def kind(self) -> str:
        """``dense``, ``moe`` or ``soft`` (the kind of the routed layers)."""
        ks = {k for k in self.kinds if k != "dense"}
        return ks.pop() if len(ks) == 1 else ("dense" if not ks else "mixed")

    @property
    def status(self) -> str:
        if not self.routed:
            who = self.label or self.model_name or "this model"
            return (f"nothing to route: {who} is dense (no layer has a router; every token uses "
                    f"the same feed-forward block)")
        return "ok"

    @property
    def title(self) -> str:
        """``<label> @ step <N>``: who routed this view, for captions."""
        who = self.label or self.model_name or "model"
        return f"{who}" + (f" @ step {self.step}" if self.step is not None else "")

    @property
    def top_expert(self) -> np.ndarray:
        """(S, L) int: each token's highest-weight expert per layer; -1 for dense layers."""
        out = np.full((len(self.ids), self.n_layers), -1, dtype=np.int64)
        for layer, w in enumerate(self.weights):
            if w is not None:
                out[:, layer] = w.argmax(-1)
        return out

    @property
    def top_weight(self) -> np.ndarray:
        """(S, L) float: the weight of that expert; NaN for dense layers."""
        out = np.full((len(self.ids), self.n_layers), np.nan)
        for layer, w in enumerate(self.weights):
            if w is not None:
                out[:, layer] = w.max(-1)
        return out

    def picked_by_bias(self, layer: int, t: int) -> set:
        """The experts token ``t`` used at sparse layer ``layer`` that are not among its k most
        probable ones (:func:`studylib.nn.router.picked_by_bias`; empty for routers without a
        selection bias, and for the soft MoE)."""
        mask = self._bias_mask(layer)
        return set() if mask is None else {e for e, m in zip(self.experts[layer][t], mask[t]) if m}

    def _bias_mask(self, layer: int) -> Optional[np.ndarray]:
        if self.kinds[layer] != "moe" or self.weights[layer] is None or not len(self.ids):
            return None
        if np.isnan(self.probs[layer]).any():  # a router without scores (hash): nothing to compare with
            return None
        idx_TK = torch.as_tensor(np.asarray(self.experts[layer], dtype=np.int64))
        return router.picked_by_bias(torch.as_tensor(self.probs[layer]), idx_TK).numpy()

    @property
    def bias_share(self) -> dict:
        """Per sparse layer: the share of (token, chosen expert) pairs picked by the bias."""
        out = {}
        for layer in self.routed_layers:
            mask = self._bias_mask(layer)
            if mask is not None:
                out[layer] = float(mask.mean())
        return out

    def to_frame(self) -> pd.DataFrame:
        """Long frame: one row per (position, layer, chosen expert) with its weight, router prob and
        ``by_bias`` (:meth:`picked_by_bias`)."""
        rows = []
        for layer, w in enumerate(self.weights):
            mask = self._bias_mask(layer)  # (S, K) or None, once per layer
            for t, (tid, piece) in enumerate(zip(self.ids, self.tokens)):
                base = {"position": t, "id": tid, "token": piece, "layer": layer, "kind": self.kinds[layer],
                        "generated": self.n_prompt is not None and t >= self.n_prompt}
                if w is None:
                    rows.append({**base, "rank": np.nan, "expert": np.nan, "weight": np.nan, "prob": np.nan,
                                 "by_bias": False})
                    continue
                for rank, e in enumerate(self.experts[layer][t]):
                    rows.append({**base, "rank": rank, "expert": e, "weight": float(w[t, e]),
                                 "prob": float(self.probs[layer][t, e]),
                                 "by_bias": bool(mask is not None and mask[t, rank])})
        return pd.DataFrame(rows)


def shared_prefix(a: RoutingView, b: RoutingView) -> int:
    """How many leading token ids the two views have in common."""
    n = 0
    for x, y in zip(a.ids, b.ids):
        if x != y:
            break
        n += 1
    return n
