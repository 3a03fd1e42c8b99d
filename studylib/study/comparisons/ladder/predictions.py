"""The law's predictions written before the runs they predict (issue #55), and their scores.

* :func:`new_cells`: each cell of the predicted trios (``study.ladder.predict``) as the law sees it,
  before it trains: per role its active and total parameters, its target tokens (the cell's
  optimizer steps x targets per step) and unique tokens (one pass of its tokenizer's training
  windows), and the seeds it will train.
* :func:`predict`: every candidate form of the joint law (:data:`FORMS`), fitted on the fit set (the
  map's other cells), at each new cell: each role's loss in bits per byte, both gaps and the
  position p, with a 95% interval (the seed bootstrap plus the noise of a mean of the cell's seeds,
  as the held-out checks of :mod:`studylib.study.analysis.law.checks` draw it).
* :func:`write` stamps the table with the fit set's hash (:func:`inputs_hash`) and the time;
  :func:`check_written_before` refuses a table written after any run it predicts began.
* :func:`score`: the measured cells beside the predictions (inside or not, error in bits per
  byte); :func:`form_verdicts`: per form, whether it passed (at least
  :data:`~studylib.study.analysis.law.checks.PASS_SHARE` of its checked quantities inside).
"""
from __future__ import annotations

import datetime as dt
import io
import json
import math
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from studylib.config import ConfigError
from studylib.config.identity import config_hash
from studylib.storage.files import write_atomic
from studylib.study.analysis.bootstrap import percentile_ci, pooled_sd
from studylib.study.analysis.law.checks import CANDIDATES, PASS_SHARE, QUANTITIES, cell_position, quantities, rests_on
from studylib.study.analysis.law.fit import COLUMNS, fit_law, runs_frame
from studylib.study.analysis.position import ROLES

#: the forms predicted: the joint law's candidates (one lambda, the multiplier, lambda(N))
FORMS = CANDIDATES
#: the table's name (under ``tables/``) and its stamp's (beside it)
TABLE = "ladder_predictions"
STAMP_SUFFIX = ".stamp.json"
#: what a cell is called in the tables: its trio's MoE, its budget and the fraction of stories
CELL_KEYS = ("size", "epochs", "stories")
#: the tolerance on target tokens when a measured cell is matched to its prediction (the trainer's
#: last batch of an epoch may be short: a few windows in thousands)
TOKENS_RTOL = 0.01


def new_cells(preset, trios, seeds: Sequence[int], epoch: int) -> pd.DataFrame:
    """One row per cell of ``trios`` and role: ``size`` (the trio's MoE), ``epochs``, ``stories``,
    ``role``, ``model``, ``active``, ``total``, ``tokens`` (steps x targets per step), ``unique``
    (at most one pass of the cell's training windows), ``passes`` and ``n`` (the seeds it trains).
    Loads (or builds) each cell's tokenizer and token cache to count its windows."""
    from studylib.config import override
    from studylib.data.pipeline import shared_data
    from studylib.run.spec import cell_overrides, tokens_per_step

    rows = []
    for t in trios:
        for e, f in t.cells():
            cp = override(preset, cell_overrides(preset, t.moe, e, f, epoch))
            steps = cp.train.max_steps if cp.train.max_steps is not None else epoch
            per_step = tokens_per_step(cp)
            targets = len(shared_data(cp.data).train_idx) * (cp.data.context - 1)
            tokens = float(steps * per_step)
            for m in t.models:
                n = cp.model_config(m).num_params
                rows.append({"size": t.size, "epochs": e, "stories": f, "role": t.role(m), "model": m,
                             "active": int(n.active), "total": int(n.total), "tokens": tokens,
                             "unique": float(min(tokens, targets)), "passes": tokens / targets,
                             "n": len(t.seeds_of(seeds, (e, f)))})
    return pd.DataFrame(rows)


def inputs_hash(fit_runs: pd.DataFrame) -> str:
    """A hash of the fit set: every run's role, size, seed, N, D, U and loss (rounded to 1e-9)."""
    cols = [c for c in COLUMNS if c in fit_runs]
    rows = fit_runs[cols].sort_values(["role", "size", "seed", "tokens", "unique"]).round(9)
    return config_hash(rows.astype(str).to_numpy().tolist())


def _cell_rows(law, cell: pd.DataFrame, sd: float, rng, level: float) -> list:
    """The rows of one new cell (its three roles) predicted by ``law``: every quantity of
    :data:`~studylib.study.analysis.law.checks.QUANTITIES` with its interval (the law's seed
    replicates plus the noise of a mean of ``n`` runs at ``sd``)."""
    c = cell.set_index("role").reindex(list(ROLES))
    b = law.at(list(ROLES), c["active"], c["total"], c["tokens"], c["unique"])
    n = c["n"].to_numpy(float)
    sims = b.draws + rng.normal(0.0, 1.0, b.draws.shape) * sd / np.sqrt(n) if len(b.draws) else b.draws
    pq, sq = quantities(b.point), quantities(sims)
    d, u = float(c["tokens"].iloc[0]), float(c["unique"].iloc[0])
    base = {k: cell[k].iloc[0] for k in CELL_KEYS}
    base.update(tokens=d, unique=u, passes=float(cell["passes"].iloc[0]), moe_active=int(c.loc["moe", "active"]),
                n=int(n.min()), noise_sd=sd)
    rows = []
    for q in QUANTITIES:
        miss, held = rests_on(law, q, d > u)
        lo, hi = percentile_ci(sq[q][:, None], level) if len(sims) else ([math.nan], [math.nan])
        note = (f"{', '.join(miss)} not identified by the fit set" if miss else
                f"rests on {', '.join(held)} held on a bound" if held else
                "no interval" if not np.isfinite(lo[0]) else "")
        ok = not miss
        rows.append({**base, "quantity": q, "predicted": float(pq[q]) if ok else math.nan,
                     "pi_low": float(lo[0]) if ok else math.nan, "pi_high": float(hi[0]) if ok else math.nan,
                     "identified": ok, "note": note})
    return rows


def predict(fit_runs: pd.DataFrame, cells: pd.DataFrame, forms: Sequence[str] = FORMS, per_role_rstar: bool = False,
            n_boot: int = 200, level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Each of ``forms`` fitted on ``fit_runs`` (:data:`~studylib.study.analysis.law.fit.COLUMNS`,
    ``value`` in bits per byte) and its predictions at every cell of ``cells`` (:func:`new_cells`):
    one row per form, cell and quantity (``predicted``, ``pi_low``, ``pi_high``, ``identified``,
    ``note``), with the form's largest fitted MoE N_active (``fit_max_active``)."""
    df = runs_frame(fit_runs, "ladder predictions")
    every = pooled_sd(df)

    def sd_at(tokens: float) -> float:
        """The fit set's pooled within-cell sd at these tokens (all of it where none trained them):
        the spread depends on the budget, as in the held-out checks."""
        same = pooled_sd(df[np.isclose(df["tokens"], tokens, rtol=TOKENS_RTOL)])
        return every if math.isnan(same) else same

    out = []
    for form in forms:
        law = fit_law(df[list(COLUMNS)], form, per_role_rstar, n_boot=n_boot, n_boot_cell=0, level=level, seed=seed)
        rng = np.random.default_rng(seed)
        rows = [r for _, cell in cells.groupby(list(CELL_KEYS), sort=False)
                for r in _cell_rows(law, cell, sd_at(float(cell["tokens"].iloc[0])), rng, level)]
        out.append(pd.DataFrame(rows).assign(form=form, fit_max_active=law.largest_moe_active))
    t = pd.concat(out, ignore_index=True)
    return t[["form", *CELL_KEYS, "moe_active", "tokens", "unique", "passes", "n", "quantity", "predicted", "pi_low",
              "pi_high", "identified", "note", "fit_max_active", "noise_sd"]]


# the table on disk: stamped, and refused when written after the runs it predicts began
def stamp_path(out_dir: Path) -> Path:
    return Path(out_dir) / "tables" / f"{TABLE}{STAMP_SUFFIX}"


def table_path(out_dir: Path) -> Path:
    return Path(out_dir) / "tables" / f"{TABLE}.csv"


def write(out_dir: Path, table: pd.DataFrame, fit_hash: str, fit_runs: int, predicted_runs: Sequence[str],
          now: Optional[dt.datetime] = None) -> dict:
    """Write the table and its stamp (``written_at`` UTC, ``fit_hash``, the fit set's run count and
    the run folders it predicts); the stamp last, so a table without one was not finished."""
    now = now or dt.datetime.now(dt.timezone.utc)
    stamp = {"written_at": now.isoformat(), "fit_hash": fit_hash, "fit_runs": int(fit_runs),
             "predicted_runs": sorted(str(p) for p in predicted_runs), "table_sha": config_hash(table.to_csv(index=False))}
    (Path(out_dir) / "tables").mkdir(parents=True, exist_ok=True)
    write_atomic(table_path(out_dir), table.to_csv(index=False))
    write_atomic(stamp_path(out_dir), json.dumps(stamp, indent=1))
    return stamp


def read(out_dir: Path) -> tuple[Optional[pd.DataFrame], Optional[dict]]:
    """(the table, its stamp), or (None, None) when either is missing. A table that is not the one
    its stamp was written with is a ConfigError naming the file."""
    t, s = table_path(out_dir), stamp_path(out_dir)
    if not (t.is_file() and s.is_file()):
        return None, None
    try:
        stamp = json.loads(s.read_text())
    except ValueError:
        raise ConfigError(f"{s}: not a JSON stamp; delete it and {t.name} to predict again") from None
    text = t.read_text()
    table = pd.read_csv(io.StringIO(text))
    if config_hash(text) != stamp.get("table_sha"):
        raise ConfigError(f"{t}: not the table its stamp {s.name} was written with (edited after the runs it "
                          f"predicts?); delete both to predict again before those runs train")
    return table, stamp


def run_started(run_dir: Path) -> Optional[dt.datetime]:
    """When a run began: its ``config.yaml``'s modification time (written once, when it starts);
    None if it has not."""
    cfg = Path(run_dir) / "config.yaml"
    if not cfg.is_file():
        return None
    return dt.datetime.fromtimestamp(cfg.stat().st_mtime, dt.timezone.utc)


def check_written_before(stamp: Mapping, run_dirs: Sequence[Path]) -> None:
    """A ConfigError naming the first run of ``run_dirs`` that began before the stamp's
    ``written_at`` (the table would not be a prediction of it)."""
    written = dt.datetime.fromisoformat(stamp["written_at"])
    for d in run_dirs:
        began = run_started(d)
        if began is not None and began <= written:
            raise ConfigError(f"{TABLE}: written {written:%Y-%m-%d %H:%M:%S} UTC, after the run {d} it predicts "
                              f"began ({began:%Y-%m-%d %H:%M:%S} UTC): not a prediction; delete the run (or the "
                              f"table) and run the study again")


def begun(run_dirs: Sequence[Path]) -> list[Path]:
    """The runs of ``run_dirs`` that have begun (a prediction written now would not precede them)."""
    return [Path(d) for d in run_dirs if run_started(d) is not None]


# the scores, once the predicted runs are trained
def measured_cells(losses: pd.DataFrame, pred: pd.DataFrame) -> pd.DataFrame:
    """Per predicted cell (:data:`CELL_KEYS`) and quantity the measured value from notebook 09's
    per-run losses (``role``, ``size``, ``seed``, ``tokens``, ``stories``, ``value`` in bits per
    byte): each role's mean, the gaps and the position of the seed means (NaN where a role has no
    run, and p where the dense pair is not resolved apart: ``measured_note`` says so). A cell is matched on its MoE, stories and target tokens (within :data:`TOKENS_RTOL`)."""
    rows = []
    for key, cell in pred.groupby(list(CELL_KEYS), sort=False):
        size, _, stories = key
        d = float(cell["tokens"].iloc[0])
        m = losses[(losses["size"] == size) & np.isclose(losses["stories"], stories)
                   & np.isclose(losses["tokens"], d, rtol=TOKENS_RTOL)]
        means = m.groupby("role")["value"].mean().reindex(list(ROLES)).to_numpy()
        q = quantities(means)
        runs = m.groupby("role").size().reindex(list(ROLES))
        full = runs.notna().all()
        pos = cell_position(m) if full else {"position_defined": False, "position_reason": "a role has no run"}
        for name in QUANTITIES:
            undefined = name == "position" and not pos["position_defined"]  # the dense pair not apart: no p
            rows.append(dict(zip(CELL_KEYS, key), quantity=name, measured=math.nan if undefined else float(q[name]),
                             measured_n=int(runs.min()) if full else 0,
                             measured_note=pos["position_reason"] if undefined else ""))
    return pd.DataFrame(rows)


def score(pred: pd.DataFrame, losses: pd.DataFrame) -> pd.DataFrame:
    """``pred`` (:func:`predict`) with the measured values (:func:`measured_cells`), ``inside`` its
    interval, ``error`` (measured − predicted; bits per byte for losses and gaps) and ``checked``
    (identified, with an interval and a measurement)."""
    meas = measured_cells(losses, pred)
    t = pred.merge(meas, on=[*CELL_KEYS, "quantity"], how="left")
    t["checked"] = t["identified"].astype(bool) & t["pi_low"].notna() & t["measured"].notna()
    t["inside"] = t["checked"] & (t["pi_low"] <= t["measured"]) & (t["measured"] <= t["pi_high"])
    t["error"] = t["measured"] - t["predicted"]
    return t


def form_verdicts(scores: pd.DataFrame) -> pd.DataFrame:
    """Per form: checked quantities, inside, share, passed (share >= :data:`PASS_SHARE`), the rms
    error of the checked losses (bits per byte) and of p."""
    rows = []
    for form, t in scores.groupby("form", sort=False):
        c = t[t["checked"]]
        loss = c[c["quantity"].str.startswith("loss")]
        pos = c[c["quantity"] == "position"]
        k, n = int(c["inside"].sum()), len(c)
        rows.append({"form": form, "checked": n, "inside": k, "share": k / n if n else math.nan,
                     "passed": bool(n and k / n >= PASS_SHARE),
                     "loss_rmse_bpb": float(np.sqrt((loss["error"] ** 2).mean())) if len(loss) else math.nan,
                     "position_rmse": float(np.sqrt((pos["error"] ** 2).mean())) if len(pos) else math.nan,
                     "fit_max_active": float(t["fit_max_active"].iloc[0])})
    return pd.DataFrame(rows)


__all__ = ["FORMS", "TABLE", "CELL_KEYS", "new_cells", "inputs_hash", "predict", "write", "read", "run_started",
           "check_written_before", "begun", "scored", "measured_cells", "score", "form_verdicts", "table_path",
           "stamp_path"]


def carry(verdicts: Optional[pd.DataFrame], choice: Optional[pd.DataFrame], law_runs: pd.DataFrame, n_boot: int = 200,
          seed: int = 0) -> pd.DataFrame:
    """The law form the answer carries to the paper's point, chosen only among the forms whose
    pre-run predictions passed (:func:`form_verdicts`): the one-lambda form unless another passed
    form's left-out error on every map cell (notebook 09's ``choice`` table, a shared R*) is lower by
    more than the choice's tie, refitted on every run (``law_runs``) and read at the paper's point
    (:func:`~studylib.study.analysis.law.checks.paper_point`). One row per quantity of that table with
    ``form``; where no form passed, one row saying the law is not identified beyond the fit set's sizes."""
    from studylib.study.analysis.law.checks import TIE, paper_point

    scored = verdicts is not None and len(verdicts) > 0
    passed = list(verdicts.loc[verdicts["passed"].astype(bool), "form"]) if scored else []
    if not passed:
        why = (f"not identified beyond {float(verdicts['fit_max_active'].max()):,.0f} active parameters: no form's "
               f"pre-run predictions passed ({PASS_SHARE:.0%} of its quantities inside)" if scored else
               "not identified beyond the fit set's sizes: no pre-run predictions were scored")
        return pd.DataFrame([{"form": "", "quantity": "position", "estimate": math.nan, "ci_low": math.nan,
                              "ci_high": math.nan, "identified": False, "reason": why}])
    form = "lambda" if "lambda" in passed else passed[0]
    if choice is not None and len(choice):
        mse = choice[~choice["per_role_rstar"].astype(bool)].set_index("form")["loo_mse"]
        for f in passed:
            if f in mse and form in mse and mse[f] < (1 - TIE) * mse[form]:
                form = f
    law = fit_law(runs_frame(law_runs, "ladder carried law")[list(COLUMNS)], form, False, n_boot=n_boot, seed=seed)
    return paper_point(law).assign(form=form, passed=", ".join(passed))


def scored(out_dir: Path, predicted_dirs: Sequence[Path], losses: pd.DataFrame) -> tuple:
    """(stamp, :func:`score`, :func:`form_verdicts`) of the table under ``out_dir``, refused when it
    was written after a run of ``predicted_dirs`` began (:func:`check_written_before`); (None, None,
    None) where no table was written (the predicted runs began first, or the stage did not run)."""
    table, stamp = read(out_dir)
    if table is None:
        return None, None, None
    check_written_before(stamp, predicted_dirs)
    scores = score(table, losses)
    return stamp, scores, form_verdicts(scores)
