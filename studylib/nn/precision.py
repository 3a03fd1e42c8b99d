"""Mixed precision, in one place: which autocast dtype a run gets (``train.amp``: the policy, the
CPU probe, the line that says why, the label checkpoints and summaries record), the autocast
context the trainer, decoding and the benchmarks enter, and the compute dtype a kernel sees under
it. bf16 autocast keeps fp32 weights; fp16 is never used (it is ~1000x slower on CPU)."""
from __future__ import annotations

from typing import Optional

import torch

from studylib.config import ConfigError, TrainConfig

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": None, "float32": None, "none": None}


def autocast(device: torch.device | str, dtype: Optional[torch.dtype]):
    """``torch.autocast`` to ``dtype`` on ``device``'s type; ``dtype=None``: autocast off (fp32)."""
    dev = device if isinstance(device, str) else device.type
    if dtype is None:
        return torch.autocast(dev, enabled=False)
    return torch.autocast(dev, dtype=dtype)


def autocast_dtype(t: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype autocast computes matmuls in for ``t``'s device, or None when it is off."""
    dev = t.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a matmul on ``t`` runs in: autocast's when it is on, else ``t``'s own."""
    return autocast_dtype(t) or t.dtype


def parse_dtype(name: Optional[str], where: str = "--dtype") -> Optional[torch.dtype]:
    """``bf16`` -> torch.bfloat16, ``fp32``/None -> None (no autocast)."""
    key = "none" if name is None else str(name)
    if key not in DTYPES:
        raise ConfigError(f"{where}: must be bf16 or fp32, got {name!r} (fp16 is never used on CPU)")
    return DTYPES[key]


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bf16 arithmetic


def _cpuinfo_flags(path: str = "/proc/cpuinfo") -> set[str]:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX) and torch's kernels use it.

    Without it (an AVX2-only CPU, e.g. the AMD EPYC this project met) torch emulates bf16
    matmuls and a training step is ~45x slower than in fp32. Asks torch first
    (``torch.cpu._is_avx512_bf16_supported`` / ``_is_amx_tile_supported``, private in torch 2.13),
    then the ``avx512_bf16`` / ``amx_bf16`` flags of /proc/cpuinfo; and requires torch's kernel
    level (``torch.backends.cpu.get_cpu_capability()``, e.g. "AVX2", "AVX512") to be an AVX-512
    one, since an ``ATEN_CPU_CAPABILITY=avx2`` process would not use the instructions.
    """
    capability = str(torch.backends.cpu.get_cpu_capability()).upper()
    if "AVX512" not in capability and "AMX" not in capability:
        return False
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        fn = getattr(torch.cpu, probe, None)
        try:
            if fn is not None and fn():
                return True
        except Exception:  # a private probe that changed: fall back to the flags
            pass
    return bool(_cpuinfo_flags() & set(BF16_CPU_FLAGS))


def resolve_amp(cfg: TrainConfig, device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype of a run: None (fp32) or bf16 (never fp16).

    ``amp: off`` -> fp32; ``amp: bf16`` -> bf16 (an error on a GPU without it; on a CPU without
    native bf16 it is emulated, ~45x slower, but it is what was asked); ``amp: auto`` -> bf16 on
    CUDA with bf16 support and on a CPU with native bf16 (:func:`cpu_has_native_bf16`), else
    fp32. What was chosen is the run's ``amp`` in ``summary.json``. Note that the identity hash
    holds ``amp`` as written (``auto``), not this resolved dtype.
    """
    if cfg.amp == "off":
        return None
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        if cfg.amp == "bf16":
            raise ConfigError("train.amp: bf16 requested but this GPU does not support it")
        return None  # never fp16
    if device.type == "cpu" and cfg.amp == "auto" and not cpu_has_native_bf16():
        return None
    return torch.bfloat16


def describe_amp(cfg: TrainConfig, device: torch.device, dtype: Optional[torch.dtype]) -> str:
    """One line naming the precision chosen, and why when ``amp: auto`` chose it."""
    name = "bf16 autocast" if dtype is not None else "fp32"
    if cfg.amp != "auto":
        return f"precision: {name} (train.amp: {cfg.amp})"
    if device.type == "cpu":
        why = "native bf16 (AVX512-BF16/AMX)" if dtype is not None else \
            "no native bf16 on this CPU (AVX512-BF16/AMX); emulated bf16 is ~45x slower"
    else:
        why = "bf16 supported on this GPU" if dtype is not None else "no bf16 on this GPU"
    return f"precision: {name} (train.amp: auto; {why})"


def precision_label(dtype: Optional[torch.dtype]) -> str:
    """What a checkpoint and a summary record of a run's precision: ``bfloat16`` or ``fp32``."""
    return str(dtype).replace("torch.", "") if dtype else "fp32"
