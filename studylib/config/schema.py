"""The typed config schema: FFN / model / data / training sections, and building them from
plain mappings with errors that name the offending field (dotted path) and what was expected.

Torch-free. A preset (a YAML file of these sections plus named models and study knobs) is
:class:`studylib.config.presets.Preset`.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union, get_args

from studylib.config.accounting import ParamCount, count_params


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; the message names the field."""


# --------------------------------------------------------------------------------------------
# dataclasses
# --------------------------------------------------------------------------------------------
FFNKind = Literal["dense", "moe", "soft"]
Dispatch = Literal["naive", "grouped", "stacked"]
RouterKind = Literal["learned", "frozen", "hash"]


@dataclass(frozen=True)
class FFNConfig:
    """Feed-forward block. ``hidden`` is the SwiGLU hidden size of the dense FFN or of *each* expert."""

    kind: FFNKind = "dense"
    hidden: int = 1024
    num_experts: int = 1  # E (moe) or K (soft)
    top_k: int = 1  # moe only
    dispatch: Dispatch = "grouped"  # moe only
    grouped_mm: Literal["auto", "on", "off"] = "auto"  # use torch._grouped_mm in `grouped`
    balance_coef: float = 0.0  # lambda_bal (moe)
    z_coef: float = 0.0  # lambda_z (moe)
    renormalize: bool = True  # moe: top-k gate weights renormalised to sum to 1 (Mixtral; SPEC).
    # False: the gate is the router probability itself (Switch style). With top_k=1 and
    # renormalisation the gate is exactly 1, so the router gets no gradient from the LM loss.
    router_scale: float = 1.0  # multiplies router logits (soft-MoE variant; 1.0 = none)
    layers: Optional[tuple[int, ...]] = None  # layers that use this FFN; None = all. Others: dense
    # --- router variants (moe only; studylib.nn.router; the defaults are the reference router) ---
    score: Literal["softmax", "sigmoid"] = "softmax"  # sigmoid: s = sigmoid(x W), weights s_topk (/ sum)
    bias_balance: bool = False  # aux-loss-free balancing (DeepSeek-V3): a per-expert bias on the
    # selection scores only, moved by bias_rate * sign(mean load - load) after each optimizer step
    bias_rate: float = 1e-3  # u
    seq_balance_coef: float = 0.0  # DeepSeek-V3's sequence-wise balance loss (alpha)
    route_scale: float = 1.0  # multiplies the routed experts' combine weights (routed_scaling_factor)
    n_shared: int = 0  # always-active shared experts of width `hidden` beside the routed ones
    balance_scope: Literal["micro", "global"] = "micro"  # the balance loss's loads f: per micro-batch,
    # or over the whole optimizer step (every micro-batch and rank; Qwen's global-batch balance)
    # --- router controls (moe only; studylib.nn.router): learned (the reference); frozen (the
    # learned router's weight kept at its initial value); hash (no weight: a fixed table maps a
    # token's id to its top_k experts, equal weights; its balance, z and sequence losses must be 0)
    router: RouterKind = "learned"
    hash_seed: int = 20220201  # the hash router's table: one draw of this seed (Clark et al. 2022's year and month)

    def validate(self, where: str = "ffn") -> None:
        _positive(self.hidden, f"{where}.hidden")
        _positive(self.num_experts, f"{where}.num_experts")
        _positive(self.top_k, f"{where}.top_k")
        if self.kind == "moe" and self.top_k > self.num_experts:
            raise ConfigError(
                f"{where}.top_k: must be between 1 and num_experts={self.num_experts}, got {self.top_k}"
            )
        if self.kind == "dense" and (self.num_experts != 1 or self.top_k != 1):
            raise ConfigError(f"{where}: a dense FFN has num_experts=1 and top_k=1")
        if self.kind == "soft" and self.top_k != 1:
            raise ConfigError(f"{where}.top_k: the soft MoE mixes all experts; leave top_k at 1")
        for name in ("balance_coef", "z_coef"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{where}.{name}: must be >= 0, got {getattr(self, name)}")
        if self.router_scale <= 0:
            raise ConfigError(f"{where}.router_scale: must be > 0, got {self.router_scale}")
        variant = {"score": self.score != "softmax", "bias_balance": self.bias_balance,
                   "seq_balance_coef": self.seq_balance_coef != 0.0, "route_scale": self.route_scale != 1.0,
                   "n_shared": self.n_shared != 0, "balance_scope": self.balance_scope != "micro",
                   "router": self.router != "learned"}
        if self.kind != "moe" and any(variant.values()):
            name = next(k for k, v in variant.items() if v)
            raise ConfigError(f"{where}.{name}: a router variant of the routed MoE (kind: moe), not of kind {self.kind!r}")
        if self.score not in ("softmax", "sigmoid"):
            raise ConfigError(f"{where}.score: must be 'softmax' or 'sigmoid', got {self.score!r}")
        if not self.bias_rate > 0:
            raise ConfigError(f"{where}.bias_rate: must be > 0, got {self.bias_rate}")
        if self.seq_balance_coef < 0:
            raise ConfigError(f"{where}.seq_balance_coef: must be >= 0, got {self.seq_balance_coef}")
        if not self.route_scale > 0:
            raise ConfigError(f"{where}.route_scale: must be > 0, got {self.route_scale}")
        if self.balance_scope not in ("micro", "global"):
            raise ConfigError(f"{where}.balance_scope: must be 'micro' or 'global', got {self.balance_scope!r}")
        if self.n_shared < 0:
            raise ConfigError(f"{where}.n_shared: must be >= 0, got {self.n_shared}")
        kinds = [repr(k) for k in get_args(RouterKind)]
        if self.router not in get_args(RouterKind):
            raise ConfigError(f"{where}.router: must be {', '.join(kinds[:-1])} or {kinds[-1]}, got {self.router!r}")
        if isinstance(self.hash_seed, bool) or not isinstance(self.hash_seed, int) or self.hash_seed < 0:
            raise ConfigError(f"{where}.hash_seed: expected a non-negative integer (the table's draw), "
                              f"got {self.hash_seed!r}")
        if self.hash_seed != FFNConfig.hash_seed and self.router != "hash":
            raise ConfigError(f"{where}.hash_seed: the hash router's table, but this router is {self.router!r}; "
                              f"set router: hash or leave hash_seed at {FFNConfig.hash_seed}")
        if self.router == "hash":
            scored = {"balance_coef": self.balance_coef != 0.0, "z_coef": self.z_coef != 0.0,
                      "seq_balance_coef": self.seq_balance_coef != 0.0, "bias_balance": self.bias_balance,
                      "score": self.score != "softmax", "balance_scope": self.balance_scope != "micro",
                      "router_scale": self.router_scale != 1.0}
            name = next((k for k, v in scored.items() if v), None)
            if name:
                raise ConfigError(f"{where}.{name}: the hash router has no scores (its experts are a fixed "
                                  f"function of the token id); leave {name} at its default "
                                  f"({'0' if name.endswith('coef') else FFNConfig.__dataclass_fields__[name].default!r})")


@dataclass(frozen=True)
class ModelConfig:
    name: str = "model"
    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    context: int = 512
    dropout: float = 0.1
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    ffn: FFNConfig = field(default_factory=FFNConfig)
    # initialisation of the expert weights (soft and routed MoE layers; dense FFNs and routers
    # never change): "normal" = N(0, init_std), output projection N(0, init_std/sqrt(2L)), as the
    # rest of the model; "fan_in" = std 1/sqrt(fan_in) for both expert projections, no residual
    # scaling (seed 003's fan-in expert init; see studylib.nn.model.Decoder.init_weights)
    expert_init: Literal["normal", "fan_in"] = "normal"
    # rows per logits matmul of the fused LM-head loss (studylib.nn.lm_loss): execution only, the
    # same function to fp32 rounding (not part of a run's identity); docs/performance.md#speed-of-a-training-step-at-the-maps-sizes
    lm_head_chunk: int = 2048

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def num_params(self) -> ParamCount:
        """Exact parameter accounting of this model (equals ``sum(p.numel())`` of the built one)."""
        return count_params(self)

    def ffn_for_layer(self, layer: int) -> FFNConfig:
        """The FFN config of one layer: ``ffn`` on the listed layers, a dense SwiGLU elsewhere.

        The dense layers of a mixed pattern use the MoE's active FFN width (``top_k * hidden``;
        for the soft MoE ``num_experts * hidden``) so that they cost what the routed layer does.
        """
        f = self.ffn
        if f.layers is None or layer in f.layers:
            return f
        width = f.hidden * (f.num_experts if f.kind == "soft" else f.top_k)
        return FFNConfig(kind="dense", hidden=width)

    def validate(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "context", "lm_head_chunk"):
            _positive(getattr(self, name), f"model.{name}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.n_heads: must divide d_model={self.d_model}; allowed: {_divisors(self.d_model)}"
                f", got {self.n_heads}"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"model.n_kv_heads: must divide n_heads={self.n_heads}; allowed: "
                f"{_divisors(self.n_heads)}, got {self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"model.n_heads: head_dim d_model/n_heads={self.head_dim} must be even (RoPE)")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout: must be in [0, 1), got {self.dropout}")
        self.ffn.validate("model.ffn")
        if self.ffn.layers is not None:
            bad = [i for i in self.ffn.layers if not 0 <= i < self.n_layers]
            if bad:
                raise ConfigError(
                    f"model.ffn.layers: layer indices must be in 0..{self.n_layers - 1}, got {bad}"
                )


@dataclass(frozen=True)
class DataConfig:
    source: Literal["auto", "local", "hub"] = "auto"
    data_dir: Optional[str] = None  # env STUDYLIB_DATA_DIR overrides
    hub_dataset: str = "roneneldan/TinyStories"
    hub_split: str = "train"
    max_stories: Optional[int] = None  # take only the first N stories (None = all)
    vocab_size: int = 4096
    context: int = 512
    val_fraction: float = 0.05
    split_seed: int = 1337
    cache_dir: str = "outputs/cache"  # env STUDYLIB_CACHE_DIR overrides
    tokenizer_threads: int = 0  # 0 = all cores
    # the first fraction of the training stories a run's windows come from (the tokenizer, the token
    # file and the validation split stay the corpus's): the same budget with fewer unique tokens
    train_fraction: float = 1.0

    def validate(self) -> None:
        _positive(self.vocab_size, "data.vocab_size")
        if self.context < 2:
            raise ConfigError(f"data.context: must be >= 2, got {self.context}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction: must be in (0, 1), got {self.val_fraction}")
        if not 0.0 < self.train_fraction <= 1.0:
            raise ConfigError(f"data.train_fraction: must be in (0, 1] (the share of the training stories a run "
                              f"reads), got {self.train_fraction}")
        if self.max_stories is not None:
            _positive(self.max_stories, "data.max_stories")


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 16
    grad_accum: int = 2
    lr: float = 3e-4
    min_lr: float = 3e-5
    warmup_frac: float = 0.03
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    max_steps: Optional[int] = None  # None = one epoch of the train windows
    eval_every: int = 250
    eval_windows: Optional[int] = None  # fixed val subset during training (None = full pass)
    final_full_eval: bool = True
    checkpoint_every: Optional[int] = None  # None = at every evaluation
    keep_checkpoints: bool = False  # keep one checkpoint per evaluation (for the explorer)
    amp: Literal["auto", "bf16", "off"] = "auto"  # auto: bf16 on CUDA, and on CPUs with native bf16
    compile: bool = False
    device: str = "auto"
    num_threads: int = 0  # torch threads on CPU; 0 = leave torch's default
    # the seed of the data order (which windows each step reads); None = the run's seed, which
    # also seeds the initialisation. Set it to vary the two apart (notebook 03's noise split).
    data_seed: Optional[int] = None
    # the routers' learning rate as a multiple of the schedule's (studylib.run.optim: their own
    # AdamW group; 1.0 = one group with the other matrices, as before the key existed)
    router_lr_scale: float = 1.0

    def validate(self) -> None:
        for name in ("batch_size", "grad_accum", "eval_every"):
            _positive(getattr(self, name), f"train.{name}")
        if self.max_steps is not None:
            _positive(self.max_steps, "train.max_steps")
        if self.eval_windows is not None:
            _positive(self.eval_windows, "train.eval_windows")
        for name in ("lr", "min_lr"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"train.{name}: must be a positive finite number, got {v!r}")
        if not 0 < self.min_lr <= self.lr:
            raise ConfigError(f"train.min_lr: must be in (0, lr={self.lr}], got {self.min_lr}")
        v = self.router_lr_scale
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"train.router_lr_scale: must be a positive finite number (the routers' lr / the "
                              f"schedule's), got {v!r}")
        if not 0.0 <= self.warmup_frac < 1.0:
            raise ConfigError(f"train.warmup_frac: must be in [0, 1), got {self.warmup_frac}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"train.betas: must be two numbers in [0, 1), got {self.betas}")
        if self.grad_clip < 0:
            raise ConfigError(f"train.grad_clip: must be >= 0 (0 = off), got {self.grad_clip}")
        if self.data_seed is not None and (isinstance(self.data_seed, bool) or not isinstance(self.data_seed, int)
                                           or self.data_seed < 0):
            raise ConfigError(f"train.data_seed: expected a seed (an integer >= 0) or null (the run's seed), "
                              f"got {self.data_seed!r}")


# --------------------------------------------------------------------------------------------
# building dataclasses from mappings, with field-naming errors
# --------------------------------------------------------------------------------------------
def _positive(v: Any, where: str) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ConfigError(f"{where}: must be a positive integer, got {v!r}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check (and gently coerce: int->float, list->tuple, '3e-4'->float) a value against a type."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: unexpected value {value!r}")
    if origin is Literal:
        if isinstance(value, bool) and ("on" if value else "off") in args:
            value = "on" if value else "off"  # YAML 1.1 reads a bare on/off as a boolean
        if value not in args:
            raise ConfigError(f"{where}: must be one of {list(args)}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: must be a list, got {type(value).__name__} {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{where}: must be a list of {len(args)} items, got {list(value)}")
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is Any or tp is dict:
        if tp is dict and not isinstance(value, dict):
            raise ConfigError(f"{where}: must be a mapping, got {value!r}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: must be an integer, got {type(value).__name__} {value!r}")
    if tp is float:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: must be a number, got {type(value).__name__} {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: must be a string, got {type(value).__name__} {value!r}")
    if dataclasses.is_dataclass(tp):
        return dataclass_from_dict(tp, value, where)
    raise ConfigError(f"{where}: unsupported type {_type_name(tp)}")  # pragma: no cover


def dataclass_from_dict(cls: type, raw: Any, where: str):
    if isinstance(raw, cls):
        return raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping of fields, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {names}")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in raw.items()}
    obj = cls(**kwargs)
    return obj


def model_from_dict(raw: dict, where: str = "model") -> ModelConfig:
    cfg = dataclass_from_dict(ModelConfig, raw, where)
    try:
        cfg.validate()
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg.replace("model.", f"{where}.", 1) if where != "model" else msg) from None
    return cfg


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def to_dict(obj: Any) -> Any:
    """A dataclass (nested) as plain YAML/JSON-friendly data (one with a ``to_raw()`` method, e.g.
    the ``study`` section, as the mapping it returns: the preset's own flat shape)."""
    if callable(getattr(obj, "to_raw", None)):
        return to_dict(obj.to_raw())
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
