"""The training runs of the study, one function per notebook that trains, and all of them at once.

The notebooks whose runs have a budget of their own get them from the function here or from their
module (:func:`studylib.study.analysis.budget_map.budget_grids`, :func:`studylib.study.analysis.lr_sweep.sweep_grids`);
the others train ``study.<list> x seeds`` at the preset's budget or at ``study.<name>_epochs``,
as the grids here do. So the plan and the notebooks name the same run directories
(tests/study/orchestration/test_plan.py). ``studylib study`` trains :func:`study_grids` of the selected notebooks
in ONE queue (:func:`studylib.study.orchestration.sweep.ensure_grids`, longest runs first)
before it executes them; each notebook then finds its runs finished and reads them. Run alone
(JupyterLab, plain papermill), a notebook trains its own runs as before.

Why: notebook by notebook, a job slot sat idle at the end of every sweep whose run count is odd
(9 headline runs, 3 iso-width runs, ...). Measured on the 2-core AVX2 machine, ``cpu`` preset: the
notebooks' training cells took about 1,590 s for 1,455 s of runs per slot; in one queue, 1,685 s for
1,674 s (a slower hour of the same machine).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import pandas as pd

from studylib.config import ConfigError, Preset
from studylib.data.pipeline import load_data
from studylib.run.optim import total_steps_for
from studylib.run.rundir import RunDir
from studylib.run.spec import budget_overrides
from studylib.study.analysis import budget_map as bm, lr_sweep, noise
from studylib.study.orchestration.sweep import Grid, ensure_grids


def study_list(preset: Preset, key: str) -> list:
    """``study.<key>``: a list of model names of the preset (checked when it loaded); absent: a
    ConfigError naming the knob."""
    v = getattr(preset.study, key)
    if not v:
        raise ConfigError(f"study.{key}: missing from preset {preset.name!r}; expected a non-empty list of "
                          f"model names of the preset")
    return list(v)


def study_epochs(preset: Preset, key: str) -> float:
    """``study.<key>`` (a budget in units of the preset's schedule; default 1.0)."""
    return getattr(preset.study, key)


@dataclass(frozen=True)
class RunBudget:
    """What one run of the preset's own schedule trains on (notebook 01): the data split
    (``split``: stories, tokens, windows and target tokens per side), its optimizer steps, the
    windows per step and the target tokens it reads."""

    split: pd.DataFrame
    steps: int
    per_step: int
    tokens: int


def run_budget(preset: Preset) -> RunBudget:
    """The preset's data (built or read from the cache) and one run's budget: one epoch of the
    training windows (the last step partial), or ``train.max_steps`` full steps when set."""
    data = load_data(preset.data, progress=False)
    summ = data.summary()
    split = pd.DataFrame({side: {"stories": summ[f"{side}_stories"], "tokens": summ[f"{side}_tokens"],
                                 "windows": summ[f"{side}_windows"], "target tokens": summ[f"{side}_targets"]}
                          for side in ("train", "val")}).T
    steps = total_steps_for(preset.train, len(data.train_idx))
    per_step = preset.train.batch_size * preset.train.grad_accum
    windows = len(data.train_idx) if preset.train.max_steps is None else steps * per_step
    return RunBudget(split, steps, per_step, windows * (data.context - 1))


def headline_grid(preset: Preset) -> Grid:
    """Notebooks 03 and 10: the headline trio at the preset's budget, every seed."""
    return Grid(study_list(preset, "headline"), list(preset.seeds))


def first_seeds(preset: Preset, key: str) -> list[int]:
    """The first ``study.<key>`` of the preset's seeds (all of them when the knob is absent): the
    comparisons that get fewer seeds than the headline."""
    k = getattr(preset.study, key)
    return list(preset.seeds) if k is None else list(preset.seeds[:k])


def downstream_grid(preset: Preset) -> Grid:
    """Notebook 10: the headline trio at the preset's budget, the first ``study.downstream_seeds``
    seeds (each run is exported and evaluated: ~8 s a run on the AVX2 machine)."""
    return Grid(study_list(preset, "headline"), first_seeds(preset, "downstream_seeds"))


def reference_moe(preset: Preset) -> str:
    """``study.reference_moe``, else the headline's MoE (its second model)."""
    return preset.study.reference() or study_list(preset, "headline")[1]


def routing_grid(preset: Preset, model: Optional[str] = None) -> Grid:
    """Notebook 04: one sparse MoE of the preset (default: the reference MoE), every seed, at the
    budget whose runs it shares: a router variant of notebook 12 at
    ``study.router_variants_epochs``, any other at the preset's budget."""
    model = model or reference_moe(preset)
    kind = preset.model_config(model).ffn.kind  # an unknown name: one line naming the preset's models
    if kind != "moe":
        raise ConfigError(f"notebook 04: model {model!r} is {kind!r}, not a sparse MoE (ffn.kind: moe); "
                          f"the routed models of preset {preset.name!r}: "
                          + ", ".join(m for m in preset.models if preset.model_config(m).ffn.kind == "moe"))
    if model != reference_moe(preset) and model in study_list(preset, "router_variants"):
        return Grid([model], list(preset.seeds),
                    budget_overrides(preset, study_epochs(preset, "router_variants_epochs")))
    return Grid([model], list(preset.seeds))


def ablation_grid(preset: Preset) -> Grid:
    """Notebook 02: the routing variants at ``study.ablation_epochs``, the first
    ``study.comparison_seeds`` seeds."""
    return Grid(study_list(preset, "ablation"), first_seeds(preset, "comparison_seeds"),
                budget_overrides(preset, study_epochs(preset, "ablation_epochs")))


def router_variants_grid(preset: Preset) -> Grid:
    """Notebook 12: the router variants, the reference MoE and the headline's two dense
    baselines at ``study.router_variants_epochs`` (1.0: the headline budget, whose runs notebook
    03 shares), every seed of the preset."""
    headline = study_list(preset, "headline")
    models = [headline[0], *study_list(preset, "router_variants"), headline[2]]
    if reference_moe(preset) not in models:
        models.insert(1, reference_moe(preset))
    return Grid(list(dict.fromkeys(models)), None, budget_overrides(preset, study_epochs(preset, "router_variants_epochs")))


def granularity_grid(preset: Preset) -> Grid:
    """Notebook 06: the soft-MoE K sweep at ``study.granularity_epochs``, the first
    ``study.comparison_seeds`` seeds."""
    return Grid(study_list(preset, "granularity"), first_seeds(preset, "comparison_seeds"),
                budget_overrides(preset, study_epochs(preset, "granularity_epochs")))


def iso_width_grid(preset: Preset) -> Grid:
    """Notebook 07: the iso-width pair at ``study.iso_width_epochs``, the first
    ``study.comparison_seeds`` seeds."""
    return Grid(study_list(preset, "iso_width"), first_seeds(preset, "comparison_seeds"),
                budget_overrides(preset, study_epochs(preset, "iso_width_epochs")))


def _budget_grids(preset: Preset) -> list[Grid]:
    trios = bm.budget_trios(preset)
    return budget_grids(trios, preset.seeds, bm.budgets(preset, trios))


def _lr_grids(preset: Preset) -> list[Grid]:
    return sweep_grids(preset, study_list(preset, "headline"), lr_sweep.sweep_spec(preset))


def _noise_grids(preset: Preset) -> list[Grid]:
    spec = noise.noise_spec(preset)
    return [] if spec is None else noise_grids(study_list(preset, "headline"), spec)



# --------------------------------------------------------------------------------------------
# the notebooks whose runs have budgets or settings of their own: their grids, and their runs
# trained (what is missing) and returned with the columns their analysis needs
# --------------------------------------------------------------------------------------------
def train_budgets(preset: Preset, trios: Sequence[bm.Trio], seeds: Sequence[int], budget_map: dict,
                  jobs: Optional[int] = None, progress: bool = True) -> pd.DataFrame:
    """Summaries (``collect_runs`` rows plus ``size``, ``epochs``, ``train_targets``) of every
    trio x budget x seed, training the missing runs in one queue (:func:`~studylib.study.orchestration.sweep.ensure_grids`; finished
    ones are reused)."""
    cells = [(t, e) for t in trios for e in t.epochs]
    frames = ensure_grids(preset, budget_grids(trios, seeds, budget_map), jobs=jobs, progress=progress)
    return pd.concat([bm.budget_columns(df, t, e) for df, (t, e) in zip(frames, cells)], ignore_index=True)


def budget_grids(trios: Sequence[bm.Trio], seeds: Sequence[int], budget_map: dict) -> list[Grid]:
    """One :class:`~studylib.study.orchestration.sweep.Grid` per trio x budget (trio order, then epochs)."""
    return [Grid(list(t.models), t.seeds_of(seeds), budget_map[e]) for t in trios for e in t.epochs]


def sweep_grids(preset: Preset, models: Sequence[str], spec: lr_sweep.SweepSpec) -> list[Grid]:
    """The sweep's runs, one :class:`~studylib.study.orchestration.sweep.Grid` per lr of ``spec.lrs``."""
    budget = budget_overrides(preset, spec.epochs)
    return [Grid(list(models), list(spec.seeds), lr_sweep.run_overrides(preset, spec, lr, budget)) for lr in spec.lrs]


def ensure_sweep(preset: Preset, models: Sequence[str], spec: lr_sweep.SweepSpec, jobs: Optional[int] = None,
                 progress: bool = True) -> pd.DataFrame:
    """Train what is missing of ``models`` x ``spec.lrs`` x ``spec.seeds`` and return one row per
    run (the summaries of :func:`studylib.study.orchestration.sweep.ensure_runs`) with columns ``lr`` and
    ``reused`` (True where the run is the preset's own run directory, e.g. the headline run)."""
    grids = sweep_grids(preset, models, spec)
    frames = ensure_grids(preset, grids, jobs=jobs, progress=progress)  # one queue for every lr
    out = []
    for lr, g, df in zip(spec.lrs, grids, frames):
        reused = [RunDir.variant(preset, m, s, g.overrides).path == RunDir.of(preset, m, s).path
                  for m, s in zip(df["model"], df["seed"])]
        out.append(df.assign(lr=lr, reused=reused))
    return pd.concat(out, ignore_index=True)


def noise_grids(models: Sequence[str], spec: noise.NoiseSpec) -> list[Grid]:
    """The runs of the design: [both, init only, order only (one grid per data seed)]."""
    s0 = spec.fixed
    return [Grid(list(models), list(spec.seeds)),
            Grid(list(models), list(spec.seeds), {"train.data_seed": s0}),
            *[Grid(list(models), [s0], {"train.data_seed": s}) for s in spec.seeds]]


def noise_runs(preset: Preset, models: Sequence[str], spec: noise.NoiseSpec, jobs: Optional[int] = None,
               progress: bool = True) -> pd.DataFrame:
    """The summaries of the design (training what is missing), with ``factor`` (one of
    :data:`studylib.study.analysis.noise.FACTORS`) and ``draw`` (the varied seed: the run seed, or the data seed)."""
    frames = ensure_grids(preset, noise_grids(models, spec), jobs=jobs, progress=progress)
    both, init, order = frames[0], frames[1], frames[2:]
    parts = [both.assign(factor="both", draw=both["seed"]), init.assign(factor="init only", draw=init["seed"])]
    parts += [f.assign(factor="order only", draw=s) for f, s in zip(order, spec.seeds)]
    return pd.concat(parts, ignore_index=True)

#: per notebook (file stem): its grids, from the preset and the notebook's ``-p`` parameters
NOTEBOOK_GRIDS: dict[str, Callable[[Preset, Mapping[str, Any]], list[Grid]]] = {
    "02_routing_ablation": lambda p, q: [ablation_grid(p)],
    "03_headline_sweep": lambda p, q: [headline_grid(p), *_noise_grids(p)],
    "04_routing_diagnostics": lambda p, q: [routing_grid(p, q.get("model"))],
    "06_granularity_sweep": lambda p, q: [granularity_grid(p)],
    "07_iso_width": lambda p, q: [iso_width_grid(p)],
    "09_token_budget": lambda p, q: _budget_grids(p),
    "10_downstream": lambda p, q: [downstream_grid(p)],
    "11_learning_rate": lambda p, q: _lr_grids(p),
    "12_router_variants": lambda p, q: [router_variants_grid(p)],
}


def study_grids(preset: Preset, notebooks: Sequence[str],
                parameters: Optional[Mapping[str, Mapping[str, Any]]] = None) -> list[Grid]:
    """The grids of the named notebooks (file stems like ``03_headline_sweep``), given each
    notebook's ``-p`` parameters (``{stem: {name: value}}``; e.g. notebook 04's ``model``); a
    notebook that trains nothing, or that this plan does not know, adds none (it trains its own
    runs)."""
    parameters = parameters or {}
    return [g for name in notebooks
            for g in NOTEBOOK_GRIDS.get(name, lambda p, q: [])(preset, parameters.get(name) or {})]


__all__ = ["budget_grids", "train_budgets", "sweep_grids", "ensure_sweep", "noise_grids", "noise_runs", "RunBudget", "run_budget", "study_grids", "first_seeds", "downstream_grid", "reference_moe", "routing_grid", "headline_grid", "ablation_grid", "granularity_grid", "iso_width_grid", "router_variants_grid",
           "study_epochs", "study_list", "NOTEBOOK_GRIDS"]
