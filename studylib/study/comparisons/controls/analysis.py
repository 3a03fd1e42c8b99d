"""Notebook 13's tables and words: per cell, each model's position p between the trio's dense
matches (:func:`studylib.study.analysis.position.position_row`: 0 at the active match, 1 at the
total match, bootstrap CI over seeds), each control's paired loss gap to the reference MoE (one
family per cell, Holm over its controls, TOST within the margin), the one-expert MoE against its
dense twin (TOST within the margin: "equivalent", or the machinery's cost), and the sentences
worded from them. Losses: each run's best validation loss (nats)."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from studylib.study.analysis.frames import seed_pairs
from studylib.study.analysis.position import p_text, position_row, position_text
from studylib.study.analysis.tables import comparison_table, concat_families
from studylib.study.analysis.text import comparison_sentences
from studylib.study.comparisons.controls.knobs import ControlCell
from studylib.study.comparisons.controls.tables import GAPS, POSITIONS, TWIN

VALUE = "best_val_loss"
#: how a role reads in the tables
ROLE_LABELS = {"moe": "learned router (reference)", "hash": "hash router", "frozen": "frozen router",
               "one_expert": "one-expert MoE", "dense_twin": "dense twin"}


def _roles(cell: ControlCell) -> list[tuple[str, str]]:
    """(role, model): the reference MoE, then the controls."""
    return [("moe", cell.moe), *cell.controls]


def positions(summaries: pd.DataFrame, cell: ControlCell, n_boot: int = 2000) -> pd.DataFrame:
    """One row per model of the cell other than the dense matches: its position p with its 95%
    bootstrap CI over the seeds all three (the two matches and the model) have, and why there is
    none when the matches are not resolved apart."""
    da, _, dt = cell.trio
    rows = []
    for role, m in _roles(cell):
        wide = seed_pairs(summaries, da, dt, VALUE).join(seed_pairs(summaries, m, m, VALUE), how="inner")
        ga, gt = (wide[da] - wide[m]).to_numpy(), (wide[dt] - wide[m]).to_numpy()
        rows.append({"cell": cell.name, "role": ROLE_LABELS[role], "model": m, "n": len(wide),
                     "loss": float(wide[m].mean()), **position_row(ga, gt, n_boot=n_boot)})
    return pd.DataFrame(rows)


def gaps(summaries: pd.DataFrame, cell: ControlCell, margin: float) -> pd.DataFrame:
    """Each control − the reference MoE (paired by seed; > 0: the reference is better), one family
    for the cell: Holm over its controls, TOST within ``±margin``."""
    pairs = {f"{m} − {cell.moe}": (m, cell.moe) for _, m in cell.controls}
    return comparison_table(summaries, pairs, VALUE, margin, family=f"13 controls − the reference MoE ({cell.name})")


def twin(summaries: pd.DataFrame, cell: ControlCell, margin: float) -> pd.DataFrame:
    """The one-expert MoE − its dense twin, a family of its own (empty when the cell lacks one)."""
    one, dense = cell.role("one_expert"), cell.role("dense_twin")
    if one is None or dense is None:
        return pd.DataFrame()
    return comparison_table(summaries, {f"{one} − {dense}": (one, dense)}, VALUE, margin,
                            family=f"13 one-expert MoE − its dense twin ({cell.name})")


def cell_tables(summaries: pd.DataFrame, cells: Sequence[ControlCell], margin: float) -> dict:
    """Every cell's tables, joined: ``positions``, ``gaps`` (family table ``controls_gaps``) and
    ``twin`` (``controls_twin``)."""
    pos = pd.concat([positions(s, c) for s, c in zip(summaries, cells)], ignore_index=True)
    g = concat_families([gaps(s, c, margin) for s, c in zip(summaries, cells)])
    tw = [twin(s, c, margin) for s, c in zip(summaries, cells)]
    tw = [t for t in tw if len(t)]
    return {"positions": pos, "gaps": g, "twin": concat_families(tw) if tw else pd.DataFrame()}


def control_table(pos: pd.DataFrame, gap: pd.DataFrame) -> pd.DataFrame:
    """The headline table: per cell and model, its loss, p [CI] and its gap to the reference MoE
    with the Holm-adjusted p and the verdict."""
    t = pos.copy()
    t["p [95% CI]"] = [position_text(r, why=True) for _, r in t.iterrows()]
    by = {(r["a"], r["family"]): r for _, r in gap.iterrows()}
    cols = {"gap to the reference": [], "p_holm": [], "verdict": []}
    for r in t.itertuples():
        row = next((v for (a, fam), v in by.items() if a == r.model and r.cell in fam), None)
        cols["gap to the reference"].append(row["gap"] if row is not None else "")
        cols["p_holm"].append(row["p_holm"] if row is not None else np.nan)
        cols["verdict"].append(row["verdict"] if row is not None else "")
    for k, v in cols.items():
        t[k] = v
    return t[["cell", "role", "model", "n", "loss", "p [95% CI]", "gap to the reference", "p_holm", "verdict"]]


def learns_to_route(gap: pd.DataFrame, cell: ControlCell) -> str:
    """Whether the learned router is resolvably better than both fixed routers (hash, frozen) in
    ``cell`` after Holm, in one sentence."""
    fixed = [m for r, m in cell.controls if r in ("hash", "frozen")]
    if not fixed:
        return ""
    rows = gap[gap["family"].str.contains(cell.name, regex=False) & gap["a"].isin(fixed)]
    better = [r["a"] for _, r in rows.iterrows() if r["resolved"] and r["mean"] > 0]
    if len(better) == len(fixed):
        return (f"At {cell.name} the learned router is resolvably better than "
                f"{' and '.join(f'`{m}`' for m in fixed)} (Holm over the cell's controls): the MoE learns to route.")
    missing = [m for m in fixed if m not in better]
    return (f"At {cell.name} the learned router is not resolvably better than "
            f"{' and '.join(f'`{m}`' for m in missing)} (Holm over the cell's controls): at this size and budget the "
            f"tiny MoE is not shown to learn to route.")


def sentences(tables: dict, cells: Sequence[ControlCell]) -> str:
    """The outcome, per cell: the learned router against the fixed ones, every control's gap in
    the family's words, and the one-expert twin's verdict."""
    out = []
    for c in cells:
        g = tables["gaps"][tables["gaps"]["family"].str.contains(c.name, regex=False)]
        out.append(learns_to_route(tables["gaps"], c))
        if len(g):
            out.append(comparison_sentences(g))
        tw = tables["twin"]
        if len(tw):
            t = tw[tw["family"].str.contains(c.name, regex=False)]
            if len(t):
                out.append("One expert against its dense twin: " + comparison_sentences(t, lead=False))
    return " ".join(s for s in out if s)


def recipe_runs(runs, first: int) -> pd.DataFrame:
    """The recipe's runs (grids ``first`` onward of :class:`~studylib.study.comparisons.base.Runs`)
    in one frame with their ``lr``."""
    frames = [runs.frame(i).assign(lr=float(g.overrides["train.lr"])) for i, g in enumerate(runs.grids) if i >= first]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def recipe_tables(recipe: pd.DataFrame, base: pd.DataFrame, cell: ControlCell, n_boot: int = 2000) -> dict:
    """The recipe at ``cell``: ``lrs`` (per model and lr: n, mean, sample std of the loss; ``best``:
    the lr of the lowest mean, chosen on these seeds) and ``position`` (the MoE's p with each model
    at its best lr, beside its p under the preset's recipe from ``base``, the cell's own runs)."""
    g = recipe.groupby(["model", "lr"], sort=True)[VALUE]
    lrs = pd.DataFrame({"n": g.size(), "mean": g.mean(), "std": g.std(ddof=1)}).reset_index()
    best = lrs.loc[lrs.groupby("model")["mean"].idxmin()].set_index("model")["lr"]
    lrs["best"] = [best[m] == lr for m, lr in zip(lrs["model"], lrs["lr"])]
    at_best = recipe[[best.get(m) == lr for m, lr in zip(recipe["model"], recipe["lr"])]]
    rows = []
    for label, frame in (("the preset's recipe", base), ("the MoE's recipe (each model at its best lr)", at_best)):
        da, moe, dt = cell.trio
        wide = frame.pivot_table(index="seed", columns="model", values=VALUE)[[da, moe, dt]].dropna()
        ga, gt = (wide[da] - wide[moe]).to_numpy(), (wide[dt] - wide[moe]).to_numpy()
        rows.append({"recipe": label, "n": len(wide), "moe_loss": float(wide[moe].mean()),
                     **{f"lr_{r}": (float(best[m]) if frame is at_best else math.nan) for r, m in zip(("dense_active", "moe", "dense_total"), cell.trio)},
                     **position_row(ga, gt, n_boot=n_boot)})
    return {"lrs": lrs, "position": pd.DataFrame(rows)}


def recipe_sentence(pos: pd.DataFrame, n_lrs: int, batch_scale: int, router: float) -> str:
    """The recipe's outcome in one sentence, from :func:`recipe_tables`' ``position``."""
    base, new = pos.iloc[0], pos.iloc[1]
    p = lambda r: position_text(r, why=True)  # noqa: E731
    return (f"With the MoE's recipe ({batch_scale}x fewer, {batch_scale}x larger steps, each model at the best of "
            f"{n_lrs} learning rates, the router at {router:g}x the lr) the MoE's position is {p(new)} against "
            f"{p(base)} under the preset's recipe (n={int(new.n)} seeds; the best lr is chosen on the same seeds, "
            f"which favours the recipe).")


__all__ = ["lead_sentence", "recipe_runs", "recipe_sentence", "recipe_tables", "ROLE_LABELS", "cell_tables", "control_table", "gaps", "learns_to_route", "position_intervals", "positions", "sentences",
           "twin"]


def position_intervals(pos: pd.DataFrame) -> pd.DataFrame:
    """The positions as :func:`studylib.study.analysis.plots.intervals` draws them (one row per
    cell and model: p with its CI; filled where it is defined), rows without a p left out."""
    p = pos[pos["position_defined"]]
    return pd.DataFrame({"mean": p["position"].to_numpy(), "ci_low": p["position_low"].to_numpy(),
                         "ci_high": p["position_high"].to_numpy(), "resolved": True},
                        index=[f"{c}: {m}" for c, m in zip(p["cell"], p["model"])])


def _against(r: pd.Series, name: str, other: str) -> str:
    """How control ``name`` stands against ``other`` from its family row (``a`` − ``b``; > 0: ``b``
    better): beats it / trails it by the gap with its 95% CI, equivalent within the margin, or not
    resolved, in plain words (the interval is in the table below the first screen)."""
    v, m, lo, hi = r["verdict"], float(r["mean"]), float(r["ci_low"]), float(r["ci_high"])
    if v == "A better":
        return f"{name} beats {other} by {-m:.3f} [{-hi:.3f}, {-lo:.3f}] nats"
    if v == "B better":
        return f"{name} trails {other} by {m:.3f} [{lo:.3f}, {hi:.3f}] nats"
    if v == "equivalent":
        return f"{name} is as good as {other} (within ±{float(r['margin']):g} nats)"
    return f"{name} is not told apart from {other}"


def _missing(here: pd.DataFrame, fam: pd.DataFrame, twin: Optional[pd.DataFrame], cell: str) -> str:
    """What the first screen's sentence reads of one cell (``here``: its positions, ``fam``: its
    gaps) that the tables lack, by table ("controls_gaps.csv lacks the frozen router `m`"), or "":
    the reference MoE's position and that of every control with a gap (the cell has at least one
    control), the hash and frozen routers' gaps, the one-expert MoE against its twin."""
    role = dict(zip(here["model"], here["role"]))
    by_role = {r: m for m, r in role.items()}
    lack = {POSITIONS: [] if ROLE_LABELS["moe"] in by_role else ["the reference MoE"], GAPS: [], TWIN: []}
    lack[POSITIONS] += [f"`{a}`" for a in fam["a"] if a not in role]
    if not len(fam) and set(by_role) <= {ROLE_LABELS["moe"]}:
        lack[POSITIONS].append("the cell's controls")
    lack[GAPS] = [f"the {r} `{by_role[r]}`" for r in (ROLE_LABELS["hash"], ROLE_LABELS["frozen"])
                  if r in by_role and by_role[r] not in set(fam["a"])]
    one, dense = by_role.get(ROLE_LABELS["one_expert"]), by_role.get(ROLE_LABELS["dense_twin"])
    if one and dense and (twin is None or not len(twin) or not twin["family"].str.contains(cell, regex=False).any()):
        lack[TWIN].append(f"`{one}` − `{dense}`")
    listed = lambda w: ", ".join(w[:-1]) + " and " + w[-1] if len(w) > 1 else w[0]  # noqa: E731
    return "; ".join(f"{name}.csv lacks {listed(what)}" for name, what in lack.items() if what)


def _first_cell(pos: pd.DataFrame, gap: pd.DataFrame, twin: Optional[pd.DataFrame], hash_name: str,
                learned: str) -> tuple:
    """(the first cell, its positions, its gaps' family, [the hash and frozen routers against the
    learned one, worded by :func:`_against`], the one expert's row against its twin or None) of
    ``pos`` (not empty)."""
    cell = pos["cell"].iloc[0]
    here = pos[pos["cell"] == cell]
    fam = gap[gap["family"].str.contains(cell, regex=False)]
    role = dict(zip(here["model"], here["role"]))
    routers = []
    for label, name in ((ROLE_LABELS["hash"], hash_name), (ROLE_LABELS["frozen"], "one frozen at its start")):
        rows = fam[fam["a"].map(role) == label]
        if len(rows):
            routers.append(_against(rows.iloc[0], name, learned if not routers else "it"))
    t = twin[twin["family"].str.contains(cell, regex=False)] if twin is not None and len(twin) else None
    return cell, here, fam, routers, t.iloc[0] if t is not None and len(t) else None


def lead_sentence(pos: pd.DataFrame, gap: pd.DataFrame, twin: Optional[pd.DataFrame],
                  trend: Optional[pd.DataFrame]) -> str:
    """The first screen's sentence on the controls, from notebook 13's tables: at the first cell
    (``pos``: ``controls_positions``), the hash and frozen routers against the learned one (Holm
    over the cell's controls, ``gap``: ``controls_gaps``), the one-expert MoE against its dense twin
    (``twin``: ``controls_twin``), and Clark et al.'s S-Base trend (E = 4) read at this MoE's size
    (``trend``: ``clark_trend``) against the MoE's own p. A row it reads that the tables lack is
    named (:func:`_missing`); with none of the controls to word (or no row at all), only that. ""
    when the first cell has no control the sentence words (a hash or frozen router, one expert and
    its twin)."""
    if not len(pos):
        return f"Controls: not stated (incomplete tables, run notebook 13 again: {POSITIONS}.csv has no rows)."
    cell, here, fam, parts, one = _first_cell(pos, gap, twin, "a router hashing the token id", "the learned one")
    parts += [_against(one, "one expert", "its dense twin")] if one is not None else []
    at = "that budget" if cell.endswith(" @ 1 epochs") else cell  # the headline's budget, the sentence before
    lack = _missing(here, fam, twin, cell)
    lack = lack and f"incomplete tables, run notebook 13 again: {lack}"
    if not parts:
        return f"Controls at {at}: not stated ({lack})." if lack else ""
    said = (f"Controls at {at}{f' ({lack})' if lack else ''}: "
            + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]))
    ref = here[here["role"] == ROLE_LABELS["moe"]]
    if trend is None or not len(ref) or not bool(ref["position_defined"].iloc[0]):
        return said + "."
    moe, p = ref["model"].iloc[0], float(ref["position"].iloc[0])
    t = trend[(trend["router"] == "S-Base") & (trend["experts"] == 4)
              & trend["size"].str.startswith(f"this study, {moe} ")]
    if not len(t):
        return said + "."
    t = t.iloc[0]
    where = "above" if t["ci_lo"] > p else "below" if t["ci_hi"] < p else "around"
    return (said + f"; Clark et al.'s learned routers, extrapolated {t['decades_out']:.1f} decades down, trend to "
            f"p = {p_text(t['p'], t['ci_lo'], t['ci_hi'])} here, {where} the MoE's {p_text(p)}.")


def lead_sentences(pos: pd.DataFrame, gap: pd.DataFrame, twin: Optional[pd.DataFrame]) -> list[str]:
    """The first screen's plain sentences on the controls at the first cell (the full sentence,
    with Clark et al.'s trend and what the tables lack, is :func:`lead_sentence`, below the first
    screen): the hash and frozen routers against the learned one, then one expert against its dense
    twin; [] when the cell has none of them."""
    if not len(pos):
        return ["Controls: not stated (incomplete tables; see below)."]
    _, _, _, routers, one = _first_cell(pos, gap, twin, "A router hashing the token id", "the learned router")
    out = [", and ".join(routers) + "."] if routers else []
    out += [_against(one, "One expert", "its dense twin") + "."] if one is not None else []
    return out
