"""The state of a run in progress, as its checkpoints hold it (torchtitan's ``Stateful``):
:meth:`TrainState.state_dict` writes and :meth:`TrainState.load_state_dict` reads every key of a
full checkpoint, :meth:`TrainState.snapshot_state_dict` those of a model-only snapshot. The file
itself (digest trailer, atomic save, which file to resume from) is :mod:`studylib.run.checkpoint`.

A full checkpoint after optimizer step ``step``::

    {"kind": "full", "step", "total_steps", "config_hash", "provenance",
     "model": state_dict (the routers' selection biases are buffers in it; their load counts are
              a step's tally, opened and closed inside the optimizer step, not state),
     "optimizer": state_dict, "scheduler": {"step", "total_steps", "lr"},
     "rng": this process's RNG, "rng_ranks": [RNG of each DDP rank],
     "data_position": :meth:`studylib.data.windows.BatchSampler.data_position`,
     "best": {"val_loss", "step", "full"}, "clock": {"elapsed_s", "train_s"},
     "final": the last "eval" record (None before the last step), "world_size", "amp",
     "metrics": the metrics.jsonl lines written so far}

The first five keys are the header (:class:`studylib.run.checkpoint.Header`, read by
:func:`studylib.run.checkpoint.header` alone). A snapshot holds the header (``kind`` "snapshot") and ``model``. Checkpoints written
before ``provenance``, ``amp`` or ``metrics`` existed lack them and still load."""
from __future__ import annotations

from typing import Optional

import torch

from studylib.config import ConfigError
from studylib.run import checkpoint, provenance
from studylib.run.optim import lr_at


class TrainState:
    """The model and optimizer of a run, its step, best subset loss, clocks, final evaluation and
    metrics lines, with what a resume must match: config hash, data fingerprints, precision.

    ``metrics`` is None until the run's records are settled (:meth:`load_state_dict` sets it to
    the checkpoint's copy, None in a checkpoint older than that copy); rank 0 then holds the
    lines it has written."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sampler, tcfg, total: int, *,
                 config_hash: Optional[str], prints: dict, amp: str, rank: int = 0, world: int = 1):
        self.model, self.optimizer, self.sampler, self.tcfg, self.total = model, optimizer, sampler, tcfg, total
        self.config_hash, self.prints, self.amp, self.rank, self.world = config_hash, prints, amp, rank, world
        self.step = 0
        self.best = {"val_loss": float("inf"), "step": 0, "full": False}  # on the eval subset
        self.clock = {"elapsed_s": 0.0, "train_s": 0.0}
        self.final: Optional[dict] = None
        self.metrics: Optional[list[str]] = None

    def _header(self, kind: str) -> dict:
        """The :class:`studylib.run.checkpoint.Header` every checkpoint opens with (read back by
        :func:`studylib.run.checkpoint.header`)."""
        return checkpoint.Header(kind=kind, step=self.step, config_hash=self.config_hash, total_steps=self.total,
                                 provenance=self.prints).as_dict()

    def snapshot_state_dict(self) -> dict:
        """A model-only snapshot at this step (``train.keep_checkpoints``; the explorer's)."""
        return {**self._header("snapshot"), "model": self.model.state_dict()}

    def state_dict(self, rng_ranks: list[dict]) -> dict:
        """The full checkpoint at this step; ``rng_ranks``: the RNG state of every rank
        (:func:`studylib.run.checkpoint.capture_rng`, gathered), this one's among them."""
        step, total = self.step, self.total
        return {
            **self._header("full"), "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": {"step": step, "total_steps": total, "lr": lr_at(min(step, total - 1), total, self.tcfg)},
            "rng": rng_ranks[self.rank], "rng_ranks": rng_ranks,
            "data_position": self.sampler.data_position(step),
            "best": self.best, "clock": self.clock, "final": self.final, "world_size": self.world,
            "amp": self.amp,
            "metrics": "".join(self.metrics or []),
        }

    def load_state_dict(self, state: dict, run: str) -> None:
        """Restore a full checkpoint of run ``run`` (a path, for messages): first refuse one trained
        on other data (:func:`studylib.run.provenance.check_resume`) or in another precision, then
        weights, optimizer, counters, metrics copy and this rank's RNG."""
        head = checkpoint.header(state, run)
        step = head.step
        # the training's code/threads on a last checkpoint (the one with its final record)
        self.prints = provenance.check_resume(run, head, state.get("final") is not None, self.prints)
        saved = state.get("amp")
        if saved is not None and saved != self.amp:  # train.amp: auto resolves per machine
            raise ConfigError(
                f"{run}: its checkpoint (step {step}) was trained in {saved}, but here "
                f"train.amp={self.tcfg.amp} gives {self.amp}; a run must not change precision midway. Resume "
                f"it where {saved} is chosen, or delete the folder to retrain")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.final = step, state.get("final")
        self.best, self.clock = dict(state["best"]), dict(state["clock"])
        copy = state.get("metrics")
        self.metrics = None if copy is None else copy.splitlines(keepends=True)
        ranks = state.get("rng_ranks") or []
        checkpoint.restore_rng(ranks[self.rank] if len(ranks) == self.world else state["rng"])

    def metrics_copy(self) -> Optional[str]:
        """The metrics lines this state holds, as one text (None: no copy)."""
        return None if self.metrics is None else "".join(self.metrics)
