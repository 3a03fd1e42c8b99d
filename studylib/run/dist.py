"""The process environment of a run: device, seeding and DDP collectives (no-ops in a single
process). The autocast precision is :mod:`studylib.nn.precision`'s."""
from __future__ import annotations

import os
import random

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
