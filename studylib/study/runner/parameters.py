"""The notebook parameters ``seeds`` and ``overrides`` (a seed sweep, or a variant preset under a
name of its own), as :func:`studylib.study.runner.notebooks.notebook_context` applies them: the same
values reach a notebook from ``studylib study -p`` and from plain ``papermill -p``.

Every parameter's value is checked where it is read (:func:`check_parameters`: ``params`` a preset
file, ``jobs`` a positive integer or None, ``seeds`` and ``overrides`` as parsed below, any other
one, e.g. notebook 04's ``model``, a string or None), and a name papermill injected that the
notebook does not declare is refused (:func:`check_notebook`, :mod:`studylib.study.runner.injected`).
"""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from studylib.config import ConfigError, Preset, config_hash, override, override_pairs, to_dict, value_at
from studylib.config.args import seed_error
from studylib.study.orchestration.plan import MAX_RUNS

_SEED_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def parse_seeds(value) -> Optional[list[int]]:
    """The ``seeds`` parameter as a list of seeds, or None (keep the preset's): a list of ints, one
    int, or a string: a range ``"1337-1346"`` (both ends included), a YAML list ``"[1, 2]"``, a
    comma list ``"1,2,3"`` or one seed ``"1337"``. Raises :class:`ConfigError` naming what was
    expected."""
    what = ("seeds: expected a list of integer seeds, a range like '1337-1346', '[1, 2]' or '1,2,3'; "
            f"got {value!r}")
    if value is None:
        return None
    if isinstance(value, str):
        m = _SEED_RANGE.match(value)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise ConfigError(f"seeds: range {value!r} ends before it starts")
            _check_count(hi - lo + 1, value)
            value = list(range(lo, hi + 1))
        else:
            try:
                value = yaml.safe_load(value if "[" in value or "," not in value else f"[{value}]")
            except yaml.YAMLError:
                raise ConfigError(what) from None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(what)
    _check_count(len(value), value)
    for i, v in enumerate(value):
        if seed_error(v, f"seeds[{i}]"):
            raise ConfigError(seed_error(v, f"seeds[{i}]"))
    if len(set(value)) != len(value):
        raise ConfigError(f"seeds: {list(value)} repeats a seed")
    return list(value)


def _check_count(n: int, value) -> None:
    """More seeds than :data:`MAX_RUNS`: a :class:`ConfigError` with the count (before a range is
    expanded into a list): every seed trains at least one run."""
    if n > MAX_RUNS:
        shown = repr(value) if isinstance(value, str) else f"a list of {n:,}"
        raise ConfigError(f"seeds: {shown} gives {n:,} seeds, at least {n:,} runs, more than the {MAX_RUNS:,} runs "
                          f"a study takes (each seed trains every model a notebook compares); give fewer seeds")


def parse_overrides(value) -> dict:
    """The ``overrides`` parameter as ``{"section.key": value}``: a mapping, a list of
    ``"key=value"`` strings (values parsed as YAML, as ``--set`` parses them), one such string, or a
    string holding a YAML mapping / list (what ``papermill -p`` passes). None or empty: ``{}``."""
    if value is None:
        return {}
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return {}
        if "=" in text and not text.startswith(("{", "[")):
            value = [text]
        else:
            try:
                value = yaml.safe_load(text)
            except yaml.YAMLError:
                value = None
            if not isinstance(value, (Mapping, list)):
                raise ConfigError(f"overrides: expected a mapping like {{'train.lr': 0.001}} or a list of "
                                  f"'key=value' strings; got {text!r}")
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return {k: v for k, v, _ in override_pairs(value, label="overrides:")}
    raise ConfigError(f"overrides: expected a mapping or a list of 'key=value' strings; got {value!r}")


def _described(preset: Preset) -> dict:
    raw = to_dict(preset)
    raw.pop("path", None)
    return raw


def apply_parameters(preset: Preset, seeds=None, overrides=None) -> tuple[Preset, dict]:
    """``preset`` with the notebook parameters applied: ``overrides`` (:func:`parse_overrides`)
    through :func:`studylib.config.override`, and ``seeds`` (:func:`parse_seeds`) in place of
    ``preset.seeds``. When the overrides change anything, the preset gets a derived name
    ``<name>-<hash of the overrides, 8 hex>`` (unless they set ``name`` themselves), so its outputs
    and run directories never mix with the base preset's. Returns (preset, the parsed overrides)."""
    ov = parse_overrides(overrides)
    out = override(preset, ov) if ov else preset
    if ov and "name" not in ov and _described(out) != _described(preset):
        # the hash of what the overrides resolve to, so "train.amp=off" and {"train.amp": False} agree
        desc = _described(out)
        resolved = {k: value_at(desc, k, v) for k, v in ov.items()}
        tag = config_hash(resolved)[:8]  # runs of another setting never share the base's runs
        out = dataclasses.replace(out, name=f"{preset.name}-{tag}", runs=f"{preset.runs}-{tag}")
    chosen = parse_seeds(seeds)
    if chosen is not None:
        out = dataclasses.replace(out, seeds=tuple(chosen))
    return out, ov


def check_parameter(name: str, value: Any, root: Optional[os.PathLike] = None) -> None:
    """A :class:`ConfigError` naming notebook parameter ``name`` and what it expects, unless
    ``value`` is one: ``params`` the path of a preset file (from ``root``, the repository, when
    given and the path is relative), ``jobs`` a positive integer or None, ``seeds`` and
    ``overrides`` what :func:`parse_seeds` / :func:`parse_overrides` take, any other (a notebook's
    own, e.g. ``model``, ``run``, ``prompt``) a string or None."""
    if name == "params":
        if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
            raise ConfigError(f"params: expected the path of a preset file, e.g. 'params/ci.yaml'; got {value!r}")
        if root is not None and not (Path(root) / value).is_file():
            raise ConfigError(f"params: {str(value)!r} is not a preset file (a path from the repository root "
                              f"{root}, or absolute; e.g. 'params/ci.yaml')")
    elif name == "jobs":
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"jobs: expected a positive integer or None, got {value!r}")
    elif name == "seeds":
        parse_seeds(value)
    elif name == "overrides":
        parse_overrides(value)
    elif value is not None and not isinstance(value, str):
        raise ConfigError(f"{name}: expected a string or None, got {value!r}")


def check_parameters(values: Mapping[str, Any], root: Optional[os.PathLike] = None) -> None:
    """:func:`check_parameter` of each ``{name: value}``."""
    for name, value in values.items():
        check_parameter(name, value, root)


def check_notebook(root: os.PathLike, params, jobs=None, seeds=None, overrides=None) -> None:
    """What a notebook checks first, before it loads, trains or writes anything: the names
    papermill injected (:func:`studylib.study.runner.injected.check_injected`: one the
    notebook does not declare is refused), then every parameter's value (:func:`check_parameters`:
    these four, and the notebook's own ones papermill injected)."""
    from studylib.study.runner.injected import check_injected

    injected = check_injected()
    check_parameters({**injected, "params": params, "jobs": jobs, "seeds": seeds, "overrides": overrides}, root)
