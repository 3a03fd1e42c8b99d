"""Training a plan (plan_runs, then train_plan: _tiny.ensure_runs): finished runs are reused, a run
directory holding another config is refused, grids share one queue (in this process; the Dask
engine's tests are test_cluster.py)."""
from __future__ import annotations

import pytest
from _tiny import ensure_grids, ensure_runs, synthetic_data, tiny_preset
from studylib.config import ConfigError, run_document
from studylib.run import spec
from studylib.run.rundir import RunDir, RunDirConflict
from studylib.study.analysis.frames import runs_frame
from studylib.study.orchestration.plan import Grid


def _fake_finished_run(preset, model, seed, loss):
    rd = RunDir.of(preset, model, seed)
    rd.path.mkdir(parents=True, exist_ok=True)
    rd.write_config(run_document(preset, preset.model_config(model), model, seed))
    rd.write_summary({"model": model, "seed": seed, "best_val_loss": loss, "final_val_loss": loss, "tokens": 10,
                      "finished": True, "params": {"total": 5}})
    return rd


def test_a_plan_reuses_finished_runs_without_training(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    p = tiny_preset()
    for s, loss in ((1, 2.0), (2, 2.5)):
        _fake_finished_run(p, "dense", s, loss)

    def no_data(*a, **k):
        raise AssertionError("nothing to train: the data must not be loaded")

    monkeypatch.setattr("studylib.data.pipeline.load_data", no_data)
    df = runs_frame(ensure_runs(p, ["dense", "dense"], [1, 2], jobs=2, progress=False))
    assert list(df["seed"]) == [1, 2] and list(df["best_val_loss"]) == [2.0, 2.5]
    assert df.loc[0, "params_total"] == 5


def test_a_plan_refuses_a_run_dir_with_another_config(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    p = tiny_preset()
    other = tiny_preset(train={"lr": 1e-3})  # same name, same run dir, another config in it
    _fake_finished_run(other, "dense", 1, 2.0)
    with pytest.raises(RunDirConflict):
        ensure_runs(p, ["dense"], [1], progress=False)


def test_a_plan_names_every_refused_folder_in_one_line(tmp_path, monkeypatch):
    """Runs of an earlier code (here: drawn before the keyed init) are refused all at once: the
    first folder's reason, then how many more and under which folder; nothing is trained."""
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    p = tiny_preset()
    for m, s in (("dense", 1), ("dense", 2), ("moe", 1)):
        rd = _fake_finished_run(p, m, s, 2.0)
        doc = rd.read_config()
        del doc["run"]["init"]
        rd.write_config(doc)
    with pytest.raises(RunDirConflict) as e:
        ensure_runs(p, ["dense", "moe"], [1, 2], progress=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.count("initial weights were drawn another way") == 1
    assert msg.endswith(f"And 2 more run folder(s) of this plan under {tmp_path / 'out' / p.name / 'runs'} hold another "
                        "run (each refused alike; delete them, or that folder, to retrain)")
    assert not RunDir.of(p, "moe", 2).path.exists()


def test_variant_runs_live_apart_and_an_unchanged_identity_reuses_the_base_run(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    p = tiny_preset()
    base = RunDir.of(p, "dense", 1).path

    def run_dir(overrides, tag=None):
        return spec.RunSpec.resolve(p, "dense", 1, overrides, tag).run_dir

    assert run_dir({"train.lr": p.train.lr}) == base  # same identity
    assert run_dir({"train.eval_every": p.train.eval_every}) == base
    lr = run_dir({"train.lr": 1e-3, "train.max_steps": 6})
    assert lr == base.parent / "train.lr=0.001,train.max_steps=6" / "seed1"
    assert run_dir(["train.max_steps=6", "train.lr=1e-3"]).parent.name == \
        "train.lr=0.001,train.max_steps=6"  # the --set form names the same variant
    assert run_dir({"train.lr": 1e-3}, tag="lowlr") == base.parent / "lowlr" / "seed1"
    with pytest.raises(ConfigError, match="tag"):
        run_dir({"train.lr": 1e-3}, tag="a/b")


def test_a_plan_trains_a_variant_into_its_own_dir_and_reuses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.setattr("studylib.data.pipeline.load_data", lambda *a, **k: synthetic_data())
    p = tiny_preset(train={"max_steps": 4, "eval_every": 2})
    _fake_finished_run(p, "dense", 1, 2.0)  # the base run: must stay untouched
    over = spec.budget_overrides(p, 0.5)
    assert over == {"train.max_steps": 2} and spec.budget_overrides(p, 1) == {}
    df = runs_frame(ensure_runs(p, ["dense"], [1], jobs=1, overrides=over, progress=False))
    rd = spec.RunSpec.resolve(p, "dense", 1, over).rundir
    assert rd.path != RunDir.of(p, "dense", 1).path and rd.finished()
    assert int(df.loc[0, "steps"]) == 2 and df.loc[0, "best_val_loss"] != 2.0
    assert RunDir.of(p, "dense", 1).summary()["best_val_loss"] == 2.0

    def no_data(*a, **k):
        raise AssertionError("the variant is finished: nothing may train again")

    monkeypatch.setattr("studylib.data.pipeline.load_data", no_data)
    again = runs_frame(ensure_runs(p, ["dense"], [1], jobs=1, overrides=over, progress=False))
    assert again.loc[0, "best_val_loss"] == df.loc[0, "best_val_loss"]


def test_budget_of_a_fraction_of_an_epoch_counts_the_training_windows(monkeypatch):
    data = synthetic_data()
    monkeypatch.setattr("studylib.data.pipeline.load_data", lambda *a, **k: data)
    p = tiny_preset(train={"max_steps": None})
    assert len(data.train_idx) == 376 and p.train.batch_size * p.train.grad_accum == 16
    assert spec.epoch_steps(p) == 24  # 23.5 batches: the last, partial one is kept
    assert spec.budget_overrides(p, 3.0) == {"train.max_steps": 72}
    assert spec.budget_overrides(p, 0.25) == {"train.max_steps": 6}
    with pytest.raises(ConfigError, match="epochs"):
        spec.budget_overrides(p, 0)


def test_grids_share_one_queue_longest_runs_first(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.setattr("studylib.data.pipeline.load_data", lambda *a, **k: synthetic_data())
    order = []

    def fake_train_run(preset, model, seed, run_dir=None, progress=True, data=None):
        order.append((model, seed, preset.train.max_steps))
        rd = RunDir(run_dir)
        rd.path.mkdir(parents=True, exist_ok=True)
        rd.write_config(run_document(preset, preset.model_config(model), model, seed))
        rd.write_summary({"model": model, "seed": seed, "best_val_loss": float(preset.train.max_steps),
                          "finished": True})

    monkeypatch.setattr("studylib.run.trainer.train_run", fake_train_run)
    p = tiny_preset()  # 12 steps; the moe has more training FLOPs per token than the dense model
    grids = [Grid(["dense", "moe"], [1], {"train.max_steps": 3}), Grid(["dense", "moe"], [1]),
             Grid(["moe"], [1, 2], {"train.max_steps": 6})]
    frames = [runs_frame(specs) for specs in ensure_grids(p, grids, jobs=1, progress=False)]
    assert order == [("moe", 1, 12), ("dense", 1, 12), ("moe", 1, 6), ("moe", 2, 6), ("moe", 1, 3), ("dense", 1, 3)]
    assert [list(f["best_val_loss"]) for f in frames] == [[3.0, 3.0], [12.0, 12.0], [6.0, 6.0]]
