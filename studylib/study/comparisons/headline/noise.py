"""Where the seed noise comes from: the initialisation or the data order (notebook 03; its runs: :func:`studylib.study.comparisons.headline.grids`).

A run's seed draws both its initial weights and the order of its batches. ``study.noise_split``
separates them with two one-factor designs around one fixed seed ``s0`` (the first of the
preset's seeds):

* **init only**: seeds ``s_1..s_k`` with ``train.data_seed = s0`` (every run reads the batches in
  the same order, the initialisations differ);
* **order only**: seed ``s0`` with ``train.data_seed = s_1..s_k`` (one initialisation, the orders
  differ);
* **both** (the headline's own runs): seeds ``s_1..s_k`` with their own orders.

The run with seed ``s0`` and data seed ``s0`` is the headline's own run in all three (the run
identity treats a data seed equal to the run's seed as the default), so the design adds
``2 (k - 1)`` runs per model. For every model's best validation loss and every headline gap,
:func:`noise_table` gives the std over the ``k`` draws of each design with its chi-square 95%
interval, and the ratio of the init-only to the order-only variance with its F interval
(:func:`studylib.study.analysis.stats.variance_ratio`): one factor *dominates* only when that interval
excludes 1.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd

from studylib.study.analysis.frames import seed_gaps
from studylib.study.analysis.stats import std_interval, variance_ratio

FACTORS = ("init only", "order only", "both")


def noise_table(runs: pd.DataFrame, models: Sequence[str], gaps: Mapping[str, tuple],
                value: str = "best_val_loss") -> pd.DataFrame:
    """One row per quantity (each model's ``value``, then each ``label: (a, b)`` gap ``a - b``,
    paired within a draw): per design the std over its draws with the 95% interval
    (``std_<factor>``, ``low_<factor>``, ``high_<factor>``), ``n``, and ``ratio`` = var(init only) /
    var(order only) with its 95% F interval and ``dominant`` (which factor, or "neither resolved")."""
    wide = runs.pivot_table(index=["factor", "draw"], columns="model", values=value)
    series = {m: wide[m] for m in models}
    series.update({label: seed_gaps(runs, a, b, value, index=["factor", "draw"]) for label, (a, b) in gaps.items()})
    rows = []
    for label, s in series.items():
        row = {"quantity": label}
        for f in FACTORS:
            x = s.xs(f, level="factor").dropna().to_numpy() if f in s.index.get_level_values(0) else []
            std, lo, hi, n = std_interval(x)
            row.update({f"std_{f}": std, f"low_{f}": lo, f"high_{f}": hi, f"n_{f}": n})
        vr = variance_ratio(s.xs("init only", level="factor").dropna(), s.xs("order only", level="factor").dropna())
        row.update({"ratio": vr.ratio, "ratio_low": vr.ci_low, "ratio_high": vr.ci_high,
                    "dominant": ("init" if vr.ci_low > 1 else "order") if vr.resolved else "neither resolved"})
        rows.append(row)
    return pd.DataFrame(rows).set_index("quantity")


def noise_sentence(table: pd.DataFrame) -> str:
    """The decomposition in words, worded from the F intervals."""
    parts = []
    for q, r in table.iterrows():
        s = (f"{q}: std {r['std_init only']:.4f} with the initialisation varied, {r['std_order only']:.4f} "
             f"with the data order varied, {r['std_both']:.4f} with both (n={int(r['n_both'])} each); "
             f"variance ratio init/order {r['ratio']:.2f} [{r['ratio_low']:.2f}, {r['ratio_high']:.2f}]")
        name = {"init": "initialisation", "order": "data order"}.get(r["dominant"])
        s += (f", so the {name} dominates (the interval excludes 1)" if name
              else ", so neither factor is resolved as the larger")
        parts.append(s + ".")
    return " ".join(parts) + (" What this does not show: the two factors' interaction (each design varies one "
                             "around one fixed seed), and the interval of a std from a few draws is wide.")


__all__ = ["noise_table", "noise_sentence", "FACTORS"]
