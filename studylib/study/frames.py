"""pandas frames across runs (the one place that turns run directories into tables): summaries,
metric curves, per-model aggregates and per-seed paired gaps."""
from __future__ import annotations

import math
from typing import Iterable, Optional

import pandas as pd

from studylib.config import Preset
from studylib.run.rundir import RunDir


def load_metrics(run_dir, kind: Optional[str] = None) -> pd.DataFrame:
    """``metrics.jsonl`` as a DataFrame (optionally only ``kind`` "train" or "eval" rows)."""
    return pd.DataFrame.from_records(RunDir(run_dir).read_metrics(kind))


def collect_runs(preset: Preset, models: Optional[Iterable[str]] = None,
                 seeds: Optional[Iterable[int]] = None, root=None):
    """One row per finished run (summary fields; ``params`` flattened to ``params_<key>``).

    Missing or unfinished runs are left out; ``df.attrs["missing"]`` lists their (model, seed).
    """
    rows, missing = [], []
    for m in (models if models is not None else preset.model_names()):
        for s in (seeds if seeds is not None else preset.seeds):
            summ = RunDir.of(preset, m, s, root).summary()
            if not summ or not summ.get("finished"):
                missing.append((m, s))
                continue
            row = {k: v for k, v in summ.items() if not isinstance(v, (dict, list))}
            for k, v in (summ.get("params") or {}).items():
                row[f"params_{k}"] = v
            row["model"], row["seed"] = m, s
            rows.append(row)
    df = pd.DataFrame.from_records(rows)
    df.attrs["missing"] = missing
    return df


def collect_metrics(preset: Preset, models: Optional[Iterable[str]] = None,
                    seeds: Optional[Iterable[int]] = None, kind: Optional[str] = "eval", root=None):
    """All runs' ``metrics.jsonl`` rows in one long DataFrame with ``model`` and ``seed`` columns."""
    frames = []
    for m in (models if models is not None else preset.model_names()):
        for s in (seeds if seeds is not None else preset.seeds):
            df = load_metrics(RunDir.of(preset, m, s, root), kind=kind)
            if len(df):
                frames.append(df.assign(model=m, seed=s))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def aggregate(df, value: str = "best_val_loss"):
    """Per model: n, mean and std (ddof=1) of ``value`` and of its perplexity exp(value)."""
    d = df.assign(_ppl=df[value].map(math.exp))
    g = d.groupby("model", sort=False)
    out = pd.DataFrame({
        "n": g[value].count(),
        f"{value}_mean": g[value].mean(), f"{value}_std": g[value].std(ddof=1),
        "ppl_mean": g["_ppl"].mean(), "ppl_std": g["_ppl"].std(ddof=1),
    })
    return out


def paired_gaps(df, a: str, b: str, value: str = "best_val_loss") -> dict:
    """Per-seed gap ``value[a] - value[b]`` over the seeds both models have; mean, std (ddof=1)."""
    wide = df.pivot_table(index="seed", columns="model", values=value)
    if a not in wide or b not in wide:
        raise KeyError(f"paired_gaps: need runs of both {a!r} and {b!r}; have {list(wide.columns)}")
    gap = (wide[a] - wide[b]).dropna()
    return {"a": a, "b": b, "per_seed": gap, "n": int(len(gap)), "mean": float(gap.mean()),
            "std": float(gap.std(ddof=1)) if len(gap) > 1 else float("nan")}
