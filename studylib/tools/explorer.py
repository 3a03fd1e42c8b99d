"""The routing explorer's logic: where the router sends which token, and how that changes over training.

Plain functions (unit-tested; the widgets only call them):

* :func:`list_runs` finds run directories under an outputs folder (``<root>/<preset>/runs/<model>/
  seed<N>/``, or a preset's own folder) as :class:`RunInfo` (path + preset / model / seed labels);
* :func:`list_checkpoints` gives the steps a run can be loaded at (its ``step_<N>.pt`` snapshots,
  written with ``train.keep_checkpoints``, plus the step of ``latest.pt``);
  :func:`load_checkpoint_model` loads one: ``(model, tokenizer, cfg)`` as
  :func:`studylib.run.decode.load_run`, with ``model.checkpoint_info`` (path, step) set;
* :func:`route_text` runs a text through a model and returns a :class:`RoutingView`: the tokens
  (SentencePiece pieces) and, per layer, each token's chosen expert(s) and their gate weights
  (the renormalised top-k weights of the sparse MoE; the soft MoE's gate over all K experts).
  A dense model gives a view whose :attr:`RoutingView.status` says there is nothing to route;
* :func:`routing_grid_figure` draws a view as a tokens x layers grid (colour = top expert,
  shade and number = its weight), optionally beside a second view;
* :func:`expert_shares` (per layer, the share of the text's tokens each expert got),
  :func:`compare_views` (two runs or two checkpoints on the same tokens: top-1 agreement per
  layer, also after the best relabelling of experts, overlap of the chosen sets, weight distance);
* :func:`diagnostics_over_training` (the per-layer router statistics of ``metrics.jsonl`` as a
  frame, with a step selector) and :func:`diagnostics_figure`;
* :func:`generate_and_route` continues a prompt with :func:`studylib.run.decode.generate` and
  routes the prompt and the generated tokens.

:class:`Explorer` (``build_explorer(outputs_root)``) wires these to ipywidgets: a run dropdown,
a checkpoint slider over the saved steps, a prompt box with preset prompts, an optional second
run / checkpoint to compare with, a generate button, and output areas (the grid as an image,
the shares and comparison tables, the diagnostics plot with its own step selector).

Every prompt is fed after an end-of-story token, as stories appear in the training windows
(``story <eos> story <eos> ...``); that ``</s>`` is the view's first token (``n_prefix = 1``).
"""
from __future__ import annotations

import html
import io
import itertools
import math
import os
import re
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
import torch

from studylib.run import checkpoint

from studylib.run import rundir as runs

PRESET_PROMPTS = (
    "Once upon a time",
    "Once upon a time, there was a little girl named Lily. She loved to",
    "The dog ran to the park and",
    "Tom and his mom went to the store. They wanted to buy",
    "One day, a big red ball",
)
ROUTER_METRICS = ("busiest", "usage_var", "entropy", "top1", "margin", "logz")
SOFT_METRICS = ("usage_entropy", "max_gt_0.9")
DIAG_PLOT_METRICS = ("val_loss", "entropy", "busiest", "top1", "margin", "logz")
_METRIC_TITLES = {
    "val_loss": "validation loss", "train_loss": "train loss", "entropy": "router entropy",
    "busiest": "busiest-expert share", "usage_var": "expert-usage variance",
    "top1": "gate (mean top-1 prob)", "margin": "top1 - top2 margin", "logz": "router log-z",
    "usage_entropy": "usage entropy", "max_gt_0.9": "share of tokens with gate > 0.9",
}


# --------------------------------------------------------------------------------------------
# runs and checkpoints
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunInfo:
    """One run directory and its labels (usable wherever a path is: ``os.fspath(info)``)."""

    path: Path
    preset: str
    model: str
    seed: Optional[int]
    kind: str = "?"  # the model's FFN kind: dense | moe | soft
    finished: bool = False

    @property
    def label(self) -> str:
        seed = f"seed{self.seed}" if self.seed is not None else self.path.name
        return f"{self.preset} / {self.model} / {seed} ({self.kind}{'' if self.finished else ', unfinished'})"

    def __fspath__(self) -> str:
        return str(self.path)


def run_info(run_dir: str | os.PathLike) -> RunInfo:
    """The labels of one run directory (from its ``config.yaml``, else its path)."""
    run_dir = Path(run_dir)
    doc = runs.read_config(run_dir) or {}
    r = doc.get("run") or {}
    ffn = ((doc.get("model") or {}).get("ffn") or {})
    seed = r.get("seed")
    if seed is None:
        m = re.fullmatch(r"seed(\d+)", run_dir.name)
        seed = int(m.group(1)) if m else None
    preset = r.get("preset") or (run_dir.parents[2].name if len(run_dir.parents) > 2 else "?")
    return RunInfo(path=run_dir, preset=str(preset), model=str(r.get("model") or run_dir.parent.name),
                   seed=seed, kind=str(ffn.get("kind", "?")), finished=runs.is_finished(run_dir))


def list_runs(outputs_root: str | os.PathLike, finished_only: bool = False) -> list[RunInfo]:
    """Run directories (holding ``config.yaml`` and a checkpoint) below ``outputs_root``.

    ``outputs_root`` may be the outputs folder (``<root>/<preset>/runs/...``), one preset's
    folder (``<root>/<preset>/runs/...``) or a run directory itself. Sorted by preset, model, seed.
    """
    root = Path(outputs_root)
    if not root.is_dir():
        return []
    found = []
    cands = [root / runs.CONFIG_FILE] if (root / runs.CONFIG_FILE).is_file() else \
        itertools.chain(root.glob(f"runs/*/*/{runs.CONFIG_FILE}"), root.glob(f"*/runs/*/*/{runs.CONFIG_FILE}"))
    for cfg in cands:
        rd = cfg.parent
        ck = rd / runs.CHECKPOINT_DIR
        if not ((ck / checkpoint.LATEST).is_file() or (ck / checkpoint.PREV).is_file()
                or checkpoint.list_snapshots(ck)):
            continue
        try:
            info = run_info(rd)
        except Exception:  # an unreadable config: not a run we can show
            continue
        if finished_only and not info.finished:
            continue
        found.append(info)
    found.sort(key=lambda i: (i.preset, i.model, -1 if i.seed is None else i.seed, str(i.path)))
    return found


def _latest_step(ck_dir: Path) -> Optional[int]:
    for name in (checkpoint.LATEST, checkpoint.PREV):
        p = ck_dir / name
        if p.is_file():
            try:
                state = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
                return int(state["step"])
            except Exception:
                continue
    return None


def list_checkpoints(run_dir: str | os.PathLike) -> list[int]:
    """Optimizer steps at which ``run_dir`` can be loaded, ascending: its ``step_<N>.pt``
    snapshots and the step of ``checkpoints/latest.pt`` (empty if it has no checkpoint)."""
    ck = Path(run_dir) / runs.CHECKPOINT_DIR
    steps = {s for s, _ in checkpoint.list_snapshots(ck)}
    last = _latest_step(ck)
    if last is not None:
        steps.add(last)
    return sorted(steps)


def load_checkpoint_model(run_dir: str | os.PathLike, step: Optional[int] = None, device="cpu"):
    """``(model, tokenizer, cfg)`` of ``run_dir`` at optimizer step ``step`` (None: the latest).

    A step loads its ``step_<N>.pt`` snapshot, or ``latest.pt`` when that is the step it holds.
    The model is in eval mode; ``model.checkpoint_info['step']`` is the step it was saved at.
    """
    from studylib.run.decode import load_run

    run_dir = Path(run_dir)
    if step is None:
        return load_run(run_dir, device=device)
    ck = run_dir / runs.CHECKPOINT_DIR
    snap = checkpoint.snapshot_path(ck, int(step))
    if snap.is_file():
        return load_run(run_dir, checkpoint_path=snap, device=device)
    if _latest_step(ck) == int(step):
        return load_run(run_dir, device=device)
    raise ValueError(f"{run_dir}: no checkpoint at step {step}; saved steps: {list_checkpoints(run_dir)} "
                     f"(train with train.keep_checkpoints=true to keep one per evaluation)")


# --------------------------------------------------------------------------------------------
# routing a text
# --------------------------------------------------------------------------------------------
@dataclass
class RoutingView:
    """How one model routed one token sequence. S tokens, L layers, E experts.

    ``weights[l]``: (S, E) combine weights of layer ``l`` (the renormalised top-k weights, 0 for
    experts a token did not choose; the soft MoE's gate) or ``None`` for a dense layer;
    ``probs[l]``: the router softmax over all E experts (equal to ``weights[l]`` for the soft MoE);
    ``experts[l][t]``: the experts token ``t`` used at layer ``l``, by weight (descending).
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
    step: Optional[int] = None
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

    def to_frame(self) -> pd.DataFrame:
        """Long frame: one row per (position, layer, chosen expert) with its weight and router prob."""
        rows = []
        for layer, w in enumerate(self.weights):
            for t, (tid, piece) in enumerate(zip(self.ids, self.tokens)):
                base = {"position": t, "id": tid, "token": piece, "layer": layer, "kind": self.kinds[layer],
                        "generated": self.n_prompt is not None and t >= self.n_prompt}
                if w is None:
                    rows.append({**base, "rank": np.nan, "expert": np.nan, "weight": np.nan, "prob": np.nan})
                    continue
                for rank, e in enumerate(self.experts[layer][t]):
                    rows.append({**base, "rank": rank, "expert": e, "weight": float(w[t, e]),
                                 "prob": float(self.probs[layer][t, e])})
        return pd.DataFrame(rows)


def _layer_kind(ffn) -> str:
    from studylib.nn.ffn import SoftMoE, SparseMoE

    return "moe" if isinstance(ffn, SparseMoE) else "soft" if isinstance(ffn, SoftMoE) else "dense"


def _pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    if tokenizer is None:
        return [str(i) for i in ids]
    return [tokenizer.id_to_piece(int(i)) for i in ids]


def route_ids(model, tokenizer, ids: Sequence[int], *, text: Optional[str] = None, n_prefix: int = 0,
              n_prompt: Optional[int] = None, label: str = "") -> RoutingView:
    """Route a token sequence (see :func:`route_text`); longer than the context: the first
    ``context`` tokens are kept (``view.truncated`` says how many were cut)."""
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("route_ids: nothing to route (empty token sequence)")
    ctx = model.cfg.context
    truncated = max(0, len(ids) - ctx)
    ids = ids[:ctx]
    kinds = [_layer_kind(b.ffn) for b in model.blocks]
    probes, handles = {}, []
    for i, blk in enumerate(model.blocks):
        if kinds[i] != "dense":
            def hook(module, args, _i=i):
                probes[_i] = torch.softmax(module.router_logits(args[0].reshape(-1, args[0].shape[-1])), -1)
            handles.append(blk.ffn.register_forward_pre_hook(hook))
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
        for h in handles:
            h.remove()
        model.train(was_training)
    weights, probs, experts = [], [], []
    E = K = 0
    for i, tr in enumerate(out.token_routing):
        if tr is None or kinds[i] == "dense":
            weights.append(None), probs.append(None), experts.append(None)
            continue
        w = tr[0].float().cpu().numpy()
        p = probes[i].float().cpu().numpy() if i in probes else w
        order = np.argsort(-w, axis=1, kind="stable")
        if kinds[i] == "soft":
            chosen = [list(map(int, row)) for row in order]
        else:
            k = model.blocks[i].ffn.cfg.top_k
            chosen = [[int(e) for e in row[:k] if w[t, e] > 0] for t, row in enumerate(order)]
        E = w.shape[1]
        K = max(K, max(len(c) for c in chosen))
        weights.append(w), probs.append(p), experts.append(chosen)
    if text is None:
        text = tokenizer.decode(ids[n_prefix:]) if tokenizer is not None else " ".join(map(str, ids))
    return RoutingView(
        text=text, ids=ids, tokens=_pieces(tokenizer, ids), kinds=kinds, weights=weights, probs=probs,
        experts=experts, num_experts=E, top_k=K, nll=nll, n_prefix=min(n_prefix, len(ids)),
        n_prompt=n_prompt, truncated=truncated, label=label, step=(getattr(model, "checkpoint_info", None) or {}).get("step"),
        model_name=getattr(model.cfg, "name", ""), router_stats=list(out.router_stats))


def _prompt_ids(tokenizer, text: str, prepend_eos: bool) -> tuple[list[int], int]:
    if tokenizer is None:
        raise ValueError("routing a text needs the run's tokenizer (load_run found none)")
    prefix = [tokenizer.eos_id()] if prepend_eos and tokenizer.eos_id() >= 0 else []
    ids = prefix + list(tokenizer.encode(text))
    if not ids:
        raise ValueError("route_text: empty text (and no end-of-story token to start from)")
    return ids, len(prefix)


def route_text(model, tokenizer, text: str, *, prepend_eos: bool = True, label: str = "") -> RoutingView:
    """Tokenise ``text`` (after an end-of-story token, as in training) and record, per layer, each
    token's chosen expert(s) and gate weights (see :class:`RoutingView`). A dense model gives a
    view with ``routed == False`` and a "nothing to route" :attr:`~RoutingView.status`."""
    ids, n_prefix = _prompt_ids(tokenizer, text, prepend_eos)
    return route_ids(model, tokenizer, ids, text=text, n_prefix=n_prefix, label=label)


def generate_and_route(model, tokenizer, prompt: str, n_new: int, *, temperature: float = 0.0,
                       top_k: Optional[int] = None, top_p: Optional[float] = None, seed: Optional[int] = 0,
                       stop_at_eos: bool = False, prepend_eos: bool = True, label: str = "") -> RoutingView:
    """Continue ``prompt`` by ``n_new`` tokens (:func:`studylib.run.decode.generate`, greedy by
    default; at most ``context - 1``) and route prompt + continuation in one causal forward pass,
    so each position's routing is the one the model used for that token. ``view.n_prompt`` marks
    where the generated tokens start, ``view.continuation`` is their text and ``view.generation``
    the :class:`~studylib.run.decode.Generation` (whose ``routing[i]`` is the routing at the
    position that *produced* generated token ``i``, i.e. position ``n_prompt + i - 1`` here)."""
    from studylib.run.decode import ContextOverflowWarning, generate

    ids, n_prefix = _prompt_ids(tokenizer, prompt, prepend_eos)
    n_new = max(0, min(int(n_new), model.cfg.context - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextOverflowWarning)  # reported as view.truncated
        g = generate(model, ids, n_new, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                     eos_id=tokenizer.eos_id() if stop_at_eos else None, return_routing=True)
    full = list(g.prompt) + list(g.tokens)
    n_prefix = max(0, n_prefix - g.truncated)
    cont = tokenizer.decode(g.tokens)
    view = route_ids(model, tokenizer, full, text=prompt, n_prefix=n_prefix, n_prompt=len(g.prompt), label=label)
    view.truncated = g.truncated
    view.continuation = cont
    view.generation = g
    return view


# --------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------
def expert_shares(view: RoutingView, measure: str = "auto", include_prefix: bool = False) -> pd.DataFrame:
    """Per routed layer (rows) and expert (columns ``e0..``): the share of this text's tokens the
    expert got; rows sum to 1.

    ``measure``: ``auto`` = ``assign`` for the sparse MoE (share of the S*k token->expert
    assignments, the f_e of the balance loss) and ``gate`` for the soft MoE (mean gate weight);
    ``top1`` = share of tokens whose highest-weight expert it is; ``weight`` = mean combine weight.
    The end-of-story prefix is left out unless ``include_prefix``. A dense view gives an empty
    frame whose ``attrs["status"]`` says why.
    """
    if measure not in ("auto", "assign", "gate", "top1", "weight"):
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
        w = view.weights[layer][start:]
        m = measure if measure != "auto" else ("assign" if view.kinds[layer] == "moe" else "gate")
        used.add(m)
        if m == "assign":
            counts = np.zeros(view.num_experts)
            for chosen in view.experts[layer][start:]:
                counts[chosen] += 1
            share = counts / counts.sum()
        elif m == "top1":
            share = np.bincount(w.argmax(-1), minlength=view.num_experts) / len(w)
        else:  # gate / weight: mean combine weight (rows of w sum to 1)
            share = w.mean(0)
        rows[layer] = share
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


def compare_views(a: RoutingView, b: RoutingView) -> pd.DataFrame:
    """Side by side, per layer, over the tokens both views share (their common prefix of ids):

    ``top1_agree`` share of tokens with the same top expert; ``top1_agree_matched`` the same after
    the best one-to-one relabelling of b's experts (expert numbers of two different runs are
    arbitrary; of two checkpoints of one run they are not); ``chosen_overlap`` mean Jaccard overlap
    of the chosen expert sets; ``weight_tv`` mean total-variation distance between the two
    weight vectors (0 = same weights, 1 = disjoint). Layers dense in either view have NaNs and a
    ``note``. Raises ValueError if the views share no token.
    """
    n = 0
    for x, y in zip(a.ids, b.ids):
        if x != y:
            break
        n += 1
    if n == 0:
        raise ValueError("compare_views: the two views share no leading token (different texts or "
                         "tokenizers); route the same token ids through both models")
    rows = []
    for layer in range(max(a.n_layers, b.n_layers)):
        ka = a.kinds[layer] if layer < a.n_layers else "absent"
        kb = b.kinds[layer] if layer < b.n_layers else "absent"
        row = {"layer": layer, "kind_a": ka, "kind_b": kb, "tokens": n, "top1_agree": np.nan,
               "top1_agree_matched": np.nan, "chosen_overlap": np.nan, "weight_tv": np.nan, "note": ""}
        if ka in ("dense", "absent") or kb in ("dense", "absent"):
            row["note"] = "nothing to compare: " + " and ".join(
                f"{'a' if k is ka else 'b'} is {k}" for k in (ka, kb) if k in ("dense", "absent"))
            rows.append(row)
            continue
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
        rows.append(row)
    df = pd.DataFrame(rows).set_index("layer")
    df.attrs["a"], df.attrs["b"] = _view_title(a), _view_title(b)
    return df


# --------------------------------------------------------------------------------------------
# diagnostics over training
# --------------------------------------------------------------------------------------------
def diagnostics_over_training(run_dir: str | os.PathLike, step: Optional[int] = None) -> pd.DataFrame:
    """The eval records of ``metrics.jsonl`` as one row per (eval step, layer): ``step``,
    ``tokens``, ``layer``, ``kind``, ``val_loss``, ``train_loss`` and the layer's router
    statistics (``busiest``, ``usage_var``, ``entropy``, ``top1``, ``margin``, ``logz``; soft
    MoE also ``usage_entropy`` and ``max_gt_0.9``; ``shares`` as a list). Dense layers have NaN
    router statistics.

    ``step`` selects one evaluation: the last one at or before ``step`` (the first one if
    ``step`` is earlier). ``attrs["steps"]`` lists all eval steps, ``attrs["selected_step"]`` the
    chosen one (None without a selector).
    """
    from studylib.config import model_from_dict

    run_dir = Path(run_dir)
    doc = runs.read_config(run_dir) or {}
    layer_kinds = None
    if isinstance(doc.get("model"), dict):
        try:
            mcfg = model_from_dict(doc["model"])
            layer_kinds = [mcfg.ffn_for_layer(i).kind for i in range(mcfg.n_layers)]
        except Exception:
            layer_kinds = None
    cols = ["step", "tokens", "layer", "kind", "val_loss", "train_loss", *ROUTER_METRICS, *SOFT_METRICS, "shares"]
    rows = []
    for r in runs.read_metrics(run_dir):
        if r.get("kind") != "eval":
            continue
        router = r.get("router")
        n_layers = len(router) if isinstance(router, list) else (len(layer_kinds) if layer_kinds else 1)
        for layer in range(n_layers):
            st = router[layer] if isinstance(router, list) else None
            kind = layer_kinds[layer] if layer_kinds and layer < len(layer_kinds) else \
                ("dense" if not isinstance(st, dict) else ("soft" if "usage_entropy" in st else "moe"))
            row = {"step": r.get("step"), "tokens": r.get("tokens"), "layer": layer, "kind": kind,
                   "val_loss": r.get("val_loss"), "train_loss": r.get("train_loss")}
            for m in (*ROUTER_METRICS, *SOFT_METRICS):
                v = st.get(m) if isinstance(st, dict) else None
                row[m] = float(v) if isinstance(v, (int, float)) else np.nan
            row["shares"] = list(st["shares"]) if isinstance(st, dict) and isinstance(st.get("shares"), list) else None
            rows.append(row)
    df = pd.DataFrame(rows, columns=cols)
    for c in ("val_loss", "train_loss", *ROUTER_METRICS, *SOFT_METRICS):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    steps = sorted({int(s) for s in df["step"].dropna()})
    selected = None
    if step is not None and steps:
        before = [s for s in steps if s <= int(step)]
        selected = before[-1] if before else steps[0]
        df = df[df["step"] == selected].reset_index(drop=True)
    df.attrs["steps"] = steps
    df.attrs["selected_step"] = selected
    df.attrs["run"] = str(run_dir)
    return df


# --------------------------------------------------------------------------------------------
# figures (matplotlib Figure objects, not pyplot: no global state, nothing shown by accident)
# --------------------------------------------------------------------------------------------
def _palette(n: int) -> list:
    import seaborn as sns

    return list(sns.color_palette("tab10" if n <= 10 else "husl", max(n, 1)))


def _view_title(v: RoutingView) -> str:
    who = v.label or v.model_name or "model"
    return f"{who}" + (f" @ step {v.step}" if v.step is not None else "")


def _show_piece(piece: str) -> str:
    return piece.replace("\n", "\\n") if piece else "''"


def _draw_grid(ax, view: RoutingView, rows: slice, palette, other: Optional[RoutingView] = None,
               annotate: bool = True) -> None:
    from matplotlib.patches import Rectangle

    S = len(view.ids[rows])
    L = view.n_layers
    rgba = np.ones((S, L, 4))
    top, topw = view.top_expert[rows], view.top_weight[rows]
    for layer in range(L):
        if view.weights[layer] is None:
            rgba[:, layer, :3] = 0.88
            continue
        k = view.top_k if view.kinds[layer] == "moe" else view.num_experts
        lo = 1.0 / max(k, 1)  # the top weight is at least 1/k
        for t in range(S):
            c = np.asarray(palette[top[t, layer] % len(palette)])
            shade = 1.0 if lo >= 1.0 else 0.2 + 0.8 * float(np.clip((topw[t, layer] - lo) / (1 - lo), 0, 1))
            rgba[t, layer, :3] = 1 - shade * (1 - c)
    ax.imshow(rgba, aspect="auto", interpolation="nearest")
    fs = 8 if S <= 48 else 6
    for t in range(S):
        for layer in range(L):
            if view.weights[layer] is None:
                txt = "dense" if annotate else ""
            else:
                w = topw[t, layer]
                txt = f"e{top[t, layer]} " + (f"{w:.2f}".lstrip("0") if w < 0.995 else "1.0") if annotate else ""
            if txt:
                ax.text(layer, t, txt, ha="center", va="center", fontsize=fs, color="0.15")
    if other is not None:  # outline cells whose top expert differs from the other view's
        n = 0
        for x, y in zip(view.ids, other.ids):
            if x != y:
                break
            n += 1
        otop = other.top_expert
        start = rows.start or 0
        for t in range(S):
            g = start + t
            if g >= n:
                break
            for layer in range(min(L, other.n_layers)):
                if view.weights[layer] is not None and other.weights[layer] is not None \
                        and top[t, layer] != otop[g, layer]:
                    ax.add_patch(Rectangle((layer - 0.5, t - 0.5), 1, 1, fill=False, lw=1.2, ec="black"))
    start = rows.start or 0
    ax.set_yticks(range(S))
    labels = ax.set_yticklabels([_show_piece(p) for p in view.tokens[rows]], fontsize=fs + 1)
    for t, lab in enumerate(labels):
        g = start + t
        if g < view.n_prefix:
            lab.set_color("0.5")
        elif view.n_prompt is not None and g >= view.n_prompt:
            lab.set_color("#b2182b")
    if view.n_prompt is not None and start <= view.n_prompt - 0.5 < start + S and view.n_prompt > start:
        ax.axhline(view.n_prompt - start - 0.5, color="#b2182b", lw=1.5)
    ax.set_xticks(range(L))
    ax.set_xticklabels([f"L{i}\n{k}" for i, k in enumerate(view.kinds)], fontsize=8)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    ax.set_xticks(np.arange(-0.5, L, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, S, 1), minor=True)
    ax.grid(which="minor", color="white", lw=0.6)
    ax.grid(which="major", visible=False)
    for s in ax.spines.values():
        s.set_visible(False)


def routing_grid_figure(view: RoutingView, other: Optional[RoutingView] = None, *, annotate: bool = True,
                        max_tokens: int = 96, title: Optional[str] = None):
    """Tokens (rows, top to bottom) x layers (columns) grid of ``view``: colour = the token's top
    expert at that layer, shade = its weight (pale: no more than uniform over the chosen
    experts; full: 1), text = expert and weight; dense layers grey. With ``other`` the two are
    drawn side by side and cells whose top expert differs from the other view's are outlined.
    Generated tokens (``generate_and_route``) have red labels below a red line; the end-of-story
    prefix is grey. A view without routed layers gives a figure saying "nothing to route".
    Returns a :class:`matplotlib.figure.Figure` (not registered with pyplot).
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    views = [view] if other is None else [view, other]
    S = max(min(len(v.ids), max_tokens) for v in views)
    L = max(v.n_layers for v in views)
    E = max([v.num_experts for v in views] + [1])
    palette = _palette(E)
    width = max(4.2, 1.6 + 1.0 * L) * len(views) + 0.6
    height = 1.6 + 0.24 * S
    fig = Figure(figsize=(width, height), dpi=100)
    axes = fig.subplots(1, len(views), squeeze=False)[0]
    for i, (ax, v) in enumerate(zip(axes, views)):
        partner = views[1 - i] if len(views) == 2 else None
        if not v.routed:
            ax.set_axis_off()
            ax.text(0.5, 0.5, "nothing to route:\nthis model is dense\n(no router in any layer)", ha="center",
                    va="center", fontsize=11, transform=ax.transAxes, wrap=True)
            ax.set_title(_view_title(v), fontsize=10)
            continue
        _draw_grid(ax, v, slice(0, min(len(v.ids), max_tokens)), palette, partner, annotate)
        note = f" (first {max_tokens} of {len(v.ids)} tokens)" if len(v.ids) > max_tokens else ""
        ax.set_title(_view_title(v) + note, fontsize=10, pad=28)
    if any(v.routed for v in views):
        handles = [Patch(color=palette[e], label=f"e{e}") for e in range(E)]
        fig.legend(handles=handles, loc="lower center", ncol=min(E, 8), fontsize=8, frameon=False,
                   title="top expert (shade = its weight)", title_fontsize=8)
    fig.suptitle(title if title is not None else "Routing by token and layer", fontsize=11)
    fig.tight_layout(rect=(0, 0.6 / height if any(v.routed for v in views) else 0, 1, 1))
    return fig


def diagnostics_figure(df: pd.DataFrame, step: Optional[int] = None,
                       metrics: Sequence[str] = DIAG_PLOT_METRICS):
    """Small multiples of :func:`diagnostics_over_training` (all steps): losses, then each router
    statistic per layer over the eval steps; a dashed line marks ``step``. Returns a Figure."""
    import seaborn as sns
    from matplotlib.figure import Figure

    routed = df[df["kind"] != "dense"] if len(df) else df
    ms = [m for m in metrics if m in ("val_loss", "train_loss") or (len(routed) and routed[m].notna().any())]
    if not ms:
        ms = ["val_loss"]
    ncol = min(3, len(ms))
    nrow = math.ceil(len(ms) / ncol)
    fig = Figure(figsize=(4.0 * ncol, 2.8 * nrow + 0.4), dpi=100)
    axes = fig.subplots(nrow, ncol, squeeze=False).ravel()
    for ax in axes[len(ms):]:
        ax.set_axis_off()
    layer_handles = None
    for ax, m in zip(axes, ms):
        if m in ("val_loss", "train_loss"):
            per = df.drop_duplicates("step")[["step", "val_loss", "train_loss"]] if len(df) else df
            for col, ls in (("val_loss", "-"), ("train_loss", ":")):
                if len(per) and per[col].notna().any():
                    ax.plot(per["step"], per[col], ls, marker="o", ms=3, label=col.replace("_", " "))
            ax.legend(fontsize=7)
            if not len(routed) and len(df):
                ax.text(0.5, 0.92, "dense: no router statistics", transform=ax.transAxes, ha="center",
                        fontsize=8, color="0.3")
        else:
            sns.lineplot(data=routed, x="step", y=m, hue="layer", marker="o", ax=ax, palette="viridis",
                         legend=not layer_handles)
            if not layer_handles and ax.get_legend() is not None:
                layer_handles = ax.get_legend_handles_labels()
                ax.get_legend().remove()
            if m == "entropy" and len(routed) and routed["shares"].notna().any():
                E = len(next(s for s in routed["shares"] if isinstance(s, list)))
                ax.axhline(math.log(E), color="0.6", lw=0.8, ls="--")
        ax.set_title(_METRIC_TITLES.get(m, m), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("")
        ax.tick_params(labelsize=7)
        if step is not None:
            ax.axvline(step, color="#b2182b", ls="--", lw=1)
    fig.suptitle("Router diagnostics over training" + (f" (selected step {step})" if step is not None else ""),
                 fontsize=10)
    if layer_handles:
        fig.legend(*layer_handles, title="layer", loc="upper right", fontsize=7, title_fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.94 if layer_handles else 1, 1))
    return fig


def figure_png(fig, dpi: Optional[int] = None) -> bytes:
    """PNG bytes of a Figure (for an ipywidgets.Image or IPython.display.Image)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi or fig.dpi)
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# HTML snippets for the explorer
# --------------------------------------------------------------------------------------------
def _table_html(df: pd.DataFrame, caption: str = "", gradient: bool = False, digits: int = 3) -> str:
    if df is None or df.empty:
        msg = (df.attrs.get("status") if df is not None else None) or "(empty)"
        return f"<div><b>{html.escape(caption)}</b><br><i>{html.escape(msg)}</i></div>"
    try:
        sty = df.style.format(precision=digits, na_rep="-")
        if gradient:
            sty = sty.background_gradient(cmap="Blues", axis=None, vmin=0.0, vmax=1.0)
        body = sty.to_html()
    except Exception:  # no jinja2: plain table
        body = df.to_html(float_format=lambda x: f"{x:.{digits}f}", na_rep="-")
    return f"<div><b>{html.escape(caption)}</b>{body}</div>"


def tokens_html(view: RoutingView) -> str:
    """The view's tokens as text, generated ones in red; with the decoded continuation if any."""
    spans = []
    for t, piece in enumerate(view.tokens):
        style = "color:#888" if t < view.n_prefix else (
            "color:#b2182b;font-weight:bold" if view.n_prompt is not None and t >= view.n_prompt else "")
        spans.append(f'<span class="studylib-token" style="{style}">{html.escape(piece)}</span>')
    out = f'<div class="studylib-tokens">{len(view.ids)} tokens: ' + " ".join(spans) + "</div>"
    if view.n_prompt is not None:
        out += (f'<div class="studylib-continuation"><b>{html.escape(view.text)}</b>'
                f'<span style="color:#b2182b">{html.escape(view.continuation)}</span></div>')
    if view.truncated:
        out += f"<div><i>{view.truncated} tokens cut to fit the model context</i></div>"
    return out


# --------------------------------------------------------------------------------------------
# the widget explorer
# --------------------------------------------------------------------------------------------
_SAME_RUN = "__same_run__"
_NONE = -1  # a SelectionSlider's stand-in for "no step"


class Explorer:
    """ipywidgets front end over the functions above; every callback is a plain method.

    Widgets: ``run`` (Dropdown of :func:`list_runs`), ``step`` (SelectionSlider over
    :func:`list_checkpoints`), ``prompt`` (Combobox with :data:`PRESET_PROMPTS`; Enter applies),
    ``compare_run`` (none / another checkpoint of the same run / another run) with
    ``compare_step``, ``n_new`` / ``temperature`` / ``generate`` (Button), ``diag_step``
    (SelectionSlider over the eval steps). Outputs: ``grid`` (Image), ``tokens`` / ``shares`` /
    ``comparison`` / ``diag_table`` / ``status`` (HTML), ``diag_plot`` (Image). The last results
    are kept as attributes (``view``, ``compare``, ``grid_figure``, ``shares_df``,
    ``comparison_df``, ``diag_df``, ``diag_figure``, ``error``) for tests and scripting.
    Display it with ``display(explorer)`` (or as a cell's last expression).
    """

    def __init__(self, outputs_root: str | os.PathLike, run: str | os.PathLike | None = None,
                 step: Optional[int] = None, prompt: str = PRESET_PROMPTS[0],
                 prompts: Sequence[str] = PRESET_PROMPTS, n_new: int = 24, cache_size: int = 8):
        import ipywidgets as W

        self.root = Path(outputs_root)
        self.runs = list_runs(self.root)
        self.mode = "text"  # "text": route the prompt; "generate": continue it and route everything
        self.view: Optional[RoutingView] = None
        self.compare: Optional[RoutingView] = None
        self.grid_figure = self.diag_figure = None
        self.shares_df = self.comparison_df = self.diag_df = None
        self.diag_df_all = pd.DataFrame()  # all eval steps of the selected run
        self.error: Optional[str] = None
        self._models: OrderedDict = OrderedDict()
        self._cache_size = cache_size
        self._hold = False
        self.refresh_count = 0

        opts = [(r.label, str(r.path)) for r in self.runs]
        if run is not None and str(Path(run)) not in [v for _, v in opts]:
            rd = Path(run)
            if (rd / runs.CONFIG_FILE).is_file():
                info = run_info(rd)
                self.runs.append(info)
                opts.append((info.label, str(rd)))
        wide = W.Layout(width="520px")
        self.run = W.Dropdown(options=opts, description="run", layout=wide)
        self.step = W.SelectionSlider(options=[("-", _NONE)], description="checkpoint", continuous_update=False,
                                      layout=W.Layout(width="420px"))
        self.prompt = W.Combobox(value=prompt, options=list(prompts), description="prompt", ensure_option=False,
                                 continuous_update=False, placeholder="type a story start, press Enter",
                                 layout=W.Layout(width="620px"))
        self.compare_run = W.Dropdown(description="compare", layout=wide)
        self.compare_step = W.SelectionSlider(options=[("-", _NONE)], description="its step", continuous_update=False,
                                              layout=W.Layout(width="420px"))
        self.n_new = W.IntSlider(value=n_new, min=1, max=64, description="new tokens", continuous_update=False,
                                 style={"description_width": "initial"})
        self.temperature = W.FloatSlider(value=0.0, min=0.0, max=1.5, step=0.1, description="temperature",
                                         continuous_update=False, style={"description_width": "initial"})
        self.generate = W.Button(description="generate", icon="play", tooltip="continue the prompt and route it")
        self.route_button = W.Button(description="route prompt", tooltip="route the prompt text only")
        self.diag_step = W.SelectionSlider(options=[("-", _NONE)], description="diag step", continuous_update=False,
                                           layout=W.Layout(width="420px"))
        self.status = W.HTML()
        self.tokens = W.HTML()
        self.grid = W.Image(format="png", layout=W.Layout(max_width="100%"))
        self.shares = W.HTML()
        self.comparison = W.HTML()
        self.diag_plot = W.Image(format="png", layout=W.Layout(max_width="100%"))
        self.diag_table = W.HTML()
        head = W.HTML("<h3 style='margin:4px 0'>Routing explorer</h3><div style='font-size:90%'>"
                      "Colour = a token's top expert at that layer, shade and number = its weight. "
                      "Pick a run and a checkpoint; type a prompt (Enter) or press <i>generate</i>.</div>")
        self.widget = W.VBox([
            head,
            W.HBox([self.run, self.step]),
            W.HBox([self.compare_run, self.compare_step]),
            self.prompt,
            W.HBox([self.route_button, self.generate, self.n_new, self.temperature]),
            self.status, self.tokens,
            W.HBox([self.grid, W.VBox([self.shares, self.comparison])]),
            W.HTML("<h4 style='margin:4px 0'>Router diagnostics over training (metrics.jsonl)</h4>"),
            self.diag_step, self.diag_plot, self.diag_table,
        ])
        self.widget.add_class("studylib-explorer")
        for w, name in ((self.status, "status"), (self.grid, "grid"), (self.shares, "shares"),
                        (self.comparison, "comparison"), (self.diag_plot, "diag-plot"), (self.prompt, "prompt")):
            w.add_class(f"studylib-{name}")

        self.run.observe(self.on_run_change, names="value")
        self.step.observe(self.on_step_change, names="value")
        self.prompt.observe(self.on_prompt_change, names="value")
        self.compare_run.observe(self.on_compare_change, names="value")
        self.compare_step.observe(self.on_compare_step_change, names="value")
        self.diag_step.observe(self.on_diag_step_change, names="value")
        self.generate.on_click(self.on_generate)
        self.route_button.on_click(self.on_route)

        if not opts:
            self.status.value = f"<b>no runs with checkpoints under {html.escape(str(self.root))}</b>"
            return
        with self._held():
            self.run.value = str(Path(run)) if run is not None else opts[0][1]
        self.on_run_change(step=step)

    # ---- plumbing ---------------------------------------------------------------------------
    class _HoldCtx:
        def __init__(self, ex):
            self.ex, self.prev = ex, False

        def __enter__(self):
            self.prev, self.ex._hold = self.ex._hold, True

        def __exit__(self, *exc):
            self.ex._hold = self.prev

    def _held(self):
        return Explorer._HoldCtx(self)

    def _repr_mimebundle_(self, **kwargs):
        data = self.widget._repr_mimebundle_(**kwargs)
        if isinstance(data, tuple):
            data, meta = data
        else:
            meta = {}
        data = dict(data or {})
        data["text/plain"] = self.summary()
        return data, meta

    def summary(self) -> str:
        v = self.view
        lines = [f"Routing explorer over {self.root} ({len(self.runs)} runs); the widgets need a live "
                 f"Jupyter kernel (JupyterLab / Notebook)."]
        if self.run.value:
            lines.append(f"run {self.run.value}, checkpoint step {self._value(self.step)}")
        if v is not None:
            lines.append(f"{len(v.ids)} tokens, status: {v.status}")
        if self.error:
            lines.append(f"error: {self.error}")
        return "\n".join(lines)

    def load(self, run_dir, step):
        """(model, tokenizer, cfg) of a run at a step, from a small LRU cache."""
        key = (str(run_dir), step)
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        got = load_checkpoint_model(run_dir, step)
        self._models[key] = got
        while len(self._models) > self._cache_size:
            self._models.popitem(last=False)
        return got

    def _label(self, run_dir) -> str:
        for r in self.runs:
            if str(r.path) == str(run_dir):
                return f"{r.model} seed{r.seed}" if r.seed is not None else r.model
        return Path(run_dir).name

    @staticmethod
    def _set_options(slider, options, value=None):
        """Options of a SelectionSlider (which needs at least one: ``-`` stands for none)."""
        options = list(options)
        if not options:
            slider.options = [("-", _NONE)]
            slider.value = _NONE
            slider.disabled = True
            return
        if value not in options:
            value = options[-1]
        slider.options = options
        slider.value = value
        slider.disabled = len(options) < 2

    @staticmethod
    def _value(slider):
        return None if slider.value == _NONE else slider.value

    # ---- callbacks --------------------------------------------------------------------------
    def on_run_change(self, change=None, step: Optional[int] = None) -> None:
        """A run was picked: its checkpoints feed the slider, its evals the diagnostics."""
        if self._hold and change is not None:
            return
        rd = self.run.value
        with self._held():
            steps = list_checkpoints(rd) if rd else []
            self._set_options(self.step, steps, step if step is not None else (steps[-1] if steps else None))
            copts = [("(none)", ""), ("same run, another checkpoint", _SAME_RUN)] + \
                    [(r.label, str(r.path)) for r in self.runs if str(r.path) != rd]
            keep = self.compare_run.value if self.compare_run.value in [v for _, v in copts] else ""
            self.compare_run.options = copts
            self.compare_run.value = keep
            self._update_compare_steps()
            try:
                ctx = self.load(rd, self._value(self.step))[2].context if rd and steps else 64
                self.n_new.max = max(1, min(128, ctx - 1))
            except Exception:
                pass
            self.diag_df_all = diagnostics_over_training(rd) if rd else pd.DataFrame()
            dsteps = self.diag_df_all.attrs.get("steps", [])
            self._set_options(self.diag_step, dsteps, self._nearest_eval(dsteps, self._value(self.step)))
        self.refresh()
        self.refresh_diagnostics()

    def on_step_change(self, change=None) -> None:
        if self._hold:
            return
        with self._held():
            if self.compare_run.value == _SAME_RUN:
                self._update_compare_steps()
            dsteps = [o for o in self.diag_step.options if o != _NONE and not isinstance(o, tuple)]
            if dsteps:
                self.diag_step.value = self._nearest_eval(dsteps, self._value(self.step))
        self.refresh()
        self.refresh_diagnostics()

    def on_prompt_change(self, change=None) -> None:
        if self._hold:
            return
        self.mode = "text"
        self.refresh()

    def on_route(self, button=None) -> None:
        self.mode = "text"
        self.refresh()

    def on_generate(self, button=None) -> None:
        self.mode = "generate"
        self.refresh()

    def on_compare_change(self, change=None) -> None:
        if self._hold:
            return
        with self._held():
            self._update_compare_steps()
        self.refresh()

    def on_compare_step_change(self, change=None) -> None:
        if self._hold:
            return
        self.refresh()

    def on_diag_step_change(self, change=None) -> None:
        if self._hold:
            return
        self.refresh_diagnostics()

    @staticmethod
    def _nearest_eval(steps, step):
        steps = [s for s in steps if s is not None]
        if not steps:
            return None
        if step is None:
            return steps[-1]
        before = [s for s in steps if s <= step]
        return before[-1] if before else steps[0]

    def _update_compare_steps(self) -> None:
        c = self.compare_run.value
        if not c:
            self._set_options(self.compare_step, [])
            self.compare_step.disabled = True
            return
        rd = self.run.value if c == _SAME_RUN else c
        steps = list_checkpoints(rd)
        if c == _SAME_RUN:  # default: the first checkpoint, to see how routing moved since
            others = [s for s in steps if s != self._value(self.step)] or steps
            value = self.compare_step.value if self.compare_step.value in others else (others[0] if others else None)
            self._set_options(self.compare_step, steps, value)
            self.compare_step.disabled = len(steps) < 2
        else:
            value = self.compare_step.value if self.compare_step.value in steps else (steps[-1] if steps else None)
            self._set_options(self.compare_step, steps, value)

    # ---- rendering --------------------------------------------------------------------------
    def compute(self) -> tuple[RoutingView, Optional[RoutingView]]:
        """The current view (and comparison view) from the widget values."""
        rd, step = self.run.value, self._value(self.step)
        model, tok, cfg = self.load(rd, step)
        label = self._label(rd)
        text = self.prompt.value or ""
        if self.mode == "generate":
            view = generate_and_route(model, tok, text, self.n_new.value, temperature=self.temperature.value,
                                      seed=0, label=label)
        else:
            view = route_text(model, tok, text, label=label)
        other = None
        c = self.compare_run.value
        if c:
            crd = rd if c == _SAME_RUN else c
            cm, ctok, _ = self.load(crd, self._value(self.compare_step))
            clabel = self._label(crd)
            same_tok = ctok is not None and tok is not None and ctok.get_piece_size() == tok.get_piece_size() \
                and list(ctok.encode(text)) == list(tok.encode(text))
            if same_tok:  # the same token ids through the other model (generated tokens included)
                other = route_ids(cm, ctok, view.ids, text=view.text, n_prefix=view.n_prefix,
                                  n_prompt=view.n_prompt, label=clabel)
                other.continuation = view.continuation
            else:
                other = route_text(cm, ctok, text, label=clabel)
        return view, other

    def refresh(self) -> None:
        """Recompute the view(s) and redraw the grid, the token text and the tables."""
        if self._hold or not self.run.value:
            return
        self.refresh_count += 1
        try:
            view, other = self.compute()
        except Exception as e:  # shown in the widget, not raised into the front end
            self.error = f"{type(e).__name__}: {e}"
            self.status.value = f"<span style='color:#b2182b'><b>error:</b> {html.escape(self.error)}</span>"
            return
        self.error = None
        self.view, self.compare = view, other
        fig = routing_grid_figure(view, other)
        self.grid_figure = fig
        self.grid.value = figure_png(fig)
        self.tokens.value = tokens_html(view)
        self.shares_df = expert_shares(view)
        what = {"moe": "share of token->expert assignments", "soft": "mean gate weight"}.get(view.kind, "shares")
        self.shares.value = _table_html(self.shares_df, f"Expert shares for this text ({what})", gradient=True)
        if other is not None:
            try:
                self.comparison_df = compare_views(view, other)
                cap = f"Comparison: {_view_title(view)} vs {_view_title(other)}"
                self.comparison.value = _table_html(self.comparison_df, cap)
            except ValueError as e:
                self.comparison_df = None
                self.comparison.value = f"<i>{html.escape(str(e))}</i>"
        else:
            self.comparison_df = None
            self.comparison.value = ""
        st = view.status
        where = f"{html.escape(_view_title(view))}"
        if st == "ok":
            self.status.value = (f"{where}: {view.kind} routing, {view.num_experts} experts, "
                                 f"{view.top_k} per token; {len(view.routed_layers)} routed of {view.n_layers} layers")
        else:
            self.status.value = f"{where}: <b>{html.escape(st)}</b>"

    def refresh_diagnostics(self) -> None:
        """Redraw the diagnostics plot and the table at the selected eval step."""
        if self._hold or not self.run.value:
            return
        full = getattr(self, "diag_df_all", None)
        if full is None or full.empty:
            self.diag_df, self.diag_figure = full, None
            self.diag_table.value = "<i>no evaluation records in metrics.jsonl yet</i>"
            return
        s = self._value(self.diag_step)
        self.diag_figure = diagnostics_figure(full, step=s)
        self.diag_plot.value = figure_png(self.diag_figure)
        self.diag_df = diagnostics_over_training(self.run.value, step=s)
        cols = ["layer", "kind", "val_loss", *ROUTER_METRICS]
        tab = self.diag_df[[c for c in cols if c in self.diag_df]].set_index("layer")
        self.diag_table.value = _table_html(tab, f"At eval step {self.diag_df.attrs.get('selected_step')}")


def build_explorer(outputs_root: str | os.PathLike, run: str | os.PathLike | None = None, **kwargs) -> Explorer:
    """An :class:`Explorer` over the runs below ``outputs_root`` (``run`` selected first)."""
    return Explorer(outputs_root, run=run, **kwargs)
