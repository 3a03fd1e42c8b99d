"""studylib.nn.precision: which autocast dtype a run gets (amp auto / bf16 / off)."""
from __future__ import annotations

import pytest
import torch

from studylib.config import ConfigError, TrainConfig
from studylib.nn import precision as D

CPU = torch.device("cpu")


@pytest.mark.parametrize("native", [True, False])
def test_amp_auto_on_cpu_is_bf16_only_with_native_support(monkeypatch, native):
    monkeypatch.setattr(D, "cpu_has_native_bf16", lambda: native)
    auto = D.resolve_amp(TrainConfig(amp="auto"), CPU)
    assert auto == (torch.bfloat16 if native else None)
    assert D.resolve_amp(TrainConfig(amp="bf16"), CPU) == torch.bfloat16  # bf16 is forced either way
    assert D.resolve_amp(TrainConfig(amp="off"), CPU) is None
    line = D.describe_amp(TrainConfig(amp="auto"), CPU, auto)
    assert line.startswith("precision: bf16 autocast" if native else "precision: fp32") and "auto" in line


def test_amp_on_cuda_without_bf16(monkeypatch):
    """A GPU without bf16: auto falls back to fp32 (never fp16), an explicit bf16 is an error;
    the CPU probe plays no part on a GPU."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(D, "cpu_has_native_bf16", lambda: pytest.fail("CPU probe asked for a GPU run"))
    gpu = torch.device("cuda:0")
    assert D.resolve_amp(TrainConfig(amp="auto"), gpu) is None
    with pytest.raises(ConfigError, match="train.amp: bf16 requested"):
        D.resolve_amp(TrainConfig(amp="bf16"), gpu)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert D.resolve_amp(TrainConfig(amp="auto"), gpu) == torch.bfloat16


@pytest.mark.parametrize("capability, probe, flags, expected", [
    ("AVX2", True, {"avx512_bf16"}, False),  # torch's kernels would not use the instructions
    ("AVX512", True, set(), True),
    ("AVX512", False, {"avx512f", "amx_bf16"}, True),
    ("AVX512", False, {"avx512f", "avx2"}, False),
    ("DEFAULT", False, set(), False),
])
def test_cpu_has_native_bf16_reads_capability_probe_and_flags(monkeypatch, capability, probe, flags, expected):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: probe, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(D, "_cpuinfo_flags", lambda path="/proc/cpuinfo": set(flags))
    assert D.cpu_has_native_bf16() is expected


def test_cpuinfo_flags_parses_the_flags_line(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    assert D._cpuinfo_flags(str(f)) == {"fpu", "avx2", "avx512_bf16"}
    assert D._cpuinfo_flags(str(tmp_path / "missing")) == set()
