"""What the notebooks compute from runs: tables, routing frames, collapse checks, model probes.

Frames over runs come from :mod:`studylib.run.rundir` (``collect_runs`` -> one row per run,
``collect_metrics`` -> one row per metrics record). Everything here is a plain function of
those frames, of ``metrics.jsonl`` records, or (for the probes) of a run directory's model:

* headline (SPEC Table 2 / 6): :func:`headline_table`, :func:`seed_table`, :func:`gap_curves`,
  :func:`ordering` (does dense_active > moe > dense_total hold, and do the gaps exceed their
  seed std?), :func:`verdict`;
* routing (Table 1 / 7): :func:`routing_frame` (long: step / layer / metric / value),
  :func:`shares_frame` (step / layer / expert / share), :func:`collapsed`,
  :func:`collapse_table`, :func:`routing_trend`, :func:`final_routing`, :func:`ablation_table`;
* budgets (Table 5): :func:`param_split`, :func:`accounting_frame`;
* probes of a trained soft MoE (seed 003): :func:`uniform_gate_ablation` (force one layer's gate
  to uniform, loss change on a fixed validation subset) and :func:`expert_cosine` (cosine
  similarity of the K experts' outputs on the same hidden states);
* :func:`generations` (a few greedy samples per model for the same prompts).

Standard deviations are sample std (ddof=1) over seeds throughout.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
import pandas as pd

#: router statistics that are scalars per layer (``metrics.jsonl`` eval records, key ``router``)
ROUTER_SCALARS = ("busiest", "usage_var", "entropy", "top1", "margin", "logz", "usage_entropy",
                  "max_gt_0.9")
ROUTER_LISTS = ("shares", "argmax_shares")


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------
def pm(mean: float, std: float, digits: int = 4) -> str:
    """``"1.6545 ± 0.0012"`` (std shown as n/a when it is NaN, e.g. one seed)."""
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return f"{mean:.{digits}f} ± n/a"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def _std(x) -> float:
    x = pd.Series(x, dtype=float).dropna()
    return float(x.std(ddof=1)) if len(x) > 1 else float("nan")


def _records(source) -> list[dict]:
    """metrics records from a run directory, a list of dicts or a metrics DataFrame."""
    if isinstance(source, (str, os.PathLike)):
        from studylib.run.rundir import read_metrics

        return read_metrics(source)
    if isinstance(source, pd.DataFrame):
        return source.to_dict("records")
    return list(source)


# --------------------------------------------------------------------------------------------
# headline: Table 2, Table 6, gap curves, the ordering
# --------------------------------------------------------------------------------------------
def headline_table(df: pd.DataFrame, models: Optional[Sequence[str]] = None,
                   value: str = "best_val_loss") -> pd.DataFrame:
    """SPEC Table 2: per model n, mean and std (ddof=1) of ``value`` and of exp(value) (ppl),
    plus the formatted ``loss`` and ``ppl`` strings and the parameter counts."""
    from studylib.run.rundir import aggregate

    if df.empty:
        raise ValueError("headline_table: no finished runs")
    agg = aggregate(df, value)
    order = [m for m in (models or agg.index) if m in agg.index]
    agg = agg.loc[order]
    out = agg.copy()
    out["loss"] = [pm(m, s) for m, s in zip(agg[f"{value}_mean"], agg[f"{value}_std"])]
    out["ppl"] = [pm(m, s, 2) for m, s in zip(agg["ppl_mean"], agg["ppl_std"])]
    for col in ("params_total", "params_active"):
        if col in df:
            out[col] = df.groupby("model", sort=False)[col].first().reindex(order)
    return out


def seed_table(df: pd.DataFrame, dense_active: str, moe: str, dense_total: str,
               value: str = "best_val_loss") -> pd.DataFrame:
    """SPEC Table 6: one row per seed with the three models' ``value``, the matched-active gap
    (dense_active - moe) and the matched-total gap (moe - dense_total), computed per seed; then
    ``mean`` and ``std`` (ddof=1) rows over the seeds."""
    wide = df.pivot_table(index="seed", columns="model", values=value)
    missing = [m for m in (dense_active, moe, dense_total) if m not in wide]
    if missing:
        raise KeyError(f"seed_table: no runs of {missing}; have {list(wide.columns)}")
    t = wide[[dense_active, moe, dense_total]].dropna().copy()
    t["active_gap"] = t[dense_active] - t[moe]
    t["total_gap"] = t[moe] - t[dense_total]
    t.index = t.index.astype(object)
    stats = pd.DataFrame([t.mean(), t.std(ddof=1)], index=["mean", "std"])
    return pd.concat([t, stats])


def gaps(df: pd.DataFrame, dense_active: str, moe: str, dense_total: str,
         value: str = "best_val_loss") -> dict:
    """Matched-active and matched-total gaps (per seed, then mean / std ddof=1)."""
    from studylib.run.rundir import paired_gaps

    return {"active": paired_gaps(df, dense_active, moe, value),
            "total": paired_gaps(df, moe, dense_total, value)}


def ordering(df: pd.DataFrame, dense_active: str, moe: str, dense_total: str,
             value: str = "best_val_loss") -> dict:
    """Does the paper's ordering dense_active > moe > dense_total (in mean ``value``) hold, and
    does each gap exceed its seed std (ddof=1 of the per-seed gaps)?"""
    means = df.groupby("model")[value].mean()
    g = gaps(df, dense_active, moe, dense_total, value)
    holds = bool(means[dense_active] > means[moe] > means[dense_total])
    out = {"holds": holds, "means": {m: float(means[m]) for m in (dense_active, moe, dense_total)}}
    for k in ("active", "total"):
        mean, std = g[k]["mean"], g[k]["std"]
        out[f"{k}_gap"] = mean
        out[f"{k}_gap_std"] = std
        out[f"{k}_gap_n"] = g[k]["n"]
        out[f"{k}_exceeds_std"] = bool(not math.isnan(std) and mean > std)
    return out


def verdict(o: dict, preset_name: str = "") -> str:
    """One paragraph stating the outcome of :func:`ordering` in words (each gap's sign against
    the paper's, and whether it is larger than its seed std)."""
    names = list(o["means"])
    where = f" in preset {preset_name!r}" if preset_name else ""
    s = (f"The paper's ordering {names[0]} > {names[1]} > {names[2]} (best validation loss) "
         f"{'HOLDS' if o['holds'] else 'does NOT hold'}{where}: "
         + ", ".join(f"{m} {v:.4f}" for m, v in o["means"].items()) + ". ")
    for k, label in (("active", "matched-active gap"), ("total", "matched-total gap")):
        mean, std, n = o[f"{k}_gap"], o[f"{k}_gap_std"], o[f"{k}_gap_n"]
        paper = PAPER_GAPS[k][0]
        if math.isnan(std):
            s += f"The {label} is {mean:+.4f} (one seed: no std; paper {paper:+.4f}). "
        elif mean > std:
            s += (f"The {label} is {mean:+.4f} ± {std:.4f} over {n} seeds (paper {paper:+.4f}): "
                  f"positive as in the paper, and larger than its seed std. ")
        elif mean > 0:
            s += (f"The {label} is {mean:+.4f} ± {std:.4f} over {n} seeds (paper {paper:+.4f}): "
                  f"positive as in the paper, but within its seed std. ")
        elif -mean > std:
            s += (f"The {label} is {mean:+.4f} ± {std:.4f} over {n} seeds (paper {paper:+.4f}): "
                  f"reversed, by more than its seed std. ")
        else:
            s += (f"The {label} is {mean:+.4f} ± {std:.4f} over {n} seeds (paper {paper:+.4f}): "
                  f"reversed, but within its seed std. ")
    return s.strip()


def mean_curves(metrics: pd.DataFrame, value: str = "val_loss") -> pd.DataFrame:
    """Per model and eval step: mean and std (ddof=1) over seeds of ``value``."""
    g = metrics.groupby(["model", "step"], sort=False)
    out = g.agg(tokens=("tokens", "first"), mean=(value, "mean"), std=(value, lambda x: _std(x)),
                n=(value, "count"))
    return out.reset_index()


def gap_curves(metrics: pd.DataFrame, pairs: dict, value: str = "val_loss") -> pd.DataFrame:
    """Gap curves over training: for each ``name: (a, b)`` in ``pairs``, the per-seed gap
    ``value[a] - value[b]`` at every eval step both runs have, then per step mean, std (ddof=1)
    and n. Long frame: gap / step / tokens / mean / std / n (and the per-seed frame in
    ``attrs["per_seed"]``: gap / seed / step / tokens / value)."""
    ev = metrics[metrics["kind"] == "eval"] if "kind" in metrics else metrics
    wide = ev.pivot_table(index=["seed", "step"], columns="model", values=value)
    tokens = ev.groupby("step")["tokens"].first()
    per_seed, rows = [], []
    for name, (a, b) in pairs.items():
        if a not in wide or b not in wide:
            raise KeyError(f"gap_curves: need eval metrics of {a!r} and {b!r}; have {list(wide.columns)}")
        gap = (wide[a] - wide[b]).dropna().rename("value").reset_index()
        gap["gap"] = name
        per_seed.append(gap)
        for step, grp in gap.groupby("step"):
            rows.append({"gap": name, "step": step, "tokens": tokens.get(step, np.nan),
                         "mean": float(grp["value"].mean()), "std": _std(grp["value"]), "n": len(grp)})
    out = pd.DataFrame(rows)
    ps = pd.concat(per_seed, ignore_index=True)
    ps["tokens"] = ps["step"].map(tokens)
    out.attrs["per_seed"] = ps
    return out


# --------------------------------------------------------------------------------------------
# routing
# --------------------------------------------------------------------------------------------
def routing_frame(source, metrics: Sequence[str] = ROUTER_SCALARS) -> pd.DataFrame:
    """Long frame step / tokens / layer / metric / value of the per-layer router statistics in
    the eval records of ``source`` (a run directory, a list of records or a metrics DataFrame).
    Dense layers (router None) are left out; an empty frame if the model has no router.

    ``busiest`` and ``usage_var`` are recomputed from the record's ``shares`` (the assignment
    shares f_e over the whole evaluation subset): max_e f_e and the population variance of f_e,
    as SPEC section 3 defines them. (The trainer's own values average per-batch maxima, which
    read higher on small batches.)"""
    rows = []
    for r in _records(source):
        if r.get("kind", "eval") != "eval" or not isinstance(r.get("router"), list):
            continue
        for layer, st in enumerate(r["router"]):
            if not isinstance(st, dict):
                continue
            st = dict(st)
            if isinstance(st.get("shares"), list) and st["shares"]:  # of the eval set's shares
                sh = np.asarray(st["shares"], dtype=float)
                st["busiest"], st["usage_var"] = float(sh.max()), float(sh.var())
            for m in metrics:
                if m in st and st[m] is not None:
                    rows.append({"step": r["step"], "tokens": r.get("tokens"), "layer": layer,
                                 "metric": m, "value": float(st[m])})
    return pd.DataFrame(rows, columns=["step", "tokens", "layer", "metric", "value"])


def shares_frame(source, key: str = "shares") -> pd.DataFrame:
    """Long frame step / tokens / layer / expert / share of a per-expert list (``shares``: the
    assignment shares f_e; ``argmax_shares`` for the soft MoE) over the eval records."""
    rows = []
    for r in _records(source):
        if r.get("kind", "eval") != "eval" or not isinstance(r.get("router"), list):
            continue
        for layer, st in enumerate(r["router"]):
            if isinstance(st, dict) and isinstance(st.get(key), list):
                for e, v in enumerate(st[key]):
                    rows.append({"step": r["step"], "tokens": r.get("tokens"), "layer": layer,
                                 "expert": e, "share": float(v)})
    return pd.DataFrame(rows, columns=["step", "tokens", "layer", "expert", "share"])


def collapsed(shares, threshold: float = 0.9) -> bool:
    """Routing collapse: one expert receives at least ``threshold`` of the assignments."""
    s = np.asarray(shares, dtype=float)
    if s.size == 0:
        raise ValueError("collapsed: empty shares")
    return bool(s.max() >= threshold)


def collapse_table(runs_by_name: dict, threshold: float = 0.9) -> pd.DataFrame:
    """Per run (``name: run_dir or records``) and layer: the final and the maximum busiest-expert
    fraction, the first eval step with a collapsed layer (NaN if never) and whether the layer is
    collapsed at the end (:func:`collapsed` of the final shares)."""
    rows = []
    for name, src in runs_by_name.items():
        sh = shares_frame(src)
        if sh.empty:
            continue
        for layer, g in sh.groupby("layer"):
            per_step = g.groupby("step")["share"].apply(list)
            busiest = per_step.map(max)
            hit = [s for s, v in per_step.items() if collapsed(v, threshold)]
            rows.append({"model": name, "layer": layer, "final_busiest": float(busiest.iloc[-1]),
                         "max_busiest": float(busiest.max()),
                         "first_collapse_step": hit[0] if hit else np.nan,
                         "collapsed_at_end": collapsed(per_step.iloc[-1], threshold)})
    return pd.DataFrame(rows)


def final_routing(source, metrics: Sequence[str] = ROUTER_SCALARS) -> pd.DataFrame:
    """Router statistics of the last evaluation, one row per routed layer (wide)."""
    rf = routing_frame(source, metrics)
    if rf.empty:
        return pd.DataFrame()
    last = rf[rf["step"] == rf["step"].max()]
    out = last.pivot_table(index="layer", columns="metric", values="value")
    return out[[m for m in metrics if m in out]]


def routing_trend(frames: dict | pd.DataFrame, metric: str = "logz") -> pd.DataFrame:
    """First -> last evaluation trend of ``metric`` per layer (SPEC Table 7's log-z trend).

    ``frames``: one :func:`routing_frame` or ``{seed: routing_frame}`` (then mean and std over
    seeds of first, last and change)."""
    if isinstance(frames, pd.DataFrame):
        frames = {0: frames}
    rows = []
    for seed, rf in frames.items():
        d = rf[rf["metric"] == metric]
        for layer, g in d.groupby("layer"):
            g = g.sort_values("step")
            rows.append({"seed": seed, "layer": layer, "first": g["value"].iloc[0],
                         "last": g["value"].iloc[-1], "change": g["value"].iloc[-1] - g["value"].iloc[0]})
    t = pd.DataFrame(rows)
    out = t.groupby("layer").agg(first=("first", "mean"), last=("last", "mean"), change=("change", "mean"),
                                 change_std=("change", lambda x: _std(x)), n=("seed", "count"))
    out["trend"] = np.where(out["change"] < 0, "falls", np.where(out["change"] > 0, "rises", "flat"))
    return out


def ablation_table(summaries: pd.DataFrame, run_dirs: dict) -> pd.DataFrame:
    """SPEC Table 1 per variant: final / best val loss, the busiest-expert fraction of each layer
    at the end, the mean router log-z at the end, and whether any layer collapsed (>= 0.9)."""
    rows = []
    s = summaries.set_index("model")
    for name, rd in run_dirs.items():
        fr = final_routing(rd)
        row = {"model": name, "final_val_loss": s.loc[name, "final_val_loss"],
               "best_val_loss": s.loc[name, "best_val_loss"]}
        for layer, v in fr["busiest"].items():
            row[f"busiest_L{layer}"] = v
        row["logz_mean"] = float(fr["logz"].mean())
        row["collapsed_layers"] = int((fr["busiest"] >= 0.9).sum())
        rows.append(row)
    return pd.DataFrame(rows).set_index("model")


# --------------------------------------------------------------------------------------------
# parameter accounting
# --------------------------------------------------------------------------------------------
def fmt_count(n: int, unit: Optional[str] = None) -> str:
    """Millions at the paper's precision (``14.89M``), or thousands (``147.8k``); ``unit`` "M" or
    "k" (default: M from one million up)."""
    unit = unit or ("M" if abs(n) >= 1e6 else "k")
    return f"{n / 1e6:.2f}M" if unit == "M" else f"{n / 1e3:.1f}k"


def accounting_frame(cfgs: Iterable) -> pd.DataFrame:
    """SPEC Table 5 for model configs: the integer accounting plus shape columns and a
    ``display`` column "embedding | non-FFN | FFN total | total / active" in millions."""
    from studylib.config import count_params, ffn_label

    rows = []
    for c in cfgs:
        n = count_params(c)
        u = "M" if n.total >= 1e6 else "k"  # one unit per model, as in the paper
        rows.append({"model": c.name, "d_model": c.d_model, "heads": f"{c.n_heads}/{c.n_kv_heads}",
                     "ffn": ffn_label(c), "embedding": n.embedding, "non_ffn": n.non_ffn, "ffn_total": n.ffn_total,
                     "ffn_active": n.ffn_active, "router": n.router, "total": n.total, "active": n.active,
                     "display": " | ".join(fmt_count(v, u) for v in (n.embedding, n.non_ffn, n.ffn_total))
                                + f" | {fmt_count(n.total, u)} / {fmt_count(n.active, u)}"})
    return pd.DataFrame(rows).set_index("model")


def param_split(cfgs: Iterable) -> pd.DataFrame:
    """Per model: embedding / non-FFN / FFN active / FFN inactive / router parameter counts
    (they sum to the total; all but FFN inactive are the active path)."""
    from studylib.config import count_params

    rows = []
    for c in cfgs:
        n = count_params(c)
        rows.append({"model": c.name, "embedding": n.embedding, "non_ffn": n.non_ffn,
                     "ffn_active": n.ffn_active, "ffn_inactive": n.ffn_total - n.ffn_active,
                     "router": n.router})
    return pd.DataFrame(rows).set_index("model")


def granularity_table(summaries: pd.DataFrame, models: Sequence[str], base: Optional[str] = None,
                      value: str = "best_val_loss") -> pd.DataFrame:
    """Soft-MoE K sweep: per model K, ``value`` and its delta vs ``base`` (default: the first)."""
    base = base or models[0]
    s = summaries.groupby("model")[value].mean()
    rows = []
    for m in models:
        rows.append({"model": m, value: float(s[m]), "delta_vs_" + base: float(s[m] - s[base])})
    return pd.DataFrame(rows).set_index("model")


# --------------------------------------------------------------------------------------------
# probes of a trained model
# --------------------------------------------------------------------------------------------
def _run_data(run_dir, data=None):
    """(TokenData, preset) of the run's own data config (``data`` if given)."""
    from studylib.config import preset_from_dict
    from studylib.run.rundir import read_config

    doc = read_config(run_dir)
    if doc is None:
        raise FileNotFoundError(f"{run_dir}: not a run directory (no config.yaml)")
    preset = preset_from_dict(doc["preset"])
    if data is None:
        from studylib.run.data import load_data

        data = load_data(preset.data, progress=False)
    return data, preset


def eval_windows(run_dir, n_windows: Optional[int] = None, data=None) -> tuple:
    """(data, window indices): a fixed subset of the run's validation windows (the trainer's
    :func:`studylib.run.trainer.eval_subset`, so every model is probed on the same windows)."""
    from studylib.run.trainer import eval_subset

    data, preset = _run_data(run_dir, data)
    return data, eval_subset(data.val_idx, n_windows, preset.data.split_seed)


def _loss(model, data, idx, batch_size: int) -> float:
    from studylib.run.trainer import evaluate

    device = next(model.parameters()).device
    return float(evaluate(model, data, idx, batch_size, device, None)["val_loss"])


def _device(device: Optional[str]) -> str:
    if device is not None:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def uniform_gate_ablation(run_dir, n_windows: Optional[int] = 64, data=None, batch_size: int = 16,
                          device: Optional[str] = None) -> pd.DataFrame:
    """Force one routed layer's gate to uniform at a time (``model.set_router_mode("uniform",
    layers=[i])``) and evaluate the loss on a fixed validation subset (fp32, no dropout).

    Returns one row per routed layer: layer / loss / delta (= loss - the learned-gate loss,
    ``attrs["base_loss"]``). For K=1 the gate is exactly 1 either way, so delta is 0.
    ``device``: default CUDA when available, else CPU."""
    from studylib.run.decode import load_run

    model, _, cfg = load_run(run_dir, device=_device(device))
    data, idx = eval_windows(run_dir, n_windows, data)
    base = _loss(model, data, idx, batch_size)
    rows = []
    for layer in model.routed_layers():
        model.set_router_mode("uniform", layers=[layer])
        loss = _loss(model, data, idx, batch_size)
        model.set_router_mode("learned")
        rows.append({"model": cfg.name, "layer": layer, "loss": loss, "delta": loss - base,
                     "base_loss": base})
    out = pd.DataFrame(rows, columns=["model", "layer", "loss", "delta", "base_loss"])
    out.attrs["base_loss"] = base
    out.attrs["n_windows"] = len(idx)
    return out


def expert_cosine(run_dir, n_windows: Optional[int] = 16, data=None, batch_size: int = 16,
                  device: Optional[str] = None) -> dict:
    """Per routed layer, the K x K matrix (DataFrame) of mean cosine similarity between the
    experts' outputs on the same hidden states (the ``ffn_norm`` outputs of the validation
    subset, captured by a forward hook; each expert run with :func:`studylib.nn.dispatch.expert_mlp`).
    Ungated outputs: what each expert *would* contribute for every token."""
    import torch

    from studylib.nn.dispatch import expert_mlp
    from studylib.run.decode import load_run

    device = _device(device)
    model, _, cfg = load_run(run_dir, device=device)
    data, idx = eval_windows(run_dir, n_windows, data)
    layers = model.routed_layers()
    sums: dict = {}
    counts: dict = {i: 0 for i in layers}
    captured: dict = {}
    hooks = [model.blocks[i].ffn_norm.register_forward_hook(
        lambda mod, args, out, i=i: captured.__setitem__(i, out.detach())) for i in layers]
    try:
        with torch.no_grad():
            for start in range(0, len(idx), batch_size):
                w = data.windows(idx[start:start + batch_size]).to(device)
                captured.clear()
                model(w[:, :-1], stats=False)
                for i in layers:
                    ffn = model.blocks[i].ffn
                    x_TD = captured[i].reshape(-1, captured[i].shape[-1]).float()
                    outs = [expert_mlp(x_TD, ffn.w_in_EFD[e].float(), ffn.w_out_EDH[e].float())
                            for e in range(ffn.w_in_EFD.shape[0])]
                    o = torch.nn.functional.normalize(torch.stack(outs, 0), dim=-1)  # (K, T, D)
                    sim = torch.einsum("itd,jtd->ij", o, o)  # summed cosine over tokens
                    sums[i] = sim if i not in sums else sums[i] + sim
                    counts[i] += x_TD.shape[0]
    finally:
        for h in hooks:
            h.remove()
    out = {}
    for i in layers:
        m = (sums[i] / max(counts[i], 1)).cpu().numpy()
        K = m.shape[0]
        out[i] = pd.DataFrame(m, index=[f"e{k}" for k in range(K)], columns=[f"e{k}" for k in range(K)])
    return out


def cosine_summary(mats: dict) -> pd.DataFrame:
    """Per layer: mean and max off-diagonal cosine of an :func:`expert_cosine` result."""
    rows = []
    for layer, m in mats.items():
        a = m.to_numpy()
        K = a.shape[0]
        off = a[~np.eye(K, dtype=bool)] if K > 1 else np.array([np.nan])
        rows.append({"layer": layer, "K": K, "mean_offdiag_cos": float(np.mean(off)),
                     "max_offdiag_cos": float(np.max(off))})
    return pd.DataFrame(rows).set_index("layer")


def generations(run_dirs: dict, prompts: Sequence[str], max_new_tokens: int = 48,
                temperature: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """A few samples per model (``name: run_dir``) for the same prompts (greedy by default;
    each prompt starts after an end-of-story token, like the training windows)."""
    from studylib.run.decode import generate, load_run

    rows = []
    for name, rd in run_dirs.items():
        model, tok, cfg = load_run(rd)
        if tok is None:
            raise FileNotFoundError(f"{rd}: the run's tokenizer was not found")
        for p in prompts:
            ids = [tok.eos_id()] + tok.encode(p)
            n_new = max(1, min(max_new_tokens, cfg.context - len(ids), cfg.context - 1))
            out = generate(model, ids, n_new, temperature=temperature, seed=seed, eos_id=tok.eos_id())
            rows.append({"prompt": p, "model": name, "continuation": tok.decode(out)})
    return pd.DataFrame(rows)


def outputs_dir(preset) -> Path:
    """``outputs/<preset>/`` (figures/ and tables/ go below it)."""
    from studylib.run.rundir import outputs_root

    return outputs_root(preset) / preset.name


# --------------------------------------------------------------------------------------------
# more notebook helpers
# --------------------------------------------------------------------------------------------
#: the paper's numbers (SPEC section 2 and 7), shown next to this preset's results
PAPER_TABLE2 = pd.DataFrame(
    {"best_val_loss": ["1.6545 ± 0.0012", "1.5788 ± 0.0020", "1.5608 ± 0.0025"],
     "params total / active": ["14.89M / 14.89M", "21.06M / 14.77M", "21.06M / 21.06M"]},
    index=pd.Index(["dense active-match", "MoE top-2 + z-loss", "dense total-match"], name="paper"))
PAPER_GAPS = {"active": (0.0758, 0.0021), "total": (0.0180, 0.0020)}
PAPER_TABLE5 = {  # name in params/paper.yaml -> (embedding, non-FFN, FFN total, total, active) as shown
    "dense_active": ("9.60M", "0.99M", "4.30M", "14.89M", "14.89M"),
    "moe_top2_z": ("7.68M", "0.79M", "12.58M", "21.06M", "14.77M"),
    "dense_total": ("11.52M", "1.58M", "7.96M", "21.06M", "21.06M"),
}
PAPER_TABLE7 = pd.DataFrame({"entropy": [1.243, 1.127, 0.938, 0.940], "top1": [0.443, 0.533, 0.644, 0.645],
                             "margin": [0.175, 0.289, 0.441, 0.451]},
                            index=pd.Index([0, 1, 2, 3], name="layer"))
PAPER_TABLE8 = pd.DataFrame(
    {"tok_per_s": ["58.1k", "54.7k", "59.3k", "42.8-48.4k", "54.4-57.6k", "61.0-61.7k"]},
    index=pd.Index(["dense_active", "moe (grouped)", "dense_total", "moe naive", "moe grouped",
                    "moe stacked"], name="paper (RTX 3060)"))
PAPER_GRANULARITY = pd.DataFrame({"delta_vs_K1": [0.0, -0.0048, 0.0053, 0.0197]},
                                 index=pd.Index([1, 2, 4, 6], name="K"))


def routing_frames(preset, model: str, seeds: Sequence[int]) -> pd.DataFrame:
    """:func:`routing_frame` of ``model`` for several seeds, with a ``seed`` column."""
    from studylib.run.rundir import run_dir_for

    frames = [routing_frame(run_dir_for(preset, model, s)).assign(seed=s) for s in seeds]
    return pd.concat(frames, ignore_index=True)


def shares_frames(preset, model: str, seeds: Sequence[int], key: str = "shares") -> pd.DataFrame:
    """:func:`shares_frame` of ``model`` for several seeds, with a ``seed`` column."""
    from studylib.run.rundir import run_dir_for

    frames = [shares_frame(run_dir_for(preset, model, s), key).assign(seed=s) for s in seeds]
    return pd.concat(frames, ignore_index=True)


def diagnostics_table(rf: pd.DataFrame, metrics: Sequence[str] = ("busiest", "usage_var", "entropy", "top1",
                                                                   "margin", "logz")) -> pd.DataFrame:
    """SPEC Table 7 shape: per layer, the last evaluation's value of each metric (mean over the
    seeds of a :func:`routing_frames` frame)."""
    last = rf[rf["step"] == rf["step"].max()]
    t = last.pivot_table(index="layer", columns="metric", values="value", aggfunc="mean")
    return t[[m for m in metrics if m in t]]


def gate_table(run_dirs: dict) -> pd.DataFrame:
    """Soft-MoE gate diagnostics at the last evaluation, per model and layer: usage entropy (of
    the mean gate), per-token gate entropy, mean max gate, share of tokens with max gate > 0.9,
    their uniform references and the argmax shares."""
    rows = []
    for name, rd in run_dirs.items():
        recs = [r for r in _records(rd) if r.get("kind") == "eval" and isinstance(r.get("router"), list)]
        if not recs:
            continue
        for layer, st in enumerate(recs[-1]["router"]):
            if not isinstance(st, dict):
                continue
            K = len(st["shares"])
            rows.append({"model": name, "K": K, "layer": layer,
                         "usage_entropy": st.get("usage_entropy"), "token_entropy": st["entropy"],
                         "max_entropy": math.log(K), "mean_max_gate": st["top1"], "uniform_gate": 1.0 / K,
                         "share_max_gt_0.9": st.get("max_gt_0.9"),
                         "argmax_shares": " ".join(f"{v:.2f}" for v in st.get("argmax_shares", []))})
    return pd.DataFrame(rows)


def collapse_sentence(col: pd.DataFrame, threshold: float = 0.9) -> str:
    """Which variants have a layer collapsed (busiest share >= threshold) at the end."""
    if col.empty:
        return "No routed layers."
    parts = []
    for m, g in col.groupby("model", sort=False):
        n = int(g["collapsed_at_end"].sum())
        first = g["first_collapse_step"].min()
        parts.append(f"{m}: {n}/{len(g)} layer(s) collapsed at the end"
                     + ("" if math.isnan(first) else f" (first collapse at step {int(first)})")
                     + f", max busiest {g['max_busiest'].max():.2f}")
    return f"Collapse (one expert >= {threshold:.0%} of assignments): " + "; ".join(parts) + "."


def format_generations(gens: pd.DataFrame) -> str:
    """Generations as readable text: each prompt, then each model's continuation."""
    lines = []
    for p, g in gens.groupby("prompt", sort=False):
        lines.append(f"PROMPT: {p}")
        for _, r in g.iterrows():
            lines.append(f"  [{r['model']}] {p}{'' if r['continuation'].startswith(' ') else ' '}"
                         f"{r['continuation'].strip()}")
        lines.append("")
    return "\n".join(lines)


def throughput_table(df: pd.DataFrame, ref: Optional[str] = None) -> pd.DataFrame:
    """SPEC Table 8 from :func:`studylib.tools.bench.bench_train` (or ``bench_decode``) rows: one row per
    variant with a ``label`` (model, [dispatch]), the median tokens/s, its min-max range over the
    rounds (``range`` text, ``lo`` / ``hi`` numbers) and the speed ratio to ``ref``: the bench's paired per-round ratio (median over rounds) when
    ``ref`` is the bench's reference (its first model), else the ratio of the medians."""
    d = df.copy()
    if "cache" in d:  # decode rows
        d["label"] = d["model"] + np.where(d["cache"], " (KV cache)", " (no cache)")
    else:
        d["label"] = d["model"] + np.where(d["dispatch"].astype(str) != "", "[" + d["dispatch"].astype(str) + "]", "")
    if "impl" in d and (d["impl"] != "studylib").any():
        d["label"] = d["label"] + np.where(d["impl"] != "studylib", " (" + d["impl"] + ")", "")
    d["tok_per_s"] = d["tok_s"]
    d["range"] = [f"{a:,.0f}-{b:,.0f}" for a, b in zip(d["tok_s_min"], d["tok_s_max"])]
    d["lo"], d["hi"] = d["tok_s_min"], d["tok_s_max"]
    if ref is not None:
        base = d.loc[d["model"] == ref, "tok_s"]
        if base.empty:
            raise KeyError(f"throughput_table: no rows of {ref!r}")
        if "ratio_ref" in d and d["model"].iloc[0] == ref:  # the bench's paired per-round ratios
            d["ratio_to_" + ref] = d.pop("ratio_ref")
        else:
            d["ratio_to_" + ref] = d["tok_s"] / float(base.iloc[0])
    cols = ["label", "model"] + [c for c in ("dispatch", "cache") if c in d] + ["tok_per_s", "range"] + \
        ["lo", "hi"] + \
        [c for c in d.columns if c.startswith("ratio_") and not d[c].isna().all()] + \
        [c for c in ("params", "mfu", "ms_per_token") if c in d]
    return d[cols].set_index("label")
