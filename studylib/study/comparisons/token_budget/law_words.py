"""The joint law (:mod:`.law`, :mod:`.law_checks`) as notebook 09 saves and words it: its tables
(:func:`law_table`: every parameter with both intervals; :func:`~.law_checks.choose`'s errors;
:func:`~.law_checks.held_out`'s points; :func:`~.law_checks.paper_point`) and the sentences the
notebook prints and the report rebuilds from those CSVs alone (:func:`law_sentences`,
:func:`paper_sentences`)."""
from __future__ import annotations

import pandas as pd

from studylib.study.analysis.paper import PAPER_HEADLINE_TOKENS
from studylib.study.comparisons.token_budget.knobs import ROLES
from studylib.study.comparisons.token_budget.law import JointLaw
from studylib.study.comparisons.token_budget.law_checks import choice_sentence, held_out_verdict


def law_table(law: JointLaw) -> pd.DataFrame:
    """One row per parameter of ``law`` (:meth:`~.law.JointLaw.table`: the estimate, the seed and
    the cell bootstrap intervals, identified or the reason), with the form, R* shared or per role,
    and the map cells, runs and sizes it was fitted on."""
    t = law.table().rename_axis("parameter").reset_index()
    return t.assign(form=law.form, per_role_rstar=law.per_role_rstar, cells=law.n_cells, runs=law.n_obs,
                    sizes=law.n_sizes, level=law.level)


def _num(r, f: str = ".3g") -> str:
    if not r["identified"]:
        return f"{r['parameter']} not identified ({r['reason']})"
    s = f"{r['parameter']} = {r['estimate']:{f}}"
    if r["ci_low"] == r["ci_low"]:
        s += f" [{r['ci_low']:{f}}, {r['ci_high']:{f}}]"
        if r["cell_ci_low"] == r["cell_ci_low"]:
            s += f" (cells resampled: [{r['cell_ci_low']:{f}}, {r['cell_ci_high']:{f}}])"
    elif r["reason"]:
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


def _ci(r, f: str) -> str:
    return f"{r['estimate']:{f}}" + ("" if r["ci_low"] != r["ci_low"] else f" [{r['ci_low']:{f}}, {r['ci_high']:{f}}]")


def paper_sentences(table: pd.DataFrame) -> list:
    """At most three sentences from :func:`~.law_checks.paper_point`'s table: the position beside
    the paper's, labelled as an extrapolation; lambda (or m), the gaps and the losses; the ordering."""
    t = table.set_index("quantity")
    where = (f"at the paper's N and {PAPER_HEADLINE_TOKENS / 1e6:.1f}M fresh tokens (an extrapolation, "
             f"{t.loc['decades', 'note']})")
    p, mix = t.loc["position"], t.index[0]
    if not p["identified"]:
        return [f"The joint law is not carried to the paper's point {where}: {p['reason']}."]
    inside = (f", {'inside' if p['paper_inside'] else 'outside'} the interval" if p["ci_low"] == p["ci_low"] else
              " (the law's p carries no interval)")
    out = [f"Extrapolated {where}, the joint law places the MoE at p = {_ci(p, '.2f')} of the way from its active "
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
        out.append(f"Predicted ordering {o['note']}" + (f" ({o['reason']})" if o["reason"] else "")
                   + f"; the paper measured {o['paper_note']}.")
    return out


def law_sentences(law: pd.DataFrame, choice: pd.DataFrame, held: pd.DataFrame, paper: pd.DataFrame) -> list[str]:
    """The joint law in words, from notebook 09's four tables: the form chosen, the parameters, the
    held-out-size and held-out-budget checks, and the paper's point (:func:`paper_sentences`)."""
    out = [choice_sentence(choice), parameter_sentence(law)]
    level = float(law["level"].iloc[0])
    checks = [held_out_verdict(held[held["by"] == by], by, level) for by in ("size", "budget")
              if len(held) and (held["by"] == by).any()]
    if checks:
        out.append("Refitted without what it predicts, " + "; ".join(checks) + ".")
    return out + paper_sentences(paper)


__all__ = ["law_table", "parameter_sentence", "paper_sentences", "law_sentences"]
