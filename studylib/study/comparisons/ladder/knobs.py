"""Notebook 14's knob: ``study.ladder``, the trios of the token-budget map (``study.token_budget``)
whose cells the law predicts before they train, named by their reference MoE
(:class:`LadderKnobs`); the map's other trios are the law's fit set."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from studylib.config import ConfigError
from studylib.study.comparisons.knobs import Context, Knobs, knob

LADDER_SHAPE = "{predict: [moe_l, moe_xl]} (the reference MoEs of the map's trios to predict)"


@dataclass(frozen=True)
class Ladder:
    """``predict``: the reference MoEs of the map's trios whose cells are predicted before they train."""

    predict: tuple[str, ...]


def LADDER(v: Any, where: str, ctx: Context) -> Ladder:
    if not isinstance(v, dict):
        raise ConfigError(f"{where}: expected {LADDER_SHAPE}, got {v!r}")
    unknown = sorted(set(v) - {"predict"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; expected {LADDER_SHAPE}")
    names = v.get("predict")
    if not isinstance(names, (list, tuple)) or not names:
        raise ConfigError(f"{where}.predict: expected a non-empty list of model names, got {names!r}")
    for i, m in enumerate(names):
        if not isinstance(m, str) or m not in ctx.models:
            raise ConfigError(f"{where}.predict[{i}]: expected a model name of the preset, got {m!r}")
        if ctx.ffn_kind(m) != "moe":
            raise ConfigError(f"{where}.predict[{i}]: {m!r} is not a routed MoE; expected the reference MoE of a "
                              f"trio of study.token_budget")
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}.predict: each model once, got {list(names)}")
    return Ladder(tuple(names))


@dataclass(frozen=True)
class LadderKnobs(Knobs):
    ladder: Optional[Ladder] = knob("ladder", LADDER)

    def model_lists(self) -> dict[str, tuple[str, ...]]:
        return {"ladder": self.ladder.predict} if self.ladder else {}
