"""What rests on a bound carries its value and no interval: a parameter the fit holds on its bound
(``JointLaw.on_bound``: every replicate holds it there too, so the width left is the other
parameters', not the law's), and a size form's lambda(N) clipped to [0, 1] at the paper's N
(:func:`paper_clip`: a clipped value is a bound, not a measurement). :mod:`.checks` says so in its
predictions' reasons."""
from __future__ import annotations

import math

from studylib.study.analysis.bootstrap import Bootstrap
from studylib.study.analysis.paper import PAPER_ACTIVE_PARAMS
from studylib.study.analysis.law.fit import JointLaw
from studylib.study.analysis.law.form import lambda_at

#: how a prediction resting on a bound ends its reason, instead of an interval
ON_BOUND = ": on the bound, no interval"
#: the paper-point quantities that rest on the MoE's worth there (the ordering through loss_moe)
ON_WORTH = ("loss_moe", "gap_active", "gap_total", "position")


def paper_lambda(law: JointLaw) -> Bootstrap:
    """The MoE's lambda at the paper's N_active with its seed replicates (a size form's kept in [0, 1])."""
    return law.seed.map(lambda t: lambda_at(t, law.form, PAPER_ACTIVE_PARAMS))


def paper_clip(law: JointLaw) -> tuple[str, str]:
    """Where a size form's lambda(N), its lambda_0 and lambda_1 identified, meets its clip to [0, 1]
    at the paper's N: (why what rests on it is not identified: its interval covers all of [0, 1];
    else what holds it on a bound: the estimate, or an end of its interval, at 0 or 1); ("", "")
    for any other law. A clipped value is a bound, not a measurement: it carries no interval."""
    if "lambda_1" not in law.names or not all(law.coefs[k].identified for k in (law.mix, "lambda_1")):
        return "", ""
    b, c1 = paper_lambda(law), law.coefs["lambda_1"]
    lam, ((lo,), (hi,)) = float(b.point[0]), b.interval()
    if lo <= 1e-9 and hi >= 1 - 1e-9:
        return (f"not identified: lambda at the paper's N has the 95% interval [{lo:.2f}, {hi:.2f}], all of [0, 1] "
                f"(lambda_1 = {c1.estimate:.3f} [{c1.ci_low:.3f}, {c1.ci_high:.3f}] per decade, carried "
                f"{math.log10(PAPER_ACTIVE_PARAMS / law.largest_moe_active):.1f} decades)"), ""
    at = [v for v in (0.0, 1.0) if lam == v or min(abs(lo - v), abs(hi - v)) <= 1e-9]
    if not at:
        return "", ""
    raw = float(lambda_at(law.theta, law.form, PAPER_ACTIVE_PARAMS, clip=False)[0])
    reps = int((b.draws == at[0]).sum())
    how = ([f"lambda_0 + lambda_1 log10(N / N_ref) = {raw:.2f} there"] * (lam == at[0])
           + [f"in {reps} of {len(b.draws)} seed replicates"] * bool(reps))
    return "", f"lambda(N) at the paper's N clipped to its bound {at[0]:g} ({'; '.join(how)})"


def bound_note(law: JointLaw, names) -> str:
    """"lambda held at its bound 0 by the fit" for ``names`` in ``law.on_bound`` ('' for none)."""
    return "; ".join(f"{k} held at its bound {law.on_bound[k]:g} by the fit" for k in names)


__all__ = ["ON_BOUND", "ON_WORTH", "paper_lambda", "paper_clip", "bound_note"]
