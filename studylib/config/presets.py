"""Presets: a YAML file (``params/*.yaml``) with the sections ``data``, ``train``, ``model``
(defaults shared by every model), ``models`` (named variants: a partial model config, or a
``derive`` rule solved by :mod:`studylib.config.derive`), ``seeds`` and ``study`` (what the notebooks
compare: :class:`studylib.config.study.StudyConfig`, its general knobs checked against the models
here, the comparisons' own knobs by the study layer);
optionally ``extends: base.yaml`` (:func:`read_preset_file`).

Loading applies the environment (``STUDYLIB_DATA_DIR``, ``STUDYLIB_CACHE_DIR``) and ``--set``
overrides (:func:`override`, the one implementation), and validates everything. Torch-free.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import yaml

from studylib.config.args import seed_error
from studylib.config.derive import derive_model
from studylib.config.study import StudyConfig, study_from_dict
from studylib.config.schema import (ConfigError, DataConfig, ModelConfig, TrainConfig, _coerce,
                                    dataclass_from_dict, deep_merge, model_from_dict, to_dict)

ENV_DIRS = (("data_dir", "STUDYLIB_DATA_DIR"), ("cache_dir", "STUDYLIB_CACHE_DIR"))


@dataclass(frozen=True)
class Preset:
    name: str
    data: DataConfig
    train: TrainConfig
    model: dict  # shared model defaults (raw mapping, merged into each model)
    models: dict  # name -> raw mapping (partial model config or a `derive` rule)
    seeds: tuple[int, ...] = (1337, 1338, 1339)
    study: StudyConfig = field(default_factory=StudyConfig)  # what the notebooks compare (config/study.py)
    path: Optional[str] = None
    #: whose runs this preset trains and reads: ``<outputs>/<runs>/runs`` and the runs' identity
    #: (default: its own name). A preset that extends another and changes nothing a run depends on
    #: names the other (``params/cpu_scale.yaml``: ``runs: cpu``) to share its runs; a run whose
    #: settings differ is still another run (refused there, never reused)
    runs: Optional[str] = None

    def __post_init__(self):
        if self.runs is None:
            object.__setattr__(self, "runs", self.name)

    def model_names(self) -> list[str]:
        return list(self.models)

    def model_config(self, name: str) -> ModelConfig:
        """The resolved, validated config of one named model (derive rules solved here)."""
        return self._resolve(name, ())

    def _resolve(self, name: str, chain: tuple[str, ...]) -> ModelConfig:
        if name not in self.models:
            raise ConfigError(f"models: no model named {name!r}; allowed: {sorted(self.models)}")
        if name in chain:
            cycle = " -> ".join((*chain[chain.index(name):], name))
            raise ConfigError(f"models.{name}.from: derive rules form a cycle ({cycle})")
        raw = self.models[name]
        if isinstance(raw, dict) and "derive" in raw:
            return derive_model(self, name, raw, resolve=lambda src: self._resolve(src, (*chain, name)))
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"models.{name}: must be a mapping of model fields, got {raw!r}")
        merged = deep_merge(self.model, raw or {})
        merged.setdefault("vocab_size", self.data.vocab_size)
        merged.setdefault("context", self.data.context)
        merged["name"] = name
        return model_from_dict(merged, where=f"models.{name}")


_PRESET_KEYS = ("name", "runs", "data", "train", "model", "models", "seeds", "study")


def preset_from_dict(raw: dict, path: Optional[str] = None) -> Preset:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path or 'preset'}: must be a YAML mapping with keys {list(_PRESET_KEYS)}")
    unknown = sorted(set(raw) - set(_PRESET_KEYS))
    if unknown:
        raise ConfigError(f"unknown top-level key(s) {unknown}; allowed: {list(_PRESET_KEYS)}")
    data_raw = raw.get("data") or {}
    if not isinstance(data_raw, dict):
        raise ConfigError(f"data: must be a mapping of data fields, got {data_raw!r}")
    data_raw = dict(data_raw)
    from_env = set()
    for key, env in ENV_DIRS:
        if os.environ.get(env):
            data_raw[key] = os.environ[env]
            from_env.add(key)
    if path is not None:  # relative data/cache dirs are relative to the repository (parent of params/)
        root = Path(path).resolve().parent.parent
        for key, _ in ENV_DIRS:
            v = data_raw.get(key, getattr(DataConfig, key))  # the default cache_dir is relative too
            if isinstance(v, str) and not os.path.isabs(v) and key not in from_env:
                data_raw[key] = str((root / v).resolve())
    data = dataclass_from_dict(DataConfig, data_raw, "data")
    data.validate()
    train = dataclass_from_dict(TrainConfig, raw.get("train") or {}, "train")
    train.validate()
    model = raw.get("model") or {}
    if not isinstance(model, dict):
        raise ConfigError("model: must be a mapping of shared model fields")
    models = raw.get("models") or {}
    if not isinstance(models, dict) or not models:
        raise ConfigError("models: must be a non-empty mapping of model name -> settings")
    for m in models:
        plain_name(m, f"models: the model name {m!r}")
    seeds = _coerce(raw.get("seeds", [1337, 1338, 1339]), tuple[int, ...], "seeds")
    if not seeds:
        raise ConfigError("seeds: must list at least one integer seed")
    for i, s in enumerate(seeds):
        if seed_error(s, f"seeds[{i}]"):
            raise ConfigError(seed_error(s, f"seeds[{i}]"))
    name = preset_name(raw.get("name"), path)
    runs = None if raw.get("runs") is None else plain_name(raw["runs"], "runs")
    study = study_from_dict(raw.get("study"), models)
    return Preset(name=name, data=data, train=train, model=model, models=models, seeds=seeds, study=study, path=path,
                  runs=runs)


#: a preset's or a model's name: one folder of the run layout (``<outputs>/<preset>/runs/<model>``), never a path
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def plain_name(name: Any, where: str) -> str:
    """``name`` when it is a plain identifier of letters, digits, ``-``, ``_`` and ``.``, starting
    with a letter or digit and without ``..`` (it names a folder of the run layout), else a
    :class:`ConfigError` naming ``where``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ConfigError(f"{where}: expected a plain name of letters, digits, '-', '_' and '.' (starting with "
                          f"a letter or digit, no '..', no path separators: it names a folder under the "
                          f"outputs), got {name!r}")
    return name


def preset_name(name: Any, path: Optional[str] = None) -> str:
    """The preset's ``name`` (default: the file's stem) as :func:`plain_name` checks it: the
    preset's folder ``<outputs>/<name>``."""
    if name is None or name == "":
        if not path:
            return "preset"
        return plain_name(Path(path).stem, f"name (from the file name {Path(path).name!r})")
    return plain_name(name, "name")


def load_preset(path: str | os.PathLike, overrides: Overrides = None) -> Preset:
    """Load a preset YAML file (following ``extends``: :func:`read_preset_file`), apply
    ``key.sub=value`` overrides, validate everything."""
    raw = read_preset_file(path)
    preset = preset_from_dict(apply_overrides(raw, overrides), str(path))
    check_model_overrides(raw, overrides, preset)
    return preset


def check_model_overrides(raw: dict, overrides: Overrides, preset: Preset) -> None:
    """Refuse a ``model.<field>`` override that no model uses (each model of the preset sets that
    field itself, or derives it): it would change nothing, not even the run identity, without a
    word (issue #24). Setting a shared field to the value it already has is allowed."""
    pairs = override_pairs(overrides)
    for i, (key, value, where) in enumerate(pairs):
        if not key.startswith("model.") or value_at(raw, key, _MISSING) == value:
            continue
        others = [(k, v) for j, (k, v, _) in enumerate(pairs) if j != i]
        base = preset_from_dict(apply_overrides(raw, dict(others)), preset.path)
        if all(to_dict(base.model_config(m)) == to_dict(preset.model_config(m)) for m in preset.model_names()):
            field, first = key.split(".", 1)[1], preset.model_names()[0]
            raise ConfigError(f"{where}: changes no model of preset {preset.name!r}: each model sets its own "
                              f"{field} or derives it, so the shared model.{field} is ignored; set it per model "
                              f"(e.g. models.{first}.{field}) or in a derive rule")


_MISSING = object()


class DuplicateKeyError(yaml.YAMLError):
    """A mapping of a YAML file names one key twice."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key written twice in one mapping (plain YAML keeps the
    last one silently: a second ``lr`` or a second ``train:`` section would win without a word)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                continue
            if first != key_node.start_mark.line + 1:
                raise DuplicateKeyError(f"key {key!r} appears twice in one mapping (lines {first} and "
                                        f"{key_node.start_mark.line + 1}); keep one")
        return super().construct_mapping(node, deep)


def read_preset_file(path: str | os.PathLike, _chain: tuple = ()) -> dict:
    """The raw mapping of a preset file. ``extends: other.yaml`` (a path relative to this file)
    starts from that preset's mapping and merges this file's keys into it: mappings key by key,
    everything else (lists, numbers, strings) replaced. So a longer variant of a preset states
    only what it changes (``params/cpu_full.yaml``)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: preset file not found (presets live in params/*.yaml)")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except DuplicateKeyError as e:
        raise ConfigError(f"{path}: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text (UTF-8) YAML file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {_first_line(e)}") from None
    raw = raw or {}
    if not isinstance(raw, dict) or "extends" not in raw:
        return raw
    raw = dict(raw)
    base = raw.pop("extends")
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: extends: expected the path of another preset file (relative to this "
                          f"one), got {base!r}")
    base_path = (path.parent / base).resolve()
    chain = (*_chain, path.resolve())
    if base_path in chain:
        cycle = " -> ".join(p.name for p in (*chain, base_path))
        raise ConfigError(f"{path}: extends: the presets extend each other in a cycle ({cycle})")
    if not base_path.is_file():
        raise ConfigError(f"{path}: extends: {base!r} not found (looked for {base_path})")
    base_raw = read_preset_file(base_path, chain)
    for key, value in raw.items():  # `train:` left empty here would wipe the base's section
        _refuse_null_section(base_raw.get(key) if isinstance(base_raw, dict) else None, str(key), value, str(path))
    return deep_merge(base_raw, raw)


Overrides = Union[None, Sequence[str], Mapping[str, Any]]


def override_pairs(overrides: Overrides, label: str = "--set") -> list[tuple[str, Any, str]]:
    """``overrides`` as ``(dotted key, value, where)`` triples: a mapping ``{"a.b.c": value}`` as it
    is, ``["a.b.c=value", ...]`` with each value parsed as YAML (as ``--set`` gives them); ``where``
    names the item for errors (``label`` prefixes the string form's). A key set twice, by either
    spelling, is a :class:`ConfigError` naming both items (:func:`check_once`)."""
    if not overrides:
        return []
    if isinstance(overrides, Mapping):
        items = [(str(k), v, f"override {k!r}") for k, v in overrides.items()]
        check_once(items)
        return items
    items = []
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(f"{label} {item!r}: not 'key.path=value'; expected key.path=value, "
                              "e.g. train.max_steps=100")
        key, value = item.split("=", 1)
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ConfigError(f"{label} {item!r}: the value is not valid YAML ({_first_line(e)})") from None
        items.append((key.strip(), parsed, f"{label} {item!r}"))
    check_once(items)
    return items


def _leaves(key: str, value: Any) -> list[str]:
    """The dotted keys a setting writes: ``key`` itself, or for a mapping each of its leaves
    (``train={lr: 1, warmup: 2}`` -> ``train.lr``, ``train.warmup``)."""
    if isinstance(value, Mapping) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(f"{key}.{k}", v)]
    return [key]


def check_once(items: Sequence[tuple[str, Any, str]]) -> None:
    """Each key set once, whichever spelling sets it (``train.lr=...`` and ``train={lr: ...}``, or
    the same key twice): a :class:`ConfigError` naming both items, as the same key twice in a
    preset file is (which one was meant cannot be told)."""
    seen: dict = {}
    for key, value, where in items:
        for leaf in _leaves(key, value):
            clash = next((k for k in seen if k == leaf or k.startswith(leaf + ".") or leaf.startswith(k + ".")), None)
            if clash is not None and seen[clash] != where:
                raise ConfigError(f"{where} sets {leaf}, which {seen[clash]} sets too; give each key once")
            seen.setdefault(leaf, where)


def value_at(doc: Mapping, key: str, default: Any = None) -> Any:
    """The value at the dotted ``key`` of a nested mapping (``default`` when it is not there)."""
    node: Any = doc
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def variant_tag(overrides: Overrides, preset: Optional[Preset] = None) -> str:
    """The name of a variant run's directory: its overrides as ``key=value``, sorted, joined by ``,``
    (``{"train.lr": 0.001, "train.max_steps": 66}`` -> ``train.lr=0.001,train.max_steps=66``; a
    mapping by its leaves: ``train={lr: 0.001}`` is ``train.lr=0.001``). With
    ``preset`` (the preset *with* the overrides applied) each value is read back from it, so the
    ``--set`` strings and the dict form of one variant give one name."""
    pairs = override_pairs(overrides)
    if not pairs:
        raise ConfigError("variant_tag: no overrides")
    resolved = to_dict(preset) if preset is not None else None
    leaves = [(leaf, value_at({k: v}, leaf) if leaf != k else v) for k, v, _ in pairs for leaf in _leaves(k, v)]
    parts = []
    for k, v in sorted(leaves, key=lambda kv: kv[0]):
        if resolved is not None:
            v = value_at(resolved, k, v)
        parts.append(f"{k}={v.strip() if isinstance(v, str) else json.dumps(v)}")
    return ",".join(parts).replace("/", "_")


def apply_overrides(raw: dict, overrides: Overrides) -> dict:
    """A copy of the nested mapping ``raw`` with overrides applied (:func:`override_pairs`). A
    mapping set where the preset holds a mapping merges into it key by key (as ``extends`` does:
    ``train={lr: 0.004}`` changes the learning rate and keeps the section's other keys); a value
    of another kind replaces what is there."""
    raw = copy.deepcopy(raw)
    items = override_pairs(overrides)
    for key, value, where in items:
        _refuse_null_section(value_at(raw, key), key, value, where)
        parts = key.split(".")
        node = raw
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{where}: {p!r} is not a section")
        old = node.get(parts[-1])
        node[parts[-1]] = deep_merge(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return raw


#: the preset's sections: mappings even where the file leaves them out
_SECTIONS = ("data", "train", "model", "models", "study")


def _refuse_null_section(old: Any, key: str, value: Any, where: str) -> None:
    """A null set where a section is (a top-level section, or a mapping of the preset such as
    ``models.moe``) is a :class:`ConfigError`: it would silently reset the whole section to its
    defaults. A study knob's null stays allowed: it means the knob's default (documented;
    ``study.noise_split: null`` turns the noise split off)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            _refuse_null_section(old.get(k) if isinstance(old, Mapping) else None, f"{key}.{k}", v, where)
    elif value is None and ((isinstance(old, Mapping) and not key.startswith("study.")) or key in _SECTIONS):
        raise ConfigError(f"{where}: {key} is a section and cannot be set to null (it would reset the whole "
                          f"section to its defaults); set its fields instead, e.g. {key}.<field>=value")


def override(preset: Preset, overrides: Overrides) -> Preset:
    """``preset`` with overrides applied (see :func:`apply_overrides`), re-validated."""
    if not overrides:
        return preset
    raw = to_dict(preset)
    raw.pop("path", None)
    if raw["runs"] == raw["name"]:  # its own runs: a new name moves them with it
        raw.pop("runs")
    varied = preset_from_dict(apply_overrides(raw, overrides), preset.path)
    check_model_overrides(raw, overrides, varied)
    return varied


def with_absolute_paths(preset: Preset) -> Preset:
    """``preset`` with ``data.data_dir`` and ``data.cache_dir`` made absolute from this process's
    working directory: what a process elsewhere (a Dask worker, another machine) must be given.
    Both are execution-only settings, so the runs' identities do not change."""
    d = preset.data
    paths = {k: os.path.abspath(v) for k in ("data_dir", "cache_dir")
             if isinstance(v := getattr(d, k), str) and not os.path.isabs(v)}
    return dataclasses.replace(preset, data=dataclasses.replace(d, **paths)) if paths else preset


def _first_line(e: Exception) -> str:
    return " ".join(str(e).split())[:200]
