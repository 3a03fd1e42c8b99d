"""The router: one module per MoE layer (:class:`Router`) that owns the routing state (its weight,
the selection bias ``bias_E``, the step's load counts and the step's global loads) and returns one
:class:`Routing` record per forward, which the expert dispatch, the auxiliary losses
(:mod:`studylib.nn.router_losses`), the router statistics, decoding's routing capture and the
explorer all read (through ``ModelOutput.routing``). The pure functions below are the decision
itself: logits -> scores -> the experts each token uses and their gate weights.

A new stateless variant (say another score function) touches this file (a function below and its
use in :meth:`Router.forward`), the config schema (:class:`studylib.config.FFNConfig`: the option
and its validation) and the HF mapping (:mod:`studylib.run.hf.format`: export the variant to the
family that computes it, or refuse it there).

Variants (``ffn`` options; the defaults are the reference router, softmax top-k):

* ``score: sigmoid``: affinities ``s = sigmoid(logits)`` instead of the softmax; the combine weights
  are the chosen ``s`` (divided by their sum with ``renormalize``). The balance loss and the
  diagnostics see ``s / sum(s)``, a distribution over experts.
* a selection bias ``bias_E`` (``bias_balance``: aux-loss-free balancing, DeepSeek-V3): top-k is
  taken over ``s + bias_E``, the combine weights use the unbiased ``s``.
* ``route_scale``: the combine weights times a constant (``routed_scaling_factor``).

Controls (``ffn.router``; ``learned`` is the reference):

* ``frozen``: the learned router with its weight kept at its initial value (``requires_grad``
  False, so the optimizer never holds it: no update, no weight decay; the checkpoint saves it as
  any weight). Its losses stay on; their gradient reaches the layer's input only.
* ``hash``: no weight at all (parameter-free). A token's id picks its K of E experts through a
  fixed table (:func:`hash_table`: the K-subsets of the E experts dealt to the vocabulary in a
  random order drawn from a generator seeded with ``ffn.hash_seed`` (:data:`HASH_SEED`), the same in every layer and
  every run), with equal combine weights 1/K (times ``route_scale``); Clark et al. 2022's Hash
  layer with top-k. The token ids reach the router through its input (``Router.forward(x_TD,
  ids_T)``). It has no scores: its routing record's logits are 0 and its distribution 1/E (as
  the ``uniform`` mode's), stand-ins that its statistics and :meth:`Router.distribution` report as
  NaN (entropy, gate, margin, log Z: not applicable); the balance, z and sequence losses must be
  off (the schema refuses them).

Modes (``Router.mode``, per layer; see :meth:`studylib.nn.model.Decoder.set_router_mode`):
``learned`` (normal), ``uniform`` (gate forced to 1/E; sparse layers take the fixed balanced
assignment with weights 1/K) and ``balanced`` (sparse only: token t goes to experts
``(t*K + j) mod E``, weighted by its renormalised router probabilities; for throughput runs).

Per optimizer step (:func:`optimizer_step`, the trainer's one routing call, through
:meth:`studylib.nn.model.Decoder.routing_step`): the global-batch loads are counted first
(``balance_scope: global``), and the selection bias moves once after the step from the
assignments the step's training forwards counted.

State-dict keys: ``...ffn.router.weight`` and ``...ffn.router.bias_E``; checkpoints written before
the bias moved into the router (``...ffn.expert_bias_E``) load unchanged (the MoE layer remaps the
old key on load).

Shape legend: T tokens, D model width, E experts, K experts chosen per token.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from studylib.config import FFNConfig
from studylib.nn import router_losses
from studylib.nn.init import Draw

MODES = ("learned", "uniform", "balanced")
HASH_SEED = FFNConfig.hash_seed  # the hash router's table by default: one fixed draw (ffn.hash_seed)
NO_SCORES = "hash router: no scores"  # why its score statistics and distribution are NaN


def hash_table(vocab_size: int, num_experts: int, top_k: int, seed: int = HASH_SEED) -> torch.Tensor:
    """(V, K) long: the experts of each token id under the hash router. The C = binom(E, K)
    K-subsets of the experts (in lexicographic order) are dealt to the ids in the order of one
    random permutation of the vocabulary (``torch.randperm`` from a CPU generator seeded with
    ``seed``): id ``v`` takes subset ``perm[v] mod C`` (:func:`kth_subsets`: computed, never
    enumerated, so 32 of 64 experts works too). Every subset goes to floor(V/C) or ceil(V/C) ids,
    so every expert to a K/E share of the vocabulary (not of the tokens: the ids' frequencies
    differ). A pure function of its arguments."""
    perm = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))
    C = math.comb(num_experts, top_k)
    return kth_subsets(perm if vocab_size <= C else perm % C, num_experts, top_k)


def kth_subsets(r_V: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """(V, k) long: for each index ``r`` of ``r_V``, the r-th k-subset of ``range(n)`` in
    lexicographic order (``itertools.combinations``' order), by the combinatorial number system:
    one pass over the elements, taking element ``x`` when ``r`` falls among the binom(n-x-1, j-1)
    subsets that take it next (j still to take), else skipping those subsets."""
    cap = int(r_V.max()) + 1 if len(r_V) else 1  # counts above every r compare alike: capped, no overflow
    ways = torch.zeros(n, k + 1, dtype=torch.long)  # ways[m, j] = binom(m, j - 1), capped at cap
    ways[0, 1] = 1
    for m in range(1, n):
        ways[m, 1:] = (ways[m - 1, 1:] + ways[m - 1, :-1]).clamp_max(cap)
    r, left = r_V.to(torch.long).clone(), torch.full_like(r_V, k, dtype=torch.long)
    out = torch.empty(len(r_V), k, dtype=torch.long)
    for x in range(n):
        c = ways[n - 1 - x][left]  # the subsets that take x next (0 once all k are taken)
        take = r < c
        out[take, k - left[take]] = x
        r = torch.where(take, r, r - c)
        left = left - take.long()
    return out


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


def distribution(logits_TE: torch.Tensor, score: str = "softmax") -> torch.Tensor:
    """The router's distribution over experts: the softmax, or the sigmoid scores normalised to
    sum to 1 (what the balance loss and the diagnostics see)."""
    return _as_distribution(scores(logits_TE, score), score)


def _as_distribution(s_TE: torch.Tensor, score: str) -> torch.Tensor:
    return s_TE if score == "softmax" else s_TE / s_TE.sum(-1, keepdim=True)


def sparse(logits_TE: torch.Tensor, top_k: int, renormalize: bool = True, mode: str = "learned",
           score: str = "softmax", bias_E: Optional[torch.Tensor] = None, scale: float = 1.0) -> tuple:
    """Top-k token-choice routing (Mixtral). With ``renormalize`` the k weights sum to 1 (so with
    k = 1 the gate is exactly 1 and the router gets no gradient from the LM loss); without it
    the gate is the router probability itself (Switch). ``score``, ``bias_E`` and ``scale``: the
    variants of the module docstring. Returns ``(probs_TE, idx_TK, w_TK)``; ``probs_TE`` is always
    a distribution over experts (1/E everywhere in ``uniform`` mode)."""
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
    return p_TE, idx_TK, w_TK


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


# --------------------------------------------------------------------------------------------
# the routing record and the module that owns the routing state
# --------------------------------------------------------------------------------------------
class Routing(NamedTuple):
    """One layer's routing of T tokens, as its forward decided it: what the expert dispatch, the
    losses, the statistics, decoding's capture and the explorer read (``ModelOutput.routing``
    holds it detached)."""

    logits_TE: torch.Tensor  # router logits (fp32, times router_scale)
    probs_TE: torch.Tensor  # the distribution the balance loss and the statistics see (1/E in
    # ``uniform`` mode; the soft MoE: its gate)
    idx_TK: torch.Tensor  # the experts each token uses (the soft MoE: all E, in order)
    w_TK: torch.Tensor  # their combine weights (the soft MoE: the gate)
    counts_E: Optional[torch.Tensor]  # assignments per expert (int64, the forward's one bincount);
    # None for the soft MoE

    @property
    def soft(self) -> bool:
        return self.counts_E is None

    def shares_E(self) -> Optional[torch.Tensor]:
        """f_e: the share of the T*K assignments that went to each expert (sums to 1); None for
        the soft MoE."""
        return None if self.counts_E is None else self.counts_E.to(torch.float32) / self.idx_TK.numel()

    def combine_TE(self) -> torch.Tensor:
        """(T, E) combine weight of each expert per token (0 for the experts a token did not use)."""
        return self.probs_TE.new_zeros(self.probs_TE.shape).scatter(1, self.idx_TK, self.w_TK)

    def detach(self) -> "Routing":
        return Routing(*(t.detach() if t is not None else None for t in self))


class Router(nn.Module):
    """A MoE layer's router: the bias-free linear map to E logits (``weight``, E x D), the routing
    decision of the variants and modes above, and the routing state: the selection bias ``bias_E``
    (``bias_balance``; a buffer, saved with the weights, no gradient, no weight decay), the
    assignments counted while :func:`optimizer_step` has a tally open (``tally_E``) and the step's
    global loads (``share_E``, ``balance_scope: global``). ``soft=True``: the soft MoE's gate over
    all experts (its weight starts at 0, so the gate starts exactly uniform). ``cfg.router``:
    ``frozen`` keeps the weight out of training (``requires_grad`` False); ``hash`` has no weight
    (``weight`` is None) and routes by token id through a fixed table (a buffer, not saved, built
    for ``vocab_size`` ids)."""

    def __init__(self, d_model: int, cfg, soft: bool = False, vocab_size: Optional[int] = None):
        super().__init__()
        self.cfg, self.soft = cfg, soft
        self.hashed = getattr(cfg, "router", "learned") == "hash" and not soft
        if self.hashed:
            if vocab_size is None:
                raise ValueError("a hash router needs the vocabulary size (Router(..., vocab_size=V))")
            self.register_parameter("weight", None)
            self.register_buffer("table_VK", hash_table(vocab_size, cfg.num_experts, cfg.top_k, cfg.hash_seed),
                                 persistent=False)
        else:
            self.weight = nn.Parameter(torch.zeros(cfg.num_experts, d_model))  # drawn by init_weights
            if getattr(cfg, "router", "learned") == "frozen":
                self.weight.requires_grad_(False)
        self.mode = "learned"
        self.biased = bool(cfg.bias_balance) and not soft
        if self.biased:
            self.register_buffer("bias_E", torch.zeros(cfg.num_experts))
        # plain tensors, not buffers (DDP's buffer broadcast would overwrite other ranks' counts)
        self.tally_E: Optional[torch.Tensor] = None  # assignments counted since optimizer_step opened it
        self.share_E: Optional[torch.Tensor] = None  # the step's global loads f, while the step runs

    @torch.no_grad()
    def init_weights(self, draw: Draw, std: float) -> None:
        """N(0, std) as ``router`` (:mod:`studylib.nn.init`); the soft MoE's gate: 0; the hash
        router: nothing (no weight)."""
        if self.hashed:
            return
        if self.soft:
            nn.init.zeros_(self.weight)
        else:
            draw.normal_(self.weight, std, "router")

    def distribution(self, logits_TE: torch.Tensor) -> torch.Tensor:
        """The router's learned distribution over experts for ``logits_TE`` (whatever the mode); NaN
        for the hash router, which has none (:data:`NO_SCORES`)."""
        if self.hashed:
            return torch.full_like(logits_TE, math.nan)
        return distribution(logits_TE, self.cfg.score)

    def forward(self, x_TD: torch.Tensor, ids_T: Optional[torch.Tensor] = None) -> Routing:
        """Route the T rows of ``x_TD``; ``ids_T``: their token ids (the hash router routes by them;
        the others ignore them)."""
        cfg, E = self.cfg, self.cfg.num_experts
        if self.hashed:
            return self._hash_forward(x_TD, ids_T)
        logits_TE = logits(x_TD, self.weight, cfg.router_scale)
        if self.soft:
            gate_TE = soft(logits_TE, self.mode)
            idx_TK = torch.arange(E, device=logits_TE.device).expand(logits_TE.shape[0], E)
            return Routing(logits_TE, gate_TE, idx_TK, gate_TE, None)
        probs_TE, idx_TK, w_TK = sparse(logits_TE, cfg.top_k, cfg.renormalize, self.mode, cfg.score,
                                        self.bias_E if self.biased else None, cfg.route_scale)
        counts_E = torch.bincount(idx_TK.reshape(-1), minlength=E)
        if self.tally_E is not None:
            self.tally_E += counts_E
        return Routing(logits_TE, probs_TE, idx_TK, w_TK, counts_E)

    def _hash_forward(self, x_TD: torch.Tensor, ids_T: Optional[torch.Tensor]) -> Routing:
        """The hash router: the table's experts for each id, weights 1/K (``learned`` mode); logits 0,
        so the forced modes (``uniform``, ``balanced``) act as on a router whose scores are all equal."""
        cfg, E = self.cfg, self.cfg.num_experts
        logits_TE = x_TD.new_zeros((x_TD.shape[0], E), dtype=torch.float32)
        if self.mode != "learned":
            probs_TE, idx_TK, w_TK = sparse(logits_TE, cfg.top_k, cfg.renormalize, self.mode, cfg.score,
                                            None, cfg.route_scale)
        else:
            if ids_T is None or ids_T.shape != x_TD.shape[:1]:
                raise ValueError(f"the hash router routes by token id: pass ids_T with one id per row of "
                                 f"x_TD ({x_TD.shape[0]}), got {None if ids_T is None else tuple(ids_T.shape)}")
            idx_TK = self.table_VK[ids_T]
            probs_TE = torch.full_like(logits_TE, 1.0 / E)
            w_TK = torch.full(idx_TK.shape, cfg.route_scale / cfg.top_k, dtype=torch.float32, device=x_TD.device)
        counts_E = torch.bincount(idx_TK.reshape(-1), minlength=E)
        if self.tally_E is not None:
            self.tally_E += counts_E
        return Routing(logits_TE, probs_TE, idx_TK, w_TK, counts_E)

    def balance_shares(self, rec: Routing) -> torch.Tensor:
        """The loads f of the balance loss: the step's global loads while they are set, else the
        shares of this forward's own assignments."""
        return self.share_E if self.share_E is not None else rec.shares_E()

    @torch.no_grad()
    def stats(self, rec: Routing) -> dict:
        """This layer's diagnostics (:func:`studylib.nn.router_losses.router_stats`), with the bias
        and the share of picks it made (``bias_picked``) for a biased router; the hash router's
        score statistics are NaN, with a ``note`` saying why (its 1/E stands in for no scores)."""
        out = router_losses.router_stats(rec.logits_TE, rec.probs_TE, rec.shares_E())
        if self.hashed:
            out.update(dict.fromkeys(router_losses.SCORE_STATS, math.nan), note=NO_SCORES)
        if self.biased:
            out["bias"] = self.bias_E.tolist()
            out["bias_picked"] = float(picked_by_bias(rec.probs_TE, rec.idx_TK).float().mean())
        return out

    @torch.no_grad()
    def update_bias(self, load_E: torch.Tensor) -> None:
        """One aux-loss-free step: ``b_e += bias_rate * sign(mean(load) - load_e)`` with the loads
        counted over a whole optimizer step."""
        load_E = load_E.to(torch.float64)
        step_E = torch.sign(load_E.mean() - load_E) * self.cfg.bias_rate
        self.bias_E += step_E.to(self.bias_E.dtype)


def _open_tallies(routers: list[Router]) -> None:
    for r in routers:
        r.tally_E = torch.zeros(r.cfg.num_experts, dtype=torch.long, device=_device(r))


def _device(r: Router) -> torch.device:
    return r.weight.device if r.weight is not None else r.table_VK.device


def _close_tallies(routers: list[Router]) -> torch.Tensor:
    """The open tallies as one (layers, E) float64 tensor (exact integers); the tallies close."""
    counts = torch.stack([r.tally_E for r in routers]).to(torch.float64)
    for r in routers:
        r.tally_E = None
    return counts


@contextlib.contextmanager
def optimizer_step(routers: list[Router], prepass: Callable[[], None],
                   all_reduce: Optional[Callable[[torch.Tensor], None]] = None) -> Iterator[None]:
    """The routing state around one optimizer step (its forwards, backwards and update: the body).

    First the global-batch loads (routers with ``balance_scope: global``): ``prepass()`` routes the
    step's micro-batches once (eval mode, no RNG draw), the assignments it counts, summed over the
    ranks (``all_reduce``, in place), become each router's ``share_E`` for the step's balance
    losses. Then the routers with ``bias_balance`` count the assignments of the step's forwards,
    and when the body has finished each bias moves once from those counts, summed over the
    micro-batches and the ranks. A body that raises moves nothing; no state outlives the step."""
    glob = [r for r in routers if not r.soft and r.cfg.balance_scope == "global"]
    biased = [r for r in routers if r.biased]
    try:
        if glob:
            _open_tallies(glob)
            try:
                prepass()
            finally:
                counts = _close_tallies(glob)
            if all_reduce is not None:
                all_reduce(counts)
            for r, c_E in zip(glob, counts):
                r.share_E = (c_E / c_E.sum().clamp_min(1)).to(torch.float32)
        _open_tallies(biased)
        yield
        if biased:
            loads = _close_tallies(biased)
            if all_reduce is not None:
                all_reduce(loads)
            for r, load_E in zip(biased, loads):
                r.update_bias(load_E)
    finally:
        for r in routers:
            r.tally_E = r.share_E = None
