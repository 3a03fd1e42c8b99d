"""No run is reused without its identity (issue #33): a run directory with a summary or a
checkpoint but no ``config.yaml``, or whose summary was written under another config hash than
its ``config.yaml`` holds, is refused with one line naming the folder, by the trainer, the sweep
and the frames (never a row of a table)."""
from __future__ import annotations

import shutil

import pytest
import yaml

from _tiny import ensure_runs, tiny_raw, write_stories
from studylib.cli import main
from studylib.config import load_preset, run_document
from studylib.run.rundir import RunDir, RunDirConflict
from studylib.study.analysis.frames import collect_runs

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A genuine finished run (6 steps) of model dense, seed 1, in its preset's outputs layout."""
    root = tmp_path_factory.mktemp("guards_rundir")
    write_stories(root / "data", 400)
    raw = tiny_raw(data={"source": "local", "data_dir": str(root / "data"), "cache_dir": str(root / "cache"),
                         "vocab_size": 320, "context": 33, "val_fraction": 0.2, "tokenizer_threads": 1},
                   train={"max_steps": 6, "eval_every": 3, "lr": 1e-2, "min_lr": 1e-3})
    (root / "params").mkdir()
    (root / "params" / "tiny.yaml").write_text(yaml.safe_dump(raw))
    with pytest.MonkeyPatch.context() as mp:
        for k in ("STUDYLIB_DATA_DIR", "STUDYLIB_CACHE_DIR", "STUDYLIB_OUTPUTS"):
            mp.delenv(k, raising=False)
        assert main(["train", "--params", str(root / "params" / "tiny.yaml"), "--model", "dense", "--seed", "1",
                     "--no-progress"]) == 0
    return root


@pytest.fixture
def box(trained, tmp_path, monkeypatch):
    """A copy of the trained world: (the preset, its run directory of dense seed 1)."""
    for k in ("STUDYLIB_DATA_DIR", "STUDYLIB_CACHE_DIR", "STUDYLIB_OUTPUTS"):
        monkeypatch.delenv(k, raising=False)
    root = tmp_path / "w"
    shutil.copytree(trained, root)
    preset = load_preset(root / "params" / "tiny.yaml")
    rd = RunDir.of(preset, "dense", 1)
    assert rd.finished() and rd.config_path.is_file() and rd.path.is_relative_to(root)
    return preset, rd


def _one_line(argv, capsys) -> str:
    rc = main(argv)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_the_genuine_run_is_read_and_reused(box):
    preset, rd = box
    df = collect_runs(preset, ["dense"], [1])
    assert list(df["seed"]) == [1] and df.loc[0, "best_val_loss"] == rd.summary()["best_val_loss"]
    assert [s.seed for s in ensure_runs(preset, ["dense"], [1], jobs=1, progress=False)] == [1]


def test_a_run_without_its_config_is_refused_everywhere(box, capsys):
    preset, rd = box
    rd.config_path.unlink()
    with pytest.raises(RunDirConflict, match=f"{rd.path}: holds summary.json and checkpoints/ but no config.yaml"):
        collect_runs(preset, ["dense"], [1])
    with pytest.raises(RunDirConflict, match="no config.yaml"):
        ensure_runs(preset, ["dense"], [1], jobs=1, progress=False)
    line = _one_line(["train", "--params", preset.path, "--model", "dense", "--seed", "1", "--no-progress"], capsys)
    assert str(rd.path) in line and "no config.yaml" in line
    assert not rd.config_path.exists()  # refused before anything was written


def test_a_checkpoint_without_a_config_is_refused(box, capsys):
    preset, rd = box
    rd.config_path.unlink()
    rd.summary_path.unlink()  # an unfinished run: only its checkpoints and metrics remain
    line = _one_line(["train", "--params", preset.path, "--model", "dense", "--seed", "1", "--no-progress"], capsys)
    assert f"{rd.path}: holds checkpoints/ but no config.yaml" in line


def test_another_seeds_run_copied_in_without_its_config_is_refused(box):
    """The issue's case: a run copied into another run's folder, its config.yaml deleted; its loss
    went into the per-seed table."""
    preset, rd = box
    other = RunDir.of(preset, "dense", 2)
    shutil.copytree(rd.path, other.path)
    other.config_path.unlink()
    with pytest.raises(RunDirConflict, match=f"{other.path}: holds summary.json"):
        collect_runs(preset, ["dense"], [1, 2])


def test_a_summary_of_another_run_beside_a_config_is_refused(box):
    """seed 2's own config, seed 1's summary (another config hash): the folder mixes two runs."""
    preset, rd = box
    other = RunDir.of(preset, "dense", 2)
    other.path.mkdir(parents=True)
    other.write_config(run_document(preset, preset.model_config("dense"), "dense", 2))
    shutil.copy(rd.summary_path, other.summary_path)
    with pytest.raises(RunDirConflict, match=f"{other.summary_path}: written by a run with config hash "
                                             f"{rd.summary()['config_hash']}.*mixes two runs"):
        collect_runs(preset, ["dense"], [2])
    with pytest.raises(RunDirConflict, match="mixes two runs"):
        ensure_runs(preset, ["dense"], [2], jobs=1, progress=False)
