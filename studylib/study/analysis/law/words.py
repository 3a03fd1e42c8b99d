"""The law's tables and words: :func:`law_table` (every parameter with both intervals) and the
sentences notebook 09 prints and the report rebuilds from its CSVs alone: the joint law
(:func:`law_sentences`, :func:`paper_sentences`), the per-role laws (:func:`role_law_sentences`,
:func:`extrapolation_sentences`)."""
from __future__ import annotations

import pandas as pd

from studylib.study.analysis.paper import PAPER_HEADLINE_TOKENS
from studylib.study.analysis.position import ROLES, p_text
from studylib.study.analysis.text import ci_text
from studylib.study.analysis.law.fit import JointLaw
from studylib.study.analysis.law.checks import RESIDUAL_LIMIT, choice_sentence, held_out_verdict


def law_table(law: JointLaw) -> pd.DataFrame:
    """One row per parameter of ``law`` (:meth:`~.fit.JointLaw.table`: the estimate, the seed and
    the cell bootstrap intervals, identified or the reason), with the form, R* shared or per role,
    and the map cells, runs and sizes it was fitted on."""
    t = law.table().rename_axis("parameter").reset_index()
    return t.assign(form=law.form, per_role_rstar=law.per_role_rstar, cells=law.n_cells, runs=law.n_obs,
                    sizes=law.n_sizes, level=law.level)


def _ci(r, f: str) -> str:
    return ci_text(r["estimate"], r["ci_low"], r["ci_high"], f)


def _num(r, f: str = ".3g") -> str:
    if not r["identified"]:
        return f"{r['parameter']} not identified ({r['reason']})"
    s = f"{r['parameter']} = {_ci(r, f)}"
    if r["ci_low"] == r["ci_low"] and r["cell_ci_low"] == r["cell_ci_low"]:
        s += f" (cells resampled: [{r['cell_ci_low']:{f}}, {r['cell_ci_high']:{f}}])"
    elif r["ci_low"] != r["ci_low"] and r["reason"]:
        s += f" ({r['reason']})"
    return s


def parameter_sentence(table: pd.DataFrame) -> str:
    """The joint law's parameters, the MoE's mixing parameter first."""
    first = table.iloc[0]
    mix = table[table["parameter"].isin(["lambda", "m"])]
    rest = table[~table["parameter"].isin(["lambda", "m"])]
    rs = "one R* per role" if bool(first["per_role_rstar"]) else "R* shared by the roles"
    return (f"One law for the three models, L = E + A / N_eff^alpha + B / D_eff^beta in bits per byte "
            f"({first['form']} form, {rs}; {int(first['cells'])} map cells, {int(first['runs'])} runs, "
            f"{int(first['sizes'])} sizes; 95% intervals, seeds resampled within cells): "
            + "; ".join(_num(r) for _, r in pd.concat([mix, rest]).iterrows()) + ".")


def paper_sentences(table: pd.DataFrame) -> list:
    """At most three sentences from :func:`~.checks.paper_point`'s table: the position beside
    the paper's, labelled as an extrapolation; lambda (or m), the gaps and the losses; the ordering."""
    t = table.set_index("quantity")
    where = (f"at the paper's N and {PAPER_HEADLINE_TOKENS / 1e6:.1f}M fresh tokens (an extrapolation, "
             f"{t.loc['decades', 'note']})")
    p, mix = t.loc["position"], t.index[0]
    if not p["identified"]:
        return [f"The joint law is not carried to the paper's point {where}: {p['reason']}."]
    inside = (f", {'inside' if p['paper_inside'] in (True, 'True') else 'outside'} the interval"
              if p["ci_low"] == p["ci_low"] else f" ({p['reason']})" if p["reason"] else
              " (the law's p carries no interval)")
    at = p_text(p["estimate"], p["ci_low"], p["ci_high"])
    out = [f"Extrapolated {where}, the joint law places the MoE at p = {at} of the way from its active "
           f"match (0) to its total match (1); the paper measured {p['paper']:.2f}{inside}."]
    m = t.loc[mix]
    s = (f"{mix} = {_ci(m, '.3f')}" if m["identified"] else
         f"{mix} = {m['estimate']:g}, held at its bound by the fit (no interval)" if m["estimate"] == m["estimate"]
         else f"{mix} not identified")
    if t.loc["gap_active", "identified"]:
        s += (f"; gap_active {_ci(t.loc['gap_active'], '+.3f')} and gap_total {_ci(t.loc['gap_total'], '+.3f')} "
              f"bits per byte (> 0: the MoE better)")
    if t.loc["loss_moe", "identified"]:
        s += "; losses " + ", ".join(f"{r} {t.loc[f'loss_{r}', 'estimate']:.3f}" for r in ROLES) + " bits per byte"
    out.append(s + ".")
    o = t.loc["ordering"]
    if o["identified"]:
        out.append(f"Predicted ordering {o['note']}" + (f" ({o['reason']})" if isinstance(o["reason"], str)
                                                        and o["reason"] else "")
                   + f"; the paper measured {o['paper_note']}.")
    return out


def law_sentences(law: pd.DataFrame, choice: pd.DataFrame, held: pd.DataFrame, paper: pd.DataFrame,
                  runs: pd.DataFrame | None = None) -> list[str]:
    """The joint law in words, from notebook 09's tables: the form chosen, the parameters, the
    held-out-size and held-out-budget checks, the paper's point (:func:`paper_sentences`) and, given
    ``runs`` (:func:`~.checks.influence`), the runs that move it (:func:`influence_sentence`)."""
    out = [choice_sentence(choice), parameter_sentence(law)]
    level = float(law["level"].iloc[0])
    checks = [held_out_verdict(held[held["by"] == by], by, level) for by in ("size", "budget")
              if len(held) and (held["by"] == by).any()]
    if checks:
        out.append("Refitted without what it predicts, " + "; ".join(checks) + ".")
    return out + paper_sentences(paper) + ([influence_sentence(runs, paper)] if runs is not None and len(runs) else [])


def influence_sentence(runs: pd.DataFrame, paper: pd.DataFrame) -> str:
    """:func:`~.checks.influence`'s table in one sentence: the runs beyond the limit by name (or
    the largest residual), and whether leaving one run out changes the answer at the paper's point:
    the refitted position outside the full fit's interval (or, without one, by how much it moves)."""
    p = paper.set_index("quantity").loc["position"]
    name = lambda r: (f"{r['role']} of size {r['size']} seed {int(r['seed'])} at {r['tokens']:.3g} tokens"  # noqa: E731
                      + (f" from {r['stories']:g} of the stories" if r.get("stories", 1.0) != 1.0 else ""))
    far = runs[runs["beyond"].astype(bool)]
    moved = runs.loc[runs["position_change"].abs().idxmax()] if runs["position_change"].notna().any() else None
    if len(far):
        s = (f"{len(far)} of {len(runs)} runs lie beyond {RESIDUAL_LIMIT:g} robust sd of the joint law: "
             + "; ".join(f"{name(r)} ({r['std_residual']:+.1f} sd)" for _, r in far.iterrows()))
    else:
        top = runs.loc[runs["std_residual"].abs().idxmax()] if runs["std_residual"].notna().any() else None
        s = (f"No run lies beyond {RESIDUAL_LIMIT:g} robust sd of the joint law"
             + (f" (the largest: {name(top)}, {top['std_residual']:+.1f} sd)" if top is not None else ""))
    if moved is None:
        return s + "."
    p1 = moved["position_without"]
    verdict = (("outside" if not p["ci_low"] <= p1 <= p["ci_high"] else "inside") + " the full fit's interval, so "
               + ("it changes the answer" if not p["ci_low"] <= p1 <= p["ci_high"] else "the answer stands")
               if p["ci_low"] == p["ci_low"] else "the full fit's position has no interval to judge it by")
    return (s + f"; left out one at a time, the run that moves the paper-point position most ({name(moved)}) moves it "
            f"from {p['estimate']:.3f} to {p1:.3f} ({p1 - p['estimate']:+.2g}), {verdict}.")




__all__ = ["law_table", "parameter_sentence", "paper_sentences", "law_sentences", "influence_sentence"]
