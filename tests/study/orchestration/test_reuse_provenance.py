"""A study never mixes runs of two corpora (issue #24's last gap): a finished run is reused only
when the stories its preset reads now have the corpus fingerprint the run recorded."""
from __future__ import annotations

import json

import pytest
import yaml

from _tiny import ensure_runs, tiny_raw, write_stories
from studylib.config import ConfigError, DataConfig, load_preset
from studylib.data.split import fingerprint_now
from studylib.run.provenance import ProvenanceError
from studylib.study.analysis.frames import runs_frame

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_finished_run_is_not_reused_on_other_stories(tmp_path, monkeypatch):
    write_stories(tmp_path / "A", 300, seed=0)
    write_stories(tmp_path / "B", 300, seed=7)
    raw = tiny_raw(data={"source": "local", "data_dir": str(tmp_path / "A"), "cache_dir": str(tmp_path / "cache"),
                         "vocab_size": 320, "context": 33, "val_fraction": 0.2, "tokenizer_threads": 1},
                   train={"max_steps": 4, "eval_every": 2})
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.delenv("STUDYLIB_DATA_DIR", raising=False)
    monkeypatch.delenv("STUDYLIB_CACHE_DIR", raising=False)
    p = load_preset(tmp_path / "t.yaml")
    ensure_runs(p, ["dense"], [1], jobs=1, progress=False)
    summary = next((tmp_path / "out").rglob("summary.json"))
    recorded = json.loads(summary.read_text())["provenance"]["corpus_sha256"]
    assert recorded == fingerprint_now(p.data)
    before = summary.stat().st_mtime_ns
    assert len(ensure_runs(p, ["dense"], [1], jobs=1, progress=False)) == 1  # same stories: reused

    monkeypatch.setenv("STUDYLIB_DATA_DIR", str(tmp_path / "B"))  # other stories behind the same preset
    other = load_preset(tmp_path / "t.yaml")
    with pytest.raises(ProvenanceError) as e:
        ensure_runs(other, ["dense"], [1], jobs=1, progress=False)
    msg = str(e.value)
    assert isinstance(e.value, ConfigError) and "\n" not in msg  # the CLI prints it as one line, exit 2
    assert f"corpus (story texts) sha256 {recorded[:12]} -> {fingerprint_now(other.data)[:12]}" in msg
    assert str(summary.parent) in msg and "STUDYLIB_DATA_DIR" in msg
    assert summary.stat().st_mtime_ns == before  # nothing retrained or rewritten


def test_a_hub_corpus_is_not_re_read_for_the_check(tmp_path):
    assert fingerprint_now(DataConfig(source="hub")) is None
    assert fingerprint_now(DataConfig(source="auto", data_dir=str(tmp_path))) is None  # no files: the hub


def test_finished_runs_another_code_trained_are_reused_and_flagged_in_one_line(tmp_path, monkeypatch, capsys):
    """Issue #33: reusing a run another studylib (or torch) trained, or one trained before code
    fingerprints were recorded, is flagged (how many, which), not refused: nothing retrained."""
    write_stories(tmp_path / "A", 300, seed=0)
    raw = tiny_raw(data={"source": "local", "data_dir": str(tmp_path / "A"), "cache_dir": str(tmp_path / "cache"),
                         "vocab_size": 320, "context": 33, "val_fraction": 0.2, "tokenizer_threads": 1},
                   train={"max_steps": 4, "eval_every": 2})
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("STUDYLIB_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.delenv("STUDYLIB_DATA_DIR", raising=False)
    monkeypatch.delenv("STUDYLIB_CACHE_DIR", raising=False)
    p = load_preset(tmp_path / "t.yaml")
    ensure_runs(p, ["dense"], [1, 2, 3], jobs=1, progress=False)
    capsys.readouterr()
    ensure_runs(p, ["dense"], [1, 2, 3], jobs=1, progress=False)
    assert "warning" not in capsys.readouterr().err  # this code trained them all: nothing to flag

    summaries = {s: next((tmp_path / "out").rglob(f"seed{s}/summary.json")) for s in (1, 2, 3)}
    for seed, edit in ((1, lambda prov: prov.update(code_sha256="e" * 64)),  # another checkout
                       (2, lambda prov: prov.pop("code_sha256"))):  # trained before the fingerprint existed
        doc = json.loads(summaries[seed].read_text())
        edit(doc["provenance"])
        summaries[seed].write_text(json.dumps(doc))
    before = {s: f.stat().st_mtime_ns for s, f in summaries.items()}
    df = runs_frame(ensure_runs(p, ["dense"], [1, 2, 3], jobs=1, progress=False))
    assert list(df["seed"]) == [1, 2, 3]
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: 2 finished run(s) reused"), lines
    assert "1 trained by other studylib code or torch (seed1)" in lines[0]
    assert "1 trained before code fingerprints were recorded (seed2)" in lines[0] and "seed3" not in lines[0]
    assert {s: f.stat().st_mtime_ns for s, f in summaries.items()} == before  # reused, not retrained
