"""Tests of studylib.run.train_state (what a checkpoint holds) and studylib.run.cadence (which steps
log, evaluate and checkpoint): the cadence against what the training loop writes, the state's
round trip through a checkpoint file, refusals that change nothing, and a run checkpointed by the
code before TrainState existed resuming to the same run."""
from __future__ import annotations

import copy
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from _tiny import comparable, synthetic_data, tiny_preset
from studylib.config import ConfigError, preset_from_dict
from studylib.data.windows import BatchSampler
from studylib.nn.model import Decoder
from studylib.run import checkpoint as C
from studylib.run import trainer as T
from studylib.run.cadence import Cadence
from studylib.run.optim import make_optimizer
from studylib.run.provenance import ProvenanceError
from studylib.run.rundir import RunDir, RunDirConflict
from studylib.run.train_state import TrainState

pytestmark = pytest.mark.usefixtures("one_thread")

LEGACY = Path(__file__).parent / "data" / "legacy_run"  # written by main 6c927cd (see the last test)
LEGACY_RAW = {
    "name": "legacy",
    "data": {"source": "local", "vocab_size": 64, "context": 17},
    "train": {"batch_size": 4, "grad_accum": 2, "lr": 3e-3, "min_lr": 3e-4, "warmup_frac": 0.1,
              "max_steps": 10, "eval_every": 3, "eval_windows": 8, "amp": "off", "device": "cpu"},
    "model": {"d_model": 8, "n_layers": 1, "n_heads": 1, "n_kv_heads": 1, "dropout": 0.1,
              "ffn": {"kind": "moe", "hidden": 8, "num_experts": 2, "top_k": 1, "balance_coef": 0.01}},
    "models": {"moe": {}},
    "seeds": [1],
}


# The fixture's first six steps were computed on the machine that wrote it; fp32 reductions on
# another CPU type differ in the last bits (on the Intel Xeon, grad_norm at step 4 is 0.41188106
# against the fixture's 0.41188109, before any resume), so records and weights are compared to 1e-5. A resume that loses the
# optimizer state, the RNG or the schedule moves them by far more (a 3e-3 learning rate, dropout 0.1).
LEGACY_RTOL = 1e-5


def _assert_close(a, b, path="") -> None:
    """``a == b`` with floats compared to LEGACY_RTOL; everything else (keys, lengths, ints,
    strings, booleans) exactly."""
    if isinstance(a, float) or isinstance(b, float):
        assert b == pytest.approx(a, rel=LEGACY_RTOL, abs=1e-9), f"{path}: {a} != {b}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def legacy_data():
    return synthetic_data(n_windows=120, context=17, vocab=64, seed=3, val=12)


# --------------------------------------------------------------------------------------------
# the cadence
# --------------------------------------------------------------------------------------------
def test_cadence_of_a_small_run_by_hand():
    c = Cadence(total=10, eval_every=4, log_every=3)
    assert c.written_by(10) == {"train": [3, 6, 9], "eval": [4, 8, 10]}
    assert c.written_by(9) == {"train": [3, 6, 9], "eval": [4, 8]}  # the last step's eval is not due yet
    assert c.written_by(0) == {"train": [], "eval": []}
    assert [s for s in range(1, 11) if c.checkpoints(s)] == [4, 8, 10]
    every3 = Cadence(total=10, eval_every=4, log_every=3, checkpoint_every=3)
    assert [s for s in range(1, 11) if every3.checkpoints(s)] == [3, 6, 9, 10]


@pytest.mark.parametrize("eval_every, log_every", [(250, 10), (30, 3), (10, 1), (5, 1), (1, 1)])
def test_log_every_is_a_tenth_of_eval_every_between_1_and_10(eval_every, log_every):
    assert Cadence.of(tiny_preset(train={"eval_every": eval_every}).train, 12).log_every == log_every


def test_the_loop_writes_what_the_cadence_says(tmp_path):
    """Records and checkpoints of a run (log every 2, evaluate every 20 and at 25, checkpoint
    every 7 and at 25) are the steps its cadence names, prefix by prefix."""
    preset = tiny_preset(train={"max_steps": 25, "eval_every": 20, "checkpoint_every": 7, "keep_checkpoints": True,
                                "batch_size": 2, "grad_accum": 1})
    T.train_run(preset, "dense", 1, run_dir=tmp_path, progress=False, data=synthetic_data(n_windows=80, val=8))
    cadence = Cadence.of(preset.train, 25)
    recs = RunDir(tmp_path).read_metrics()
    for done in (6, 19, 20, 24, 25):
        got = {kind: [r["step"] for r in recs if r["kind"] == kind and r["step"] <= done] for kind in ("train", "eval")}
        assert got == cadence.written_by(done)
    assert got == {"train": list(range(2, 25, 2)), "eval": [20, 25]}
    assert [s for s, _ in C.list_snapshots(tmp_path / "checkpoints")] == [7, 14, 21, 25]
    assert [s for s in range(1, 26) if cadence.checkpoints(s)] == [7, 14, 21, 25]


# --------------------------------------------------------------------------------------------
# the training state
# --------------------------------------------------------------------------------------------
def _state(seed: int, amp: str = "fp32", prints=None) -> TrainState:
    preset = tiny_preset()
    torch.manual_seed(seed)
    model = Decoder(preset.model_config("moe"))
    opt = make_optimizer(model, preset.train)
    sampler = BatchSampler(np.arange(64), 1, 8, 2)
    return TrainState(model, opt, sampler, preset.train, 12, config_hash="h", prints=prints or {}, amp=amp)


def _trained(state: TrainState, steps: int) -> TrainState:
    x = torch.randint(0, 256, (2, 9))
    for _ in range(steps):
        out = state.model(x[:, :-1], x[:, 1:], return_logits=False)
        (out.loss + out.aux_loss).backward()
        state.optimizer.step()
        state.optimizer.zero_grad()
    state.step = steps
    state.best, state.clock = {"val_loss": 4.5, "step": 2, "full": False}, {"elapsed_s": 1.5, "train_s": 1.0}
    state.metrics = ['{"kind": "train", "step": 1}\n', '{"kind": "train", "step": 2}\n']
    return state


def _assert_same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def test_state_round_trips_through_a_checkpoint_file(tmp_path):
    src = _trained(_state(seed=1), steps=3)
    random.seed(4), np.random.seed(4), torch.manual_seed(4)
    written = src.state_dict([C.capture_rng()])
    after = (random.random(), np.random.rand(), torch.rand(3))
    C.save(tmp_path / C.LATEST, written)
    dst = _state(seed=2)  # other initial weights, fresh optimizer
    torch.manual_seed(99)
    dst.load_state_dict(C.load(tmp_path / C.LATEST, kind="full"), "run")
    assert (random.random(), np.random.rand()) == after[:2] and torch.equal(torch.rand(3), after[2])
    assert dst.step == 3 and dst.best == src.best and dst.clock == src.clock and dst.final is None
    assert dst.metrics_copy() == "".join(src.metrics)
    _assert_same(dst.state_dict(written["rng_ranks"]), written)  # everything it holds came back
    assert written["scheduler"]["step"] == 3 and written["data_position"]["step"] == 3
    snap = src.snapshot_state_dict()
    assert snap["kind"] == "snapshot" and snap["step"] == 3 and "optimizer" not in snap
    _assert_same(snap["model"], written["model"])


def test_the_header_trainstate_writes_is_read_back_by_the_one_reader(tmp_path):
    """issue #30: the header's keys are read in one place, checkpoint.header, whose record is what
    TrainState wrote; load, peek_step and RunDir read the step and hash through it."""
    src = _trained(_state(seed=1, prints={"corpus_sha256": "aaa"}), steps=3)
    C.save(tmp_path / C.LATEST, src.state_dict([C.capture_rng()]))
    C.save(C.snapshot_path(tmp_path, 3), src.snapshot_state_dict())
    full = C.header(C.load(tmp_path / C.LATEST), tmp_path / C.LATEST)
    assert full == C.Header(kind="full", step=3, config_hash="h", total_steps=12, provenance={"corpus_sha256": "aaa"})
    assert C.header(C.load(C.snapshot_path(tmp_path, 3)), "snap") == C.Header("snapshot", 3, "h", 12,
                                                                                {"corpus_sha256": "aaa"})
    assert C.header({"step": 5, "config_hash": "x"}, "old") == C.Header(None, 5, "x")  # before kind / provenance
    with pytest.raises(C.CheckpointError, match=r"^f\.pt: incomplete checkpoint \(no 'config_hash'\)$"):
        C.header({"step": 1}, "f.pt")
    state = src.state_dict([C.capture_rng()])
    state["step"] = "three"
    C.save(tmp_path / C.LATEST, state)
    with pytest.raises(C.CheckpointError, match=r"latest\.pt: its step 'three' is not an integer"):
        C.load(tmp_path / C.LATEST)
    assert C.peek_step(tmp_path) is None  # latest.pt's step is no number, and there is no prev.pt
    C.save(tmp_path / C.LATEST, src.state_dict([C.capture_rng()]), keep_prev=True)
    assert C.peek_step(tmp_path) == 3


@pytest.mark.parametrize("other", ["amp", "data"])
def test_a_refused_resume_changes_nothing(tmp_path, other):
    saved = _trained(_state(seed=1, prints={"corpus_sha256": "aaa"}), steps=2).state_dict([C.capture_rng()])
    kw = {"amp": "bfloat16"} if other == "amp" else {"prints": {"corpus_sha256": "bbb"}}
    dst = _state(seed=2, **kw)
    before = copy.deepcopy(dst.model.state_dict())
    with pytest.raises(ProvenanceError if other == "data" else ConfigError,
                       match="trained in fp32, but here" if other == "amp" else "corpus"):
        dst.load_state_dict(saved, "run")
    assert dst.step == 0 and dst.metrics is None and not dst.optimizer.state
    _assert_same(dst.model.state_dict(), before)


def test_a_run_checkpointed_by_earlier_code_is_refused_or_resumed_as_marked(tmp_path):
    """``data/legacy_run``: LEGACY_RAW's moe, seed 1, trained by main 6c927cd (before TrainState,
    and before the keyed initial draws) and killed in step 8: its latest.pt (step 6) and
    metrics.jsonl. Its weights were drawn in construction order, so it is another run than this
    code's: refused with one line, nothing written. Marked as this code's (``run.init``), its
    checkpoint of the earlier format still loads and the run resumes to the end, its first records
    kept as written. (That it then equals an uninterrupted run was checked before the keyed draws;
    no earlier-format run of them exists.)"""
    import yaml

    preset = preset_from_dict(LEGACY_RAW)
    res = tmp_path / "res"
    shutil.copytree(LEGACY, res)
    def files():  # but the folder's lock file, which any attempt takes
        return {p.relative_to(res): p.read_bytes() for p in res.rglob("*") if p.is_file() and p.name != ".lock"}

    before = files()
    with pytest.raises(RunDirConflict, match=r"initial weights were drawn another way"):
        T.train_run(preset, "moe", 1, run_dir=res, progress=False, data=legacy_data())
    assert files() == before
    doc = yaml.safe_load((res / "config.yaml").read_text())
    doc["run"]["init"] = "keyed/v1"
    (res / "config.yaml").write_text(yaml.safe_dump(doc))
    written = RunDir(res).read_metrics()
    assert C.load(res / "checkpoints" / C.LATEST)["step"] == 6
    T.train_run(preset, "moe", 1, run_dir=res, progress=False, data=legacy_data())
    after = RunDir(res).read_metrics()
    kept = [r for r in written if r["step"] <= 6]  # what the checkpoint at step 6 had seen
    assert len(after) == 10 + 4 and kept and comparable(after[:len(kept)]) == comparable(kept)
    assert json.loads((res / "summary.json").read_text())["steps"] == 10
