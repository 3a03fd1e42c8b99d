"""Every preset plans every comparison it runs: ``studylib study``'s plan
(:func:`studylib.study.runner.notebooks.plan_study`) under each file of ``params/``, over its
``study.notebooks`` (absent: every notebook), resolves every run and counts its steps without
training one. A comparison whose keys a preset lacks fails here, naming the key and the preset,
not in a user's run of that preset."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from _tiny import add_toy_comparison
from conftest import ROOT, require_subset
from studylib.config import ConfigError, load_preset
from studylib.run.spec import epoch_steps
from studylib.study.runner.notebooks import find_notebooks, plan_study, preset_notebooks

PRESETS = sorted((ROOT / "params").glob("*.yaml"))
#: the training windows of one epoch of full TinyStories (the paper preset's data, from the hub:
#: not on a test machine), as params/paper.yaml's header states them, and its steps
PAPER_WINDOWS, PAPER_STEPS = 834_322, 26_073


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def plan_preset(path: Path, notebook_dir: Path, monkeypatch, cache: Path):
    """(the notebooks, the study's plan) of the preset at ``path`` with its notebooks found in
    ``notebook_dir``, into empty outputs: a preset on the shared TinyStories subset counts its
    epoch from it, one on the full corpus (``max_stories: null``) from :data:`PAPER_WINDOWS`."""
    monkeypatch.setenv("STUDYLIB_CACHE_DIR", str(cache))
    preset = load_preset(path)
    if preset.data.max_stories is None:
        monkeypatch.setattr("studylib.data.pipeline.shared_data",
                            lambda cfg, progress=False: SimpleNamespace(train_idx=range(PAPER_WINDOWS)))
        assert epoch_steps(preset) == PAPER_STEPS
    else:
        monkeypatch.setenv("STUDYLIB_DATA_DIR", str(require_subset()))
    nbs = find_notebooks(notebook_dir, preset_notebooks(preset), "study.notebooks")
    return nbs, plan_study(preset, nbs)


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_every_preset_plans_every_comparison_it_runs(path, tmp_path, monkeypatch, cache):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.chdir(ROOT)
    nbs, (parts, planned) = plan_preset(path, ROOT / "notebooks", monkeypatch, cache)
    assert [c.notebook for c, _, _ in parts] == [py.stem for py in nbs]  # each selected notebook's comparison
    assert [g for _, _, gs in parts for g in gs] == list(planned.grids)
    # nothing trained yet: every run of the plan is missing, each once, with its steps
    assert len(planned.missing) == planned.runs == len(planned.steps) and min(planned.steps.values()) >= 1


def test_a_new_comparison_whose_keys_a_preset_lacks_fails_here(tmp_path, monkeypatch, cache):
    """A toy comparison added as docs/architecture.md says, its keys in no preset: params/ci.yaml
    (no study.notebooks: every notebook, the toy's too) refuses it naming the key and the preset."""
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.chdir(ROOT)
    add_toy_comparison(tmp_path / "plugins", monkeypatch)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for py in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        (notebooks / py.name).symlink_to(py)
    (notebooks / "15_toy.py").write_text("")
    with pytest.raises(ConfigError, match=r"^study\.toy_models: missing from preset 'ci'"):
        plan_preset(ROOT / "params" / "ci.yaml", notebooks, monkeypatch, cache)
