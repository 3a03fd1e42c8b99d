"""Decoding: a lean sampling loop with a KV cache, routing capture, and loading a trained run.

``generate(model, prompt_ids, max_new_tokens, ...)`` prefills the prompt once into a
:class:`~studylib.nn.model.KVCache` and then feeds one token at a time (``use_cache=True``), or
recomputes the whole prefix every step (``use_cache=False``, the seed-002 decoding protocol).
It runs under ``torch.inference_mode()`` with the model in eval mode (restored afterwards) and
returns the *new* token ids only (a ``list[int]``); with ``return_routing=True`` it returns a
:class:`Generation` holding the tokens and, per generated token and layer, the router's choice.

Sampling: ``temperature=0`` is greedy (argmax); otherwise logits / temperature, then optional
``top_k`` (keep the k largest) and ``top_p`` (keep the smallest set of most likely tokens whose
probability reaches p; the most likely token is always kept), then one draw from a private
``torch.Generator`` seeded with ``seed`` (the global RNG is left alone; ``seed=None`` draws a seed
from it). So ``top_k=1`` and a tiny ``top_p`` are greedy.

Context: prompt + new tokens must fit ``model.cfg.context`` (the KV cache and the RoPE tables end
there). A longer prompt is left-truncated to ``context - max_new_tokens`` tokens with a warning
(``truncate=False`` raises instead); ``max_new_tokens >= context`` is always an error. The CLI
caps the new tokens first (:func:`new_token_budget`), so its defaults work on every run.

A trained run is loaded with :meth:`studylib.run.rundir.RunDir.load_model`.
CLI: ``python -m studylib generate --run DIR --prompt "Once upon a time"``.
"""
from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from studylib.config import ConfigError
from studylib.config import args as T
from studylib.nn.ffn import SoftMoE, SparseMoE
from studylib.nn.precision import autocast
from studylib.nn.model import Decoder, KVCache
from studylib.run.rundir import RunDir


class ContextOverflowWarning(UserWarning):
    """The prompt was left-truncated so that prompt + new tokens fit the model context."""


@dataclass
class Generation:
    """What ``generate(..., return_routing=True)`` returns.

    ``routing[i][l]`` describes generated token ``i`` at layer ``l``: ``None`` for a dense layer,
    else ``{"kind": "moe"|"soft", "experts": [...], "weights": [...], "probs": [...]}`` (and
    ``"mode"`` for a router forced to ``uniform`` / ``balanced``) where ``probs`` is the router's
    distribution over all experts (the softmax, or the normalised sigmoid scores; fp32),
    ``experts`` the experts the token used (top-k for the sparse MoE, all of them for the soft
    MoE) and ``weights`` their mixing weights (the gate weights, or the soft gate): the forward's
    own routing record (:func:`last_token_routing`). The routing of token ``i`` is the one
    computed at the position that *produced* it (the last position of the step's input).
    """

    tokens: list[int]
    prompt: list[int]  # the prompt actually used (after any truncation)
    truncated: int = 0  # prompt tokens dropped from the left
    routing: list = field(default_factory=list)
    seconds: float = 0.0


# --------------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------------
def sample_next(logits_V: torch.Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                top_p: Optional[float] = None, generator: Optional[torch.Generator] = None) -> int:
    """One token id from a 1-D logits vector (see the module docstring for the rules)."""
    logits_V = logits_V.float()
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return int(torch.argmax(logits_V))
    logits_V = logits_V / temperature
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if top_k < logits_V.numel():
            kth = torch.topk(logits_V, top_k).values[-1]
            logits_V = logits_V.masked_fill(logits_V < kth, float("-inf"))
    if top_p is not None:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if top_p < 1.0:
            sorted_V, order_V = torch.sort(logits_V, descending=True)
            p_V = torch.softmax(sorted_V, -1)
            drop_V = (p_V.cumsum(-1) - p_V) >= top_p  # the more likely tokens already reach p
            drop_V[0] = False
            drop_V = torch.zeros_like(drop_V).scatter(0, order_V, drop_V)  # back to vocabulary order
            logits_V = logits_V.masked_fill(drop_V, float("-inf"))
    probs_V = torch.softmax(logits_V, -1)
    return int(torch.multinomial(probs_V, 1, generator=generator))


# --------------------------------------------------------------------------------------------
# routing capture: the forward's own routing records (ModelOutput.routing)
# --------------------------------------------------------------------------------------------
def ffn_kind(ffn) -> str:
    """``moe``, ``soft`` or ``dense``: what a block's feed-forward layer is."""
    return "moe" if isinstance(ffn, SparseMoE) else "soft" if isinstance(ffn, SoftMoE) else "dense"


def last_token_routing(model: Decoder, routing: list) -> list:
    """Per layer, the routing of the last position of a forward (``ModelOutput.routing``): the
    experts the token used, their weights, the router's distribution over all experts
    (``probs``) and, for a router forced off ``learned``, its ``mode``; None for a dense layer."""
    out: list = [None] * len(routing)
    for i, rec in enumerate(routing):
        if rec is None:
            continue
        r = model.blocks[i].ffn.router
        out[i] = {"kind": "soft" if rec.soft else "moe", "experts": rec.idx_TK[-1].tolist(),
                  "weights": rec.w_TK[-1].tolist()}
        if not rec.soft and r.mode != "learned":
            out[i]["mode"] = r.mode
        out[i]["probs"] = r.distribution(rec.logits_TE[-1:])[0].tolist()
    return out


# --------------------------------------------------------------------------------------------
# the decode loop
# --------------------------------------------------------------------------------------------
def _fit_context(prompt: list[int], max_new_tokens: int, context: int,
                 truncate: bool) -> tuple[list[int], int]:
    if max_new_tokens >= context:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model "
                         f"context of {context} tokens; ask for at most {context - 1}")
    room = context - max_new_tokens
    if len(prompt) <= room:
        return prompt, 0
    msg = (f"prompt of {len(prompt)} tokens + {max_new_tokens} new tokens exceeds the model context "
           f"of {context}")
    if not truncate:
        raise ValueError(msg + f"; shorten the prompt to {room} tokens or ask for fewer new tokens")
    drop = len(prompt) - room
    warnings.warn(msg + f"; keeping the last {room} prompt tokens (dropped {drop} from the left)",
                  ContextOverflowWarning, stacklevel=3)
    return prompt[drop:], drop


def generate(model: Decoder, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int, *,
             temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None,
             seed: Optional[int] = None, use_cache: bool = True, eos_id: Optional[int] = None,
             return_routing: bool = False, truncate: bool = True,
             amp_dtype: Optional[torch.dtype] = None):
    """Decode ``max_new_tokens`` tokens after ``prompt_ids`` (batch 1).

    Returns the new token ids (``list[int]``; generation stops after emitting ``eos_id``), or a
    :class:`Generation` with ``return_routing=True``. ``amp_dtype=torch.bfloat16`` runs under
    autocast (default: the model's own dtype, fp32).
    """
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() == 2:
            if prompt_ids.shape[0] != 1:
                raise ValueError(f"generate decodes one sequence; got a batch of {prompt_ids.shape[0]}")
            prompt_ids = prompt_ids[0]
        prompt = [int(t) for t in prompt_ids.tolist()]
    else:
        prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("generate needs a prompt of at least one token (e.g. the EOS/BOS id)")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    cfg = model.cfg
    prompt, dropped = _fit_context(prompt, max_new_tokens, cfg.context, truncate)
    bad = [t for t in prompt if not 0 <= t < cfg.vocab_size]
    if bad:
        raise ValueError(f"prompt token ids must be in [0, {cfg.vocab_size}); got {bad[:5]}")

    param = next(model.parameters())
    device = param.device
    gen = None
    if temperature != 0:
        gen = torch.Generator(device="cpu")
        gen.manual_seed(int(seed) if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    was_training = model.training
    model.eval()
    amp = autocast(device, amp_dtype)
    out: list[int] = []
    routing: list = []
    t0 = time.perf_counter()
    try:
        with torch.inference_mode(), amp:
            ids = torch.tensor([prompt], dtype=torch.long, device=device)
            cache = KVCache(cfg, 1, device, dtype=param.dtype) if use_cache else None
            step_in = ids
            for _ in range(max_new_tokens):
                fwd = model(step_in, cache=cache, last_only=True, aux_losses=False)
                logits = fwd.logits[0, -1]
                if return_routing:
                    routing.append(last_token_routing(model, fwd.routing))
                nxt = sample_next(logits.cpu() if gen is not None else logits, temperature, top_k, top_p, gen)
                out.append(nxt)
                if eos_id is not None and nxt == eos_id:
                    break
                tok = torch.tensor([[nxt]], dtype=torch.long, device=device)
                step_in = tok if use_cache else torch.cat([step_in, tok], dim=1)
    finally:
        model.train(was_training)
    if not return_routing:
        return out
    return Generation(tokens=out, prompt=prompt, truncated=dropped, routing=routing,
                      seconds=time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------
# CLI: python -m studylib generate --run DIR --prompt "..."
# --------------------------------------------------------------------------------------------
DEFAULT_NEW_TOKENS = 64


def add_cli(parser) -> None:
    parser.add_argument("--run", required=True, help="run directory (holds config.yaml and checkpoints/)")
    parser.add_argument("--prompt", default="", help="prompt text (a story start); empty = from scratch")
    parser.add_argument("--max-new-tokens", type=T.positive_int, default=None,
                        help=f"new tokens per sample (default {DEFAULT_NEW_TOKENS}); capped to what the "
                             "model context leaves after the prompt (a prompt longer than that is "
                             "left-truncated so that at least a quarter of the context is new tokens)")
    parser.add_argument("--temperature", type=T.non_negative_float, default=1.0, help="0 = greedy")
    parser.add_argument("--top-k", type=T.positive_int, default=None, help="keep the k most likely tokens")
    parser.add_argument("--top-p", type=T.probability, default=None, help="nucleus sampling, in (0, 1]")
    parser.add_argument("--seed", type=T.seed, default=None)
    parser.add_argument("--no-cache", action="store_true", help="recompute the prefix every step")
    parser.add_argument("--samples", type=T.positive_int, default=1,
                        help="number of samples (seeds seed, seed+1, ...)")
    parser.add_argument("--checkpoint", default=None, help="checkpoint file (default: checkpoints/latest.pt)")
    parser.add_argument("--tokenizer", default=None, help="SentencePiece model (default: the run's)")
    parser.add_argument("--no-stop", action="store_true", help="do not stop at the end-of-story token")
    parser.add_argument("--routing", action="store_true", help="print each token's experts per layer")


def new_token_budget(requested: Optional[int], prompt_len: int, context: int) -> int:
    """How many new tokens ``generate`` decodes: ``requested`` (default ``DEFAULT_NEW_TOKENS``)
    capped to the room the context leaves after the prompt, but at least ``context // 4`` (the
    prompt is then left-truncated by :func:`generate`) and at most ``context - 1``."""
    n = DEFAULT_NEW_TOKENS if requested is None else requested
    return max(1, min(n, max(context - prompt_len, context // 4), context - 1))


def _load(args):
    """The run's model and tokenizer; a missing tokenizer is a ConfigError naming the run."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = RunDir(args.run).load_model(checkpoint_path=args.checkpoint, tokenizer=args.tokenizer)
    for w in caught:
        if loaded.tokenizer is not None:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if loaded.tokenizer is None:
        why = "; ".join(str(w.message) for w in caught) or "the run names no tokenizer"
        raise ConfigError(f"{args.run}: no tokenizer ({why}); pass --tokenizer PATH")
    return loaded


def _check_prompt(prompt: str) -> None:
    """Text that is not valid UTF-8 reaches Python as lone surrogates (``surrogateescape``)."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = prompt[e.start].encode("utf-8", "surrogateescape")
        raise ConfigError(f"argument --prompt: not valid UTF-8 text (byte 0x{bad.hex()} at character {e.start}); "
                          f"give the prompt as UTF-8") from None


def run_cli(args) -> int:
    _check_prompt(args.prompt)
    loaded = _load(args)
    model, tok, cfg = loaded.model, loaded.tokenizer, loaded.config
    eos = tok.eos_id()
    # training windows are "story <eos> story <eos> ...": a story starts after an <eos>
    prompt = [eos] + tok.encode(args.prompt)
    step = loaded.step
    n_new = new_token_budget(args.max_new_tokens, len(prompt), cfg.context)
    if args.max_new_tokens is not None and n_new < args.max_new_tokens:
        print(f"# --max-new-tokens {args.max_new_tokens} capped to {n_new} (model context "
              f"{cfg.context}, prompt {len(prompt)} tokens)", file=sys.stderr)
    print(f"# {cfg.name}: {model.num_params():,} params, step {step}, "
          f"{'no cache' if args.no_cache else 'KV cache'}, temperature {args.temperature}", file=sys.stderr)
    for i in range(args.samples):
        seed = None if args.seed is None else args.seed + i
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ContextOverflowWarning)
            g = generate(model, prompt, n_new, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, seed=seed, use_cache=not args.no_cache,
                         eos_id=None if args.no_stop else eos, return_routing=True)
        for w in caught:
            print(f"# {w.message}", file=sys.stderr)
        text = tok.decode(g.tokens)
        print(args.prompt + (" " if args.prompt and not text.startswith(" ") else "") + text)
        rate = len(g.tokens) / max(g.seconds, 1e-9)
        print(f"# {len(g.tokens)} tokens in {g.seconds:.2f} s ({rate:.0f} tok/s)", file=sys.stderr)
        if args.routing:
            for t, r in zip(g.tokens, g.routing):
                layers = " ".join("-" if x is None else
                                  ("/".join(map(str, x["experts"])) if x["kind"] == "moe"
                                   else "g" + ",".join(f"{w:.2f}" for w in x["weights"]))
                                  for x in r)
                print(f"{tok.id_to_piece(t)!r:>16}  {layers}")
        if args.samples > 1:
            print("---")
    return 0
