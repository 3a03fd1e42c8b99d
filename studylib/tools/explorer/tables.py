"""Tables over routing views: each expert's share of a text's tokens (:func:`expert_shares`) and
two views of the same tokens side by side (:func:`compare_views`)."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from studylib.tools.explorer.view import RoutingView, shared_prefix

SHARE_MEASURES = ("auto", "assign", "gate", "top1", "weight")


def _layer_share(view: RoutingView, layer: int, measure: str, start: int) -> np.ndarray:
    """One layer's share per expert over the tokens from ``start`` (sums to 1)."""
    w = view.weights[layer][start:]
    if measure == "assign":
        counts = np.zeros(view.num_experts)
        for chosen in view.experts[layer][start:]:
            counts[chosen] += 1
        return counts / counts.sum()
    if measure == "top1":
        return np.bincount(w.argmax(-1), minlength=view.num_experts) / len(w)
    return w.mean(0)  # gate / weight: mean combine weight (rows of w sum to 1)


def expert_shares(view: RoutingView, measure: str = "auto", include_prefix: bool = False) -> pd.DataFrame:
    """Per routed layer (rows) and expert (columns ``e0..``): the share of this text's tokens the
    expert got; rows sum to 1.

    ``measure``: ``auto`` = ``assign`` for the sparse MoE (share of the S*k token->expert
    assignments, the f_e of the balance loss) and ``gate`` for the soft MoE (mean gate weight);
    ``top1`` = share of tokens whose highest-weight expert it is; ``weight`` = mean combine weight.
    The end-of-story prefix is left out unless ``include_prefix``. A dense view gives an empty
    frame whose ``attrs["status"]`` says why.
    """
    if measure not in SHARE_MEASURES:
        raise ValueError(f"measure must be auto, assign, gate, top1 or weight, got {measure!r}")
    cols = [f"e{e}" for e in range(view.num_experts)]
    if not view.routed:
        df = pd.DataFrame(columns=cols, dtype=float)
        df.index.name = "layer"
        df.attrs["status"] = view.status
        return df
    start = 0 if include_prefix else view.n_prefix
    if start >= len(view.ids):
        start = 0
    rows, used = {}, set()
    for layer in view.routed_layers:
        m = measure if measure != "auto" else ("assign" if view.kinds[layer] == "moe" else "gate")
        used.add(m)
        rows[layer] = _layer_share(view, layer, m, start)
    df = pd.DataFrame.from_dict(rows, orient="index", columns=cols)
    df.index.name = "layer"
    df.attrs["measure"] = "/".join(sorted(used))
    df.attrs["tokens"] = len(view.ids) - start
    df.attrs["status"] = "ok"
    return df


def _best_matching(a: np.ndarray, b: np.ndarray, E: int) -> tuple[float, dict]:
    """Highest top-1 agreement over one-to-one relabellings of b's experts (exhaustive for E <= 8,
    else greedy on the contingency table); returns (agreement, mapping b->a)."""
    table = np.zeros((E, E), dtype=np.int64)
    np.add.at(table, (b, a), 1)
    if E <= 8:
        best, perm_best = -1, tuple(range(E))
        for perm in itertools.permutations(range(E)):
            s = table[np.arange(E), perm].sum()
            if s > best:
                best, perm_best = s, perm
        mapping = {i: perm_best[i] for i in range(E)}
    else:
        mapping, t = {}, table.astype(float).copy()
        for _ in range(E):
            i, j = np.unravel_index(np.argmax(t), t.shape)
            mapping[int(i)] = int(j)
            t[i, :] = -1
            t[:, j] = -1
        best = sum(table[i, j] for i, j in mapping.items())
    return float(best) / max(len(a), 1), mapping


def _compare_layer(a: RoutingView, b: RoutingView, layer: int, n: int) -> dict:
    """One row of :func:`compare_views`: the layer's agreement over the first ``n`` tokens."""
    ka = a.kinds[layer] if layer < a.n_layers else "absent"
    kb = b.kinds[layer] if layer < b.n_layers else "absent"
    row = {"layer": layer, "kind_a": ka, "kind_b": kb, "tokens": n, "top1_agree": np.nan,
           "top1_agree_matched": np.nan, "chosen_overlap": np.nan, "weight_tv": np.nan, "note": ""}
    if ka in ("dense", "absent") or kb in ("dense", "absent"):
        row["note"] = "nothing to compare: " + " and ".join(
            f"{who} is {k}" for who, k in (("a", ka), ("b", kb)) if k in ("dense", "absent"))
        return row
    wa, wb = a.weights[layer][:n], b.weights[layer][:n]
    ta, tb = wa.argmax(-1), wb.argmax(-1)
    row["top1_agree"] = float((ta == tb).mean())
    if wa.shape[1] == wb.shape[1]:
        row["top1_agree_matched"], _ = _best_matching(ta, tb, wa.shape[1])
        row["weight_tv"] = float(0.5 * np.abs(wa - wb).sum(-1).mean())
    else:
        row["note"] = f"different expert counts ({wa.shape[1]} vs {wb.shape[1]})"
    sa, sb = a.experts[layer][:n], b.experts[layer][:n]
    row["chosen_overlap"] = float(np.mean([len(set(x) & set(y)) / len(set(x) | set(y)) for x, y in zip(sa, sb)]))
    return row


def compare_views(a: RoutingView, b: RoutingView) -> pd.DataFrame:
    """Side by side, per layer, over the tokens both views share (their common prefix of ids):

    ``top1_agree`` share of tokens with the same top expert; ``top1_agree_matched`` the same after
    the best one-to-one relabelling of b's experts (expert numbers of two different runs are
    arbitrary; of two checkpoints of one run they are not); ``chosen_overlap`` mean Jaccard overlap
    of the chosen expert sets; ``weight_tv`` mean total-variation distance between the two
    weight vectors (0 = same weights, 1 = disjoint). Layers dense in either view have NaNs and a
    ``note``. Raises ValueError if the views share no token.
    """
    n = shared_prefix(a, b)
    if n == 0:
        raise ValueError("compare_views: the two views share no leading token (different texts or "
                         "tokenizers); route the same token ids through both models")
    rows = [_compare_layer(a, b, layer, n) for layer in range(max(a.n_layers, b.n_layers))]
    df = pd.DataFrame(rows).set_index("layer")
    df.attrs["a"], df.attrs["b"] = a.title, b.title
    return df
