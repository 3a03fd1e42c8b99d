"""Tests of studylib.data (the pipeline): sources, split by story (no leak), tokenizer/token caches, windows, CLI."""
from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from studylib.data import cache as C, pipeline as P, split as SP, tokenizer as TK, tokens as TF, windows as W
from studylib.data import stories as S
from studylib.data.stories import DataError
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
    return P.load_data(cfg(cache), progress=False)


# ------------------------------------------------------------------ split by story, windows per side
def _norm(sp, text: str) -> str:
    """``text`` as the token file holds it (SentencePiece's normalisation, byte fallback: exact)."""
    return sp.decode(sp.encode(text))


def _side_texts(td, sp, side: str) -> list[str]:
    """The stories of one side of the token file (each stored as ``story <eos>``), decoded."""
    toks = np.asarray(td.side_tokens(side)).astype(np.int64)
    ends = np.flatnonzero(toks == sp.eos_id())
    assert len(toks) and ends[-1] == len(toks) - 1  # a side holds whole stories
    return [sp.decode(toks[a:b].tolist()) for a, b in zip(np.r_[0, ends[:-1] + 1], ends)]


def _assert_windows_stay_in_their_side(td):
    t, ctx = td.n_train_tokens, td.context
    ts, vs = td.window_starts(td.train_idx), td.window_starts(td.val_idx)
    assert np.all(ts + ctx <= t) and np.all(vs >= t) and np.all(vs + ctx <= len(td.tokens))
    assert np.array_equal(ts, np.arange(len(ts)) * ctx) and np.array_equal(vs, t + np.arange(len(vs)) * ctx)


@needs_subset
def test_windows_and_split_counts(td):
    s = td.summary()
    t, n = td.n_train_tokens, len(td.tokens)
    assert s["stories"] == N_STORIES and s["vocab_size"] == VOCAB and td.tokens.dtype == np.uint16
    assert s["val_stories"] == round(0.05 * N_STORIES) and s["train_stories"] + s["val_stories"] == N_STORIES
    assert s["train_tokens"] == t and s["val_tokens"] == n - t and s["tokens"] == n
    assert s["train_windows"] == t // CONTEXT and s["val_windows"] == (n - t) // CONTEXT
    assert s["train_windows"] > 100 and s["val_windows"] > 5
    assert td.n_windows == s["train_windows"] + s["val_windows"]
    assert s["train_targets"] == s["train_windows"] * (CONTEXT - 1)
    assert s["val_targets"] == s["val_windows"] * (CONTEXT - 1)
    assert np.array_equal(td.train_idx, np.arange(s["train_windows"]))
    assert np.array_equal(td.val_idx, np.arange(s["train_windows"], td.n_windows))
    assert td.train_idx.dtype == np.int64 and td.val_idx.dtype == np.int64
    _assert_windows_stay_in_their_side(td)
    # window T + j is the j-th window of the validation region
    w = td.windows(td.val_idx[:3])
    assert tuple(w.shape) == (3, CONTEXT) and str(w.dtype) == "torch.int64"
    assert w[1].tolist() == td.tokens[t + CONTEXT:t + 2 * CONTEXT].tolist()
    assert td.windows(td.train_idx[-1:])[0].tolist() == td.tokens[t // CONTEXT * CONTEXT - CONTEXT:
                                                                   t // CONTEXT * CONTEXT].tolist()
    with pytest.raises(IndexError, match="out of range"):
        td.windows([td.n_windows])
    # every story ends with eos, each side ends with one; decoding gives back the text
    sp = td.tokenizer()
    assert int((np.asarray(td.side_tokens("train")) == sp.eos_id()).sum()) == s["train_stories"]
    assert int((np.asarray(td.side_tokens("val")) == sp.eos_id()).sum()) == s["val_stories"]
    assert td.tokens[t - 1] == sp.eos_id() and td.tokens[-1] == sp.eos_id()
    stories = list(S.story_source(cfg("unused"))())
    first_train = stories[int(np.argmin(SP.split_stories(N_STORIES, 0.05, 1337)))]
    end = int(np.argmax(np.asarray(td.tokens) == sp.eos_id()))
    assert sp.decode(td.tokens[:end].tolist()) == " ".join(first_train.split())


@needs_subset
def test_sides_are_the_split_of_the_corpus(td):
    """The token file's two sides are exactly the training and the validation stories of the
    split, in corpus order: disjoint by story, and together the whole corpus."""
    sp = td.tokenizer()
    stories = [_norm(sp, x) for x in S.story_source(cfg("unused"))()]
    is_val = SP.split_stories(len(stories), 0.05, 1337)
    train, val = _side_texts(td, sp, "train"), _side_texts(td, sp, "val")
    assert train == [x for x, v in zip(stories, is_val) if not v]
    assert val == [x for x, v in zip(stories, is_val) if v]
    assert len(train) + len(val) == N_STORIES and sorted(train + val) == sorted(stories)


@needs_subset
def test_no_validation_text_in_any_training_window(td):
    """No 60-character piece of a validation story appears in a decoded training window (pieces
    that also occur in some training story, TinyStories' stock phrases, prove nothing and are
    skipped). Under the window split, every validation story shared text with training windows."""
    sp = td.tokenizer()
    stories = [_norm(sp, x) for x in S.story_source(cfg("unused"))()]
    is_val = SP.split_stories(len(stories), 0.05, 1337)
    train_stories = "\n".join(x for x, v in zip(stories, is_val) if not v)
    windows = "\n".join(sp.decode(w) for w in td.windows(td.train_idx).tolist())
    checked = 0
    for story in (x for x, v in zip(stories, is_val) if v):
        for piece in (story[i:i + 60] for i in range(0, len(story) - 59, 30)):
            if piece not in train_stories:
                assert piece not in windows, piece
                checked += 1
    assert checked > 20 * 10  # most of the validation text is unique to it: the check has teeth


# a tiny synthetic corpus: every story carries a unique tag; the validation stories (by the split
# of split_seed 1337) also hold a word whose letters 'z' and 'f' occur nowhere in training text
N_TINY, TINY_VAL = 60, 0.2
WORDS = ("the a cat dog sun ran big little happy sad tree park ball girl boy mom saw said play jump "
         "red").split()
VAL_WORD = "zebrafish"


def _tag(i: int) -> str:
    return "x" + "".join("bcdgmnop"[(i // 8 ** k) % 8] for k in range(2)) + "x"


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    import random

    rng = random.Random(0)
    is_val = SP.split_stories(N_TINY, TINY_VAL, 1337)
    stories = [f"{_tag(i)} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 60)))
               + (f" {VAL_WORD}" * 5 if v else "") + "." for i, v in enumerate(is_val)]
    root = tmp_path_factory.mktemp("tiny")
    (root / "data").mkdir()
    (root / "data" / "train.txt").write_text("\n<|endoftext|>\n".join(stories) + "\n")
    return root, stories, is_val


def _tiny_cfg(root, **kw) -> DataConfig:
    base = dict(source="local", data_dir=str(root / "data"), vocab_size=300, context=32,
                val_fraction=TINY_VAL, cache_dir=str(root / "cache"), tokenizer_threads=2)
    return DataConfig(**dict(base, **kw))


def test_tiny_corpus_split_by_story_without_leak(tiny_corpus):
    root, stories, is_val = tiny_corpus
    td = P.load_data(_tiny_cfg(root), progress=False)
    sp, s = td.tokenizer(), td.summary()
    assert (s["train_stories"], s["val_stories"]) == (48, 12) and int(is_val.sum()) == 12
    assert s["train_windows"] == td.n_train_tokens // 32
    assert s["val_windows"] == (len(td.tokens) - td.n_train_tokens) // 32
    _assert_windows_stay_in_their_side(td)
    assert _side_texts(td, sp, "val") == [_norm(sp, x) for x, v in zip(stories, is_val) if v]
    train_text = " ".join(sp.decode(w) for w in td.windows(td.train_idx).tolist())
    val_text = " ".join(sp.decode(w) for w in td.windows(td.val_idx).tolist())
    assert not [i for i in range(N_TINY) if is_val[i] and _tag(i) in train_text]
    assert VAL_WORD not in train_text and VAL_WORD in val_text
    # the check can see a story: the training tags are there (but those cut by a window edge)
    assert sum(_tag(i) in train_text for i in range(N_TINY) if not is_val[i]) >= 40
    assert sum(_tag(i) in val_text for i in range(N_TINY) if is_val[i]) >= 8


def test_tokenizer_is_trained_on_the_training_stories_only(tiny_corpus, tmp_path):
    root, stories, is_val = tiny_corpus
    td = P.load_data(_tiny_cfg(root), progress=False)
    sp = td.tokenizer()
    # letters that only validation stories hold are no pieces: byte fallback encodes them
    assert {"z", "f"} & {sp.id_to_piece(i) for i in range(sp.get_piece_size())} == set()
    assert "<0x7A>" in sp.encode(VAL_WORD, out_type=str)
    # exactly the model SentencePiece trains on the training stories; not the one on all stories
    TK.train_tokenizer([x for x, v in zip(stories, is_val) if not v], 300, tmp_path / "train.model", 2)
    TK.train_tokenizer(stories, 300, tmp_path / "all.model", 2)
    ours = td.tokenizer_path.read_bytes()
    assert ours == (tmp_path / "train.model").read_bytes() != (tmp_path / "all.model").read_bytes()
    assert "z" in TK.load_tokenizer(tmp_path / "all.model").encode(VAL_WORD, out_type=str)


def test_a_killed_writers_temp_files_are_removed_and_a_live_ones_kept(tiny_corpus, tmp_path):
    """issue #24: a killed prepare-data left a 0-byte temporary file in the cache that nothing
    removed. The next load removes the temporary files whose writer is gone (the pid in the name),
    and leaves those of a writer still running (two processes may fill one cache)."""
    import subprocess
    import sys

    root, _, _ = tiny_corpus
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()  # a pid that has exited
    cache = tmp_path / "cache"
    cache.mkdir()
    dead = cache / f".tmp-tokenizer-0123.model.{gone}"
    live = cache / f".tmp-tokens-4567.bin.{os.getpid()}"
    dead.touch()
    live.touch()
    P.load_data(_tiny_cfg(root, cache_dir=str(cache)), progress=False)
    assert not dead.exists() and live.exists()


def test_two_tokenizers_swapped_in_the_cache_are_refused_naming_the_file(tiny_corpus, tmp_path):
    """Each cached tokenizer's sha256 is recorded under its name when it is trained; a file whose
    own sha is not its name's (two cache files swapped) is refused, naming it: a run trained (and
    recorded) with the other tokenizer, and decoded with it, before (issue #49)."""
    root, _, _ = tiny_corpus
    cache = tmp_path / "cache"
    a = P.load_data(_tiny_cfg(root, cache_dir=str(cache)), progress=False)
    b = P.load_data(_tiny_cfg(root, cache_dir=str(cache), vocab_size=320), progress=False)
    pa, pb = a.tokenizer_path, b.tokenizer_path
    assert pa != pb and TK.sha_path(pa).read_text().strip() == a.build["tokenizer_sha256"]
    assert P.load_data(_tiny_cfg(root, cache_dir=str(cache)), progress=False).build["tokenizer_sha256"] == \
        a.build["tokenizer_sha256"]  # intact: reused
    ta, tb = pa.read_bytes(), pb.read_bytes()
    pa.write_bytes(tb)
    pb.write_bytes(ta)
    with pytest.raises(DataError, match=rf"^{re.escape(str(pa))}: its sha256 {b.build['tokenizer_sha256'][:12]} is "
                                        rf"not the {a.build['tokenizer_sha256'][:12]} recorded"):
        P.load_data(_tiny_cfg(root, cache_dir=str(cache)), progress=False)


def test_a_cached_tokenizer_without_its_record_gets_one(tiny_corpus, tmp_path):
    root, _, _ = tiny_corpus
    cache = tmp_path / "cache"
    a = P.load_data(_tiny_cfg(root, cache_dir=str(cache)), progress=False)
    TK.sha_path(a.tokenizer_path).unlink()  # a cache from before the record was kept
    again = P.load_data(_tiny_cfg(root, cache_dir=str(cache)), progress=False)
    assert not again.build["tokenizer_trained"]
    assert TK.sha_path(a.tokenizer_path).read_text().strip() == a.build["tokenizer_sha256"]


def test_window_split_caches_are_never_reused(tiny_corpus, tmp_path):
    """Caches under the keys of the window split (before story/v1) are ignored, not loaded."""
    from _tiny import tiny_tokenizer

    root, stories, _ = tiny_corpus
    c = _tiny_cfg(root, cache_dir=str(tmp_path))
    corpus, _ = S.fingerprint(S.story_source(c)())
    old_tok = C.cache_key("tokenizer", corpus, c.vocab_size, TK.SPM_OPTIONS)
    old_tokens = C.cache_key("story+eos/v1", old_tok, "uint16")
    planted, _ = tiny_tokenizer(tmp_path, f"tokenizer-{old_tok}")
    before = planted.read_bytes()
    (tmp_path / f"tokens-{old_tokens}.bin").write_bytes(np.arange(4096, dtype=np.uint16).tobytes())
    td = P.load_data(c, progress=False)
    assert td.build["tokenizer_trained"] and td.build["tokens_built"]
    assert td.build["tokenizer_key"] != old_tok and td.build["tokens_key"] != old_tokens
    assert td.tokenizer_path != planted and planted.read_bytes() == before
    meta = json.loads(Path(td.tokens.filename).with_suffix(".json").read_text())
    assert meta["format"] == TF.TOKEN_FORMAT and meta["split"]["format"] == "story/v1"
    assert (meta["n_train_stories"], meta["n_val_stories"]) == (48, 12)
    assert meta["n_train_tokens"] == td.n_train_tokens


def test_split_determinism():
    a, b, c = (SP.split_stories(1000, 0.05, s) for s in (1337, 1337, 1338))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.dtype == bool and a.sum() == 50 and c.sum() == 50
    assert SP.split_stories(10, 0.01, 0).sum() == 1 and SP.split_stories(10, 0.99, 0).sum() == 9
    assert SP.split_stories(2, 0.5, 0).sum() == 1
    with pytest.raises(S.DataError, match="at least 2"):
        SP.split_stories(1, 0.05, 0)
    assert np.array_equal(W.split_windows(300, 1000, 128)[0], [0, 1])
    assert np.array_equal(W.split_windows(300, 1000, 128)[1], [2, 3, 4, 5, 6])  # 700 val tokens
    with pytest.raises(S.DataError, match="validation stories hold 100 tokens.*data.val_fraction"):
        W.split_windows(900, 1000, 128)
    with pytest.raises(S.DataError, match="training stories hold 100 tokens"):
        W.split_windows(100, 1000, 128)


@needs_subset
def test_split_seed_changes_the_split_and_the_caches(td, cache):
    other = P.load_data(cfg(cache, split_seed=7), progress=False)
    assert other.build["tokenizer_trained"] and other.build["tokens_built"]  # the split is in the keys
    assert other.n_val_stories == td.n_val_stories and other.n_stories == td.n_stories
    sp, osp = td.tokenizer(), other.tokenizer()
    assert set(_side_texts(td, sp, "val")) != set(_side_texts(other, osp, "val"))
    again = P.load_data(cfg(cache), progress=False)  # back to 1337: cached, same split
    assert not again.build["tokenizer_trained"] and not again.build["tokens_built"]
    assert np.array_equal(np.asarray(again.tokens), np.asarray(td.tokens))
    assert again.n_train_tokens == td.n_train_tokens


def test_epoch_order_determinism():
    a, b = W.epoch_order(500, 1, 0), W.epoch_order(500, 1, 0)
    assert np.array_equal(a, b) and np.array_equal(np.sort(a), np.arange(500))
    assert not np.array_equal(a, W.epoch_order(500, 1, 1))
    assert not np.array_equal(a, W.epoch_order(500, 2, 0))


# ------------------------------------------------------------------ caches
@needs_subset
def test_tokenizer_cache_reused_and_keyed(td, cache):
    mtime = td.tokenizer_path.stat().st_mtime_ns
    again = P.load_data(cfg(cache), progress=False)
    assert not again.build["tokenizer_trained"] and not again.build["tokens_built"]
    assert again.tokenizer_path == td.tokenizer_path and td.tokenizer_path.stat().st_mtime_ns == mtime
    assert np.array_equal(again.tokens, td.tokens)
    bigger = P.load_data(cfg(cache, vocab_size=600), progress=False)
    assert bigger.build["tokenizer_trained"] and bigger.tokenizer_path != td.tokenizer_path
    assert bigger.vocab_size == 600
    fewer = P.load_data(cfg(cache, max_stories=N_STORIES - 50), progress=False)  # other corpus
    assert fewer.build["tokenizer_trained"] and fewer.tokenizer_path != td.tokenizer_path
    assert re.fullmatch(r"tokenizer-[0-9a-f]{16}\.model", td.tokenizer_path.name)


@needs_subset
@pytest.mark.parametrize("damage", ["flip", "truncate", "drop_meta", "no_boundary", "bad_boundary"])
def test_corrupt_token_cache_is_rebuilt(tmp_path, damage):
    first = P.load_data(cfg(tmp_path), progress=False)
    ref, boundary = np.array(first.tokens), first.n_train_tokens
    bin_path = Path(first.tokens.filename)
    meta_path = bin_path.with_suffix(".json")
    del first
    raw = bytearray(bin_path.read_bytes())
    if damage == "flip":
        raw[1000] ^= 0xFF
        raw[-3] ^= 0x01
        bin_path.write_bytes(bytes(raw))
    elif damage == "truncate":
        bin_path.write_bytes(bytes(raw[:-2]))
    elif damage == "drop_meta":
        meta_path.unlink()
    else:  # a sidecar without the train/val boundary (as before the split by story), or a wrong one
        meta = json.loads(meta_path.read_text())
        if damage == "no_boundary":
            del meta["n_train_tokens"]
        else:
            meta["n_train_tokens"] = meta["n_tokens"] + 1
        meta_path.write_text(json.dumps(meta))
    with pytest.warns(C.CacheWarning, match="rebuilding"):
        again = P.load_data(cfg(tmp_path), progress=False)
    assert again.build["tokens_built"] and not again.build["tokenizer_trained"]
    assert np.array_equal(np.asarray(again.tokens), ref) and again.n_train_tokens == boundary
    meta = json.loads(meta_path.read_text())
    assert meta["n_tokens"] == len(ref) and bin_path.stat().st_size == 2 * len(ref)


# ------------------------------------------------------------------ errors
@needs_subset
def test_vocab_too_large_names_maximum(tmp_path):
    with pytest.raises(S.DataError) as e:
        P.load_data(cfg(tmp_path, vocab_size=30008), progress=False)
    msg = str(e.value)
    assert isinstance(e.value, ConfigError) and "data.vocab_size=30008" in msg
    top = int(re.search(r"at most ([\d,]+)", msg).group(1).replace(",", ""))
    assert VOCAB < top < 30008
    assert P.load_data(cfg(tmp_path, vocab_size=top), progress=False).vocab_size == top


def test_hub_offline_env_fails_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(S.DataError) as e:
        P.load_data(DataConfig(source="hub", cache_dir=str(tmp_path)), progress=False)
    msg = str(e.value)
    assert "unreachable" in msg and "HF_HUB_OFFLINE" in msg
    assert "STUDYLIB_DATA_DIR" in msg and "data_dir" in msg and "train.txt.gz" in msg


def test_hub_unreachable_probe(tmp_path, monkeypatch):
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://127.0.0.1:9")  # nothing listens there
    with pytest.raises(S.DataError, match=r"127\.0\.0\.1:9\) is unreachable"):
        P.load_data(DataConfig(source="hub", cache_dir=str(tmp_path)), progress=False)
    # auto with an empty data_dir falls back to the hub and says the dir was empty
    with pytest.raises(S.DataError, match="holds no data files"):
        P.load_data(DataConfig(source="auto", data_dir=str(tmp_path), cache_dir=str(tmp_path)),
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
        P.load_data(DataConfig(source="local", data_dir=str(missing), cache_dir=str(tmp_path)))
    (tmp_path / "notes.md").write_text("hi")
    (tmp_path / "valid.txt").write_text("ignored\n<|endoftext|>\n")
    with pytest.raises(S.DataError, match="holds no data files.*parquet"):
        P.load_data(DataConfig(source="local", data_dir=str(tmp_path), cache_dir=str(tmp_path)))


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
    (dirs["jsonl"] / "train-00000-of-00002.jsonl").write_text(  # one export's two shards
        "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate([STORIES[0], ""])))
    (dirs["jsonl"] / "train-00001-of-00002.jsonl").write_text(
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
    a = P.load_data(cfg(tmp_path / "c", max_stories=300), progress=False)
    b = P.load_data(cfg(tmp_path / "c", data_dir=str(tmp_path / "j"), max_stories=None), progress=False)
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
    assert s["split"] == "story/v1" and s["tokens_per_s"] > 0
    assert (s["train_stories"], s["val_stories"]) == (N_STORIES - 20, 20)
    assert s["train_tokens"] + s["val_tokens"] == s["tokens"]
    assert s["train_windows"] == s["train_tokens"] // 256 and s["val_windows"] == s["val_tokens"] // 256
    assert s["val_targets"] == 255 * s["val_windows"]
    assert main(["prepare-data", "--params", str(p), "--set", f"data.max_stories={N_STORIES}",
                 "--set", "data.context=256"]) == 0
    out = capsys.readouterr().out
    assert f"train: {N_STORIES - 20} stories, {s['train_tokens']:,} tokens, {s['train_windows']:,} windows" in out
    assert f"val:   20 stories, {s['val_tokens']:,} tokens, {s['val_windows']:,} windows, " \
           f"{s['val_targets']:,} target tokens" in out
    assert main(["prepare-data", "--params", str(p), "--set", "data.vocab_size=40000"]) == 2
    assert "data.vocab_size=40000" in capsys.readouterr().err


def test_shared_data_loads_each_data_section_once_per_process(monkeypatch):
    import dataclasses

    loads = []
    monkeypatch.setattr(P, "load_data", lambda cfg, progress=True: loads.append(cfg) or object())
    a, b = DataConfig(), dataclasses.replace(DataConfig(), context=65)
    first = P.shared_data(a)
    assert P.shared_data(dataclasses.replace(a)) is first  # an equal section: the same data, not reloaded
    assert P.shared_data(b) is not first and loads == [a, b]


# ------------------------------------------------------------------ a fraction of the training stories
def test_a_fraction_of_the_training_stories_reads_their_windows_and_nothing_else_changes(td, cache):
    """data.train_fraction (the map's repetition cells): the windows of the first stories only; the
    tokenizer, the token file, the validation windows and the bytes per token are the whole corpus's."""
    half = P.load_data(cfg(cache, train_fraction=0.5), progress=False)
    assert half.tokenizer_path == td.tokenizer_path and half.tokens.filename == td.tokens.filename
    assert np.array_equal(half.val_idx, td.val_idx) and half.bytes_per_token() == td.bytes_per_token()
    k = round(0.5 * td.n_train_stories)
    assert half.n_train_stories == k
    sp = td.tokenizer()
    train = np.asarray(td.side_tokens("train"))
    used = int(np.flatnonzero(train == sp.eos_id())[k - 1]) + 1  # the end of the k-th story
    assert half.summary()["train_tokens"] == used and np.array_equal(half.train_idx, td.train_idx[: used // CONTEXT])
    assert half.summary()["train_targets"] == (used // CONTEXT) * (CONTEXT - 1) < td.summary()["train_targets"]
    with pytest.raises(ConfigError, match=r"data\.train_fraction: must be in \(0, 1\]"):
        P.load_data(cfg(cache, train_fraction=1.5), progress=False)


def test_bytes_per_token_is_the_validation_texts_bytes_over_its_tokens(td):
    from studylib.data.split import read_corpus, side_stories, split_stories

    c = cfg(Path("/nonexistent"))
    stories, _, n = read_corpus(c)
    raw = list(side_stories(stories, split_stories(n, c.val_fraction, c.split_seed), "val"))
    assert td.summary()["val_bytes"] == td.val_bytes == sum(len(t.encode("utf-8")) for t in raw)
    decoded = _side_texts(td, td.tokenizer(), "val")  # the token file's validation side, decoded
    assert td.val_bytes == pytest.approx(sum(len(t.encode("utf-8")) for t in decoded), rel=0.01)
    assert td.bytes_per_token() == td.val_bytes / len(td.side_tokens("val"))
