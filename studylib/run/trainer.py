"""The trainer: one model of a preset, one seed -> one run directory (see :mod:`studylib.run.rundir`).

``train_run(preset, model_name, seed)`` seeds Python/NumPy/torch, builds the model under the
seed, and trains it with AdamW (decay on >=2-D tensors only), linear warmup + cosine decay
(:func:`lr_at`), gradient accumulation, clipping and bf16 autocast (CPU and CUDA; never fp16).

Batches are a pure function of (seed, optimizer step, micro-step): the global stream of training
windows is ``epoch_order(n_train, seed, epoch)`` for epoch 0, 1, ...; micro-batch ``m`` of step
``s`` takes the ``batch_size`` windows at positions ``(s*grad_accum + m)*batch_size + [0, B)``.
So resuming needs only the step number (stored in the checkpoint as ``data_position``).

Evaluation every ``eval_every`` optimizer steps and at the end, on a fixed subset of
``eval_windows`` validation windows; the end also makes a full pass (``final_full_eval``), which is
the run's ``final_val_loss``. ``best_val_loss`` is the lowest loss *on the subset* (the last step
evaluates the subset too), so it never compares two different samples of windows.
Checkpoints at each evaluation
(or every ``checkpoint_every`` steps) and at the end; a finished run directory is skipped, an
unfinished one resumes from its last good checkpoint, bit for bit on CPU.

DDP: under ``torchrun`` (``WORLD_SIZE`` > 1) the same code initialises a process group (gloo on
CPU, NCCL on CUDA) and wraps the model in DistributedDataParallel. The *global* batch stays
``batch_size * grad_accum`` windows: rank r takes windows ``r::world_size`` of every micro-batch,
weights its loss by its share (so unequal shares are exact), skips the gradient all-reduce on
non-final micro-steps (``no_sync``), and only rank 0 writes files. With dropout 0 the loss curve
equals the single-process run up to float rounding. Caveats: dropout masks differ from a
single-process run (each rank has its own RNG stream), and the MoE balance loss is computed per
rank on that rank's tokens (as in most MoE codebases), so MoE runs with a balance loss are close
to, not identical with, the single-process run.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from typing import Optional

import numpy as np
import torch

from studylib.nn.precision import autocast
from studylib.run import checkpoint
from studylib.run.dist import Dist, resolve_amp, resolve_device, seed_everything
from studylib.run.optim import lr_at, make_optimizer, total_steps_for

from studylib.run.rundir import RunDir, run_dir_for
from studylib.config import ConfigError, Preset, override, run_document


class NonFiniteLossError(RuntimeError):
    """The training loss (or gradient norm) became NaN/inf; the last good checkpoint is kept."""


# --------------------------------------------------------------------------------------------
# batches
# --------------------------------------------------------------------------------------------
class BatchSampler:
    """Window indices of micro-batch ``micro`` of optimizer step ``step``: pure in (seed, step, micro)."""

    def __init__(self, train_idx: np.ndarray, seed: int, batch_size: int, grad_accum: int):
        self.train_idx = np.asarray(train_idx, dtype=np.int64)
        self.n = len(self.train_idx)
        self.seed, self.batch_size, self.grad_accum = seed, batch_size, grad_accum
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            from studylib.run.data import epoch_order

            if len(self._perms) >= 2:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = epoch_order(self.n, self.seed, epoch)
        return self._perms[epoch]

    def position(self, step: int, micro: int = 0) -> int:
        """Index of the first window of this micro-batch in the endless stream of windows."""
        return (step * self.grad_accum + micro) * self.batch_size

    def indices(self, step: int, micro: int) -> np.ndarray:
        pos = self.position(step, micro) + np.arange(self.batch_size)
        epochs, offs = np.divmod(pos, self.n)
        out = np.empty(self.batch_size, dtype=np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self.train_idx[self._perm(int(e))[offs[sel]]]
        return out


def eval_subset(val_idx: np.ndarray, n: Optional[int], seed: int) -> np.ndarray:
    """A fixed, sorted subset of ``n`` val windows (all if n is None or too large); same for every run."""
    val_idx = np.asarray(val_idx, dtype=np.int64)
    if n is None or n >= len(val_idx):
        return val_idx
    pick = np.random.default_rng(seed).choice(len(val_idx), size=n, replace=False)
    return val_idx[np.sort(pick)]


# --------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------
def _tree_add(acc, x, w: float):
    """acc + w*x over nested lists/dicts of numbers (None stays None; non-numbers: first seen)."""
    if x is None:
        return acc
    if isinstance(x, dict):
        acc = {} if acc is None else acc
        for k, v in x.items():
            acc[k] = _tree_add(acc.get(k), v, w)
        return acc
    if isinstance(x, (list, tuple)):
        acc = [None] * len(x) if acc is None else acc
        return [_tree_add(a, v, w) for a, v in zip(acc, x)]
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return (acc or 0.0) + w * float(x)
    return x if acc is None else acc


def _tree_scale(x, s: float):
    if isinstance(x, dict):
        return {k: _tree_scale(v, s) for k, v in x.items()}
    if isinstance(x, list):
        return [_tree_scale(v, s) for v in x]
    if isinstance(x, float):
        return x * s
    return x


@torch.no_grad()
def evaluate(model, data, idx: np.ndarray, batch_size: int, device: torch.device,
             amp_dtype: Optional[torch.dtype], dist: Optional[Dist] = None) -> dict:
    """Mean next-token CE over windows ``idx`` (no dropout), and router stats averaged over batches.

    Under DDP each rank takes ``r::world`` of every batch; sums are combined across ranks.
    """
    dist = dist or Dist()
    was_training = model.training
    model.eval()
    loss_sum, n_sum, stats_acc = 0.0, 0, None
    for start in range(0, len(idx), batch_size):
        mine = idx[start:start + batch_size][dist.rank::dist.world]
        if len(mine) == 0:
            continue
        w = data.windows(mine).to(device, non_blocking=True)
        with autocast(device, amp_dtype):
            out = model(w[:, :-1], w[:, 1:], stats=True, return_logits=False)
        n = len(mine)
        loss_sum += float(out.loss) * n
        n_sum += n
        stats_acc = _tree_add(stats_acc, list(out.router_stats), n)
    model.train(was_training)
    parts = dist.gather((loss_sum, n_sum, stats_acc))
    loss_sum = sum(p[0] for p in parts)
    n_sum = sum(p[1] for p in parts)
    stats = None
    for p in parts:
        stats = _tree_add(stats, p[2], 1.0)
    stats = _tree_scale(stats, 1.0 / max(n_sum, 1)) if stats is not None else None
    val = loss_sum / max(n_sum, 1)
    return {"val_loss": val, "n_windows": n_sum, "router": stats}


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _param_accounting(model_cfg, model) -> dict:
    try:
        from studylib.config import count_params

        acc = count_params(model_cfg)
        d = acc.as_dict() if hasattr(acc, "as_dict") else dict(acc)
    except ImportError:
        d = {}
    d.setdefault("total", model.num_params())
    return d


def _ppl(loss: float) -> float:
    return math.exp(loss) if loss < 700 else float("inf")


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------
def train_run(preset: Preset, model_name: str, seed: int, run_dir: str | os.PathLike | None = None,
              overrides=None, progress: bool = True, data=None) -> dict:
    """Train ``model_name`` of ``preset`` with ``seed``; returns the run's summary dict.

    ``run_dir`` defaults to :func:`studylib.run.rundir.run_dir_for`. A finished run is not redone
    (its summary is returned), an unfinished one resumes from its last good checkpoint, and a
    run directory with a different config raises :class:`studylib.run.rundir.RunDirConflict`.
    ``data``: a :class:`studylib.run.data.TokenData` (or look-alike) to use instead of loading it.
    """
    preset = override(preset, overrides)
    tcfg = preset.train
    mcfg = preset.model_config(model_name)
    dist = Dist()
    device = resolve_device(tcfg, dist.local_rank)
    amp_dtype = resolve_amp(tcfg, device)
    rd = RunDir(run_dir if run_dir is not None else run_dir_for(preset, model_name, seed))
    run_dir = rd.path
    doc = run_document(preset, mcfg, model_name, seed)
    show = progress and dist.main

    def say(msg: str) -> None:
        if dist.main:
            print(msg, file=sys.stderr, flush=True)

    chash = rd.check(doc)  # an existing run keeps the hash its checkpoints carry
    doc["run"]["config_hash"] = chash
    if rd.finished():
        summary = rd.summary()
        say(f"{run_dir}: finished run found (best val loss {summary.get('best_val_loss'):.4f} "
            f"at step {summary.get('best_step')}); skipping")
        return summary

    threads = torch.get_num_threads()
    if tcfg.num_threads > 0:
        torch.set_num_threads(tcfg.num_threads)
    dist.init(device)
    try:
        return _train(preset, tcfg, mcfg, model_name, seed, rd, doc, chash, dist, device,
                      amp_dtype, show, say, data)
    finally:
        dist.close()
        torch.set_num_threads(threads)


def _train(preset, tcfg, mcfg, model_name, seed, rd, doc, chash, dist, device, amp_dtype,
           show, say, data) -> dict:
    run_dir = rd.path
    from tqdm.auto import tqdm

    from studylib.nn.model import Decoder

    if data is None:
        from studylib.run.data import load_data

        if not dist.main:
            dist.barrier()  # rank 0 builds the tokenizer / token caches first; the rest reuse them
        data = load_data(preset.data, progress=show)
        if dist.main:
            dist.barrier()
    context = getattr(data, "context", None) or data.windows(np.asarray(data.train_idx[:1])).shape[1]
    if data.vocab_size > mcfg.vocab_size:
        raise ConfigError(f"models.{model_name}.vocab_size={mcfg.vocab_size} is smaller than the "
                          f"tokenizer's vocabulary ({data.vocab_size})")
    if context - 1 > mcfg.context:
        raise ConfigError(f"models.{model_name}.context={mcfg.context} is shorter than the "
                          f"{context - 1} input tokens of a data window")
    B, accum = tcfg.batch_size, tcfg.grad_accum
    if B < dist.world:
        raise ConfigError(f"train.batch_size={B} is smaller than the {dist.world} DDP ranks")
    total = total_steps_for(tcfg, len(data.train_idx))
    sampler = BatchSampler(data.train_idx, seed, B, accum)
    sub_idx = eval_subset(data.val_idx, tcfg.eval_windows, preset.data.split_seed)
    full_idx = np.asarray(data.val_idx, dtype=np.int64)
    targets_per_step = B * accum * (context - 1)

    # ---- model and optimizer under the seed ------------------------------------------------
    seed_everything(seed)
    model = Decoder(mcfg).to(device)
    opt = make_optimizer(model, tcfg)
    if dist.enabled and dist.rank > 0:  # own dropout stream per rank (init is identical)
        torch.manual_seed(seed * 1000 + dist.rank)

    # ---- resume or start -------------------------------------------------------------------
    ckpt_dir = rd.checkpoints
    found = checkpoint.load_resume(ckpt_dir, expect_hash=chash, warn=say)
    state, state_path = found if found is not None else (None, None)
    start, best, clock, final = 0, {"val_loss": float("inf"), "step": 0, "full": False}, \
        {"elapsed_s": 0.0, "train_s": 0.0}, None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start, best, clock, final = state["step"], dict(state["best"]), dict(state["clock"]), state.get("final")
        ranks = state.get("rng_ranks") or []
        checkpoint.restore_rng(ranks[dist.rank] if len(ranks) == dist.world else state["rng"])
        say(f"{run_dir}: resuming from step {start} of {total} (checkpoint {state_path})")
    dist.barrier()  # every rank has read the run dir before rank 0 changes it
    if dist.main:
        checkpoint.clean_temp_files(ckpt_dir)
        rd.write_config(doc)
        rd.truncate_metrics(start)  # drop records written after the checkpoint
    net = torch.compile(model) if tcfg.compile else model
    if dist.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    params_acc = _param_accounting(mcfg, model)

    def save_checkpoint(step: int, final_rec=None) -> None:
        rng = checkpoint.capture_rng()
        all_rng = dist.gather(rng)
        last_ckpt[0] = step
        if not dist.main:
            return
        ckpt = {
            "kind": "full", "step": step, "total_steps": total, "config_hash": chash,
            "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": {"step": step, "total_steps": total, "lr": lr_at(min(step, total - 1), total, tcfg)},
            "rng": rng, "rng_ranks": all_rng,
            "data_position": {"step": step, "windows": sampler.position(step),
                              "epoch": sampler.position(step) // sampler.n,
                              "offset": sampler.position(step) % sampler.n, "seed": seed},
            "best": best, "clock": clock, "final": final_rec, "world_size": dist.world,
        }
        checkpoint.save(ckpt_dir / checkpoint.LATEST, ckpt, keep_prev=True)
        if tcfg.keep_checkpoints:
            checkpoint.save(checkpoint.snapshot_path(ckpt_dir, step),
                            {"kind": "snapshot", "step": step, "total_steps": total,
                             "config_hash": chash, "model": model.state_dict()})

    last_ckpt = [start if state is not None else None]

    def last_good() -> str:
        if last_ckpt[0] is None:
            return "No checkpoint was written yet; the run directory"
        return f"The last good checkpoint ({ckpt_dir / checkpoint.LATEST}, step {last_ckpt[0]})"

    def run_eval(step: int, full: bool) -> dict:
        t0 = time.perf_counter()
        ev = evaluate(model, data, full_idx if full else sub_idx, B, device, amp_dtype, dist)
        ev["eval_s"] = time.perf_counter() - t0
        ev["full"] = full or len(sub_idx) == len(full_idx)
        return ev

    # ---- training loop ---------------------------------------------------------------------
    log_every = max(1, min(10, tcfg.eval_every // 10 or 1))
    since_eval = {"loss": 0.0, "n": 0, "train_s": 0.0}
    since_log = {"loss": 0.0, "aux": 0.0, "n": 0}
    t_wall0 = time.perf_counter() - clock["elapsed_s"]
    bar = tqdm(total=total, initial=start, disable=not show, unit="step", dynamic_ncols=True,
               desc=f"{model_name} seed{seed}")
    model.train()
    try:
        for step in range(start, total):
            lr = lr_at(step, total, tcfg)
            for g in opt.param_groups:
                g["lr"] = lr
            t0 = time.perf_counter()
            ce_acc = torch.zeros(2, device=device, dtype=torch.float32)  # (ce, aux) over the global batch
            for m in range(accum):
                mine = sampler.indices(step, m)[dist.rank::dist.world]
                w = data.windows(mine).to(device, non_blocking=True)
                share = len(mine) / B  # this rank's share of the micro-batch
                sync = contextlib.nullcontext() if (not dist.enabled or m == accum - 1) else net.no_sync()
                with sync:
                    with autocast(device, amp_dtype):
                        out = net(w[:, :-1], w[:, 1:], return_logits=False)
                    loss = out.loss + out.aux_loss
                    (loss * (share * dist.world / accum)).backward()
                ce_acc += torch.stack([out.loss.detach().float(), out.aux_loss.detach().float()]) * (share / accum)
            dist.all_reduce_sum(ce_acc)
            ce, aux = ce_acc.tolist()
            done = step + 1
            if not (math.isfinite(ce) and math.isfinite(aux)):
                raise NonFiniteLossError(
                    f"non-finite training loss at step {done} (CE {ce}, aux {aux}); stopped. "
                    f"{last_good()} is untouched; lower train.lr or check the data")
            gnorm = None
            if tcfg.grad_clip > 0:
                gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip))
                if not math.isfinite(gnorm):
                    raise NonFiniteLossError(
                        f"non-finite gradient norm at step {done} (loss {ce:.4f}); stopped. "
                        f"{last_good()} is untouched")
            opt.step()
            opt.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            clock["train_s"] += dt
            since_eval["loss"] += ce
            since_eval["n"] += 1
            since_eval["train_s"] += dt
            since_log["loss"] += ce
            since_log["aux"] += aux
            since_log["n"] += 1
            tok_s = targets_per_step / max(dt, 1e-9)
            bar.set_postfix_str(f"loss {ce:.3f}  {tok_s:,.0f} tok/s", refresh=False)
            bar.update(1)

            if dist.main and done % log_every == 0:
                rec = {"kind": "train", "step": done, "tokens": done * targets_per_step,
                       "train_loss": since_log["loss"] / since_log["n"], "lr": lr}
                if aux or since_log["aux"]:
                    rec["aux_loss"] = since_log["aux"] / since_log["n"]
                if gnorm is not None:
                    rec["grad_norm"] = gnorm
                rd.append_metrics(rec)
                since_log = {"loss": 0.0, "aux": 0.0, "n": 0}

            is_last = done == total
            evaluated = False
            if done % tcfg.eval_every == 0 or is_last:
                ev = run_eval(done, full=is_last and tcfg.final_full_eval)
                # `best` compares like with like: the subset's losses only (a full pass at the end
                # is a different sample of windows); the full pass is the final record
                ev_best = ev if not ev["full"] or len(sub_idx) == len(full_idx) else run_eval(done, full=False)
                clock["elapsed_s"] = time.perf_counter() - t_wall0
                if ev_best["val_loss"] < best["val_loss"]:
                    best = {"val_loss": ev_best["val_loss"], "step": done, "full": ev_best["full"]}
                rec = {"kind": "eval", "step": done, "tokens": done * targets_per_step,
                       "val_loss": ev["val_loss"], "val_ppl": _ppl(ev["val_loss"]),
                       "train_loss": since_eval["loss"] / max(since_eval["n"], 1), "lr": lr,
                       "tok_per_s": since_eval["n"] * targets_per_step / max(since_eval["train_s"], 1e-9),
                       "elapsed_s": clock["elapsed_s"], "eval_s": ev["eval_s"], "full": ev["full"],
                       "val_windows": ev["n_windows"], "router": ev["router"]}
                if ev_best is not ev:
                    rec["subset_val_loss"] = ev_best["val_loss"]
                if dist.main:
                    rd.append_metrics(rec)
                since_eval = {"loss": 0.0, "n": 0, "train_s": 0.0}
                evaluated = True
                if is_last:
                    final = rec
            ck_due = (done % tcfg.checkpoint_every == 0) if tcfg.checkpoint_every else evaluated
            if ck_due or is_last:
                clock["elapsed_s"] = time.perf_counter() - t_wall0
                save_checkpoint(done, final if is_last else None)
    finally:
        bar.close()

    if final is None:  # resumed from the final checkpoint: nothing left to do but the summary
        raise CheckpointStateError(run_dir)
    clock["elapsed_s"] = max(clock["elapsed_s"], time.perf_counter() - t_wall0)
    summary = {
        "model": model_name, "seed": seed, "preset": preset.name,
        "best_val_loss": best["val_loss"], "best_val_ppl": _ppl(best["val_loss"]),
        "best_step": best["step"], "best_is_full_eval": best["full"],
        "final_val_loss": final["val_loss"], "final_val_ppl": final["val_ppl"],
        "steps": total, "tokens": total * targets_per_step,
        "wall_time_s": clock["elapsed_s"], "train_time_s": clock["train_s"],
        "train_tok_per_s": total * targets_per_step / max(clock["train_s"], 1e-9),
        "params": params_acc, "num_params": model.num_params(),
        "device": str(device), "amp": str(amp_dtype).replace("torch.", "") if amp_dtype else "fp32",
        "world_size": dist.world, "config_hash": chash, "data": _data_summary(data),
        "finished": True,
    }
    if dist.main:
        rd.write_summary(summary)
    dist.barrier()
    return summary


class CheckpointStateError(checkpoint.CheckpointError):
    def __init__(self, run_dir):
        super().__init__(f"{run_dir}: the final checkpoint lacks its evaluation record; delete "
                         f"{RunDir(run_dir).checkpoints} to rerun")


def _data_summary(data) -> dict:
    try:
        return dict(data.summary())
    except Exception:  # a look-alike without summary()
        return {"train_windows": len(data.train_idx), "val_windows": len(data.val_idx)}


# --------------------------------------------------------------------------------------------
# CLI: python -m studylib train --params params/X.yaml --model NAME --seed N [--set k=v ...]
# --------------------------------------------------------------------------------------------
def add_cli(parser) -> None:
    parser.add_argument("--params", required=True, help="preset YAML, e.g. params/tiny.yaml")
    parser.add_argument("--model", required=True, help="model name from the preset's models")
    parser.add_argument("--seed", type=int, default=None, help="seed (default: the preset's first)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a preset value, e.g. --set train.max_steps=100 (repeatable)")
    parser.add_argument("--run-dir", default=None, help="run directory (default: outputs/<preset>/runs/"
                                                        "<model>/seed<seed>/)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_cli(args) -> int:
    from studylib.config import load_preset

    preset = load_preset(args.params, args.set)
    seed = args.seed if args.seed is not None else preset.seeds[0]
    try:
        s = train_run(preset, args.model, seed, run_dir=args.run_dir, progress=not args.no_progress)
    except (NonFiniteLossError, checkpoint.CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{args.model} seed {seed}: best val loss {s['best_val_loss']:.4f} "
              f"(ppl {s['best_val_ppl']:.2f}) at step {s['best_step']}; final {s['final_val_loss']:.4f}; "
              f"{s['steps']} steps, {s['train_tok_per_s']:,.0f} tok/s")
    return 0
