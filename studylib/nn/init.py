"""Initial weights drawn per tensor by name: each tensor from its own generator, keyed by the
model's init key (one draw of the global RNG, the first thing a
:class:`~studylib.nn.model.Decoder` does) and the tensor's name. Two models built under one seed
therefore hold equal values in every tensor they have in common, whatever else they hold and in
whatever order they are built: a hash or frozen router's model differs from the learned MoE's only
in the router, and expert ``e`` of an MoE equals a dense FFN of the expert's shape (a dense FFN
is drawn as expert 0). A control then differs from its reference only in what it controls.

The identity of a run records this scheme (:data:`studylib.config.identity.INIT`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


def draw_key() -> int:
    """The model's init key: one draw of the global RNG (seeded with the run's seed)."""
    return int(torch.randint(0, 2**62, (1,)).item())


@dataclass(frozen=True)
class Draw:
    """N(0, std) fills keyed by ``key`` and a tensor's dotted name (``prefix`` + the name given)."""

    key: int
    prefix: str = ""

    def __truediv__(self, name: str) -> "Draw":
        """The same draws under ``name.``: ``(draw / "blocks.0" / "attn").normal_(w, 0.02, "wo")``."""
        return Draw(self.key, f"{self.prefix}{name}.")

    def seed(self, name: str) -> int:
        """The generator seed of tensor ``prefix + name`` (a hash: stable across processes)."""
        digest = hashlib.blake2b(f"{self.key}/{self.prefix}{name}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 1

    @torch.no_grad()
    def normal_(self, t: torch.Tensor, std: float, name: str) -> None:
        """Fill ``t`` (any device, dtype or view) with N(0, std) from the generator of ``name``."""
        g = torch.Generator().manual_seed(self.seed(name))
        t.copy_(torch.empty(t.shape, dtype=torch.float32).normal_(0.0, std, generator=g))
