"""Notebook 11's knob, ``study.lr_sweep: {lrs, seeds, epochs, tolerance}`` (:class:`LrSweep`), and
the sweep it resolves to against the ``train.lr`` and seeds a notebook runs with (:class:`SweepSpec`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from studylib.config import ConfigError
from studylib.config.checks import number
from studylib.study.comparisons.knobs import Knobs, knob

DEFAULT_TOLERANCE = 0.01  # nats: the largest mean cost of an lr that still counts as "flat"


@dataclass(frozen=True)
class SweepSpec:
    """:class:`LrSweep` resolved against a preset's ``train.lr`` and seeds (:meth:`LrSweep.resolve`):
    the grid with the preset's own rate exactly, the seeds, and the knobs' budget and tolerance
    (default :data:`DEFAULT_TOLERANCE`)."""

    knobs: "LrSweep"
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    preset_lr: float

    @property
    def epochs(self) -> float:
        return self.knobs.epochs

    @property
    def tolerance(self) -> float:
        return DEFAULT_TOLERANCE if self.knobs.tolerance is None else self.knobs.tolerance


@dataclass(frozen=True)
class LrSweep:
    """The grid of learning rates (ascending), how many of the preset's seeds, the budget and the
    tolerance (nats; None: the default)."""

    lrs: tuple[float, ...]
    seeds: int
    epochs: float
    tolerance: Optional[float] = None

    def resolve(self, train_lr: float, seeds: Sequence[int]) -> SweepSpec:
        """This sweep against the ``train.lr`` and seeds a notebook runs with: ``train_lr`` must be
        one of the grid's rates (it replaces its near-equal), and ``self.seeds`` at most
        ``len(seeds)``; else one ConfigError line naming the field."""
        if not any(math.isclose(lr, train_lr, rel_tol=1e-9) for lr in self.lrs):
            raise ConfigError(f"study.lr_sweep.lrs: must include the preset's train.lr={train_lr:g} (the lr under "
                              f"test), got {list(self.lrs)}")
        if self.seeds > len(seeds):
            raise ConfigError(f"study.lr_sweep.seeds: {self.seeds} seeds asked, the preset has {len(seeds)} "
                              f"({list(seeds)})")
        lrs = tuple(train_lr if math.isclose(lr, train_lr, rel_tol=1e-9) else lr for lr in self.lrs)
        return SweepSpec(self, lrs, tuple(seeds[: self.seeds]), train_lr)


def parse_lr_sweep(raw: Any, where: str, ctx=None) -> LrSweep:
    """``study.lr_sweep`` checked: one ConfigError line naming the field."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping with lrs, seeds, epochs; got {raw!r}")
    allowed = {"lrs", "seeds", "epochs", "tolerance"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    for key in ("lrs", "seeds", "epochs"):
        if key not in raw:
            raise ConfigError(f"{where}.{key}: missing (lrs: a list of learning rates, seeds: how many "
                              f"of the preset's seeds, epochs: the budget in units of the preset's schedule)")
    lrs_raw = raw["lrs"]
    if not isinstance(lrs_raw, (list, tuple)):
        raise ConfigError(f"{where}.lrs: must be a list of learning rates, got {lrs_raw!r}")
    lrs = sorted({number(v, f"{where}.lrs[{i}]") for i, v in enumerate(lrs_raw)})
    if len(lrs) < 3 or lrs[0] <= 0:
        raise ConfigError(f"{where}.lrs: need at least 3 distinct positive learning rates (a log grid), "
                          f"got {list(lrs_raw)}")
    n = raw["seeds"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ConfigError(f"{where}.seeds: must be an integer >= 2 (a paired interval needs two "
                          f"seeds), got {n!r}")
    budget = number(raw["epochs"], f"{where}.epochs")
    if not budget > 0:
        raise ConfigError(f"{where}.epochs: must be > 0, got {raw['epochs']!r}")
    tol = raw.get("tolerance")
    if tol is not None:
        tol = number(tol, f"{where}.tolerance")
        if not tol > 0:
            raise ConfigError(f"{where}.tolerance: must be > 0 (nats), got {raw['tolerance']!r}")
    return LrSweep(tuple(lrs), n, budget, tol)


@dataclass(frozen=True)
class LrSweepKnobs(Knobs):
    """``lr_sweep`` (None: the preset has none; notebook 11 then says what to add)."""

    sweep: Optional[LrSweep] = knob("lr_sweep", parse_lr_sweep)

    def resolve(self, train_lr: float, seeds: Sequence[int]) -> SweepSpec:
        """:meth:`LrSweep.resolve`; no sweep in the preset: one ConfigError line saying what to add."""
        if self.sweep is None:
            raise ConfigError("study.lr_sweep: missing; add e.g. `lr_sweep: {lrs: [1.0e-3, 3.0e-3, 1.0e-2], "
                              "seeds: 2, epochs: 1.0}` to the preset's study section")
        return self.sweep.resolve(train_lr, seeds)


__all__ = ["DEFAULT_TOLERANCE", "LrSweep", "LrSweepKnobs", "SweepSpec", "parse_lr_sweep"]
