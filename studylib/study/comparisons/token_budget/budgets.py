"""The map's budgets and runs. A cell is (trio, budget in epochs of the preset's schedule, fraction
of the training stories): ``epochs: 1.0`` from all the stories is the preset's own run (reused);
``epochs: e`` trains ``round(e * S)`` steps, S one epoch of the preset's training windows (or
``train.max_steps`` when set); ``tokens_per_param: x`` trains ``round(x * A / tokens_per_step)``
steps. A trio whose MoE has its own ``vocab_size`` trains on a tokenizer of that size; a
repetition cell reads only the first ``data.train_fraction`` of the training stories.
"""
from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from studylib.config import ConfigError, Preset, load_preset
from studylib.run.rundir import RunDir
from studylib.run.spec import RunSpec, cell_overrides, epoch_steps, tokens_per_param_epochs, tokens_per_step
from studylib.study.analysis.frames import collect_runs
from studylib.study.comparisons.knobs import Study, required
from studylib.study.comparisons.token_budget.gaps import gap_frame, gap_table
from studylib.study.comparisons.token_budget.knobs import MAP_KNOB, TOKEN_BUDGET_SHAPE, TokenBudgetKnobs, TrioConfig

KEY = f"study.{MAP_KNOB}"
#: the longest budget, in units of the preset's own schedule (one pass over the training windows,
#: or ``train.max_steps`` when set): past ~40 passes, repeated data is worth almost nothing
#: (Muennighoff et al. 2023); more is a typo that would queue a run of billions of steps
MAX_EPOCHS = 100


def budget_trios(preset: Preset, knobs: TokenBudgetKnobs, epoch: Optional[int] = None) -> list[TrioConfig]:
    """The trios of ``study.token_budget`` with every budget in epochs of ``epoch`` steps (default
    :func:`studylib.run.spec.epoch_steps`, which may load the data): ``tokens_per_param`` ``x``
    becomes ``round(x * A / tokens_per_step)`` steps (A: the trio's MoE's active parameters), 1.0
    exactly when that is one epoch. Checked (:func:`check_budgets`) unless ``epoch`` is given."""
    trios = list(required(knobs.trios, MAP_KNOB, preset, TOKEN_BUDGET_SHAPE))
    s = epoch_steps(preset) if epoch is None else epoch
    if epoch is None:
        check_budgets(preset, trios, s)
    out = []
    for t in trios:
        a = int(preset.model_config(t.moe).num_params.active)

        def epochs_of(x: float) -> float:
            return tokens_per_param_epochs(preset, x, a, s)

        if t.tokens_per_param:
            by_steps = {max(1, round(e * s)): e for e in t.epochs}
            for x in t.tokens_per_param:
                by_steps.setdefault(max(1, round(epochs_of(x) * s)), epochs_of(x))
            cell = {e: e for e in t.epochs}  # each budget as written -> its cell's epochs
            cell.update({x: by_steps[max(1, round(epochs_of(x) * s))] for x in t.tokens_per_param})
            t = replace(t, epochs=tuple(sorted(by_steps.values())), tokens_per_param=(),
                        repeat=tuple(epochs_of(x) for x in t.repeat), seeds_at=tuple((cell[x], n) for x, n in t.seeds_at))
        out.append(t)
    return out


def check_budgets(preset: Preset, trios: Sequence[TrioConfig], epoch: int) -> None:
    """Every budget, in optimizer steps, must be at least the preset's warm-up, differ from the
    trio's other budgets and be at most :data:`MAX_EPOCHS` schedules (a repeated budget: passes over
    its fraction of the stories); else one ConfigError line naming the budget and the limit."""
    from studylib.run.optim import warmup_steps

    per_step, warmup = tokens_per_step(preset), max(1, warmup_steps(epoch, preset.train))
    unit = ("passes over the training windows" if preset.train.max_steps is None else
            f"times the preset's train.max_steps = {epoch:,}")
    for i, t in enumerate(trios):
        a = int(preset.model_config(t.moe).num_params.active)
        seen: dict[int, str] = {}
        given = [("epochs", e * epoch, f"{e:g} epochs", 1.0) for e in t.epochs]
        given += [("tokens_per_param", x * a / per_step, f"{x:g} tokens per active parameter", 1.0)
                  for x in t.tokens_per_param]
        given += [("repeat", x * a / per_step, f"{x:g} tokens per active parameter from {f:g} of the stories", f)
                  for x in t.repeat for f in t.stories]
        for key, exact, what, f in given:
            where, n = f"{KEY}.trios[{i}].{key}", round(exact)
            if n / f > MAX_EPOCHS * epoch:
                raise ConfigError(f"{where}: {what} is {n:,} optimizer steps, {n / epoch / f:,.0f} {unit}; at most "
                                  f"{MAX_EPOCHS} (repeated data is worth almost nothing long before that)")
            if n < warmup:
                raise ConfigError(f"{where}: {what} is {exact:.3g} optimizer steps, fewer than the preset's warm-up "
                                  f"of {warmup} (a shorter run only ramps its learning rate); give a larger budget")
            if f == 1.0 and n in seen:
                raise ConfigError(f"{where}: {what} rounds to {n:,} optimizer steps, as {seen[n]} does; "
                                  f"two budgets of one trio must differ by at least one step")
            seen[n] = what


def active_params(preset: Preset, trios: Sequence[TrioConfig]) -> dict:
    """``{size: active parameters of its reference MoE}`` (exact accounting)."""
    return {t.size: int(preset.model_config(t.moe).num_params.active) for t in trios}


def run_plan(study: Study, trios: Sequence[TrioConfig], specs: Sequence[Sequence[RunSpec]]) -> pd.DataFrame:
    """One row per cell x model of the runs the plan resolved (``specs``: one group per cell, in
    :func:`~studylib.study.comparisons.token_budget.grids`' order): max_steps, vocabulary, stories,
    ``preset_run`` (the preset's own run, trained once for every notebook; ``also_in``: the other
    ``study`` lists naming it), its run directory and how many seeds are finished."""
    cells = [(t, e, f) for t in trios for e, f in t.cells()]
    if len(cells) != len(specs):
        raise ValueError(f"run_plan: {len(cells)} cells but {len(specs)} groups of runs")
    preset, rows = study.preset, []
    for (t, e, f), group in zip(cells, specs):
        for m in t.models:
            mine = [s for s in group if s.model == m]
            own = mine[0].run_dir == Path(os.path.abspath(RunDir.of(preset, m, mine[0].seed).path))
            rows.append({"size": t.size, "epochs": e, "stories": f, "model": m, "role": t.role(m),
                         "max_steps": mine[0].preset.train.max_steps, "vocab": mine[0].preset.data.vocab_size,
                         "preset_run": own, "also_in": ", ".join(study.lists_naming(m)) if own else "",
                         "run_dir": str(mine[0].run_dir.parent / "seed*"),
                         "finished": sum(s.rundir.finished() for s in mine), "seeds": len(mine)})
    return pd.DataFrame(rows)


def budget_columns(df: pd.DataFrame, trio: TrioConfig, e: float, stories: float = 1.0,
                   data_cfg=None) -> pd.DataFrame:
    """Run summaries of one cell with ``size``, ``epochs``, ``stories``, ``train_targets`` (target
    tokens of one pass), ``unique`` (at most one pass), ``passes``, ``bytes_per_token`` (from the
    summary, or ``data_cfg``'s data for an older run) and ``best_val_bpb``."""
    df = df.copy()
    df["size"], df["epochs"], df["stories"] = trio.size, e, stories
    df["train_targets"] = df["data_train_targets"].astype(float) if "data_train_targets" in df else math.nan
    df["unique"] = df[["tokens", "train_targets"]].min(axis=1) if "tokens" in df else math.nan
    df["passes"] = df["tokens"] / df["train_targets"] if "tokens" in df else math.nan
    bpt = (df["data_val_bytes"] / df["data_val_tokens"] if {"data_val_bytes", "data_val_tokens"} <= set(df)
           else pd.Series(math.nan, index=df.index))
    if bpt.isna().any() and data_cfg is not None:
        from studylib.data.pipeline import shared_data

        bpt = bpt.fillna(shared_data(data_cfg).bytes_per_token())
    df["bytes_per_token"] = bpt
    if "best_val_loss" in df:
        df["best_val_bpb"] = df["best_val_loss"] / math.log(2) / df["bytes_per_token"]
    return df


def paper_preset_points(root, current: Preset) -> tuple[Optional[pd.DataFrame], str]:
    """(a :func:`~.gaps.gap_table` of the ``paper`` preset's runs under ``<root>``, or None; what was
    found). Never trains nor loads data: one epoch's steps come from its ``epochs: 1.0`` runs."""
    path = Path(root) / "params" / "paper.yaml"
    if current.name == "paper":
        return None, "This is the paper preset: its budgets are the measured points."
    if not path.is_file():
        return None, f"No paper preset ({path})."
    from studylib.study.comparisons import study_of  # the registry imports this package

    paper_p = load_preset(path)
    knobs = next(k for k in study_of(paper_p).knobs.values() if isinstance(k, TokenBudgetKnobs))
    if knobs.trios is None:
        return None, f"The paper preset lists no {KEY}."
    trios, frames = [], []
    for t in knobs.trios:
        one = collect_runs(paper_p, list(t.models), list(paper_p.seeds))
        if one.empty or "steps" not in one:
            continue
        steps = int(one["steps"].iloc[0])  # its one epoch, without loading data
        t = next(r for r in budget_trios(paper_p, knobs, steps) if r.moe == t.moe)
        trios.append(t)
        for e, f in t.cells():
            ov = cell_overrides(paper_p, t.moe, e, f, steps)
            df = collect_runs(paper_p, list(t.models), list(paper_p.seeds), overrides=ov)
            if not df.empty:
                frames.append(budget_columns(df, t, e, f))
    if not frames:
        return None, ("The paper preset's runs do not exist here (they need a GPU: "
                      "`python -m studylib study --params params/paper.yaml --notebooks 09`).")
    df = pd.concat(frames, ignore_index=True)
    act = active_params(paper_p, trios)
    table = gap_table(gap_frame(df, trios, act), act)
    return table, f"The paper preset's own runs: {len(df)} finished runs found under outputs/paper."


def loss_frame(preset: Preset, trios: Sequence[TrioConfig], summaries: pd.DataFrame,
               value: str = "best_val_bpb") -> pd.DataFrame:
    """One row per run of the map: ``role``, ``model``, ``size``, ``seed``, ``params`` (N, active),
    ``total``, ``tokens`` (D), ``unique``, ``stories``, ``passes`` and ``value`` (default: the best
    validation loss in bits per byte, one scale across the trios' tokenizers)."""
    role_of = {m: t.role(m) for t in trios for m in t.models}
    counts = {m: preset.model_config(m).num_params for m in role_of}
    return pd.DataFrame([{"role": role_of[r.model], "model": r.model, "size": r.size, "seed": int(r.seed),
                          "params": int(counts[r.model].active), "total": int(counts[r.model].total),
                          "tokens": float(r.tokens), "unique": float(r.unique), "stories": float(r.stories),
                          "passes": float(r.passes), "value": float(getattr(r, value))}
                         for r in summaries.itertuples(index=False)])


__all__ = ["KEY", "MAX_EPOCHS", "active_params", "budget_columns", "budget_trios", "check_budgets",
           "paper_preset_points", "run_plan"]
