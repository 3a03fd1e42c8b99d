"""Mixed precision, in one place: the autocast context the trainer, decoding and the benchmarks
enter, and the compute dtype a kernel sees under it. bf16 autocast keeps fp32 weights; fp16 is
never used (it is ~1000x slower on CPU)."""
from __future__ import annotations

from typing import Optional

import torch

from studylib.config import ConfigError

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
