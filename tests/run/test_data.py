"""Tests of studylib.run.data: sources, tokenizer/token caches, windows, split, CLI."""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

from studylib.run import data as D
from studylib.run import stories as S
from studylib.config import ConfigError, DataConfig

from conftest import require_subset, subset_dir

SUBSET = subset_dir()
needs_subset = pytest.mark.usefixtures("subset")  # skips without the subset, fails under CI
N_STORIES, VOCAB, CONTEXT = 400, 512, 128


def cfg(cache, **kw) -> DataConfig:
    base = dict(source="local", data_dir=str(SUBSET), max_stories=N_STORIES, vocab_size=VOCAB,
                context=CONTEXT, cache_dir=str(cache), tokenizer_threads=2)
    base.update(kw)
    return DataConfig(**base)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def td(cache):
    require_subset()
    return D.load_data(cfg(cache), progress=False)


# ------------------------------------------------------------------ windows and split
@needs_subset
def test_windows_and_split_counts(td):
    s = td.summary()
    n = len(td.tokens) // CONTEXT
    assert n > 100 and s["stories"] == N_STORIES and s["vocab_size"] == VOCAB
    assert s["val_windows"] == round(0.05 * n) and s["train_windows"] == n - s["val_windows"]
    assert s["train_targets"] == s["train_windows"] * (CONTEXT - 1)
    assert s["val_targets"] == s["val_windows"] * (CONTEXT - 1)
    assert s["tokens"] == len(td.tokens) and td.tokens.dtype == np.uint16
    tr, va = set(td.train_idx.tolist()), set(td.val_idx.tolist())
    assert not tr & va and tr | va == set(range(n))
    assert td.train_idx.dtype == np.int64 and np.all(np.diff(td.train_idx) > 0)
    w = td.windows(td.val_idx[:3])
    assert tuple(w.shape) == (3, CONTEXT) and str(w.dtype) == "torch.int64"
    i = int(td.val_idx[1])
    assert w[1].tolist() == td.tokens[i * CONTEXT:(i + 1) * CONTEXT].tolist()
    # every story ends with eos; decoding gives back the text
    sp = td.tokenizer()
    assert int((np.asarray(td.tokens) == sp.eos_id()).sum()) == N_STORIES
    assert td.tokens[-1] == sp.eos_id()
    first = next(S.story_source(cfg("unused"))())
    end = int(np.argmax(np.asarray(td.tokens) == sp.eos_id()))
    assert sp.decode(td.tokens[:end].tolist()) == " ".join(first.split())


def test_split_determinism():
    a = D.split_windows(1000, 0.05, 1337)
    b = D.split_windows(1000, 0.05, 1337)
    c = D.split_windows(1000, 0.05, 1338)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[1], c[1])
    assert len(a[1]) == 50 and len(D.split_windows(10, 0.01, 0)[1]) == 1  # at least one val window
    with pytest.raises(S.DataError, match="at least 2"):
        D.split_windows(1, 0.05, 0)


@needs_subset
def test_split_seed_reuses_cache(td, cache):
    other = D.load_data(cfg(cache, split_seed=7), progress=False)
    assert not other.build["tokenizer_trained"] and not other.build["tokens_built"]
    assert len(other.val_idx) == len(td.val_idx) and not np.array_equal(other.val_idx, td.val_idx)


def test_epoch_order_determinism():
    a, b = D.epoch_order(500, 1, 0), D.epoch_order(500, 1, 0)
    assert np.array_equal(a, b) and np.array_equal(np.sort(a), np.arange(500))
    assert not np.array_equal(a, D.epoch_order(500, 1, 1))
    assert not np.array_equal(a, D.epoch_order(500, 2, 0))


# ------------------------------------------------------------------ caches
@needs_subset
def test_tokenizer_cache_reused_and_keyed(td, cache):
    mtime = td.tokenizer_path.stat().st_mtime_ns
    again = D.load_data(cfg(cache), progress=False)
    assert not again.build["tokenizer_trained"] and not again.build["tokens_built"]
    assert again.tokenizer_path == td.tokenizer_path and td.tokenizer_path.stat().st_mtime_ns == mtime
    assert np.array_equal(again.tokens, td.tokens)
    bigger = D.load_data(cfg(cache, vocab_size=600), progress=False)
    assert bigger.build["tokenizer_trained"] and bigger.tokenizer_path != td.tokenizer_path
    assert bigger.vocab_size == 600
    fewer = D.load_data(cfg(cache, max_stories=N_STORIES - 50), progress=False)  # other corpus
    assert fewer.build["tokenizer_trained"] and fewer.tokenizer_path != td.tokenizer_path
    assert re.fullmatch(r"tokenizer-[0-9a-f]{16}\.model", td.tokenizer_path.name)


@needs_subset
@pytest.mark.parametrize("damage", ["flip", "truncate", "drop_meta"])
def test_corrupt_token_cache_is_rebuilt(tmp_path, damage):
    first = D.load_data(cfg(tmp_path), progress=False)
    ref = np.array(first.tokens)
    bin_path = Path(first.tokens.filename)
    del first
    raw = bytearray(bin_path.read_bytes())
    if damage == "flip":
        raw[1000] ^= 0xFF
        raw[-3] ^= 0x01
        bin_path.write_bytes(bytes(raw))
    elif damage == "truncate":
        bin_path.write_bytes(bytes(raw[:-2]))
    else:
        bin_path.with_suffix(".json").unlink()
    with pytest.warns(D.CacheWarning, match="rebuilding"):
        again = D.load_data(cfg(tmp_path), progress=False)
    assert again.build["tokens_built"] and not again.build["tokenizer_trained"]
    assert np.array_equal(np.asarray(again.tokens), ref)
    meta = json.loads(bin_path.with_suffix(".json").read_text())
    assert meta["n_tokens"] == len(ref) and bin_path.stat().st_size == 2 * len(ref)


# ------------------------------------------------------------------ errors
@needs_subset
def test_vocab_too_large_names_maximum(tmp_path):
    with pytest.raises(S.DataError) as e:
        D.load_data(cfg(tmp_path, vocab_size=30008), progress=False)
    msg = str(e.value)
    assert isinstance(e.value, ConfigError) and "data.vocab_size=30008" in msg
    top = int(re.search(r"at most ([\d,]+)", msg).group(1).replace(",", ""))
    assert VOCAB < top < 30008
    assert D.load_data(cfg(tmp_path, vocab_size=top), progress=False).vocab_size == top


def test_hub_offline_env_fails_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(S.DataError) as e:
        D.load_data(DataConfig(source="hub", cache_dir=str(tmp_path)), progress=False)
    msg = str(e.value)
    assert "unreachable" in msg and "HF_HUB_OFFLINE" in msg
    assert "STUDYLIB_DATA_DIR" in msg and "data_dir" in msg and "train.txt.gz" in msg


def test_hub_unreachable_probe(tmp_path, monkeypatch):
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://127.0.0.1:9")  # nothing listens there
    with pytest.raises(S.DataError, match=r"127\.0\.0\.1:9\) is unreachable"):
        D.load_data(DataConfig(source="hub", cache_dir=str(tmp_path)), progress=False)
    # auto with an empty data_dir falls back to the hub and says the dir was empty
    with pytest.raises(S.DataError, match="holds no data files"):
        D.load_data(DataConfig(source="auto", data_dir=str(tmp_path), cache_dir=str(tmp_path)),
                    progress=False)


def test_hub_loading_code_path(monkeypatch):
    """The hub branch, with the network replaced by an in-memory dataset."""
    import datasets

    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    seen = {}

    def fake_load(name, split):
        seen.update(name=name, split=split)
        return datasets.Dataset.from_dict({"text": [" a story ", "", "another"], "x": [1, 2, 3]})

    monkeypatch.setattr(S, "_reachable", lambda host, port, timeout=3.0: None)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    got = list(S.story_source(DataConfig(source="hub", max_stories=3))())
    assert got == ["a story", "another"] and seen == {"name": "roneneldan/TinyStories", "split": "train[:3]"}


def test_missing_or_empty_dir(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(S.DataError, match=re.escape(str(missing)) + ".*does not exist.*jsonl"):
        D.load_data(DataConfig(source="local", data_dir=str(missing), cache_dir=str(tmp_path)))
    (tmp_path / "notes.md").write_text("hi")
    (tmp_path / "valid.txt").write_text("ignored\n<|endoftext|>\n")
    with pytest.raises(S.DataError, match="holds no data files.*parquet"):
        D.load_data(DataConfig(source="local", data_dir=str(tmp_path), cache_dir=str(tmp_path)))


# ------------------------------------------------------------------ sources
STORIES = ["Once upon a time.\nThe end.", "Tom had a “red” ball.", "Ça va? Oui!\n\nBye."]


def _write_all_formats(root: Path) -> dict[str, Path]:
    txt = "".join(s + "\n<|endoftext|>\n" for s in [STORIES[0], "  ", STORIES[1]]) + STORIES[2] + "\n"
    dirs = {k: root / k for k in ("txt", "gz", "jsonl", "parquet")}
    for d in dirs.values():
        d.mkdir()
        (d / "validation.txt").write_text("not used\n<|endoftext|>\n")
    (dirs["txt"] / "train.txt").write_text(txt, encoding="utf-8")
    with gzip.open(dirs["gz"] / "train.txt.gz", "wt", encoding="utf-8") as f:
        f.write(txt.replace("\n", "\r\n"))
    (dirs["jsonl"] / "a.jsonl").write_text(
        "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate([STORIES[0], ""])))
    (dirs["jsonl"] / "b.jsonl").write_text(
        "".join(json.dumps({"text": f" {t} "}) + "\n" for t in STORIES[1:]) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": STORIES, "n": [1, 2, 3]}), dirs["parquet"] / "train.parquet")
    return dirs


def test_all_local_formats_give_same_stories(tmp_path):
    for kind, d in _write_all_formats(tmp_path).items():
        got = [s.replace("\r\n", "\n") for s in S.story_source(DataConfig(source="local", data_dir=str(d)))()]
        assert got == STORIES, kind
        auto = list(S.story_source(DataConfig(source="auto", data_dir=str(d), max_stories=2))())
        assert len(auto) == 2, kind


@needs_subset
def test_jsonl_and_txt_sources_match(tmp_path):
    stories = list(S.story_source(cfg(tmp_path, max_stories=300))())
    assert len(stories) == 300
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "train.jsonl").write_text("".join(json.dumps({"text": s}) + "\n" for s in stories))
    a = D.load_data(cfg(tmp_path / "c", max_stories=300), progress=False)
    b = D.load_data(cfg(tmp_path / "c", data_dir=str(tmp_path / "j"), max_stories=None), progress=False)
    assert b.build["corpus_sha256"] == a.build["corpus_sha256"]
    assert not b.build["tokenizer_trained"] and not b.build["tokens_built"]  # same corpus: cache hit


# ------------------------------------------------------------------ CLI
@needs_subset
def test_prepare_data_cli_json(tmp_path, monkeypatch, capsys):
    from studylib.cli import main

    for k in ("STUDYLIB_DATA_DIR", "STUDYLIB_CACHE_DIR"):
        monkeypatch.delenv(k, raising=False)
    (tmp_path / "params").mkdir()
    p = tmp_path / "params" / "t.yaml"
    p.write_text(f"data: {{source: local, data_dir: {SUBSET}, cache_dir: {tmp_path / 'cache'}, "
                 f"vocab_size: 700}}\nmodels: {{tiny: {{}}}}\n")
    rc = main(["prepare-data", "--params", str(p), "--set", f"data.max_stories={N_STORIES}",
               "--set", "data.context=256", "--json"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out)
    assert s["stories"] == N_STORIES and s["vocab_size"] == 700 and s["context"] == 256
    assert s["val_windows"] == round(0.05 * (s["tokens"] // 256)) and s["tokens_per_s"] > 0
    assert main(["prepare-data", "--params", str(p), "--set", "data.vocab_size=40000"]) == 2
    assert "data.vocab_size=40000" in capsys.readouterr().err
