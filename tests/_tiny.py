"""Shared tiny fixtures for trainer tests: a synthetic TokenData look-alike and a tiny preset.

Importable from tests (``from _tiny import ...``) and from subprocess scripts that put
``tests/`` on ``sys.path``.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from studylib.config import Preset, preset_from_dict

VOCAB, CONTEXT = 256, 33  # 32 input tokens per window


@dataclass
class SyntheticData:
    """The parts of :class:`studylib.data.windows.TokenData` the trainer uses, over generated tokens."""

    tokens: np.ndarray
    context: int
    train_idx: np.ndarray
    val_idx: np.ndarray
    vocab_size: int
    tokenizer_path: Path = Path("/nonexistent/tokenizer.model")

    def windows(self, idx) -> torch.Tensor:
        grid = self.tokens[: (len(self.tokens) // self.context) * self.context].reshape(-1, self.context)
        return torch.from_numpy(grid[np.asarray(idx, dtype=np.int64)].astype(np.int64))

    def summary(self) -> dict:
        t = self.context - 1
        return dict(train_windows=len(self.train_idx), val_windows=len(self.val_idx),
                    train_targets=len(self.train_idx) * t, val_targets=len(self.val_idx) * t,
                    tokens=len(self.tokens), vocab_size=self.vocab_size, context=self.context)


def synthetic_data(n_windows: int = 400, context: int = CONTEXT, vocab: int = VOCAB, seed: int = 0,
                   val: int = 24) -> SyntheticData:
    """Tokens from a sparse random Markov chain (learnable: each token has 4 likely successors)."""
    rng = np.random.default_rng(seed)
    succ = rng.integers(0, vocab, size=(vocab, 4))
    n = n_windows * context
    toks = np.empty(n, dtype=np.uint16)
    toks[0] = 1
    choice = rng.integers(0, 4, size=n)
    noise = rng.random(n) < 0.1
    rand = rng.integers(0, vocab, size=n)
    for i in range(1, n):
        toks[i] = rand[i] if noise[i] else succ[toks[i - 1], choice[i]]
    perm = rng.permutation(n_windows)
    return SyntheticData(tokens=toks, context=context, train_idx=np.sort(perm[val:]).astype(np.int64),
                         val_idx=np.sort(perm[:val]).astype(np.int64), vocab_size=vocab)


STORY_WORDS = ("once upon a time there was little girl named Lily she liked to play with her red ball in the "
               "park one day Tom said let's go and they ran fast happy sad big dog cat tree sun").split()


def write_stories(data_dir: Path, n: int, seed: int = 0) -> Path:
    """``n`` synthetic stories in ``data_dir/train.txt`` (separated as TinyStories is); most end
    "... and they were happy." (a learnable last word), the rest in a random word."""
    import random

    rng = random.Random(seed)
    stories = [" ".join(rng.choice(STORY_WORDS) for _ in range(rng.randint(4, 10))).capitalize()
               + (" and they were happy." if rng.random() < 0.7 else f" {rng.choice(STORY_WORDS)}.")
               for _ in range(n)]
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "train.txt").write_text("\n<|endoftext|>\n".join(stories) + "\n")
    return data_dir


TINY_RAW = {
    "name": "tiny",
    "data": {"source": "local", "vocab_size": VOCAB, "context": CONTEXT},
    "train": {"batch_size": 8, "grad_accum": 2, "lr": 3e-3, "min_lr": 3e-4, "warmup_frac": 0.1,
              "max_steps": 12, "eval_every": 4, "eval_windows": 16, "amp": "off", "device": "cpu"},
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "dropout": 0.1,
              "ffn": {"kind": "dense", "hidden": 64}},
    "models": {
        "dense": {},
        "moe": {"ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2,
                        "balance_coef": 0.01, "z_coef": 0.001}},
    },
    "seeds": [1, 2],
}


def tiny_raw(**sections) -> dict:
    """TINY_RAW with sections updated, e.g. ``tiny_raw(train={"max_steps": 20})``."""
    raw = copy.deepcopy(TINY_RAW)
    for k, v in sections.items():
        if isinstance(v, dict) and isinstance(raw.get(k), dict):
            raw[k].update(v)
        else:
            raw[k] = v
    return raw


def tiny_preset(**sections) -> Preset:
    return preset_from_dict(tiny_raw(**sections))


def ensure_grids(preset: Preset, grids, jobs=None, progress: bool = False, scheduler=None) -> list[list]:
    """What ``studylib study`` does with a few grids: plan them
    (:func:`~studylib.study.orchestration.plan.plan_runs`), train the missing runs
    (:func:`~studylib.study.orchestration.train.train_plan`); one list of finished runs per grid."""
    from studylib.study.orchestration.plan import plan_runs
    from studylib.study.orchestration.train import train_plan

    plan = plan_runs(preset, grids, progress=progress)
    train_plan(plan, jobs=jobs, progress=progress, scheduler=scheduler)
    return [list(specs) for specs in plan.specs]


def ensure_runs(preset: Preset, models, seeds=None, jobs=None, overrides=None, progress: bool = False, tag=None,
                scheduler=None) -> list:
    """:func:`ensure_grids` of one grid ``models x seeds`` of ``preset`` + ``overrides``."""
    from studylib.study.orchestration.plan import Grid

    return ensure_grids(preset, [Grid(models, seeds, overrides, tag)], jobs=jobs, progress=progress,
                        scheduler=scheduler)[0]


#: a toy comparison as docs/architecture.md adds one: its knobs (two flat keys), its plan (the models
#: at a budget of their own, every seed) and one family table; notebook 15_toy
TOY_COMPARISON = '''"""A toy comparison: two models of the preset at a budget of their own."""
from dataclasses import dataclass
from typing import Optional

from studylib.run.spec import budget_overrides
from studylib.study.comparisons.base import Comparison
from studylib.study.comparisons.knobs import EPOCHS, MODELS, Knobs, knob, required
from studylib.study.orchestration.plan import Grid


@dataclass(frozen=True)
class ToyKnobs(Knobs):
    models: Optional[tuple] = knob("toy_models", MODELS, models=True)
    epochs: float = knob("toy_epochs", EPOCHS, 1.0)


def grids(study, knobs):
    models = required(knobs.models, "toy_models", study.preset, "a list of model names of the preset")
    return [Grid(list(models), list(study.preset.seeds), budget_overrides(study.preset, knobs.epochs))]


COMPARISON = Comparison("toy", "15_toy", ToyKnobs, grids, tables=("toy_gaps",))
'''


def installed_comparison(folder: Path, module: str, source: str, entry: Optional[str] = None) -> Path:
    """``folder`` holding the module ``module`` and, with ``entry``, a distribution's metadata that
    declares it as the entry point ``entry`` of ``studylib.comparisons`` (what ``pip install`` of a
    package with ``[project.entry-points."studylib.comparisons"]`` leaves)."""
    from studylib.study import comparisons as C

    (folder / module).mkdir(parents=True)
    (folder / module / "__init__.py").write_text(source)
    if entry:
        info = folder / f"{module}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[{C.ENTRY_POINT_GROUP}]\n{entry} = {module}\n")
    return folder


def on_the_path(monkeypatch, folder: Path) -> None:
    """``folder`` on this process's path and on the kernels' (PYTHONPATH, after the repository)."""
    monkeypatch.syspath_prepend(str(folder))
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo), str(folder), os.environ.get("PYTHONPATH")])))


def add_toy_comparison(folder: Path, monkeypatch) -> Path:
    """:data:`TOY_COMPARISON` installed in ``folder`` as the entry point ``toy`` of
    ``studylib.comparisons``, on this process's path and the kernels'; returns ``folder``."""
    on_the_path(monkeypatch, installed_comparison(folder, "toy_comparison", TOY_COMPARISON, entry="toy"))
    return folder


TIMING_KEYS = ("tok_per_s", "elapsed_s", "eval_s")


def comparable(records: list[dict]) -> list[dict]:
    """Metrics records without the wall-clock fields (for exact comparisons between runs)."""
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def main(argv=None) -> int:
    """``python tests/_tiny.py RUN_DIR [--model M] [--raw JSON] [--delay S]``: one tiny run on
    synthetic data (used by the subprocess / torchrun tests). ``--delay`` sleeps that long in
    every training forward so a test can kill the process mid-run."""
    import argparse
    import json
    import time

    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--model", default="dense")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--raw", default="{}", help="JSON: preset sections to update")
    ap.add_argument("--delay", type=float, default=0.0)
    a = ap.parse_args(argv)
    if a.delay:
        import studylib.nn.model as M

        forward = M.Decoder.forward

        def slow_forward(self, *args, **kw):
            if self.training:
                time.sleep(a.delay)
            return forward(self, *args, **kw)

        M.Decoder.forward = slow_forward
    from studylib.run.trainer import train_run

    preset = tiny_preset(**json.loads(a.raw))
    train_run(preset, a.model, a.seed, run_dir=a.run_dir, progress=False, data=synthetic_data())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def tiny_tokenizer(cache: Path, name: str = "tokenizer-abc") -> tuple[Path, int]:
    """A tiny SentencePiece BPE model trained on one repeated sentence, as the data cache names it:
    ``(path, vocab size)``."""
    import sentencepiece as spm

    cache.mkdir(parents=True, exist_ok=True)
    text = ["Once upon a time there was a little cat. The cat liked to play in the sun."] * 50
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_prefix=str(cache / name),
                                   vocab_size=60, model_type="bpe", byte_fallback=False, minloglevel=2,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, hard_vocab_limit=False)
    path = cache / f"{name}.model"
    return path, spm.SentencePieceProcessor(model_file=str(path)).get_piece_size()
