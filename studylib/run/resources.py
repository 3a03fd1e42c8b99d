"""Up-front checks that a run fits its data and its machine, before anything big is allocated.

:func:`check_run` raises a one-line :class:`studylib.config.ConfigError` when the tokenizer's
vocabulary or a data window does not fit the model, when one optimizer step wants more windows
than the training split holds, or when a rough *lower* estimate of one micro-batch's training
memory (:func:`micro_batch_bytes`) exceeds what the device has free (:func:`free_bytes`:
``MemAvailable`` of ``/proc/meminfo`` on CPU, ``torch.cuda.mem_get_info`` on CUDA). The estimate
is deliberately low (real use is higher), so it only stops runs that cannot possibly fit.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from studylib.config import ConfigError, ModelConfig, TrainConfig

LOGITS_CHUNK = 2048  # rows of the fused LM-head chunk (studylib.nn.lm_loss)


def ffn_width(mcfg: ModelConfig, layer: int) -> int:
    """The FFN width one token goes through in ``layer`` (top-k experts; all of a soft MoE)."""
    f = mcfg.ffn_for_layer(layer)
    if f.kind == "moe":
        return f.hidden * f.top_k
    if f.kind == "soft":
        return f.hidden * f.num_experts
    return f.hidden


def micro_batch_bytes(mcfg: ModelConfig, batch: int, tokens: int, amp: Optional[torch.dtype]) -> int:
    """A low estimate of the training memory of one micro-batch of ``batch`` x ``tokens``: the
    activations kept for backward (per token and layer ~4 x d_model for attention and residual,
    3 x the FFN width for SwiGLU, in the autocast dtype), one fp32 chunk of logits and its
    gradient, and weights + gradients + AdamW moments in fp32."""
    elem = 2 if amp is not None else 4
    n = batch * tokens
    per_token = sum(4 * mcfg.d_model + 3 * ffn_width(mcfg, layer) for layer in range(mcfg.n_layers))
    logits = 2 * min(n, LOGITS_CHUNK) * mcfg.vocab_size * 4
    state = 16 * mcfg.num_params.total
    return n * per_token * elem + logits + state


def free_bytes(device: torch.device) -> Optional[int]:
    """Free memory of ``device`` (None if unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _gb(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_batch(tcfg: TrainConfig, n_train: int, world: int = 1) -> None:
    """One optimizer step's windows (``batch_size x grad_accum``) must fit in the training split."""
    per_step = tcfg.batch_size * tcfg.grad_accum
    if per_step > n_train:
        raise ConfigError(f"train.batch_size={tcfg.batch_size} x train.grad_accum={tcfg.grad_accum} = "
                          f"{per_step:,} windows per step, but the training split has only {n_train:,} "
                          f"windows; lower them (or use more data)")
    if tcfg.batch_size < world:
        raise ConfigError(f"train.batch_size={tcfg.batch_size} is smaller than the {world} DDP ranks")


def check_model_fits_data(mcfg: ModelConfig, name: str, vocab: int, context: int) -> None:
    if vocab > mcfg.vocab_size:
        raise ConfigError(f"models.{name}.vocab_size={mcfg.vocab_size} is smaller than the "
                          f"tokenizer's vocabulary ({vocab})")
    if context - 1 > mcfg.context:
        raise ConfigError(f"models.{name}.context={mcfg.context} is shorter than the "
                          f"{context - 1} input tokens of a data window")


def check_memory(mcfg: ModelConfig, name: str, tcfg: TrainConfig, tokens: int, amp: Optional[torch.dtype],
                 device: torch.device, world: int = 1, free: Optional[int] = None) -> None:
    """:class:`ConfigError` if one micro-batch (this rank's share) cannot fit in ``free`` bytes
    (default: :func:`free_bytes` of ``device``)."""
    free = free_bytes(device) if free is None else free
    batch = math.ceil(tcfg.batch_size / world)
    need = micro_batch_bytes(mcfg, batch, tokens, amp)
    if free is not None and need > free:
        raise ConfigError(
            f"train.batch_size={tcfg.batch_size}: one micro-batch of model {name} ({batch} x {tokens} tokens, "
            f"{mcfg.n_layers} layers, d_model {mcfg.d_model}, FFN width {ffn_width(mcfg, 0)}, vocab "
            f"{mcfg.vocab_size}) needs at least {_gb(need)} but {device.type} has {_gb(free)} free; "
            f"lower train.batch_size (raise train.grad_accum to keep the batch)")


def check_run(mcfg: ModelConfig, name: str, tcfg: TrainConfig, data, context: int,
              amp: Optional[torch.dtype], device: torch.device, world: int = 1) -> None:
    """Every up-front check of a run on ``data`` (windows of ``context`` tokens)."""
    check_model_fits_data(mcfg, name, data.vocab_size, context)
    check_batch(tcfg, len(data.train_idx), world)
    check_memory(mcfg, name, tcfg, context - 1, amp, device, world)
