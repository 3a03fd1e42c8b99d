"""studylib.run.resources: the up-front checks of batch, data and memory (before any allocation)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from studylib.config import ConfigError, load_preset
from studylib.run import resources as R

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


@pytest.mark.parametrize("name", ["ci", "cpu", "paper"])
def test_every_preset_model_fits_a_24_gb_machine(name):
    preset = load_preset(ROOT / "params" / f"{name}.yaml")
    for model in preset.models:
        mcfg = preset.model_config(model)
        for amp in (None, torch.bfloat16):
            R.check_memory(mcfg, model, preset.train, preset.data.context - 1, amp, CPU, free=24 * 10**9)


def test_estimate_grows_with_the_batch_and_refuses_what_cannot_fit():
    preset = load_preset(ROOT / "params" / "cpu.yaml")
    mcfg = preset.model_config("moe_top1")
    small = R.micro_batch_bytes(mcfg, 16, 127, torch.bfloat16)
    assert 16 * mcfg.num_params.total < small < 2 * 2**30
    assert R.micro_batch_bytes(mcfg, 32, 127, torch.bfloat16) > small
    assert R.micro_batch_bytes(mcfg, 16, 127, None) > small  # fp32 activations
    huge = preset.train.__class__(**{**preset.train.__dict__, "batch_size": 100000, "grad_accum": 2})
    with pytest.raises(ConfigError, match=r"train.batch_size=100000: one micro-batch of model moe_top1 "
                                          r"\(100000 x 127 tokens, 4 layers, d_model 32, FFN width 128, "
                                          r"vocab 3750\) needs at least \d+\.\d GiB but cpu has 24.0 GiB free"):
        R.check_memory(mcfg, "moe_top1", huge, 127, torch.bfloat16, CPU, free=24 * 2**30)
    with pytest.raises(ConfigError, match=r"batch_size=100000 x train.grad_accum=2 = 200,000 windows per step, but the "
                                          r"training split has only 4,304 windows"):
        R.check_batch(huge, 4304)
    R.check_batch(preset.train, preset.train.batch_size * preset.train.grad_accum)  # exactly one step's windows


def test_free_bytes_reads_meminfo():
    free = R.free_bytes(CPU)
    assert free is None or free > 0
