"""Which windows a run reads: the training batch stream and the fixed evaluation subset.

Batches are a pure function of (seed, optimizer step, micro-step). Training goes through the
train windows epoch by epoch, epoch ``e`` in the order ``epoch_order(n_train, seed, e)``. An epoch
is ``S = ceil(n_train / (batch_size * grad_accum))`` optimizer steps
(:func:`studylib.run.optim.steps_per_epoch`); local step ``l = step % S`` of it takes the windows
at positions ``l*batch_size*grad_accum + [0, batch_size*grad_accum)`` of that order, micro-batch
``m`` the ``batch_size`` of them at ``(l*grad_accum + m)*batch_size``. The last step of an epoch
takes only the windows that remain (a partial batch, as the paper's data loader kept it), so
every training window is seen exactly once per epoch and the next epoch starts with a full step.
Its later micro-batches may be short or empty; :meth:`BatchSampler.micro_batch` gives each
micro-batch's weight so that a step's loss is the mean over the windows it actually read.
Resuming needs only the step number (stored in the checkpoint as ``data_position``).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from studylib.run.data import epoch_order
from studylib.run.optim import steps_per_epoch


class BatchSampler:
    """Window indices of micro-batch ``micro`` of optimizer step ``step``: pure in (seed, step, micro)."""

    def __init__(self, train_idx: np.ndarray, seed: int, batch_size: int, grad_accum: int):
        self.train_idx = np.asarray(train_idx, dtype=np.int64)
        self.n = len(self.train_idx)
        self.seed, self.batch_size, self.grad_accum = seed, batch_size, grad_accum
        self.per_step = batch_size * grad_accum
        self.steps_per_epoch = steps_per_epoch(self.n, batch_size, grad_accum)
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = epoch_order(self.n, self.seed, epoch)
        return self._perms[epoch]

    def _span(self, step: int, micro: int) -> tuple[int, int, int]:
        """(epoch, start, end): micro-batch ``micro`` of ``step`` is positions [start, end) of the
        epoch's order (end - start < batch_size only in an epoch's last step, possibly 0)."""
        epoch, local = divmod(step, self.steps_per_epoch)
        start = min(self.n, (local * self.grad_accum + micro) * self.batch_size)
        return epoch, start, min(self.n, start + self.batch_size)

    def windows_before(self, step: int) -> int:
        """Training windows read by optimizer steps 0 .. step-1 (exact, partial steps included)."""
        epoch, local = divmod(step, self.steps_per_epoch)
        return epoch * self.n + min(self.n, local * self.per_step)

    def step_windows(self, step: int) -> int:
        """Windows read by optimizer step ``step``: ``batch_size * grad_accum``, fewer in an
        epoch's last step."""
        return self.windows_before(step + 1) - self.windows_before(step)

    def position(self, step: int, micro: int = 0) -> int:
        """Index of the first window of this micro-batch in the endless stream of windows."""
        epoch, start, _ = self._span(step, micro)
        return epoch * self.n + start

    def data_position(self, step: int) -> dict:
        """Where the stream stands before optimizer step ``step`` (stored in checkpoints)."""
        windows = self.windows_before(step)
        epoch = step // self.steps_per_epoch
        return {"step": step, "windows": windows, "epoch": epoch, "offset": windows - epoch * self.n,
                "seed": self.seed}

    def indices(self, step: int, micro: int) -> np.ndarray:
        """The windows of micro-batch ``micro`` of ``step`` (``batch_size`` of them, fewer or none
        in the last step of an epoch)."""
        epoch, start, end = self._span(step, micro)
        return self.train_idx[self._perm(epoch)[start:end]]

    def micro_batch(self, step: int, micro: int, rank: int = 0, world: int = 1) -> tuple[np.ndarray, float]:
        """This rank's windows of micro-batch ``micro`` of ``step`` (rank ``r`` takes ``r::world``)
        and the weight of their mean loss in the step's loss: their share of the windows the
        step reads, so that the weights of a step sum to 1 over micro-batches and ranks and the
        step's loss is the mean over its windows, also in a partial last step."""
        mine = self.indices(step, micro)[rank::world]
        return mine, len(mine) / self.step_windows(step)


def eval_subset(val_idx: np.ndarray, n: Optional[int], seed: int) -> np.ndarray:
    """A fixed, sorted subset of ``n`` val windows (all if n is None or too large); same for every run."""
    val_idx = np.asarray(val_idx, dtype=np.int64)
    if n is None or n >= len(val_idx):
        return val_idx
    pick = np.random.default_rng(seed).choice(len(val_idx), size=n, replace=False)
    return val_idx[np.sort(pick)]
