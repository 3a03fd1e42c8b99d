"""The trainer: one model of a preset, one seed -> one run directory (see :mod:`studylib.run.rundir`).

``train_run(preset, model_name, seed)`` seeds Python/NumPy/torch, builds the model under the
seed, and trains it with AdamW (decay on >=2-D tensors only), linear warmup + cosine decay
(:func:`studylib.run.optim.lr_at`), gradient accumulation, clipping and bf16 autocast where the hardware has bf16
(:func:`studylib.nn.precision.resolve_amp`; never fp16). :class:`Trainer` holds the run in progress;
its methods are the phases: setup, resume, train_step, evaluate, save, log and finish. What a checkpoint
holds is its :class:`studylib.run.train_state.TrainState`; which steps log, evaluate and checkpoint is its
:class:`studylib.run.cadence.Cadence`. Which windows a step reads is :mod:`studylib.data.windows`; the
validation pass is :mod:`studylib.run.evaluation`.

Evaluation every ``eval_every`` optimizer steps and at the end, on a fixed subset of
``eval_windows`` validation windows; the end also makes a full pass (``final_full_eval``), which is
the run's ``final_val_loss``. ``best_val_loss`` is the lowest loss *on the subset* (the last step
evaluates the subset too), so it never compares two different samples of windows. Checkpoints
at each evaluation (or every ``checkpoint_every`` steps) and at the end; a finished run directory
is skipped, an unfinished one resumes from its last good checkpoint, bit for bit on CPU. One
process writes a run directory (rank 0 holds :meth:`RunDir.lock` for the whole run); checkpoints
carry the metrics lines written so far, so a resume restores lost ones
(:meth:`RunDir.resume_metrics`). Batch, data and memory are checked up front
(:mod:`studylib.run.resources`); the records are built by :mod:`studylib.run.records`.

DDP (``torchrun``, ``WORLD_SIZE`` > 1): gloo on CPU, NCCL on CUDA. The global batch stays
``batch_size * grad_accum`` windows: rank r takes windows ``r::world_size`` of every micro-batch,
weights its loss by its share, skips the all-reduce on non-final micro-steps (``no_sync``); only
rank 0 writes files. With dropout 0 the loss curve equals the single-process run up to rounding;
dropout masks differ (one RNG stream per rank); the MoE balance loss is per rank with
``balance_scope: micro`` and over every rank's loads of the step with ``global``.
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

from studylib.config import Preset, count_params, run_document
from studylib.nn.model import Decoder
from studylib.nn.precision import autocast, describe_amp, precision_label, resolve_amp
from studylib.run import checkpoint, provenance
from studylib.data.windows import BatchSampler, eval_subset
from studylib.data.pipeline import load_data
from studylib.run.dist import Dist, resolve_device, seed_everything
from studylib.run.evaluation import evaluate
from studylib.storage.files import clean_temp_files
from studylib.run.optim import lr_at, make_optimizer, set_lr, total_steps_for
from studylib.run.cadence import Cadence
from studylib.run.records import SUMMARY_REQUIRED, RunningSums, StepResult, eval_record, summary_record, train_record
from studylib.run.resources import check_run
from studylib.run.layout import run_dir_for
from studylib.run.rundir import RunDir
from studylib.run.train_state import TrainState

class NonFiniteLossError(RuntimeError):
    """The training loss (or gradient norm) became NaN/inf; the last good checkpoint is kept."""


class CheckpointStateError(checkpoint.CheckpointError):
    def __init__(self, run_dir):
        super().__init__(f"{run_dir}: the final checkpoint lacks its evaluation record; delete "
                         f"{RunDir(run_dir).checkpoints} to rerun")


class Trainer:
    """One run in progress: its configuration, data, cadence and training state (``self.state``)."""

    def __init__(self, preset: Preset, model_name: str, seed: int, run_dir=None, progress: bool = True):
        self.preset, self.model_name, self.seed = preset, model_name, seed
        self.tcfg = preset.train
        self.mcfg = preset.model_config(model_name)
        self.dist = Dist()
        self.device = resolve_device(self.tcfg, self.dist.local_rank)
        self.amp_dtype = resolve_amp(self.tcfg, self.device)
        self.rd = RunDir(run_dir if run_dir is not None else run_dir_for(preset, model_name, seed))
        self.doc = run_document(preset, self.mcfg, model_name, seed)
        self.show = progress and self.dist.main
        self.B, self.accum = self.tcfg.batch_size, self.tcfg.grad_accum
        self.chash: Optional[str] = None
        self.last_ckpt: Optional[int] = None  # the step of the last checkpoint written or resumed from

    def say(self, msg: str) -> None:
        if self.dist.main:
            print(msg, file=sys.stderr, flush=True)

    def finished_summary(self, data=None) -> Optional[dict]:
        """Claim the run directory (:class:`studylib.run.rundir.RunDirConflict` if it holds another
        run); the summary of a finished run, else None. A finished run trained on other stories than
        the preset reads now (``data``'s corpus fingerprint, else the local stories': a hub corpus
        is not re-read) is refused (:func:`studylib.run.provenance.check_reuse`), not skipped."""
        self.chash = self.rd.check(self.doc)  # an existing run keeps the hash its checkpoints carry
        self.doc["run"]["config_hash"] = self.chash
        missing = self.rd.summary_missing(SUMMARY_REQUIRED)
        if missing:
            if missing != ["summary.json"]:
                self.say(f"{self.rd.summary_path}: marked finished but lacks {', '.join(missing)}; "
                         f"resuming the run to rewrite it")
            return None
        summary = self.rd.summary()
        provenance.check_finished_corpus(self.rd.path, summary.get("provenance"), data, self.preset.data)
        self.say(f"{self.rd.path}: finished run found (best val loss {summary.get('best_val_loss'):.4f} "
                 f"at step {summary.get('best_step')}); skipping")
        return summary

    def run(self, data=None) -> dict:
        """Set up, resume, train to the last step, and write the summary (returned)."""
        self.setup(data)
        self.resume()
        self.claim_files()
        self.wrap_model()
        self.train()
        return self.finish()

    # ---- setup: data, model and optimizer under the seed ------------------------------------
    def setup(self, data=None) -> None:
        self.data = self._load_data(data)
        self.prints = provenance.of_data(self.data)  # what this run trains on, fingerprinted
        self._plan_batches()
        self.say(describe_amp(self.tcfg, self.device, self.amp_dtype))  # also the summary's "amp"
        seed_everything(self.seed)
        self.model = Decoder(self.mcfg).to(self.device)
        self.opt = make_optimizer(self.model, self.tcfg)
        self.state = TrainState(self.model, self.opt, self.sampler, self.tcfg, self.total, config_hash=self.chash,
                                prints=self.prints, amp=precision_label(self.amp_dtype), rank=self.dist.rank,
                                world=self.dist.world)
        if self.dist.enabled and self.dist.rank > 0:  # own dropout stream per rank (init is identical)
            torch.manual_seed(self.seed * 1000 + self.dist.rank)

    def _load_data(self, data):
        if data is not None:
            return data
        if not self.dist.main:
            self.dist.barrier()  # rank 0 builds the tokenizer / token caches first; the rest reuse them
        data = load_data(self.preset.data, progress=self.show)
        if self.dist.main:
            self.dist.barrier()
        return data

    def _plan_batches(self) -> None:
        data = self.data
        context = getattr(data, "context", None) or data.windows(np.asarray(data.train_idx[:1])).shape[1]
        check_run(self.mcfg, self.model_name, self.tcfg, data, context, self.amp_dtype, self.device,
                  self.dist.world)
        self.total = total_steps_for(self.tcfg, len(data.train_idx))
        self.cadence = Cadence.of(self.tcfg, self.total)
        data_seed = self.seed if self.tcfg.data_seed is None else self.tcfg.data_seed
        self.sampler = BatchSampler(data.train_idx, data_seed, self.B, self.accum)
        self.sub_idx = eval_subset(data.val_idx, self.tcfg.eval_windows, self.preset.data.split_seed)
        self.full_idx = np.asarray(data.val_idx, dtype=np.int64)
        self.subset_is_full = len(self.sub_idx) == len(self.full_idx)
        self.targets_per_step = self.B * self.accum * (context - 1)  # of a full step
        self.targets_per_window = context - 1

    def tokens(self, done: int) -> int:
        """Target tokens trained on in optimizer steps 0 .. done-1 (exact: an epoch's last step
        reads only the windows that remain)."""
        return self.sampler.windows_before(done) * self.targets_per_window

    # ---- resume or start ---------------------------------------------------------------------
    def resume(self) -> None:
        """Restore the training state from the last good checkpoint, if any."""
        found = checkpoint.load_resume(self.rd.checkpoints, expect_hash=self.chash, warn=self.say)
        if found is None:
            return
        ckpt, path = found
        self.state.load_state_dict(ckpt, self.rd.path)
        self.last_ckpt = self.state.step
        self.say(f"{self.rd.path}: resuming from step {self.state.step} of {self.total} (checkpoint {path})")

    def claim_files(self) -> None:
        """Rank 0 writes the config and drops what a crash left after the checkpoint."""
        self.dist.barrier()  # every rank has read the run dir before rank 0 changes it
        if self.dist.main:
            clean_temp_files(self.rd.checkpoints)
            self.rd.write_config(self.doc)
            # keep exactly the records up to the checkpoint: drop later ones, restore lost ones
            step = self.state.step
            note = self.rd.resume_metrics(step, self.state.metrics_copy(), self.cadence.written_by(step))
            if note:
                self.say(note)
            self.state.metrics = [line + "\n" for line in self.rd.metric_lines()]  # now exactly those up to step

    def wrap_model(self) -> None:
        """``self.net``: the model as trained (compiled and/or DDP-wrapped); ``self.model`` stays bare."""
        net = torch.compile(self.model) if self.tcfg.compile else self.model
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            net = DDP(net, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.net = net

    # ---- training loop -----------------------------------------------------------------------
    def train(self) -> None:
        from tqdm.auto import tqdm

        self.since_eval, self.since_log = RunningSums(), RunningSums()
        self.t_wall0 = time.perf_counter() - self.state.clock["elapsed_s"]
        bar = tqdm(total=self.total, initial=self.state.step, disable=not self.show, unit="step",
                   dynamic_ncols=True, desc=f"{self.model_name} seed{self.seed}")
        self.model.train()
        try:
            for step in range(self.state.step, self.total):
                result = self.train_step(step)
                self.state.step = step + 1
                self._tally(result)
                tok_s = self.targets_per_step / max(result.dt, 1e-9)
                bar.set_postfix_str(f"loss {result.ce:.3f}  {tok_s:,.0f} tok/s", refresh=False)
                bar.update(1)
                self._after_step(step + 1, result)
        finally:
            bar.close()

    def train_step(self, step: int) -> StepResult:
        """One optimizer step (0-based ``step``): micro-batches, accumulation, clipping, checks."""
        lr = lr_at(step, self.total, self.tcfg)
        set_lr(self.opt, lr)
        t0 = time.perf_counter()
        inputs = lambda: [self.data.windows(i).to(self.device)[:, :-1] for i in  # noqa: E731
                          self.sampler.rank_micro_batches(step, self.dist.rank, self.dist.world) if len(i)]
        # the routing state of the step: the global-batch loads first, the bias update after it
        with self.model.routing_step(inputs, self.dist.all_reduce_sum, autocast(self.device, self.amp_dtype)):
            ce_acc = torch.zeros(2, device=self.device, dtype=torch.float32)  # (ce, aux) over the global batch
            for m in range(self.accum):
                ce_acc += self._micro_step(step, m)
            self.dist.all_reduce_sum(ce_acc)
            ce, aux = ce_acc.tolist()
            self._check_loss(step + 1, ce, aux)
            gnorm = self._clip_gradients(step + 1, ce)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        return StepResult(lr=lr, ce=ce, aux=aux, gnorm=gnorm, dt=time.perf_counter() - t0)

    def _micro_step(self, step: int, m: int) -> torch.Tensor:
        """Forward/backward of micro-batch ``m``; returns its weighted (ce, aux) contribution.

        The weight is this rank's share of the step's windows (:meth:`BatchSampler.micro_batch`),
        so the step's loss is the mean over the windows it read, also in an epoch's partial last
        step. A micro-batch with no windows here is skipped; under DDP every rank still runs
        one (a stand-in window, weight 0) so that the collectives stay in step."""
        dist = self.dist
        mine, weight = self.sampler.micro_batch(step, m, dist.rank, dist.world)
        if len(mine) == 0:
            if not dist.enabled:
                return torch.zeros(2, device=self.device, dtype=torch.float32)
            mine, weight = self.sampler.indices(step, 0)[:1], 0.0
        w = self.data.windows(mine).to(self.device, non_blocking=True)
        last = not dist.enabled or m == self.accum - 1
        with contextlib.nullcontext() if last else self.net.no_sync():
            with autocast(self.device, self.amp_dtype):
                out = self.net(w[:, :-1], w[:, 1:], return_logits=False)
            loss = out.loss + out.aux_loss
            (loss * (weight * dist.world)).backward()  # DDP averages gradients over the ranks
        return torch.stack([out.loss.detach().float(), out.aux_loss.detach().float()]) * weight

    def _check_loss(self, done: int, ce: float, aux: float) -> None:
        if not (math.isfinite(ce) and math.isfinite(aux)):
            raise NonFiniteLossError(
                f"non-finite training loss at step {done} (CE {ce}, aux {aux}); stopped. "
                f"{self._last_good()} is untouched; lower train.lr or check the data")

    def _clip_gradients(self, done: int, ce: float) -> Optional[float]:
        if self.tcfg.grad_clip <= 0:
            return None
        gnorm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tcfg.grad_clip))
        if not math.isfinite(gnorm):
            raise NonFiniteLossError(f"non-finite gradient norm at step {done} (loss {ce:.4f}); stopped. "
                                     f"{self._last_good()} is untouched")
        return gnorm

    def _last_good(self) -> str:
        if self.last_ckpt is None:  # train_run removes what this attempt wrote (RunDir.forget_unsaved)
            return (f"No checkpoint was written yet, so nothing can resume: this attempt's {self.rd.config_path.name} "
                    f"and {self.rd.metrics_path.name} are removed and a corrected rerun starts afresh in "
                    f"{self.rd.path}; the rest")
        return f"The last good checkpoint ({self.rd.checkpoints / checkpoint.LATEST}, step {self.last_ckpt})"

    def _tally(self, result: StepResult) -> None:
        self.state.clock["train_s"] += result.dt
        self.since_eval.add(result)
        self.since_log.add(result)

    def _after_step(self, done: int, result: StepResult) -> None:
        """Log, evaluate and checkpoint as the cadence has it after optimizer step ``done`` (1-based)."""
        if self.cadence.logs(done):
            self.log(done, result)
        if self.cadence.evaluates(done):
            rec = self.evaluate(done, result.lr)
            if self.cadence.is_last(done):
                self.state.final = rec
        if self.cadence.checkpoints(done):
            self.state.clock["elapsed_s"] = time.perf_counter() - self.t_wall0
            self.save()

    # ---- log: the "train" records -------------------------------------------------------------
    def log(self, done: int, result: StepResult) -> None:
        """Append a "train" record (means since the last one; rank 0 writes it)."""
        if not self.dist.main:
            return
        self.state.metrics.append(self.rd.append_metrics(train_record(done, self.targets_per_step, self.since_log,
                                                                      result, tokens=self.tokens(done))))
        self.since_log = RunningSums()

    # ---- evaluate: the "eval" records ---------------------------------------------------------
    def evaluate(self, done: int, lr: float) -> dict:
        """Evaluate after step ``done`` (the subset; at the last step also the full pass), update
        ``best``, append the "eval" record and return it."""
        ev = self._eval_pass(full=done == self.total and self.tcfg.final_full_eval)
        # `best` compares like with like: the subset's losses only (a full pass at the end
        # is a different sample of windows); the full pass is the final record
        ev_best = ev if not ev["full"] or self.subset_is_full else self._eval_pass(full=False)
        state = self.state
        state.clock["elapsed_s"] = time.perf_counter() - self.t_wall0
        if ev_best["val_loss"] < state.best["val_loss"]:
            state.best = {"val_loss": ev_best["val_loss"], "step": done, "full": ev_best["full"]}
        rec = eval_record(done, self.targets_per_step, lr, ev, self.since_eval, state.clock["elapsed_s"],
                          tokens=self.tokens(done))
        if ev_best is not ev:
            rec["subset_val_loss"] = ev_best["val_loss"]
        if self.dist.main:
            state.metrics.append(self.rd.append_metrics(rec))
        self.since_eval = RunningSums()
        return rec

    def _eval_pass(self, full: bool) -> dict:
        t0 = time.perf_counter()
        ev = evaluate(self.model, self.data, self.full_idx if full else self.sub_idx, self.B,
                      self.device, self.amp_dtype, self.dist)
        ev["eval_s"] = time.perf_counter() - t0
        ev["full"] = full or self.subset_is_full
        return ev

    # ---- save: checkpoints --------------------------------------------------------------------
    def save(self) -> None:
        """With ``keep_checkpoints`` a model-only snapshot, THEN ``latest.pt`` (the old one becomes
        ``prev.pt``): a kill between the two resumes before this step and rewrites the snapshot,
        so none is ever lost. Every rank contributes its RNG state, rank 0 writes."""
        rng_ranks = self.dist.gather(checkpoint.capture_rng())
        if self.dist.main:
            ckpt_dir = self.rd.checkpoints
            if self.tcfg.keep_checkpoints:
                checkpoint.save(checkpoint.snapshot_path(ckpt_dir, self.state.step), self.state.snapshot_state_dict())
            checkpoint.save(ckpt_dir / checkpoint.LATEST, self.state.state_dict(rng_ranks), keep_prev=True)
        self.last_ckpt = self.state.step

    # ---- finish: the summary ------------------------------------------------------------------
    def finish(self) -> dict:
        """Write ``summary.json`` (rank 0) and return the summary."""
        state = self.state
        if state.final is None:  # resumed from the final checkpoint: nothing left to do but the summary
            raise CheckpointStateError(self.rd.path)
        state.clock["elapsed_s"] = max(state.clock["elapsed_s"], time.perf_counter() - self.t_wall0)
        summary = summary_record(state, model=self.model_name, seed=self.seed, preset=self.preset.runs,
                                 tokens=self.tokens(self.total), params=count_params(self.mcfg).as_dict(),
                                 device=self.device, data=self.data)
        if self.dist.main:
            self.rd.write_summary(summary)
        self.dist.barrier()
        return summary


def train_run(preset: Preset, model_name: str, seed: int, run_dir: str | os.PathLike | None = None,
              progress: bool = True, data=None) -> dict:
    """Train ``model_name`` of ``preset`` with ``seed``; returns the run's summary dict.

    ``run_dir`` defaults to :func:`studylib.run.layout.run_dir_for`. A finished run is not redone
    (its summary is returned), an unfinished one resumes from its last good checkpoint, and a
    run directory with a different config raises :class:`studylib.run.rundir.RunDirConflict`.
    ``data``: a :class:`studylib.data.windows.TokenData` (or look-alike) to use instead of loading it.
    """
    trainer = Trainer(preset, model_name, seed, run_dir, progress)
    # one writer per run directory: rank 0 holds its lock for the whole run (RunDirLocked if taken)
    with trainer.rd.lock() if trainer.dist.main else contextlib.nullcontext():
        summary = trainer.finished_summary(data)
        if summary is not None:
            return summary
        threads = torch.get_num_threads()
        if trainer.tcfg.num_threads > 0:
            torch.set_num_threads(trainer.tcfg.num_threads)
        trainer.dist.init(trainer.device)
        try:
            return trainer.run(data)
        except NonFiniteLossError:
            if trainer.dist.main and trainer.last_ckpt is None:
                trainer.rd.forget_unsaved()  # nothing to resume: a corrected rerun is not refused
            raise
        finally:
            trainer.dist.close()
            torch.set_num_threads(threads)


def train_spec(spec, progress: bool = True, data=None) -> dict:
    """:func:`train_run` of a :class:`studylib.run.spec.RunSpec` (a run the plan resolved)."""
    return train_run(spec.preset, spec.model, spec.seed, run_dir=spec.run_dir, progress=progress, data=data)
