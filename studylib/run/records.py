"""What a training run records, as plain dicts: the per-step result, the running sums between two
records, the "train" and "eval" records of ``metrics.jsonl`` (written by
:meth:`studylib.run.rundir.RunDir.append_metrics`) and ``summary.json``, each from explicit
arguments. Which steps write them is :mod:`studylib.run.cadence`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from studylib.run.provenance import THREADS


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


def summary_record(state, *, model: str, seed: int, preset: str, tokens: int, params: dict, device,
                   data) -> dict:
    """``summary.json`` of the finished run ``model`` / ``seed`` of preset ``preset``: ``state``
    (its :class:`studylib.run.train_state.TrainState` at the last step) holds the losses, clocks and
    identity; ``tokens``: the target tokens it trained on (exact: an epoch's partial last step
    counts the windows it read); ``params``: its parameter counts; ``data``: its
    :class:`studylib.data.windows.TokenData`."""
    best, final, clock = state.best, state.final, state.clock
    return {
        "model": model, "seed": seed, "preset": preset,
        "best_val_loss": best["val_loss"], "best_val_ppl": ppl(best["val_loss"]),
        "best_step": best["step"], "best_is_full_eval": best["full"],
        "final_val_loss": final["val_loss"], "final_val_ppl": final["val_ppl"],
        "steps": state.total, "tokens": tokens,
        "wall_time_s": clock["elapsed_s"], "train_time_s": clock["train_s"],
        "train_tok_per_s": tokens / max(clock["train_s"], 1e-9),
        "params": params, "num_params": state.model.num_params(),
        "device": str(device), "amp": state.amp,
        # fp32 results depend on it (~1e-7 between 1 and 2 threads): --jobs 1 trains in-process on
        # every core, a sweep's workers on cores // jobs each (docs/design.md, "Precision")
        # the training's (provenance.of_data; a rebuilt summary: its last checkpoint's); None where that
        # checkpoint predates the record: unknown, never the rebuilding process's own
        "torch_threads": state.prints.get(THREADS),
        "world_size": state.world, "config_hash": state.config_hash, "data": data_summary(data),
        "provenance": state.prints,  # fingerprints of the corpus and tokenizer (studylib.run.provenance)
        "finished": True,
    }
