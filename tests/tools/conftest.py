"""The tiny study the explorer tests (test_explore, test_browser) share: one finished run per FFN
kind, with a checkpoint snapshot at every evaluation."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from studylib.config import load_preset

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = os.environ.get("STUDYLIB_DATA_DIR") or str(REPO.parent / "shared" / "data" / "tinystories")

TINY_STUDY = {
    "name": "explore_tiny",
    "data": {"source": "local", "max_stories": 200, "vocab_size": 384, "context": 32, "val_fraction": 0.05,
             "split_seed": 1337},
    "train": {"batch_size": 8, "grad_accum": 1, "lr": 3e-3, "min_lr": 3e-4, "warmup_frac": 0.1,
              "max_steps": 12, "eval_every": 4, "eval_windows": 16, "amp": "off", "device": "cpu",
              "keep_checkpoints": True},
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "dropout": 0.0},
    "models": {
        "moe": {"ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, "balance_coef": 0.01,
                        "z_coef": 0.001}},
        "soft": {"ffn": {"kind": "soft", "hidden": 32, "num_experts": 3}},
        "dense": {"ffn": {"kind": "dense", "hidden": 64}},
    },
    "seeds": [1],
    "study": {"reference_moe": "moe"},
}
MODELS = ("moe", "soft", "dense")


def build_tiny_study(root: Path) -> dict:
    """A preset at ``root/params/explore_tiny.yaml`` (data cache in ``root/cache``) and one
    finished run per model in ``root/outputs/explore_tiny/runs/<model>/seed1`` with snapshots at
    steps 4, 8, 12. Idempotent (finished runs are skipped). Returns paths."""
    from studylib.data.pipeline import load_data
    from studylib.run.trainer import train_run

    root = Path(root)
    raw = yaml.safe_load(yaml.safe_dump(TINY_STUDY))
    raw["data"]["data_dir"] = DATA_DIR
    raw["data"]["cache_dir"] = str(root / "cache")
    params = root / "params" / "explore_tiny.yaml"
    params.parent.mkdir(parents=True, exist_ok=True)
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    preset = load_preset(params)
    out = root / "outputs" / preset.name
    data = None
    run_dirs = {}
    for m in MODELS:
        rd = out / "runs" / m / "seed1"
        if not (rd / "summary.json").is_file():
            data = data or load_data(preset.data, progress=False)
            train_run(preset, m, 1, run_dir=rd, progress=False, data=data)
        run_dirs[m] = rd
    return {"root": root, "params": params, "preset": preset, "outputs": out, "runs": run_dirs}


@pytest.fixture(scope="session")
def explore_study(tmp_path_factory):
    """The tiny study, built once per session (skipped without the TinyStories subset)."""
    if not Path(DATA_DIR).is_dir():
        pytest.skip(f"TinyStories subset not found at {DATA_DIR} (set STUDYLIB_DATA_DIR)")
    return build_tiny_study(tmp_path_factory.getbasetemp() / "explore-study")
