"""The process environment of a run: device, autocast precision, seeding and DDP collectives
(no-ops in a single process)."""
from __future__ import annotations

import os
import random
from typing import Optional

import numpy as np
import torch

from studylib.config import ConfigError, TrainConfig


def resolve_device(cfg: TrainConfig, local_rank: int = 0) -> torch.device:
    if cfg.device == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    dev = torch.device(cfg.device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device(f"cuda:{local_rank}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device: {cfg.device!r} requested but CUDA is not available")
    return dev


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


class Dist:
    """World size, rank and collectives (no-ops in a single process)."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.owns_group = False

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def init(self, device: torch.device) -> None:
        if not self.enabled:
            return
        import torch.distributed as dist

        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
            self.owns_group = True
        self.world, self.rank = dist.get_world_size(), dist.get_rank()

    def close(self) -> None:
        if self.owns_group:
            import gc

            import torch.distributed as dist

            gc.collect()  # free the DDP wrapper (and its reducer threads) before the group goes
            dist.barrier()  # no rank tears gloo down while another still talks to it
            dist.destroy_process_group()
            self.owns_group = False

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            import torch.distributed as dist

            dist.all_reduce(t)
        return t

    def gather(self, obj) -> list:
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
