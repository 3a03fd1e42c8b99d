"""Run identity: which settings make two runs the same run, and the hash that names it.

A run is (preset name (``runs``: whose runs it shares), model name, seed, data settings, training settings, resolved model
config). The identity document keeps only what changes results, by two rules:

* execution-only settings are left out: where the data and cache live, threads, device,
  ``torch.compile``, checkpoint cadence, the MoE's dispatch path (naive / grouped / stacked
  compute the same function; their parity is tested) and the LM-head loss's chunk (the same
  function to fp32 rounding; tested);
* a setting at its schema default is left out (``train.data_seed`` equal to the run's seed is
  its default: the run's own data order). So a field added to the schema later, at its
  default, changes no existing run's identity, and a stored ``config.yaml`` written by any
  earlier version is compared by the same rule (:func:`same_run`).

Two things are not schema fields: how the corpus is cut into training and validation data
(:data:`DATA_SPLIT`, see ``studylib.data``) and how the initial weights are drawn from the seed
(:data:`INIT`, see ``studylib.nn.init``). Both are always part of the identity, and a run's
``config.yaml`` records them as ``run.data_split`` and ``run.init``. A document without the first
was written before the split by story (windows were split, so every validation window shared a
story with a training window); one without the second drew its weights in construction order (a
control's weights then differed from its reference's in every tensor). Such a run is a
*different* run, and its directory is refused, never silently resumed or reused.

Torch-free.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Mapping, Optional

from studylib.config.schema import DataConfig, FFNConfig, ModelConfig, TrainConfig, to_dict

DATA_SPLIT = "story/v1"  # stories split into train / val, each side windowed on its own (studylib.data)
INIT = "keyed/v1"  # each initial tensor drawn from a generator keyed by the seed and its name (studylib.nn.init)

EXEC_ONLY = {
    DataConfig: ("source", "data_dir", "cache_dir", "tokenizer_threads"),
    TrainConfig: ("device", "num_threads", "compile", "keep_checkpoints", "checkpoint_every"),
    FFNConfig: ("dispatch", "grouped_mm"),
    ModelConfig: ("lm_head_chunk",),
}


def config_hash(doc: Any) -> str:
    """A short stable hash of a plain (JSON-able) document."""
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _sparse(cls: type, values: Mapping[str, Any]) -> dict:
    """``values`` (a plain mapping of ``cls``'s fields) without execution-only fields and
    without fields at their default; nested config sections are treated the same way."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in EXEC_ONLY[cls] or f.name not in values:
            continue
        v = values[f.name]
        if f.type in ("FFNConfig", FFNConfig) and isinstance(v, Mapping):
            v = _sparse(FFNConfig, v)
            if v:
                out[f.name] = v
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if default is dataclasses.MISSING or to_dict(default) != v:
            out[f.name] = v
    return out


def identity(preset: str, model: str, seed: int, data: Mapping, train: Mapping, model_cfg: Mapping,
             split: Optional[str], init: Optional[str]) -> dict:
    """The identity document of a run, from plain mappings (as ``to_dict`` or ``config.yaml`` hold
    them); ``split`` is the data split's version (None: written before the story split), ``init``
    the initial draws' (None: written before keyed draws)."""
    train = dict(train)
    if train.get("data_seed") == seed:  # the data order of the run's own seed: the default
        train["data_seed"] = None
    return {"preset": preset, "model_name": model, "seed": int(seed), "split": split, "init": init,
            "data": _sparse(DataConfig, data), "train": _sparse(TrainConfig, train),
            "model": _sparse(ModelConfig, model_cfg)}


def run_identity(preset, model_cfg: ModelConfig, model: str, seed: int) -> dict:
    """The identity document of ``model`` x ``seed`` of a :class:`~studylib.config.presets.Preset`."""
    return identity(preset.runs, model, seed, to_dict(preset.data), to_dict(preset.train), to_dict(model_cfg),
                    split=DATA_SPLIT, init=INIT)


def stored_identity(doc: Mapping) -> dict:
    """The identity document of a stored ``config.yaml`` (see :func:`run_document`)."""
    run, p = doc.get("run") or {}, doc.get("preset") or {}
    return identity(run.get("preset"), run.get("model"), run.get("seed", -1), p.get("data") or {},
                    p.get("train") or {}, doc.get("model") or {}, split=run.get("data_split"), init=run.get("init"))


def run_document(preset, model_cfg: ModelConfig, model: str, seed: int) -> dict:
    """What a run's ``config.yaml`` holds: its identity hash, the data split's and the initial
    draws' versions, the resolved preset and model config."""
    p = to_dict(preset)
    p.pop("path", None)
    return {
        "run": {"preset": preset.runs, "model": model, "seed": seed,
                "config_hash": config_hash(run_identity(preset, model_cfg, model, seed)),
                "data_split": DATA_SPLIT, "init": INIT, "preset_path": preset.path},
        "model": to_dict(model_cfg),
        "preset": p,
    }


def _flat(doc: Any, prefix: str = "") -> dict:
    if isinstance(doc, Mapping):
        out = {}
        for k, v in doc.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: doc}


def identity_diff(stored: Mapping, new: Mapping) -> list[str]:
    """What makes two ``config.yaml`` documents different runs, as ``key: stored -> new`` lines
    (an absent setting is its schema default)."""
    a, b = _flat(stored_identity(stored)), _flat(stored_identity(new))
    return [f"{k}: {a.get(k, 'default')!r} -> {b.get(k, 'default')!r}" for k in sorted(set(a) | set(b))
            if a.get(k, "default") != b.get(k, "default")]


def same_run(stored: Mapping, new: Mapping) -> bool:
    """Whether two ``config.yaml`` documents describe the same run (by the rules above)."""
    return config_hash(stored_identity(stored)) == config_hash(stored_identity(new))
