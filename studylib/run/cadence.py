"""Which optimizer steps of a run write what: a "train" record every ``log_every`` steps, an
evaluation (an "eval" record) every ``train.eval_every`` steps and at the last step, a checkpoint
at every evaluation (or every ``train.checkpoint_every`` steps) and at the last step.

The training loop asks :class:`Cadence` what is due after a step; resume asks it which records a
run has written by the step of its checkpoint (:meth:`Cadence.written_by`), so the two never
disagree. Steps are 1-based counts of optimizer steps done."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Cadence:
    """The record and checkpoint schedule of a run of ``total`` optimizer steps."""

    total: int
    eval_every: int
    log_every: int
    checkpoint_every: Optional[int] = None  # None (or 0): at every evaluation

    @classmethod
    def of(cls, tcfg, total: int) -> "Cadence":
        """The cadence of a :class:`studylib.config.TrainConfig` over ``total`` steps: ``log_every``
        is a tenth of ``eval_every``, between 1 and 10."""
        return cls(total=total, eval_every=tcfg.eval_every, log_every=max(1, min(10, tcfg.eval_every // 10 or 1)),
                   checkpoint_every=tcfg.checkpoint_every)

    def is_last(self, done: int) -> bool:
        return done == self.total

    def logs(self, done: int) -> bool:
        """A "train" record after step ``done``."""
        return done % self.log_every == 0

    def evaluates(self, done: int) -> bool:
        """An evaluation (and its "eval" record) after step ``done``."""
        return done % self.eval_every == 0 or self.is_last(done)

    def checkpoints(self, done: int) -> bool:
        """A checkpoint after step ``done``."""
        due = done % self.checkpoint_every == 0 if self.checkpoint_every else self.evaluates(done)
        return due or self.is_last(done)

    def written_by(self, done: int) -> dict[str, list[int]]:
        """The steps of the "train" and "eval" records a run has written after step ``done``."""
        steps = range(1, done + 1)
        return {"train": [s for s in steps if self.logs(s)], "eval": [s for s in steps if self.evaluates(s)]}
