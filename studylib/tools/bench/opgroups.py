"""``bench train --profile --groups``: one training step's CPU time by kind of work.

The step is profiled with torch.profiler while every module kind opens a named scope (forward
hooks; RoPE and the fused LM-head loss through their module-level functions), and each profiler
event's *self* time is given to one group, so the groups add up to the step:

- ``optimizer``: inside ``Optimizer.step`` / ``zero_grad`` or the gradient clipping;
- ``data``: the trainer's own batch reading (:class:`~studylib.data.windows.BatchSampler` and
  :meth:`~studylib.data.windows.TokenData.windows` over a synthetic token array of the corpus size);
- ``LM head + loss``: the fused chunked LM-head cross-entropy, its matmuls included;
- ``matmul``: every other matrix product (projections, FFN / expert weights, the router), with
  the copies its kernel makes;
- ``attention`` (SDPA and its layout copies), ``rotary``, ``norms``, ``FFN activation`` (the
  SwiGLU's elementwise work), ``MoE router + dispatch`` (routing, gathers, scatters, the router
  losses), ``embedding``: by the scope the op ran in;
- ``other``: residual adds, the loss sum, autograd's bookkeeping.

A backward op takes the group of the forward op that created its autograd node (the profiler's
sequence number links them), so e.g. SDPA's backward counts as attention and RMSNorm's as norms.
"""
from __future__ import annotations

import contextlib
import re
from typing import Callable, Iterator, Optional

import numpy as np
import torch
from torch import nn

GROUPS = ("matmul", "attention", "rotary", "norms", "FFN activation", "MoE router + dispatch",
          "LM head + loss", "embedding", "optimizer", "data", "other")
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_grouped_mm",
                        "aten::matmul", "aten::linear", "aten::addmv", "aten::mv"})
SCOPE_PREFIX = "group:"
_SCOPE_GROUP = {"attention": "attention", "rotary": "rotary", "norm": "norms", "ffn": "FFN activation",
                "moe": "MoE router + dispatch", "lm_head": "LM head + loss", "embedding": "embedding",
                "optimizer": "optimizer", "data": "data"}
_BACKWARD = "autograd::engine::evaluate_function: "


def scope(name: str):
    """A profiler scope naming a group's region (``name`` a key of ``_SCOPE_GROUP``)."""
    return torch.profiler.record_function(SCOPE_PREFIX + name)


def _module_scope(m: nn.Module) -> Optional[str]:
    from studylib.nn.ffn import DenseFFN, _Experts
    from studylib.nn.model import Attention, RMSNorm

    for kind, name in ((RMSNorm, "norm"), (Attention, "attention"), (_Experts, "moe"), (DenseFFN, "ffn"),
                       (nn.Embedding, "embedding")):
        if isinstance(m, kind):
            return name
    return None


def _scoped(fn: Callable, name: str) -> Callable:
    def wrapper(*a, **k):
        with scope(name):
            return fn(*a, **k)
    return wrapper


@contextlib.contextmanager
def scoped_model(net: nn.Module) -> Iterator[None]:
    """Scopes around every module kind's forward, RoPE and the fused LM-head loss, removed after."""
    from studylib.nn import model as model_mod

    handles, stack = [], []

    def pre(name):
        def hook(mod, args):
            rf = scope(name)
            rf.__enter__()
            stack.append(rf)
        return hook

    def post(mod, args, out):
        stack.pop().__exit__(None, None, None)

    for m in net.modules():
        name = _module_scope(m)
        if name is not None:
            handles.append(m.register_forward_pre_hook(pre(name)))
            handles.append(m.register_forward_hook(post))
    saved = {"apply_rope": model_mod.apply_rope, "linear_cross_entropy": model_mod.linear_cross_entropy}
    model_mod.apply_rope = _scoped(saved["apply_rope"], "rotary")
    model_mod.linear_cross_entropy = _scoped(saved["linear_cross_entropy"], "lm_head")
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for k, v in saved.items():
            setattr(model_mod, k, v)


def _ancestors(e) -> Iterator:
    while e is not None:
        yield e
        e = e.cpu_parent


def _scope_of(e) -> Optional[str]:
    for a in _ancestors(e):
        if a.name.startswith(SCOPE_PREFIX):
            return a.name[len(SCOPE_PREFIX):]
    return None


def _backward_scope(bwd, fwd_scope: dict, by_name: dict) -> Optional[str]:
    """The forward scope of a backward node: by sequence number, else (a custom autograd Function,
    whose forward event carries none) by its name, ``XBackward`` -> ``X``."""
    if bwd.sequence_nr in fwd_scope:
        return fwd_scope[bwd.sequence_nr]
    return by_name.get(re.sub(r"Backward\d*$", "", bwd.name[len(_BACKWARD):]))


def classify(events) -> list[tuple[object, str]]:
    """Each of the profiler's ``events`` with its group (:data:`GROUPS`)."""
    # sequence number / custom Function name -> scope of the forward op. Ops that make no autograd
    # node report the number the next node will take, so the node's maker is the last to start
    fwd_scope, by_name = {}, {}
    for e in sorted(events, key=lambda e: e.time_range.start):
        if not any(a.name.startswith(_BACKWARD) for a in _ancestors(e)):
            if e.sequence_nr >= 0:
                fwd_scope[e.sequence_nr] = _scope_of(e)
            by_name.setdefault(e.name, _scope_of(e))
    out = []
    for e in events:
        anc = list(_ancestors(e))
        names = [a.name for a in anc]
        own = _scope_of(e)
        if any(n.startswith("Optimizer.") for n in names) or own == "optimizer":
            out.append((e, "optimizer"))
            continue
        if own == "data":
            out.append((e, "data"))
            continue
        bwd = next((a for a in anc if a.name.startswith(_BACKWARD)), None)
        where = own if bwd is None else _backward_scope(bwd, fwd_scope, by_name)
        if where == "lm_head":
            g = "LM head + loss"
        elif any(n in MATMUL_OPS for n in names):
            g = "matmul"
        else:
            g = _SCOPE_GROUP.get(where, "other")
        out.append((e, g))
    return out


def group_events(events) -> dict[str, float]:
    """Self CPU microseconds per group (:data:`GROUPS`) over the profiler's ``events``."""
    out = dict.fromkeys(GROUPS, 0.0)
    for e, g in classify(events):
        out[g] += e.self_cpu_time_total
    return out


class DataProbe:
    """The trainer's batch reading for one step, on a synthetic corpus of ``tokens`` tokens."""

    def __init__(self, vocab: int, batch: int, context: int, tokens: int = 870_000, seed: int = 0):
        from pathlib import Path

        from studylib.data.windows import BatchSampler, TokenData

        rng = np.random.default_rng(seed)
        toks = rng.integers(0, vocab, tokens, dtype=np.int64).astype(np.uint16 if vocab < 65536 else np.int32)
        n = tokens // (context + 1)
        self.data = TokenData(tokens=toks, context=context + 1, train_idx=np.arange(n - 1),
                              val_idx=np.arange(n - 1, n), vocab_size=vocab, tokenizer_path=Path("."),
                              n_train_tokens=(n - 1) * (context + 1))
        self.sampler = BatchSampler(self.data.train_idx, seed, batch, 1)
        self.step = 0

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        with scope("data"):
            mine, _ = self.sampler.micro_batch(self.step, 0, 0, 1)
            w = self.data.windows(mine)
            self.step += 1
            return w[:, :-1], w[:, 1:]


def table(groups_ms: dict[str, float], tokens: int, flops: float, peak_gflops: float) -> str:
    """The groups (ms per step) as text with their shares, then the step's tokens/s and fraction
    of the matmul peak."""
    total = sum(groups_ms.values())
    lines = [f"{'group':<24}{'ms/step':>9}{'share':>8}"]
    for g in GROUPS:
        lines.append(f"{g:<24}{groups_ms[g]:>9.2f}{groups_ms[g] / total:>8.1%}")
    s = total / 1e3
    lines.append(f"{'step':<24}{total:>9.2f}  -> {tokens / s:,.0f} tok/s per core, "
                 f"{flops / s / 1e9:.2f} GFLOP/s = {flops / s / 1e9 / peak_gflops:.1%} of the {peak_gflops:.0f} "
                 f"GFLOP/s peak")
    return "\n".join(lines)
