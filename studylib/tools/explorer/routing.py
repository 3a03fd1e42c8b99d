"""Routing a token sequence through a model: which expert(s) each token used, per layer.

One forward pass with ``stats=True`` gives each routed layer's routing record (``ModelOutput.routing``:
the model's own decision, made by its :class:`studylib.nn.router.Router`): the experts each token
used, their combine weights and the router logits, whose distribution over all experts (the
softmax, or the sigmoid scores normalised) the view shows as ``probs``. The result is a
:class:`~studylib.tools.explorer.view.RoutingView`.

Every prompt is fed after an end-of-story token, as stories appear in the training windows
(``story <eos> story <eos> ...``); that ``</s>`` is the view's first token (``n_prefix = 1``).
"""
from __future__ import annotations

import warnings
from typing import Optional, Sequence

import numpy as np
import torch

from studylib.run.decode import ContextOverflowWarning, ffn_kind, generate
from studylib.tools.explorer.view import RoutingView


def _pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    if tokenizer is None:
        return [str(i) for i in ids]
    return [tokenizer.id_to_piece(int(i)) for i in ids]


def _forward(model, ids: list[int]):
    """``(out, nll_S)``: the model's output with router stats and routing records, and each
    position's -log p(token | previous tokens) (NaN at 0)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            x = torch.tensor([ids], dtype=torch.long, device=device)
            out = model(x, stats=True)
            logp = torch.log_softmax(out.logits[0].float(), -1)
            nll = np.full(len(ids), np.nan)
            if len(ids) > 1:
                nll[1:] = (-logp[:-1].gather(1, x[0, 1:, None])[:, 0]).cpu().numpy()
    finally:
        model.train(was_training)
    return out, nll


def _chosen_experts(rec) -> list[list[int]]:
    """Per token, the experts it used (the routing record's, all of them for the soft MoE), by
    weight (descending; ties by expert id)."""
    idx_TK, w_TK = rec.idx_TK.cpu().numpy(), rec.w_TK.float().cpu().numpy()
    return [[int(e) for e in row[np.lexsort((row, -w))]] for row, w in zip(idx_TK, w_TK)]


def route_ids(model, tokenizer, ids: Sequence[int], *, text: Optional[str] = None, n_prefix: int = 0,
              n_prompt: Optional[int] = None, label: str = "", step: Optional[int] = None) -> RoutingView:
    """Route a token sequence (see :func:`route_text`); longer than the context: the first
    ``context`` tokens are kept (``view.truncated`` says how many were cut). ``step``: the
    optimizer step of the model's weights (``LoadedRun.step``), for captions."""
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("route_ids: nothing to route (empty token sequence)")
    ctx = model.cfg.context
    truncated = max(0, len(ids) - ctx)
    ids = ids[:ctx]
    kinds = [ffn_kind(b.ffn) for b in model.blocks]
    out, nll = _forward(model, ids)
    weights, probs, experts = [], [], []
    E = K = 0
    for i, rec in enumerate(out.routing):
        if rec is None or kinds[i] == "dense":
            weights.append(None), probs.append(None), experts.append(None)
            continue
        w = rec.combine_TE().float().cpu().numpy()
        p = model.blocks[i].ffn.router.distribution(rec.logits_TE).float().cpu().numpy()
        chosen = _chosen_experts(rec)
        E = w.shape[1]
        K = max(K, max(len(c) for c in chosen))
        weights.append(w), probs.append(p), experts.append(chosen)
    if text is None:
        text = tokenizer.decode(ids[n_prefix:]) if tokenizer is not None else " ".join(map(str, ids))
    return RoutingView(
        text=text, ids=ids, tokens=_pieces(tokenizer, ids), kinds=kinds, weights=weights, probs=probs,
        experts=experts, num_experts=E, top_k=K, nll=nll, n_prefix=min(n_prefix, len(ids)),
        n_prompt=n_prompt, truncated=truncated, label=label, step=step,
        model_name=getattr(model.cfg, "name", ""), router_stats=list(out.router_stats))


def _prompt_ids(tokenizer, text: str, prepend_eos: bool) -> tuple[list[int], int]:
    if tokenizer is None:
        raise ValueError("routing a text needs the run's tokenizer (RunDir.load_model found none)")
    prefix = [tokenizer.eos_id()] if prepend_eos and tokenizer.eos_id() >= 0 else []
    ids = prefix + list(tokenizer.encode(text))
    if not ids:
        raise ValueError("route_text: empty text (and no end-of-story token to start from)")
    return ids, len(prefix)


def route_text(model, tokenizer, text: str, *, prepend_eos: bool = True, label: str = "",
               step: Optional[int] = None) -> RoutingView:
    """Tokenise ``text`` (after an end-of-story token, as in training) and record, per layer, each
    token's chosen expert(s) and gate weights (see :class:`RoutingView`). A dense model gives a
    view with ``routed == False`` and a "nothing to route" :attr:`~RoutingView.status`."""
    ids, n_prefix = _prompt_ids(tokenizer, text, prepend_eos)
    return route_ids(model, tokenizer, ids, text=text, n_prefix=n_prefix, label=label, step=step)


def generate_and_route(model, tokenizer, prompt: str, n_new: int, *, temperature: float = 0.0,
                       top_k: Optional[int] = None, top_p: Optional[float] = None, seed: Optional[int] = 0,
                       stop_at_eos: bool = False, prepend_eos: bool = True, label: str = "",
                       step: Optional[int] = None) -> RoutingView:
    """Continue ``prompt`` by ``n_new`` tokens (:func:`studylib.run.decode.generate`, greedy by
    default; at most ``context - 1``) and route prompt + continuation in one causal forward pass,
    so each position's routing is the one the model used for that token. ``view.n_prompt`` marks
    where the generated tokens start, ``view.continuation`` is their text and ``view.generation``
    the :class:`~studylib.run.decode.Generation` (whose ``routing[i]`` is the routing at the
    position that *produced* generated token ``i``, i.e. position ``n_prompt + i - 1`` here)."""
    ids, n_prefix = _prompt_ids(tokenizer, prompt, prepend_eos)
    n_new = max(0, min(int(n_new), model.cfg.context - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextOverflowWarning)  # reported as view.truncated
        g = generate(model, ids, n_new, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                     eos_id=tokenizer.eos_id() if stop_at_eos else None, return_routing=True)
    n_prefix = max(0, n_prefix - g.truncated)
    view = route_ids(model, tokenizer, list(g.prompt) + list(g.tokens), text=prompt, n_prefix=n_prefix,
                     n_prompt=len(g.prompt), label=label, step=step)
    view.truncated = g.truncated
    view.continuation = tokenizer.decode(g.tokens)
    view.generation = g
    return view


def samples_per_model(runs, prompt: str, max_new: int = 32, temperature: float = 0.8, seed: int = 0):
    """One continuation of ``prompt`` per model: the first finished run of each model among
    ``runs`` (:class:`~studylib.tools.explorer.runs.RunInfo`; the preset's own runs, not variants
    at other budgets), at most ``max_new`` tokens (half the
    context at most), routed as it was generated. A frame: model, kind, seed, continuation, its
    pieces and what was routed."""
    import pandas as pd

    first: dict = {}
    for r in runs:
        if r.finished and r.tag is None and r.model not in first:
            first[r.model] = r
    rows = []
    for name, r in first.items():
        loaded = r.load()
        g = generate_and_route(loaded.model, loaded.tokenizer, prompt, min(max_new, loaded.config.context // 2),
                               temperature=temperature, seed=seed, label=name, step=loaded.step)
        rows.append({"model": name, "kind": r.kind, "seed": r.seed, "continuation": g.continuation,
                     "pieces": " ".join(g.tokens[g.n_prompt:]),
                     "routing": "nothing to route (dense)" if not g.routed else f"{g.kind}, {g.num_experts} experts"})
    return pd.DataFrame(rows)
