"""Which windows a run reads: the training batch stream and the fixed evaluation subset.

Batches are a pure function of (seed, optimizer step, micro-step): the global stream of training
windows is ``epoch_order(n_train, seed, epoch)`` for epoch 0, 1, ...; micro-batch ``m`` of step
``s`` takes the ``batch_size`` windows at positions ``(s*grad_accum + m)*batch_size + [0, B)``.
So resuming needs only the step number (stored in the checkpoint as ``data_position``).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from studylib.run.data import epoch_order


class BatchSampler:
    """Window indices of micro-batch ``micro`` of optimizer step ``step``: pure in (seed, step, micro)."""

    def __init__(self, train_idx: np.ndarray, seed: int, batch_size: int, grad_accum: int):
        self.train_idx = np.asarray(train_idx, dtype=np.int64)
        self.n = len(self.train_idx)
        self.seed, self.batch_size, self.grad_accum = seed, batch_size, grad_accum
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = epoch_order(self.n, self.seed, epoch)
        return self._perms[epoch]

    def position(self, step: int, micro: int = 0) -> int:
        """Index of the first window of this micro-batch in the endless stream of windows."""
        return (step * self.grad_accum + micro) * self.batch_size

    def data_position(self, step: int) -> dict:
        """Where the stream stands before optimizer step ``step`` (stored in checkpoints)."""
        windows = self.position(step)
        return {"step": step, "windows": windows, "epoch": windows // self.n,
                "offset": windows % self.n, "seed": self.seed}

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
