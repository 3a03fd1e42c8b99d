"""Run the study: train its runs, execute the notebooks with papermill, then one HTML report.

``python -m studylib study --params params/cpu.yaml [--notebooks 01 03] [--jobs N] [--notebook-jobs N]
[--scheduler ADDRESS] [--no-report] [--timeout S] [-p NAME VALUE ...]``: first the runs the selected
notebooks read are trained in one queue (:func:`train_study_runs`: a local Dask cluster of ``--jobs``
workers, or the Dask cluster at ``--scheduler``; :mod:`studylib.study.orchestration.cluster`). Then the notebook phase:
each ``notebooks/NN_*.py`` (Jupytext ``py:percent``) is converted to a notebook, executed with
papermill (kernel ``python3``, working directory = the repository root, parameters ``params`` and
``jobs`` injected after the cell tagged ``parameters``, plus each ``-p NAME VALUE`` whose NAME that
notebook's parameters cell declares; VALUE is parsed as YAML, like papermill's ``-y``) and written
to ``outputs/<preset>/notebooks/NN_*.ipynb`` (or :func:`~studylib.study.runner.execute.executed_stem`).

Up to ``--notebook-jobs`` notebooks execute at a time (default 2), in file order; those marked
``run_alone`` run alone; a failure stops the phase (:mod:`studylib.study.runner.execute`). Then, unless ``--no-report``, the executed notebooks are stitched
into ``outputs/<preset>/report.html`` (:mod:`studylib.study.runner.report`: code hidden, figures
embedded). While the notebooks run, the terminal shows which runs train, their step and ETA
(:mod:`studylib.study.orchestration.watch`).

Every notebook opens with :func:`open_comparison`: its comparison's runs (trained when missing,
else reused) and :func:`notebook_context`, which finds the repository root (a notebook runs from any
working directory, e.g. nbval's), loads the preset, applies the ``seeds`` and ``overrides``
parameters (:func:`studylib.study.runner.parameters.apply_parameters`) and sets the plotting
style; every path it returns is absolute.

Every notebook's parameters cell holds ``params``, ``jobs``, ``seeds = None`` and
``overrides = None``, so the same values reach it from ``studylib study -p`` and from plain
``papermill -p`` on the Jupytext-converted notebook.

Exit status of ``studylib study`` (docs/cli.md): 0 when done; 2 with one line ``error: ...`` for a
known error (arguments, preset, data, a run that failed to train, a Dask cluster that cannot train
the runs); 1 when a notebook failed (its failing cell, the error and the partly executed notebook).
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping, Optional, Sequence

import yaml

from studylib.config import ConfigError, load_preset
from studylib.run.layout import link_shared_runs, outputs_root
from studylib.run.tensorboard import after_runs
from studylib.study.runner.execute import StudyError, environment, execute_all, notebook_header, notebook_parameters
from studylib.study.orchestration.train import SCHEDULER_ENV, available_cores, default_jobs, scheduler_address
from studylib.study.runner.parameters import apply_parameters, check_notebook, check_parameters
from studylib.study.runner.report import write_answer, write_report

NOTEBOOK_RE = re.compile(r"^(\d\d)_.+\.py$")


# --------------------------------------------------------------------------------------------
# locating things
# --------------------------------------------------------------------------------------------
def _is_root(d: Path) -> bool:
    return (d / "params").is_dir() and (d / "notebooks").is_dir()


def repo_root(start: Optional[os.PathLike] = None) -> Path:
    """The repository root: ``$STUDYLIB_ROOT``, else the first folder at or above ``start``
    (default: the working directory) holding ``params/`` and ``notebooks/``, else the folder
    above the installed package."""
    if os.environ.get("STUDYLIB_ROOT"):
        return Path(os.environ["STUDYLIB_ROOT"]).resolve()
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if _is_root(d):
            return d
    return Path(__file__).resolve().parents[3]  # studylib/study/runner/notebooks.py -> the repository


def find_notebooks(notebook_dir: os.PathLike, select: Optional[Sequence[str]] = None,
                   label: str = "--notebooks") -> list[Path]:
    """``NN_*.py`` files of ``notebook_dir`` in order; ``select``: numbers ("01", "3") or names
    (``label`` names where they came from in an error)."""
    nbs = sorted(p for p in Path(notebook_dir).glob("*.py") if NOTEBOOK_RE.match(p.name))
    if not select:
        return nbs
    out = []
    for s in select:
        s = str(s)
        hits = [p for p in nbs if p.name.split("_")[0] == s.zfill(2) or p.stem == s or p.name == s]
        if not hits:
            raise ConfigError(f"{label}: no notebook {s!r} in {notebook_dir}; allowed: "
                              f"{[p.name.split('_')[0] for p in nbs]}")
        out += [h for h in hits if h not in out]
    return sorted(out)


# --------------------------------------------------------------------------------------------
# inside a notebook
# --------------------------------------------------------------------------------------------
def notebook_context(params: str, jobs: Optional[int] = None, seeds=None, overrides=None) -> SimpleNamespace:
    """What every notebook needs first: ``root`` (the repository), ``preset`` (``params``, a
    path relative to the root or absolute, with ``seeds`` and ``overrides`` applied by
    :func:`apply_parameters`), ``params`` (its absolute path), ``out`` (the absolute
    ``outputs/<preset>``), ``jobs`` (``jobs`` or ``study.jobs``), ``seeds``, ``first_seed``,
    ``study`` (the preset's study section typed: :func:`studylib.study.comparisons.study_of`) and
    ``overrides`` (the parsed overrides, ``{}`` if none). Prints what the parameters changed. Sets
    the seaborn style; the working directory is left as it is."""
    from studylib.study.analysis import plots  # matplotlib / seaborn: only once a notebook runs
    from studylib.study.comparisons import study_of

    root = repo_root()
    check_notebook(root, params, jobs, seeds, overrides)  # an unknown injected name, a wrong type: nothing done yet
    path = root / params  # an absolute ``params`` stays as it is
    base = load_preset(path)
    preset, ov = apply_parameters(base, seeds, overrides)
    if ov:
        kv = ", ".join(f"{k}={v!r}" for k, v in ov.items())
        print(f"overrides: {kv} -> preset {preset.name!r}"
              + (f" (its own outputs and runs, apart from {base.name!r})" if preset.name != base.name
                 else " (nothing changed)"))
    if preset.seeds != base.seeds:
        print(f"seeds: {list(preset.seeds)} (the preset's: {list(base.seeds)})")
    study = study_of(preset)
    plots.setup()
    out = root / outputs_root(preset) / preset.name  # a relative $STUDYLIB_OUTPUTS: from the root
    out.mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(root=root, preset=preset, params=str(path), out=out,
                           jobs=default_jobs(preset) if jobs is None else int(jobs),
                           seeds=list(preset.seeds), first_seed=preset.seeds[0], study=study, overrides=ov)


def open_comparison(name: str, params: str, jobs: Optional[int] = None, seeds=None, overrides=None,
                    **parameters) -> tuple[SimpleNamespace, Any]:
    """What a notebook opens with: (:func:`notebook_context`, the
    :class:`~studylib.study.comparisons.base.Runs` of comparison ``name`` under that context's
    study and the notebook's own ``parameters``, e.g. notebook 04's ``model``). The runs are the
    plan ``studylib study`` wrote for this comparison when it matches (:mod:`.plan_file`: nothing
    resolved, checked or counted again); run alone, the notebook plans them and trains the missing
    ones. ``ctx.comparison`` is the :class:`~studylib.study.comparisons.base.Comparison`,
    ``ctx.knobs`` its typed knobs."""
    from studylib.study.comparisons import Runs, comparison
    from studylib.study.orchestration.plan_file import plan_key, plan_path, read_plan

    found = comparison(name)
    ctx = notebook_context(params, jobs, seeds, overrides)
    ctx.comparison, ctx.knobs = found, ctx.study[found]
    check_parameters(parameters)  # the notebook's own, e.g. model (in JupyterLab too)
    given = found.given(parameters)
    planned = read_plan(plan_path(ctx.out, found.name), plan_key(ctx.preset, found.name, given))
    if planned is not None:
        grids, specs = planned
        return ctx, Runs(ctx.preset, tuple(grids), tuple(tuple(s) for s in specs))
    return ctx, found.train(ctx.study, jobs=ctx.jobs, parameters=parameters)


def _study_params(params: str, root: Path) -> tuple:
    """(preset, the ``params`` the kernels get): ``params`` from the working directory, else
    from ``root``; passed on relative to ``root`` when it lies below it."""
    ppath = Path(params)
    abs_params = ppath if ppath.is_absolute() else (Path.cwd() / ppath)
    if not abs_params.is_file():
        abs_params = root / ppath
    preset = load_preset(abs_params)  # validates the preset before any kernel starts
    try:
        return preset, str(abs_params.resolve().relative_to(root))
    except ValueError:
        return preset, str(abs_params.resolve())


def _check_parameters(nbs: Sequence[Path], parameters: Mapping[str, Any], jobs) -> tuple[dict, dict, Any]:
    """(``{notebook: names}`` of each notebook's parameters cell, the ``-p`` parameters, jobs);
    unknown names are a :class:`ConfigError` naming the allowed ones."""
    declared = {py: notebook_parameters(py) for py in nbs}
    allowed = sorted({n for names in declared.values() for n in names} - {"params"})
    parameters = dict(parameters or {})
    if "params" in parameters:
        raise ConfigError("-p params: give the preset with --params")
    unknown = sorted(set(parameters) - set(allowed))
    if unknown:
        raise ConfigError(f"-p {unknown[0]}: not a parameter of the selected notebooks; allowed: {allowed}")
    check_parameters({k: v for k, v in parameters.items() if k != "jobs"})  # e.g. -p model 5: before anything trains
    if "jobs" in parameters:
        pj = parameters.pop("jobs")
        if jobs is not None and pj != jobs:
            raise ConfigError(f"-p jobs {pj!r} and --jobs {jobs}: give jobs once")
        jobs = pj
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ConfigError(f"jobs: must be a positive integer, got {jobs!r}")
    return declared, parameters, jobs


def run_study(params: str, notebooks: Optional[Sequence[str]] = None, jobs: Optional[int] = None,
              report: bool = True, timeout: Optional[float] = None, notebook_dir: Optional[os.PathLike] = None,
              root: Optional[os.PathLike] = None, progress: bool = True, echo=None,
              parameters: Optional[Mapping[str, Any]] = None, notebook_jobs: Optional[int] = None,
              scheduler: Optional[str] = None) -> dict:
    """Train the selected notebooks' runs, then execute the notebooks, ``notebook_jobs`` at a time
    (default: ``min(2, available cores)``; see the module docstring); returns
    ``{"notebooks": {name: seconds} in file order, "runs_s": seconds, "report": path or None,
    "total_s": seconds}``.

    ``parameters`` (``-p NAME VALUE``): passed to each notebook whose parameters cell declares
    NAME; a NAME no selected notebook declares is an error naming the allowed ones. ``seeds`` and
    ``overrides`` are checked here, before any kernel starts, and decide the output folder (a
    preset with overrides has a derived name: :func:`apply_parameters`)."""
    echo = echo or (lambda msg: print(msg, flush=True))
    t_start = time.perf_counter()
    root = Path(root).resolve() if root is not None else repo_root()
    preset, param_arg = _study_params(params, root)
    nb_dir = Path(notebook_dir) if notebook_dir is not None else root / "notebooks"
    label = "--notebooks"
    if not notebooks and preset.study.notebooks is not None:
        notebooks, label = preset_notebooks(preset), "study.notebooks"
    nbs = find_notebooks(nb_dir, notebooks, label)
    if not nbs:
        raise ConfigError(f"no notebooks (NN_*.py) in {nb_dir}")
    declared, extra, jobs = _check_parameters(nbs, parameters, jobs)
    notebook_jobs = _check_notebook_jobs(notebook_jobs)
    headers = {py: notebook_header(py) for py in nbs}  # a bad header fails before any run trains
    preset, ov = apply_parameters(preset, extra.get("seeds"), extra.get("overrides"))
    out = root / outputs_root(preset) / preset.name  # where notebook_context puts it too
    link_shared_runs(preset, root / outputs_root(preset))  # a preset sharing another's runs sees them here
    echo(f"study {preset.name!r}: {len(nbs)} notebook(s) -> {out / 'notebooks'}"
         + (f"; parameters {extra}" if extra else "")
         + (f"; the preset's study.notebooks: {', '.join(p.name.split('_')[0] for p in nbs)} (others: "
            "--notebooks NN)" if label == "study.notebooks" else ""))
    per_notebook = {py: {"params": param_arg, "jobs": jobs, **{k: v for k, v in extra.items() if k in declared[py]}}
                    for py in nbs}
    address = scheduler_address(preset, scheduler)
    runs_s = train_study_runs(preset, nbs, jobs, root, progress, echo, address, per_notebook)
    lone = [py.name.split("_")[0] for py in nbs if headers[py].run_alone]
    echo(f"notebooks: {min(notebook_jobs, len(nbs))} at a time"
         + (f"; {', '.join(lone)} alone (run_alone in the header)" if lone and notebook_jobs > 1 else ""))
    with environment(SCHEDULER_ENV, address):  # a run a notebook trains itself goes to the same cluster
        times = execute_all(nbs, out / "notebooks", per_notebook, root, timeout, progress, echo, t_start,
                            notebook_jobs, headers)
    after_runs(out / "runs", echo)  # every run trained, by the queue or by a notebook: its TensorBoard curves
    report_path = None
    if report:
        executed = [out / "notebooks" / (stem + ".ipynb") for stem in times]
        report_path = write_report(executed, out / "report.html", title=f"Dense vs MoE study: preset {preset.name}")
        echo(f"report: {report_path}; the answer at a glance (and the README's): {write_answer(out)}")
    total = time.perf_counter() - t_start
    echo(f"study {preset.name!r} finished in {total:.1f} s: runs {runs_s:.1f} s, "
         + ", ".join(f"{k.split('_')[0]} {v:.1f} s" for k, v in times.items()))
    return {"notebooks": times, "runs_s": runs_s, "report": report_path, "total_s": total}


def preset_notebooks(preset) -> list[str]:
    """``study.notebooks``: the notebooks a preset's study runs when ``--notebooks`` is not given
    (numbers or names; absent: all). A preset that leaves some out (``cpu``: the comparisons that did
    not fit its 30 minutes) names them in its header and a longer preset runs them."""
    return list(preset.study.notebooks or ())


def _check_notebook_jobs(notebook_jobs) -> int:
    """``notebook_jobs``, or its default ``min(2, available cores)``; not a positive integer: a
    :class:`ConfigError`."""
    if notebook_jobs is None:
        return min(2, available_cores())
    if isinstance(notebook_jobs, bool) or not isinstance(notebook_jobs, int) or notebook_jobs < 1:
        raise ConfigError(f"notebook_jobs: must be a positive integer, got {notebook_jobs!r}")
    return notebook_jobs


def plan_study(preset, nbs: Sequence[Path], parameters: Optional[Mapping[Path, Mapping]] = None,
               progress: bool = False) -> tuple[list, Optional[Any]]:
    """The selected notebooks' comparisons in one plan: (``[(comparison, the notebook parameters its
    plan takes, its grids)]`` in notebook order, the
    :class:`~studylib.study.orchestration.plan.Plan` of all their grids, or None when they train
    nothing); ``parameters``: ``{notebook: {name: value}}``. Nothing trains; a knob a comparison
    needs that the preset lacks is one ConfigError line naming ``study.<key>``."""
    from studylib.study.comparisons import by_notebook, study_of
    from studylib.study.orchestration.plan import plan_runs

    study, found = study_of(preset), by_notebook()
    parts = []
    for py in nbs:
        if py.stem in found:
            c = found[py.stem]
            given = c.given((parameters or {}).get(py))
            parts.append((c, given, c.plan(study, given)))
    grids = [g for _, _, gs in parts for g in gs]
    if not grids:
        return parts, None
    return parts, plan_runs(preset, grids, "notebook(s) " + ", ".join(py.name.split("_")[0] for py in nbs), progress)


def _staged(nbs: Sequence[Path]) -> list:
    """The comparisons of ``nbs`` with a first stage (:class:`~studylib.study.comparisons.base.Stage`)."""
    from studylib.study.comparisons import by_notebook

    found = by_notebook()
    return [found[py.stem] for py in nbs if py.stem in found and found[py.stem].stage is not None]


def train_study_runs(preset, nbs: Sequence[Path], jobs: Optional[int], root: Path, progress: bool, echo,
                     scheduler: Optional[str] = None, parameters: Optional[Mapping[Path, Mapping]] = None) -> float:
    """Train the first stage of each selected comparison that has one (its runs, then its act),
    then plan the selected notebooks' comparisons in one plan (:func:`plan_study`, given each
    notebook's parameters ``{notebook: {name: value}}``), train its missing runs in one queue before
    any notebook executes (from the repository root, as the notebooks run; on the Dask scheduler at
    ``scheduler`` or here), and write each comparison's part under the preset's outputs
    (:func:`~studylib.study.orchestration.plan_file.write_plan`) for its notebook to read; the
    seconds it took. A failed run is the sweep's :class:`~studylib.study.orchestration.common.SweepError`
    naming the run and its log (a known error: the CLI prints its one line and exits with 2, as
    for a cluster that cannot train it)."""
    import contextlib

    from studylib.study.orchestration.plan_file import plan_key, plan_path, write_plan
    from studylib.study.orchestration.train import train_plan

    t0 = time.perf_counter()
    out = root / outputs_root(preset) / preset.name
    with contextlib.chdir(root):
        from studylib.study.comparisons import study_of

        for c in _staged(nbs):  # e.g. predictions written before the runs they predict train
            echo(f"notebook {c.notebook}: its first stage trains, then acts, before the rest")
            study = study_of(preset)
            c.stage.run(study, study[c], jobs, progress, scheduler, f"notebook {c.notebook}'s first stage")
        parts, planned = plan_study(preset, nbs, parameters, progress)
        if planned is None:
            return 0.0
        echo(f"training the runs of {len(planned.grids)} grid(s) in one queue, longest first, "
             + (f"on the Dask cluster at {scheduler}" if scheduler else f"{jobs or default_jobs(preset)} at a time")
             + "; the notebooks then read them")
        train_plan(planned, jobs=jobs, progress=progress, scheduler=scheduler)
        at = 0
        for c, given, gs in parts:
            if gs:
                write_plan(plan_path(out, c.name), plan_key(preset, c.name, given), gs, planned.specs[at:at + len(gs)])
            at += len(gs)
    took = time.perf_counter() - t0
    echo(f"runs ready in {took:.1f} s")
    return took


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def add_cli(parser) -> None:
    from studylib.config import args as T

    parser.add_argument("--params", required=True, help="preset YAML, e.g. params/cpu.yaml")
    parser.add_argument("--notebooks", nargs="+", default=None, metavar="NN",
                        help="only these notebooks (numbers like 01 03, or names); default: all")
    parser.add_argument("--jobs", type=T.positive_int, default=None,
                        help="parallel training processes (default: the preset's study.jobs)")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="train the runs on the Dask cluster at ADDRESS (e.g. tcp://host:8786; default: "
                             "$STUDYLIB_SCHEDULER, the preset's study.scheduler, else a local cluster of --jobs "
                             "workers); outputs and the data cache must be on a filesystem every worker sees")
    parser.add_argument("--notebook-jobs", type=T.positive_int, default=None, metavar="N",
                        help="notebooks executed at a time, after the runs trained (default: 2, or 1 on one "
                             "core); a notebook marked run_alone in its header always runs alone")
    parser.add_argument("--no-report", action="store_true", help="skip outputs/<preset>/report.html")
    parser.add_argument("--comparison-module", action="append", default=[], metavar="MODULE",
                        help="a comparison kept outside studylib: a module (importable here and by the "
                             "notebook kernels) whose COMPARISON is a studylib Comparison; repeatable; added to "
                             "$STUDYLIB_COMPARISONS, which the kernels inherit (installed packages declare theirs "
                             "as entry points of the group studylib.comparisons instead)")
    parser.add_argument("--timeout", type=T.positive_float, default=None, metavar="S",
                        help="per-cell execution timeout in seconds (default: none)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars (papermill's per-cell bar shows with --notebook-jobs 1 only)")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="a notebook parameter, repeatable; VALUE is parsed as YAML (as papermill -y). "
                             "Every notebook takes seeds (e.g. 1337-1346 or [1,2]) and overrides "
                             "(e.g. '{\"train.amp\": \"off\"}'); a preset with overrides gets a derived name")


def cli_parameters(pairs: Sequence[Sequence[str]]) -> dict:
    """``-p NAME VALUE`` pairs as ``{NAME: VALUE parsed as YAML}`` (a name given twice is an error)."""
    out = {}
    for name, text in pairs:
        if name in out:
            raise ConfigError(f"-p {name}: given twice")
        try:
            out[name] = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ConfigError(f"-p {name}: the value {text!r} is not valid YAML") from None
    return out


def run_cli(args) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"--jobs: must be >= 1, got {args.jobs}")
    if args.comparison_module:
        from studylib.study.comparisons import name_modules

        name_modules(args.comparison_module, "--comparison-module")
    try:
        run_study(args.params, args.notebooks, args.jobs, report=not args.no_report, timeout=args.timeout,
                  progress=not args.no_progress, parameters=cli_parameters(args.parameter),
                  notebook_jobs=args.notebook_jobs, scheduler=args.scheduler)
    except StudyError as e:  # a notebook failed: its cell's error and where the partly executed notebook is
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
