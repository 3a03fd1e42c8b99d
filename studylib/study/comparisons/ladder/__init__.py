"""Notebook 14, the size ladder (issue #55): the token-budget map's trios up the paper's line, the
MoE's position p and its learned router's worth over a hash against size, and the joint law's
forms scored on sizes they had not seen when they predicted them.

Its plan is the map's (notebook 09's grids, :func:`grids`) in two stages (:data:`STAGE`): the fit
set (every trio not named in ``study.ladder.predict``) trains first; then each law form, fitted on
it, writes its predictions of the other cells (:mod:`.predictions`: stamped with the fit set's hash
and the time) before any of their runs begins; then the rest trains. A table written after a run it
predicts began is refused. The measurements against size are :mod:`.trend`'s."""
from __future__ import annotations

from pathlib import Path

from studylib.config import ConfigError
from studylib.run.layout import outputs_root
from studylib.study.comparisons.base import Answer, Comparison, Runs, Stage
from studylib.study.comparisons.knobs import Study, required
from studylib.study.comparisons.ladder import predictions
from studylib.study.comparisons.ladder.knobs import LADDER_SHAPE, LadderKnobs
from studylib.study.orchestration.plan import Grid


def _map(study: Study):
    """(the map's trios with every budget in epochs, one epoch's optimizer steps)."""
    from studylib.run.spec import epoch_steps
    from studylib.study.comparisons.token_budget import budgets

    return budgets.budget_trios(study.preset, study["token_budget"]), epoch_steps(study.preset)


def split(study: Study, knobs: LadderKnobs) -> tuple[list, list]:
    """(the fit set's trios, the predicted trios) of the map; a predicted MoE that is no trio's
    reference is one ConfigError line."""
    ladder = required(knobs.ladder, "ladder", study.preset, LADDER_SHAPE)
    trios, _ = _map(study)
    moes = [t.moe for t in trios]
    for i, m in enumerate(ladder.predict):
        if m not in moes:
            raise ConfigError(f"study.ladder.predict[{i}]: {m!r} is not the reference MoE of a trio of "
                              f"study.token_budget ({', '.join(moes)})")
    fit = [t for t in trios if t.moe not in ladder.predict]
    if not fit:
        raise ConfigError("study.ladder.predict: names every trio of study.token_budget; the law needs at least "
                          "one trio to fit on")
    return fit, [t for t in trios if t.moe in ladder.predict]


def _grids(study: Study, trios) -> list[Grid]:
    from studylib.run.spec import epoch_steps
    from studylib.study.comparisons.token_budget import cell_grids

    return cell_grids(study.preset, trios, study.preset.seeds, epoch_steps(study.preset))


def predicted_dirs(runs: Runs, fit) -> list[Path]:
    """The run folders of the predicted cells among ``runs`` (:func:`grids`' order: the fit set's
    ``fit`` trios' grids first)."""
    first = sum(len(t.cells()) for t in fit)
    return sorted({s.run_dir for group in runs.specs[first:] for s in group})


def grids(study: Study, knobs: LadderKnobs) -> list[Grid]:
    """The map's grids: the fit set's, then the predicted trios' (one grid per trio x cell)."""
    fit, new = split(study, knobs)
    return _grids(study, fit) + _grids(study, new)


def out_dir(study: Study) -> Path:
    return outputs_root(study.preset) / study.preset.name


def fit_runs(study: Study, trios, runs: Runs):
    """The fit set's runs as the law takes them (notebook 09's per-run losses, bits per byte)."""
    from studylib.study.comparisons.token_budget import budgets, summaries

    return budgets.loss_frame(study.preset, trios, summaries(runs, trios)).rename(columns={"params": "active"})


def predict_before(study: Study, knobs: LadderKnobs, runs: Runs) -> None:
    """The stage's act: each law form fitted on the fit set's ``runs`` predicts every predicted
    cell, unless a run of those cells has begun (then nothing is written: it would not be a
    prediction) or the table on disk was written from the same fit set (kept, with its time)."""
    from studylib.study.orchestration.plan import plan_runs

    fit, new = split(study, knobs)
    planned = plan_runs(study.preset, _grids(study, new), "the ladder's predicted cells")
    dirs = sorted({s.run_dir for group in planned.specs for s in group})
    out = out_dir(study)
    _, stamp = predictions.read(out)
    law_runs = fit_runs(study, fit, runs)
    h = predictions.inputs_hash(law_runs)
    if stamp is not None and stamp.get("fit_hash") == h:
        print(f"ladder: the predictions of {predictions.TABLE} (written {stamp['written_at']}) stand: same fit set")
        return
    began = predictions.begun(dirs)
    if began:
        print(f"ladder: no predictions written: {len(began)} of the {len(dirs)} predicted runs have begun "
              f"(e.g. {began[0]}); the scores will say so")
        return
    _, epoch = _map(study)
    cells = predictions.new_cells(study.preset, new, study.preset.seeds, epoch)
    t = predictions.predict(law_runs, cells, n_boot=study["token_budget"].law_boot)
    predictions.write(out, t, h, len(law_runs), dirs)
    print(f"ladder: {len(t):,} predictions of {cells.groupby(list(predictions.CELL_KEYS)).ngroups} cells by "
          f"{t['form'].nunique()} law forms written to {predictions.table_path(out)}, before their "
          f"{len(dirs)} runs train")


STAGE = Stage(grids=lambda study, knobs: _grids(study, split(study, knobs)[0]), then=predict_before)


def answer(out: Path) -> Answer:
    """The ladder's sentences (its tables), its figure; the lead: p's slope and the carried form."""
    from studylib.study.comparisons.glance import read_table
    from studylib.study.comparisons.ladder import trend

    lad, worth, sl = (read_table(out, n, ()) for n in (trend.POSITIONS, trend.WORTH, trend.SLOPES))
    if lad is None or sl is None:
        return Answer(f"**The size ladder.** Not computed: no `tables/{trend.POSITIONS}.csv` (notebook 14 did not "
                      "run in this study).")
    words = trend.ladder_sentences(lad, worth if worth is not None else lad.iloc[:0], sl)
    verdicts, carried = read_table(out, trend.VERDICTS, ()), read_table(out, trend.CARRIED, ())
    words += law_sentences(verdicts, carried)
    fig = out / "figures" / f"{trend.FIGURE}.png"
    lead = trend.lead_sentences(lad, worth if worth is not None else lad.iloc[:0], sl) + law_lead(lad, verdicts, carried)
    return Answer("**The size ladder (notebook 14).**\n\n" + "\n".join(f"* {s}" for s in words),
                  (fig,) if fig.is_file() else (), lead=tuple(lead), covers=("law", "routers"))


def law_lead(ladder, verdicts, carried) -> list[str]:
    """The first screen's plain sentence on the law: whether a form predicted the new sizes before
    they trained (then what it puts at the paper's size) or nothing is identified there."""
    pos = None
    if carried is not None and len(carried) and "position" in set(carried["quantity"]):
        pos = carried.set_index("quantity").loc["position"]
    n = len(verdicts) if verdicts is not None else 0
    if pos is not None and bool(pos["identified"]):
        k = int(verdicts["passed"].astype(bool).sum())
        ci = f" [{pos['ci_low']:.2f}, {pos['ci_high']:.2f}]" if pos["ci_low"] == pos["ci_low"] else " (no interval)"
        return [f"{k} of {n} law forms predicted the larger sizes before they trained; carried on, the chosen one puts "
                f"p at {pos['estimate']:.2f}{ci} at the paper's size."]
    from studylib.study.comparisons.ladder.trend import size_text

    top = float(verdicts["fit_max_active"].max()) if n else float(ladder["moe_active"].max())
    return [f"No law form predicted the larger sizes before they trained ({n} tried), so the law is not identified "
            f"beyond {size_text(top)} and says nothing at the paper's size."]


def law_sentences(verdicts, carried) -> list[str]:
    """The pre-run predictions' verdicts per form and the carried form's p at the paper's point."""
    out = []
    if verdicts is not None and len(verdicts):
        parts = [f"{r.form}: nothing checkable (the fit set does not identify what they rest on)" if not r.checked
                 else f"{r.form} {r.inside} of {r.checked} inside ({'passed' if r.passed else 'failed'}; losses off by "
                 f"{r.loss_rmse_bpb:.3f} bits per byte rms)" for r in verdicts.itertuples()]
        out.append("Predictions written before the new sizes trained, scored on them: " + "; ".join(parts) + ".")
    if carried is not None and len(carried):
        c = carried.set_index("quantity")
        pos = c.loc["position"] if "position" in c.index else None
        if pos is None or not bool(pos["identified"]):
            out.append("The law is " + (str(pos["reason"]) if pos is not None else "not identified") + ".")
        else:
            ci = (f" [{pos['ci_low']:.2f}, {pos['ci_high']:.2f}]" if pos["ci_low"] == pos["ci_low"] else
                  f" ({pos['reason']})" if pos["reason"] == pos["reason"] and pos["reason"] else "")
            out.append(f"The law carried to the paper's size is the {pos['form']} form (it passed); there it puts p at "
                       f"{pos['estimate']:.2f}{ci}, against the paper's 0.81.")
    return out


COMPARISON = Comparison("ladder", "14_size_ladder", LadderKnobs, grids, answer=answer, stage=STAGE,
                        builds_on=("token_budget", "controls"))
