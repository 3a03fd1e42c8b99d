"""Run directories and their contents, and pandas frames across runs (for the notebooks).

A run lives in ``<outputs>/<preset>/runs/<model>/seed<seed>/`` where ``<outputs>`` is
``$STUDYLIB_OUTPUTS``, else the ``outputs/`` folder next to the preset's ``params/`` folder,
else ``./outputs``. It holds ``config.yaml`` (resolved preset and model config, and the config
hash), ``metrics.jsonl`` (one JSON object per line, ``kind`` "train" or "eval"),
``summary.json`` (written when the run finished) and ``checkpoints/``.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable, Optional

import yaml

from studylib.run import checkpoint
from studylib.config.schema import ConfigError, ModelConfig, Preset, to_dict

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"

# settings that say how/where a run executes, not what it computes: left out of the config hash
_EXEC_ONLY = {"data": ("source", "data_dir", "cache_dir", "tokenizer_threads"),
              "train": ("device", "num_threads", "compile", "keep_checkpoints", "checkpoint_every")}


# FFN fields added after runs existed: hashed only when set away from their default, so run
# directories written before keep their identity (and are reused, not retrained)
_FFN_ADDED = {"renormalize": True}


def _hashed_model(model_cfg: ModelConfig) -> dict:
    doc = to_dict(model_cfg)
    ffn = doc.get("ffn") or {}
    for key, default in _FFN_ADDED.items():
        if key in ffn and ffn[key] == default:
            del ffn[key]
    return doc


class RunDirConflict(ConfigError):
    """The run directory holds a run with a different configuration."""


def outputs_root(preset: Optional[Preset] = None) -> Path:
    if os.environ.get("STUDYLIB_OUTPUTS"):
        return Path(os.environ["STUDYLIB_OUTPUTS"])
    if preset is not None and preset.path:
        params_dir = Path(preset.path).resolve().parent
        if params_dir.name == "params":
            return params_dir.parent / "outputs"
    return Path("outputs")


def run_dir_for(preset: Preset, model: str, seed: int, root: str | os.PathLike | None = None) -> Path:
    root = Path(root) if root is not None else outputs_root(preset)
    return root / preset.name / "runs" / model / f"seed{seed}"


# --------------------------------------------------------------------------------------------
# config document and hash
# --------------------------------------------------------------------------------------------
def config_document(preset: Preset, model_cfg: ModelConfig, model: str, seed: int) -> dict:
    """What ``config.yaml`` holds: the run's identity, the resolved preset and model config."""
    p = to_dict(preset)
    p.pop("path", None)
    hashed = {
        "preset": preset.name, "model_name": model, "seed": seed,
        "data": {k: v for k, v in p["data"].items() if k not in _EXEC_ONLY["data"]},
        "train": {k: v for k, v in p["train"].items() if k not in _EXEC_ONLY["train"]},
        "model": _hashed_model(model_cfg),
    }
    return {
        "run": {"preset": preset.name, "model": model, "seed": seed,
                "config_hash": checkpoint.config_hash(hashed), "preset_path": preset.path},
        "model": to_dict(model_cfg),
        "preset": p,
    }


def read_config(run_dir: str | os.PathLike) -> Optional[dict]:
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise RunDirConflict(f"{path}: unreadable run config ({e})") from None


def check_run_dir(run_dir: str | os.PathLike, config_hash: str) -> None:
    """Raise :class:`RunDirConflict` if ``run_dir`` holds a run with another config hash."""
    doc = read_config(run_dir)
    if doc is None:
        return
    old = (doc.get("run") or {}).get("config_hash") if isinstance(doc, dict) else None
    if old != config_hash:
        raise RunDirConflict(
            f"{run_dir}: holds a run with a different configuration (config hash {old}, this run "
            f"{config_hash}). Use another --run-dir, restore the settings, or delete that folder.")


def write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_config(run_dir: Path, doc: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{CONFIG_FILE}.tmp"
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    os.replace(tmp, run_dir / CONFIG_FILE)


# --------------------------------------------------------------------------------------------
# reading runs
# --------------------------------------------------------------------------------------------
def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """The records of ``metrics.jsonl`` (a torn last line, from a crash, is skipped)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def truncate_metrics(run_dir: str | os.PathLike, step: int) -> None:
    """Keep only the records up to optimizer step ``step`` (used when resuming)."""
    path = Path(run_dir) / METRICS_FILE
    keep = [r for r in read_metrics(run_dir) if r.get("step", 0) <= step]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
    os.replace(tmp, path)


def load_metrics(run_dir: str | os.PathLike, kind: Optional[str] = None):
    """``metrics.jsonl`` as a DataFrame (optionally only ``kind`` "train" or "eval" rows)."""
    import pandas as pd

    recs = read_metrics(run_dir)
    if kind is not None:
        recs = [r for r in recs if r.get("kind") == kind]
    return pd.DataFrame.from_records(recs)


def load_summary(run_dir: str | os.PathLike) -> Optional[dict]:
    path = Path(run_dir) / SUMMARY_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def is_finished(run_dir: str | os.PathLike) -> bool:
    s = load_summary(run_dir)
    return bool(s and s.get("finished"))


def collect_runs(preset: Preset, models: Optional[Iterable[str]] = None,
                 seeds: Optional[Iterable[int]] = None, root=None):
    """One row per finished run (summary fields; ``params`` flattened to ``params_<key>``).

    Missing or unfinished runs are left out; ``df.attrs["missing"]`` lists their (model, seed).
    """
    import pandas as pd

    rows, missing = [], []
    for m in (models if models is not None else preset.model_names()):
        for s in (seeds if seeds is not None else preset.seeds):
            summ = load_summary(run_dir_for(preset, m, s, root))
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
    import pandas as pd

    frames = []
    for m in (models if models is not None else preset.model_names()):
        for s in (seeds if seeds is not None else preset.seeds):
            df = load_metrics(run_dir_for(preset, m, s, root), kind=kind)
            if len(df):
                frames.append(df.assign(model=m, seed=s))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def aggregate(df, value: str = "best_val_loss"):
    """Per model: n, mean and std (ddof=1) of ``value`` and of its perplexity exp(value)."""
    import pandas as pd

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
