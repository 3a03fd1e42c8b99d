"""What the routers learn, per routed layer, measured at the end of training (the run's latest
checkpoint) on its whole validation split (fp32, no dropout):

* ``changed``: the share of tokens whose K experts (as a set) differ from those the run's
  *initial* router weights pick for the same router input (the trained model's hidden state): what
  the router's weights learned. 0 for the hash and the frozen router by construction.
* ``changed_model``: the same against the initial *model*'s own forward (its hidden states and its
  router): what training changed in the routing, the router's input included (a frozen router's
  choices move only through its input).
  The initial model is rebuilt exactly: the trainer seeds everything with the run's seed and then
  builds the model (:func:`studylib.run.dist.seed_everything`, :class:`~studylib.nn.model.Decoder`),
  so doing the same gives the step-0 weights bit for bit (tested on a frozen router's run).
* ``load_<e>``: each expert's share of the layer's assignments (sums to 1; balanced: 1/E), and
  ``busiest`` = E x the largest share (1 = balanced).
* ``entropy_given_id``: H(S | token id) in bits, S the token's set of K experts: how much the
  choice depends on context beyond the token itself (0 for the hash router; plug-in estimate over
  the validation tokens, biased low for rare ids), beside ``entropy`` = H(S) (at most
  log2 binom(E, K)).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd
import torch

from studylib.nn.model import Decoder
from studylib.run.dist import seed_everything
from studylib.run.spec import RunSpec
from studylib.study.analysis.probes import eval_windows


def initial_model(spec: RunSpec) -> Decoder:
    """The run's model at step 0 (what the trainer built under the run's seed)."""
    seed_everything(spec.seed)
    return Decoder(spec.preset.model_config(spec.model)).eval()


def _entropy_bits(counts: np.ndarray) -> float:
    c = counts[counts > 0].astype(float)
    if c.sum() == 0:
        return math.nan
    p = c / c.sum()
    return float(-(p * np.log2(p)).sum())


def _conditional_entropy_bits(joint: np.ndarray) -> float:
    """H(S | V) in bits from a (V, codes) table of counts."""
    n = joint.sum()
    per_id = joint.sum(axis=1)
    return float(sum(per_id[v] / n * _entropy_bits(joint[v]) for v in np.flatnonzero(per_id)))


@torch.no_grad()
def router_measures(spec: RunSpec, data=None, batch_size: int = 32, n_windows: Optional[int] = None) -> pd.DataFrame:
    """One row per routed layer of ``spec``'s run (model, seed, layer, tokens, changed, changed_model, busiest,
    entropy, entropy_given_id, load_0 .. load_{E-1}); empty for a model without a routed layer of
    more than one expert. ``data``: the run's token data when loaded; ``n_windows``: a subset of the
    validation windows (None: all)."""
    cfg = spec.preset.model_config(spec.model)
    f = cfg.ffn
    if f.kind != "moe" or f.num_experts < 2:
        return pd.DataFrame()
    model = spec.rundir.load_model(device="cpu").model.float().eval()
    init = initial_model(spec)
    data, idx = eval_windows(spec.run_dir, n_windows, data)
    routers, routers0 = model.routers(), init.routers()
    E, K, V = f.num_experts, f.top_k, cfg.vocab_size
    codes = E ** K
    place = torch.tensor([E ** k for k in range(K)])
    joint = [np.zeros((V, codes), dtype=np.int64) for _ in routers]
    loads = [np.zeros(E, dtype=np.int64) for _ in routers]
    changed, changed_model, seen = [0] * len(routers), [0] * len(routers), 0
    inputs: dict[int, tuple] = {}
    hooks = [r.register_forward_pre_hook(lambda mod, args, i=i: inputs.__setitem__(i, args))
             for i, r in enumerate(routers)]
    try:
        for start in range(0, len(idx), batch_size):
            w = data.windows(idx[start:start + batch_size])[:, :-1]
            out = model(w, return_logits=True, aux_losses=False)
            ids_T = w.reshape(-1)
            seen += ids_T.numel()
            recs = [r for r in out.routing if r is not None]
            recs0 = [r for r in init(w, return_logits=True, aux_losses=False).routing if r is not None]
            for i, rec in enumerate(recs):
                x_TD = inputs[i][0]
                now = rec.idx_TK.sort(-1).values
                was = routers0[i](x_TD, ids_T).idx_TK.sort(-1).values
                changed[i] += int((now != was).any(-1).sum())
                changed_model[i] += int((now != recs0[i].idx_TK.sort(-1).values).any(-1).sum())
                loads[i] += np.bincount(now.reshape(-1).numpy(), minlength=E)
                code = (now * place).sum(-1).numpy()
                np.add.at(joint[i], (ids_T.numpy(), code), 1)
    finally:
        for h in hooks:
            h.remove()
    rows = []
    for i, layer in enumerate(model.routed_layers()):
        share = loads[i] / loads[i].sum()
        rows.append({"model": spec.model, "seed": spec.seed, "layer": layer, "tokens": seen,
                     "changed": changed[i] / seen, "changed_model": changed_model[i] / seen, "busiest": float(E * share.max()),
                     "entropy": _entropy_bits(joint[i].sum(axis=0)),
                     "entropy_given_id": _conditional_entropy_bits(joint[i]),
                     **{f"load_{e}": float(share[e]) for e in range(E)}})
    return pd.DataFrame(rows)


def measures(specs, n_windows: Optional[int] = None) -> pd.DataFrame:
    """:func:`router_measures` of several runs (one data load per corpus), in one frame."""
    from studylib.data.pipeline import shared_data

    frames = [router_measures(s, shared_data(s.preset.data), n_windows=n_windows) for s in specs]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def routed_specs(runs, cells) -> list:
    """The runs of each cell's routers whose routing is measured: its reference MoE, hash and frozen
    routers (``runs.specs[i]``: cell ``i``'s planned runs, in plan order)."""
    return [s for i, c in enumerate(cells) for s in runs.specs[i]
            if s.model in {c.moe, c.role("hash"), c.role("frozen")}]


def summary(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per model and layer: mean, sample std and n over seeds of changed, changed_model, busiest,
    entropy and entropy_given_id."""
    if per_run.empty:
        return per_run
    cols = ["changed", "changed_model", "busiest", "entropy", "entropy_given_id"]
    g = per_run.groupby(["model", "layer"], sort=False)[cols]
    out = g.mean().add_suffix("_mean").join(g.std(ddof=1).add_suffix("_std")).join(g.size().rename("n"))
    return out[[f"{c}_{s}" for c in cols for s in ("mean", "std")] + ["n"]].reset_index()


__all__ = ["initial_model", "measures", "routed_specs", "router_measures", "summary"]
