"""What a training run records, as plain dicts: the per-step result, the running sums between two
records, the "train" and "eval" records of ``metrics.jsonl`` (written by
:meth:`studylib.run.rundir.RunDir.append_metrics`) and the data part of ``summary.json``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from studylib.config import count_params
from studylib.nn.precision import precision_label
from studylib.run.optim import lr_at


@dataclass
class StepResult:
    """One optimizer step: its learning rate, global-batch CE and aux loss, gradient norm (None
    without clipping) and wall time."""

    lr: float
    ce: float
    aux: float
    gnorm: Optional[float]
    dt: float


@dataclass
class RunningSums:
    """Sums over the optimizer steps since the last metrics record."""

    loss: float = 0.0
    aux: float = 0.0
    n: int = 0
    train_s: float = 0.0

    def add(self, step: StepResult) -> None:
        self.loss += step.ce
        self.aux += step.aux
        self.n += 1
        self.train_s += step.dt


def ppl(loss: float) -> float:
    return math.exp(loss) if loss < 700 else float("inf")


def train_record(done: int, targets_per_step: int, sums: RunningSums, last: StepResult,
                 tokens: Optional[int] = None) -> dict:
    """The "train" record after step ``done``: mean losses since the last one, ``last``'s lr and
    gradient norm; ``aux_loss`` only when there is an aux loss. ``tokens``: the target tokens
    trained on so far (default ``done * targets_per_step``; fewer after an epoch's partial step)."""
    rec = {"kind": "train", "step": done, "tokens": done * targets_per_step if tokens is None else tokens,
           "train_loss": sums.loss / sums.n, "lr": last.lr}
    if last.aux or sums.aux:
        rec["aux_loss"] = sums.aux / sums.n
    if last.gnorm is not None:
        rec["grad_norm"] = last.gnorm
    return rec


def eval_record(done: int, targets_per_step: int, lr: float, ev: dict, sums: RunningSums,
                elapsed_s: float, tokens: Optional[int] = None) -> dict:
    """The "eval" record after step ``done`` from an evaluation ``ev`` (see
    :func:`studylib.run.evaluation.evaluate`, plus ``eval_s`` and ``full``) and the training
    steps since the last evaluation; ``tokens`` as in :func:`train_record`."""
    return {"kind": "eval", "step": done, "tokens": done * targets_per_step if tokens is None else tokens,
            "val_loss": ev["val_loss"], "val_ppl": ppl(ev["val_loss"]),
            "train_loss": sums.loss / max(sums.n, 1), "lr": lr,
            "tok_per_s": sums.n * targets_per_step / max(sums.train_s, 1e-9),
            "elapsed_s": elapsed_s, "eval_s": ev["eval_s"], "full": ev["full"],
            "val_windows": ev["n_windows"], "router": ev["router"]}


def data_summary(data) -> dict:
    try:
        return dict(data.summary())
    except Exception:  # a look-alike without summary()
        return {"train_windows": len(data.train_idx), "val_windows": len(data.val_idx)}


# what a finished run's summary must hold for the trainer to skip the run (and the CLI to print it)
SUMMARY_REQUIRED = ("best_val_loss", "best_val_ppl", "best_step", "final_val_loss", "steps",
                    "train_tok_per_s")


def expected_steps(done: int, total: int, log_every: int, eval_every: int) -> dict[str, list[int]]:
    """The steps of the "train" and "eval" records a run has written after optimizer step ``done``."""
    evals = list(range(eval_every, done + 1, eval_every))
    if done == total and (not evals or evals[-1] != total):
        evals.append(total)
    return {"train": list(range(log_every, done + 1, log_every)), "eval": evals}


def checkpoint_state(t, step: int, final_rec: Optional[dict], rng: dict, all_rng: list) -> dict:
    """The full checkpoint of trainer ``t`` after optimizer step ``step`` (see
    :mod:`studylib.run.checkpoint` for the format): weights, optimizer, RNG of every rank, data
    position, counters, the run's config hash and fingerprints, and the metrics lines so far."""
    total = t.total
    return {
        "kind": "full", "step": step, "total_steps": total, "config_hash": t.chash, "provenance": t.prints,
        "model": t.model.state_dict(), "optimizer": t.opt.state_dict(),
        "scheduler": {"step": step, "total_steps": total, "lr": lr_at(min(step, total - 1), total, t.tcfg)},
        "rng": rng, "rng_ranks": all_rng,
        "data_position": t.sampler.data_position(step),
        "best": t.best, "clock": t.clock, "final": final_rec, "world_size": t.dist.world,
        "amp": precision_label(t.amp_dtype),
        "metrics": "".join(t.records),
    }


def summary_record(t) -> dict:
    """``summary.json`` of the finished run held by trainer ``t`` (a :class:`studylib.run.trainer.Trainer`)."""
    best, final, clock = t.best, t.final, t.clock
    tokens = t.tokens(t.total)  # exact: an epoch's partial last step counts the windows it read
    amp = precision_label(t.amp_dtype)
    return {
        "model": t.model_name, "seed": t.seed, "preset": t.preset.name,
        "best_val_loss": best["val_loss"], "best_val_ppl": ppl(best["val_loss"]),
        "best_step": best["step"], "best_is_full_eval": best["full"],
        "final_val_loss": final["val_loss"], "final_val_ppl": final["val_ppl"],
        "steps": t.total, "tokens": tokens,
        "wall_time_s": clock["elapsed_s"], "train_time_s": clock["train_s"],
        "train_tok_per_s": tokens / max(clock["train_s"], 1e-9),
        "params": count_params(t.mcfg).as_dict(), "num_params": t.model.num_params(),
        "device": str(t.device), "amp": amp,
        # fp32 results depend on it (~1e-7 between 1 and 2 threads): --jobs 1 trains in-process on
        # every core, a sweep's workers on cores // jobs each (README, "Measured")
        "torch_threads": t.prints.get("torch_threads", torch.get_num_threads()),  # the training's (provenance.of_data)
        "world_size": t.dist.world, "config_hash": t.chash, "data": data_summary(t.data),
        "provenance": t.prints,  # fingerprints of the corpus and tokenizer (studylib.run.provenance)
        "finished": True,
    }
