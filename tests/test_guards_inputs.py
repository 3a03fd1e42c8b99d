"""Names and inputs that cannot go wrong (issue #33): a preset name is a plain folder name, a data
folder holds one corpus format, ``-p seeds`` has a limit, and the bench's numeric options are
range-checked. Each is one line ``error: ...`` naming the field (exit 2) before anything is
written."""
from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
import yaml

from _tiny import tiny_raw, write_stories
from studylib.cli import main
from studylib.config import ConfigError, load_preset, preset_from_dict
from studylib.data import stories as S
from studylib.config.schema import DataConfig
from studylib.study.runner.parameters import MAX_RUNS, apply_parameters, parse_seeds

ROOT = Path(__file__).resolve().parents[1]
CI = str(ROOT / "params" / "ci.yaml")


def _files(*dirs) -> set:
    return {p for d in dirs for p in Path(d).rglob("*")}


def _call(argv, capsys, *watched) -> str:
    """``main(argv)``: exit 2, one stderr line ``error: ...``, no new files under ``watched``."""
    before = _files(*watched)
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert _files(*watched) == before, "an error path created files"
    return err[0]


@pytest.fixture
def box(scratch, monkeypatch):
    """:func:`scratch` without $STUDYLIB_DATA_DIR."""
    monkeypatch.delenv("STUDYLIB_DATA_DIR", raising=False)
    return scratch


# ---- preset names ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../etc", "a/b", "..", ".", ".hidden", "a\\b", "x..y", "with space", "/abs", 7])
def test_a_preset_name_that_is_not_a_plain_folder_name_is_refused(name):
    with pytest.raises(ConfigError, match=r"^name: expected a plain name") as e:
        preset_from_dict(tiny_raw(name=name))
    assert str(e.value).endswith(f"got {name!r}")


@pytest.mark.parametrize("name", ["ci", "cpu_full", "paper-v2", "tiny.1", "9x"])
def test_plain_preset_names_load(name):
    assert preset_from_dict(tiny_raw(name=name)).name == name


def test_a_bad_name_from_the_command_line_writes_nothing_outside_the_outputs(box, capsys):
    write_stories(box / "data", 50)
    raw = tiny_raw(data={"source": "local", "data_dir": str(box / "data"), "vocab_size": 320, "context": 33})
    (box / "t.yaml").write_text(yaml.safe_dump(raw))
    line = _call(["train", "--params", str(box / "t.yaml"), "--model", "dense", "--set", "name=../../escaped",
                  "--set", "train.max_steps=2"], capsys, box)
    assert line.startswith("error: name: expected a plain name") and "'../../escaped'" in line
    assert not (box.parent / "escaped").exists()  # out/../../escaped


@pytest.mark.parametrize("model", ["../x", "a/b", ".."])
def test_a_model_name_that_is_not_a_plain_folder_name_is_refused(model):
    with pytest.raises(ConfigError, match=r"^models: the model name .* expected a plain name"):
        preset_from_dict(tiny_raw(models={model: {}}))


def test_the_file_name_default_is_checked_too(tmp_path):
    raw = tiny_raw()
    raw.pop("name")
    (tmp_path / "my preset.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"^name \(from the file name 'my preset.yaml'\): expected"):
        load_preset(tmp_path / "my preset.yaml")
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(raw))
    assert load_preset(tmp_path / "mine.yaml").name == "mine"


# ---- one corpus per data folder ---------------------------------------------------------------
def _two_formats(d: Path) -> Path:
    d.mkdir()
    stories = ["Once upon a time.", "The end."]
    with gzip.open(d / "train.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n<|endoftext|>\n".join(stories) + "\n")
    (d / "train.jsonl").write_text("".join(json.dumps({"text": s}) + "\n" for s in stories))
    return d


def test_a_data_folder_with_two_formats_is_refused_naming_both(tmp_path):
    d = _two_formats(tmp_path / "data")
    for source in ("local", "auto"):
        with pytest.raises(S.DataError, match=r"holds training stories in 2 formats \(train\.jsonl, train\.txt\.gz\)"):
            list(S.story_source(DataConfig(source=source, data_dir=str(d)))())
    (d / "train.jsonl").rename(d / "valid.jsonl")  # a held-out file is not read: one corpus again
    assert list(S.story_source(DataConfig(source="local", data_dir=str(d)))()) == ["Once upon a time.", "The end."]


def test_txt_beside_its_gzip_is_two_formats(tmp_path):
    d = tmp_path / "data"
    write_stories(d, 5)
    with gzip.open(d / "train.txt.gz", "wt", encoding="utf-8") as f:
        f.write((d / "train.txt").read_text())
    with pytest.raises(S.DataError, match=r"\(train\.txt, train\.txt\.gz\)"):
        S.data_files(d)


@pytest.mark.parametrize("names", [("train.txt.gz", "train2.txt.gz"), ("a.jsonl", "b.jsonl"),
                                   ("train-00000-of-00002.jsonl", "extra.jsonl"),
                                   ("train-00000-of-00002.jsonl", "other-00001-of-00002.jsonl")])
def test_two_corpus_files_of_one_format_are_refused_naming_them(tmp_path, names):
    d = tmp_path / "data"
    d.mkdir()
    for name in names:
        if name.endswith(".gz"):
            with gzip.open(d / name, "wt", encoding="utf-8") as f:
                f.write("Once upon a time.\n<|endoftext|>\n")
        else:
            (d / name).write_text(json.dumps({"text": "Once upon a time."}) + "\n")
    for source in ("local", "auto"):
        with pytest.raises(S.DataError, match=rf"holds 2 corpus files \({', '.join(sorted(names))}\): a data folder "
                                              "holds one corpus"):
            list(S.story_source(DataConfig(source=source, data_dir=str(d)))())


def test_one_exports_shards_are_read_in_order_and_a_missing_shard_is_refused(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for i in (1, 0, 2):
        (d / f"train-{i:05d}-of-00003.jsonl").write_text(json.dumps({"text": f"story {i}"}) + "\n")
    assert list(S.story_source(DataConfig(source="local", data_dir=str(d)))()) == ["story 0", "story 1", "story 2"]
    (d / "train-00001-of-00003.jsonl").unlink()
    with pytest.raises(S.DataError, match=r"holds 2 of the 3 shards of one export .*; missing: 00001$"):
        S.data_files(d)


def test_the_shared_subset_is_one_corpus_file():
    from conftest import require_subset

    assert [p.name for p in S.data_files(require_subset())] == ["train.txt.gz"]


def test_prepare_data_on_two_formats_is_one_line(box, capsys):
    d = _two_formats(box / "data")
    line = _call(["prepare-data", "--params", CI, "--set", "data.source=local", "--set", f"data.data_dir={d}"],
                 capsys, box)
    assert str(d) in line and "train.jsonl, train.txt.gz" in line


# ---- the seeds parameter ------------------------------------------------------------------
def test_more_seeds_than_the_limit_are_refused_up_front_with_the_count():
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"^seeds: '1-100000' gives 100,000 seeds, at least 100,000 runs, more than the 1,000 runs"):
        parse_seeds("1-100000")
    with pytest.raises(ConfigError, match=r"gives 4,294,967,296 seeds"):
        parse_seeds("0-4294967295")  # refused before a list of 4 billion seeds is built
    assert time.perf_counter() - t0 < 1.0
    with pytest.raises(ConfigError, match=rf"a list of {MAX_RUNS + 1:,} gives"):
        apply_parameters(preset_from_dict(tiny_raw()), list(range(MAX_RUNS + 1)))
    assert len(parse_seeds(f"1-{MAX_RUNS}")) == MAX_RUNS  # as many seeds as the limit: the plan's runs decide


def test_study_with_too_many_seeds_is_one_line_before_any_run(box, capsys):
    line = _call(["study", "--params", CI, "--notebooks", "01", "-p", "seeds", "1-100000", "--no-report"],
                 capsys, box)
    assert "seeds: '1-100000' gives 100,000 seeds" in line


# ---- bench options --------------------------------------------------------------------------
@pytest.mark.parametrize("argv, option", [
    (["train", "--batch", "0"], "--batch"),
    (["train", "--context", "-1"], "--context"),
    (["train", "--rounds", "0"], "--rounds"),
    (["train", "--warmup", "-1"], "--warmup"),
    (["train", "--dropout", "1"], "--dropout"),
    (["train", "--threads", "-2"], "--threads"),
    (["train", "--seed", "-1"], "--seed"),
    (["decode", "--new-tokens", "0"], "--new-tokens"),
    (["decode", "--trials", "x"], "--trials"),
    (["alloc", "--reps", "0"], "--reps"),
])
def test_bench_numeric_options_are_range_checked(box, capsys, argv, option):
    line = _call(["bench", *argv], capsys, box)
    assert f"argument {option}: expected" in line


# ---- the scripts' arguments (issue #49) -------------------------------------------------------
@pytest.mark.parametrize("args, expected", [
    (["--boot", "0"], "argument --boot: expected a positive integer, got '0'"),  # printed coverage of no replicate
    (["--maps", "-1"], "argument --maps: expected a non-negative integer, got '-1'"),  # a KeyError
    (["--held-out", "-1"], "argument --held-out: expected a non-negative integer, got '-1'"),
    (["--jobs", "-3"], "argument --jobs: expected a positive integer, got '-3'"),  # "-3 process(es)"
    (["--maps", "0"], "--maps 0 and --held-out 0: nothing to measure"),  # "0 of 0 points"
])
def test_law_coverage_arguments_are_one_error_line(args, expected):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "law_coverage.py"), *args], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and r.stdout == "", (r.stdout, r.stderr)
    assert err[0].startswith("error: law_coverage.py: ") and expected in err[0], err


def test_law_coverage_caps_its_processes_at_the_cores_and_the_maps():
    """``--jobs 100000`` forked every worker up front (the pool does under fork) and printed nothing
    in 300 s; the processes are capped, and the cap is said in one line."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("law_coverage", ROOT / "scripts" / "law_coverage.py")
    law = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(law)
    assert law.capped_jobs(100_000, 2, 16) == (2, "--jobs 100000: capped at 2 process(es) (16 cores here, 2 maps)")
    assert law.capped_jobs(100_000, 200, 4) == (4, "--jobs 100000: capped at 4 process(es) (4 cores here, 200 maps)")
    assert law.capped_jobs(2, 200, 4) == (2, "")  # what the machine and the work allow stands
    assert law.capped_jobs(3, 1, 1)[0] == 1


def test_gpu_throughput_without_cuda_says_so_in_one_line():
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_throughput.sh")], capture_output=True, text=True,
                       timeout=120, env={**__import__("os").environ, "PY": sys.executable})
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "no CUDA device" in r.stderr, r.stderr
