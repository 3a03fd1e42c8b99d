"""Stage 5: the windows of each side (:func:`split_windows`, :class:`TokenData`), and which of them
a run reads: the training batch stream and the fixed evaluation subset.

Batches are a pure function of (seed, optimizer step, micro-step). Training goes through the
train windows epoch by epoch, epoch ``e`` in the order ``epoch_order(n_train, seed, e)``. An epoch
is ``S = ceil(n_train / (batch_size * grad_accum))`` optimizer steps
(:func:`steps_per_epoch`); local step ``l = step % S`` of it takes the windows
at positions ``l*batch_size*grad_accum + [0, batch_size*grad_accum)`` of that order, micro-batch
``m`` the ``batch_size`` of them at ``(l*grad_accum + m)*batch_size``. The last step of an epoch
takes only the windows that remain (a partial batch, as the paper's data loader kept it), so
every training window is seen exactly once per epoch and the next epoch starts with a full step.
Its later micro-batches may be short or empty; :meth:`BatchSampler.micro_batch` gives each
micro-batch's weight so that a step's loss is the mean over the windows it actually read.
Resuming needs only the step number (stored in the checkpoint as ``data_position``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import sentencepiece as spm
import torch

from studylib.data.split import SIDES
from studylib.data.stories import DataError



def split_windows(n_train_tokens: int, n_tokens: int, context: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) window indices: ``0..T-1`` over the first ``n_train_tokens`` tokens and
    ``T..T+V-1`` over the rest, each side cut into whole windows of ``context`` on its own."""
    n_val_tokens = n_tokens - n_train_tokens
    n_train, n_val = n_train_tokens // context, n_val_tokens // context
    if n_train == 0:
        raise DataError(f"the training stories hold {n_train_tokens:,} tokens, less than one window of "
                        f"data.context={context}: use more stories, a smaller data.val_fraction or a "
                        f"smaller data.context")
    if n_val == 0:
        raise DataError(f"the validation stories hold {n_val_tokens:,} tokens, less than one window of "
                        f"data.context={context}: use more stories, a larger data.val_fraction or a "
                        f"smaller data.context")
    return np.arange(n_train, dtype=np.int64), np.arange(n_train, n_train + n_val, dtype=np.int64)


@dataclass
class TokenData:
    """The tokens and windows of both sides. ``tokens[:n_train_tokens]`` are the training stories'
    tokens, the rest the validation stories'; ``train_idx`` = ``0..T-1`` and ``val_idx`` =
    ``T..T+V-1`` index windows that lie wholly in their own side (:meth:`window_starts`)."""

    tokens: np.ndarray  # flat memmap of token ids: training stories, then validation stories
    context: int
    train_idx: np.ndarray  # int64 window indices, sorted
    val_idx: np.ndarray  # int64 window indices, sorted
    vocab_size: int
    tokenizer_path: Path
    n_train_tokens: int  # where the validation stories' tokens begin
    n_train_stories: int = 0  # the training stories the windows come from
    n_val_stories: int = 0
    build: dict = field(default_factory=dict)  # cache keys, what was (re)built, timings
    val_bytes: int = 0  # UTF-8 bytes of the validation stories' text (bits per byte: val_tokens / val_bytes)
    train_used: Optional[int] = None  # tokens of the training stories read (data.train_fraction < 1), else all

    @property
    def n_stories(self) -> int:
        return self.n_train_stories + self.n_val_stories

    @property
    def n_windows(self) -> int:
        return self.n_train_tokens // self.context + (len(self.tokens) - self.n_train_tokens) // self.context

    def side_tokens(self, side: str) -> np.ndarray:
        """The tokens of one side's stories (``story <eos>`` each, whole): ``"train"`` or ``"val"``."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {side!r}")
        return self.tokens[: self.n_train_tokens] if side == "train" else self.tokens[self.n_train_tokens:]

    def window_starts(self, idx) -> np.ndarray:
        """The offsets in ``tokens`` where windows ``idx`` begin."""
        idx = np.asarray(idx, dtype=np.int64)
        n, t = self.n_windows, self.n_train_tokens // self.context
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"window index out of range [0, {n})")
        return np.where(idx < t, idx * self.context, self.n_train_tokens + (idx - t) * self.context)

    def windows(self, idx) -> torch.Tensor:
        """Windows ``idx`` (array of window indices) as a (len(idx), context) int64 tensor."""
        rows = np.lib.stride_tricks.sliding_window_view(self.tokens, self.context)  # row r: tokens[r:r+context]
        return torch.from_numpy(np.asarray(rows[self.window_starts(idx)]).astype(np.int64))

    def summary(self) -> dict:
        """Corpus totals and, per side, stories / windows / target tokens (context - 1 per
        window) / tokens: ``train_windows``, ``val_targets``, ..."""
        t = self.context - 1
        out = dict(stories=self.n_stories, tokens=len(self.tokens), vocab_size=self.vocab_size,
                   context=self.context, tokenizer=str(self.tokenizer_path))
        for side, idx, n in (("train", self.train_idx, self.n_train_stories),
                             ("val", self.val_idx, self.n_val_stories)):
            out.update({f"{side}_stories": n, f"{side}_windows": len(idx), f"{side}_targets": len(idx) * t,
                        f"{side}_tokens": len(self.side_tokens(side))})
        if self.train_used is not None:
            out["train_tokens"] = self.train_used
        if self.val_bytes:
            out["val_bytes"] = self.val_bytes
        return out

    def bytes_per_token(self) -> float:
        """UTF-8 bytes of the validation stories per validation token (``story <eos>`` each): a
        loss in nats per token over ``ln 2`` times this is bits per byte, comparable across
        tokenizers."""
        return self.val_bytes / len(self.side_tokens("val"))

    def tokenizer(self) -> spm.SentencePieceProcessor:
        return spm.SentencePieceProcessor(model_file=str(self.tokenizer_path))


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of ``range(n)`` determined by (seed, epoch): same seed -> same batches."""
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)



def steps_per_epoch(n_train: int, batch_size: int, grad_accum: int) -> int:
    """Optimizer steps of one epoch: ceil(windows / (batch_size * grad_accum)). The last step takes
    the remaining windows (a partial batch; see :class:`BatchSampler`), so every training
    window is seen exactly once per epoch. The paper: 834,322 / 32 -> 26,073 steps."""
    return -(-n_train // (batch_size * grad_accum))


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

    def rank_micro_batches(self, step: int, rank: int = 0, world: int = 1) -> list[np.ndarray]:
        """This rank's windows of every micro-batch of ``step`` (:meth:`micro_batch`), in order."""
        return [self.micro_batch(step, m, rank, world)[0] for m in range(self.grad_accum)]


def eval_subset(val_idx: np.ndarray, n: Optional[int], seed: int) -> np.ndarray:
    """A fixed, sorted subset of ``n`` val windows (all if n is None or too large); same for every run."""
    val_idx = np.asarray(val_idx, dtype=np.int64)
    if n is None or n >= len(val_idx):
        return val_idx
    pick = np.random.default_rng(seed).choice(len(val_idx), size=n, replace=False)
    return val_idx[np.sort(pick)]
