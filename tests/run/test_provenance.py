"""A run's weights, tokenizer and corpus are proven to belong together (issue #24): every
checkpoint carries the run's config hash and the fingerprints of its corpus and tokenizer, and
resume, generate and export refuse what is not the run's with one line, exit 2, nothing written;
a moved data cache still works (fingerprints, not paths)."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from _tiny import tiny_raw, write_stories
from studylib.cli import main
from studylib.run import checkpoint as C
from studylib.run.rundir import RunDir
from studylib.storage.files import sha256_file

pytestmark = pytest.mark.usefixtures("one_thread")


def _preset(path, data_dir, cache):
    raw = tiny_raw(data={"source": "local", "data_dir": str(data_dir), "cache_dir": str(cache), "vocab_size": 320,
                         "context": 33, "val_fraction": 0.2, "tokenizer_threads": 1},
                   train={"max_steps": 6, "eval_every": 3, "lr": 1e-2, "min_lr": 1e-3})
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two finished runs (seeds 1 and 2) on corpus A, and a corpus B of other stories."""
    root = tmp_path_factory.mktemp("prov")
    write_stories(root / "A", 400, seed=0)
    write_stories(root / "B", 400, seed=7)
    params = _preset(root / "tiny.yaml", root / "A", root / "cacheA")
    with pytest.MonkeyPatch.context() as mp:
        for k in ("STUDYLIB_DATA_DIR", "STUDYLIB_CACHE_DIR"):
            mp.delenv(k, raising=False)
        for seed in (1, 2):
            assert main(["train", "--params", params, "--model", "dense", "--seed", str(seed),
                         "--run-dir", str(root / f"run{seed}"), "--no-progress"]) == 0
    return root, params


@pytest.fixture
def box(world, tmp_path, monkeypatch):
    root, params = world
    monkeypatch.chdir(tmp_path)
    for k in ("STUDYLIB_DATA_DIR", "STUDYLIB_CACHE_DIR"):
        monkeypatch.delenv(k, raising=False)
    run = tmp_path / "run"
    shutil.copytree(root / "run1", run)
    return root, params, run


def _files(*dirs) -> dict:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for d in dirs for p in d.rglob("*") if p.is_file() and p.name != ".lock"}


def _refused(argv, capsys, *watched) -> str:
    before = _files(*watched)
    rc = main(argv)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    errors = [ln for ln in err if ln.startswith("error: ")]  # train also prints its precision line
    assert rc == 2 and len(errors) == 1 and err[-1] == errors[0], err
    assert not any("Traceback" in ln for ln in err)
    assert _files(*watched) == before, "a refused command changed files"
    return errors[0]


def test_runs_record_their_fingerprints(world):
    root, _ = world
    rd = RunDir(root / "run1")
    prints = rd.fingerprints()
    tok = rd.summary()["data"]["tokenizer"]
    assert prints["tokenizer_sha256"] == sha256_file(tok) and len(prints["corpus_sha256"]) == 64
    state = C.load(rd.checkpoints / C.LATEST)
    assert state["provenance"] == prints
    assert RunDir(root / "run2").fingerprints() == prints  # same corpus, same tokenizer


def test_a_checkpoint_of_another_run_is_refused(box, capsys, tmp_path):
    root, _, run = box
    shutil.copy(root / "run2" / "checkpoints" / C.LATEST, run / "checkpoints" / C.LATEST)  # seed 2's weights
    h1, h2 = RunDir(root / "run1").summary()["config_hash"], RunDir(root / "run2").summary()["config_hash"]
    for argv in (["generate", "--run", str(run), "--max-new-tokens", "2"],
                 ["export", "--run", str(run), "--out", str(tmp_path / "hf")]):
        line = _refused(argv, capsys, run, tmp_path)
        assert h1 in line and h2 in line and "another run" in line
    assert not (tmp_path / "hf").exists()


def test_a_checkpoint_with_other_fingerprints_is_refused(box, capsys, tmp_path):
    _, _, run = box
    path = run / "checkpoints" / C.LATEST
    state = C.load(path)
    state["provenance"] = dict(state["provenance"], corpus_sha256="f" * 64)
    C.save(path, state)
    line = _refused(["generate", "--run", str(run), "--max-new-tokens", "2"], capsys, run)
    assert "not this run's checkpoint" in line and "ffffffffffff" in line


def test_a_foreign_tokenizer_is_never_used(box, capsys, tmp_path):
    """The recorded tokenizer is gone and the cache holds another corpus's tokenizer of the same
    vocab size: not found (before: packed without a word); given explicitly: refused."""
    root, _, run = box
    other = _preset(tmp_path / "b.yaml", root / "B", tmp_path / "cacheB")
    assert main(["prepare-data", "--params", other]) == 0
    capsys.readouterr()
    (foreign,) = (tmp_path / "cacheB").glob("tokenizer-*.model")
    summ = json.loads((run / "summary.json").read_text())
    summ["data"]["tokenizer"] = str(tmp_path / "gone.model")
    (run / "summary.json").write_text(json.dumps(summ))
    env_cache = tmp_path / "cacheB"
    import os
    os.environ["STUDYLIB_CACHE_DIR"] = str(env_cache)
    try:
        line = _refused(["export", "--run", str(run), "--out", str(tmp_path / "hf")], capsys, run)
        assert "tokenizer was not found" in line
        line = _refused(["export", "--run", str(run), "--out", str(tmp_path / "hf"), "--tokenizer", str(foreign)],
                        capsys, run)
        assert str(foreign) in line and "not the tokenizer" in line
        line = _refused(["generate", "--run", str(run), "--tokenizer", str(foreign)], capsys, run)
        assert "not the tokenizer" in line
    finally:
        del os.environ["STUDYLIB_CACHE_DIR"]
    assert not (tmp_path / "hf").exists()


def test_a_moved_data_cache_still_works(box, capsys, tmp_path, monkeypatch):
    """Fingerprints, not paths: the recorded tokenizer's folder is moved; the run's tokenizer is
    found in the cache named by STUDYLIB_CACHE_DIR by its sha256."""
    root, _, run = box
    moved = tmp_path / "moved_cache"
    shutil.copytree(root / "cacheA", moved)
    summ = json.loads((run / "summary.json").read_text())
    summ["data"]["tokenizer"] = str(tmp_path / "old_place" / "tokenizer.model")
    (run / "summary.json").write_text(json.dumps(summ))
    monkeypatch.setenv("STUDYLIB_CACHE_DIR", str(moved))
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert main(["generate", "--run", str(run), "--max-new-tokens", "2", "--seed", "1"]) == 0
    assert RunDir(run).tokenizer_path().parent == moved


def test_resuming_on_another_corpus_is_refused(box, capsys, tmp_path, monkeypatch):
    """A run stopped after its last checkpoint and resumed with STUDYLIB_DATA_DIR pointing at
    other stories (before: trained on, and only the new tokenizer recorded)."""
    root, params, run = box
    (run / "summary.json").unlink()  # unfinished: the next train resumes from its checkpoint
    monkeypatch.setenv("STUDYLIB_DATA_DIR", str(root / "B"))
    monkeypatch.setenv("STUDYLIB_CACHE_DIR", str(tmp_path / "cacheB"))
    line = _refused(["train", "--params", params, "--model", "dense", "--seed", "1", "--run-dir", str(run),
                     "--no-progress"], capsys, run)
    assert "other data" in line and "corpus (story texts) sha256" in line and str(run) in line
    monkeypatch.setenv("STUDYLIB_DATA_DIR", str(root / "A"))  # the run's own stories: resumes and finishes
    assert main(["train", "--params", params, "--model", "dense", "--seed", "1", "--run-dir", str(run),
                 "--no-progress"]) == 0
    assert RunDir(run).summary()["best_val_loss"] == RunDir(root / "run1").summary()["best_val_loss"]


# --------------------------------------------------------------------------------------------
# the code that trained a run (issue #33)
# --------------------------------------------------------------------------------------------
def _copy_package(dest):
    from studylib.run.provenance import PACKAGE

    shutil.copytree(PACKAGE, dest / "studylib", ignore=shutil.ignore_patterns("__pycache__"))
    return dest / "studylib"


def test_the_code_fingerprint_is_the_source_not_its_place(tmp_path):
    """The same source at another path has this process's fingerprint; one constant changed in
    lr_at (the issue's other checkout) gives another; a bytecode cache does not count."""
    from studylib.run.provenance import code_sha256

    here = code_sha256()
    a = _copy_package(tmp_path / "a")
    (a / "run" / "__pycache__").mkdir(exist_ok=True)
    (a / "run" / "__pycache__" / "optim.cpython-311.pyc").write_bytes(b"stale")
    assert code_sha256(a) == here
    b = _copy_package(tmp_path / "b")
    optim = b / "run" / "optim.py"
    text = optim.read_text()
    assert "(1.0 + math.cos(math.pi * p))" in text
    optim.write_text(text.replace("(1.0 + math.cos(math.pi * p))", "(1.0 + math.cos(math.pi * p * 0.9))"))
    assert code_sha256(b) != here
    (a / "run" / "optim.py").rename(a / "run" / "optim2.py")  # a renamed file is other code too
    assert code_sha256.__wrapped__(a) != here


def test_runs_record_the_code_torch_and_threads_that_trained_them(world):
    import torch

    from studylib.run.provenance import code_sha256

    root, _ = world
    rd = RunDir(root / "run1")
    prints, summary = rd.fingerprints(), rd.summary()
    assert prints["code_sha256"] == code_sha256() and prints["torch_version"] == torch.__version__
    assert prints["torch_threads"] == summary["torch_threads"] >= 1
    assert C.load(rd.checkpoints / C.LATEST)["provenance"] == prints


def test_resuming_under_other_code_is_refused(box, capsys):
    """A run stopped at step 3 of 6 whose checkpoint another studylib trained: refused, one line,
    nothing written; with its own code's fingerprint it resumes and ends as the uninterrupted run."""
    root, params, run = box
    (run / "summary.json").unlink()
    latest, prev = run / "checkpoints" / C.LATEST, run / "checkpoints" / "prev.pt"
    state = C.load(prev)
    assert state["step"] == 3 and state.get("final") is None
    own = state["provenance"]["code_sha256"]
    state["provenance"] = dict(state["provenance"], code_sha256="c" * 64)
    C.save(latest, state)
    argv = ["train", "--params", params, "--model", "dense", "--seed", "1", "--run-dir", str(run), "--no-progress"]
    line = _refused(argv, capsys, run)
    assert str(run) in line and "other code" in line and f"studylib code sha256 {'c' * 12} -> {own[:12]}" in line
    state["provenance"]["code_sha256"] = own
    C.save(latest, state)
    assert main(argv) == 0
    assert RunDir(run).summary()["best_val_loss"] == RunDir(root / "run1").summary()["best_val_loss"]


def _rebuild_under_threads(params, run, threads: int) -> None:
    """``studylib train`` over a finished run without its summary, in a process set to ``threads``
    torch threads (the summary is rebuilt from the last checkpoint)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert main(["train", "--params", params, "--model", "dense", "--seed", "1", "--run-dir", str(run),
                     "--no-progress"]) == 0
    finally:
        torch.set_num_threads(n)


def test_a_rebuilt_summary_records_the_trainings_threads(box, capsys):
    """The summary is gone, the last checkpoint is there: the run is not retrained, its summary is
    rebuilt, and it records the threads (and code) that trained it, not the rebuilding process's."""
    root, params, run = box
    trained = RunDir(root / "run1").summary()
    (run / "summary.json").unlink()
    _rebuild_under_threads(params, run, trained["torch_threads"] + 1)
    rebuilt = RunDir(run).summary()
    assert rebuilt["torch_threads"] == trained["torch_threads"]
    assert rebuilt["provenance"] == trained["provenance"]
    assert rebuilt["best_val_loss"] == trained["best_val_loss"]


def test_a_summary_rebuilt_from_a_checkpoint_without_threads_records_none_not_the_rebuilders(box, capsys):
    """A last checkpoint written before the thread count was recorded: the rebuilt summary cannot
    know the training's threads and says so (None), instead of this process's count."""
    import torch

    root, params, run = box
    (run / "summary.json").unlink()
    latest = run / "checkpoints" / C.LATEST
    state = C.load(latest)
    assert state.get("final") is not None
    state["provenance"] = {k: v for k, v in state["provenance"].items() if k != "torch_threads"}
    C.save(latest, state)
    _rebuild_under_threads(params, run, torch.get_num_threads() + 1)
    rebuilt = RunDir(run).summary()
    assert rebuilt["torch_threads"] is None and "torch_threads" not in rebuilt["provenance"]
