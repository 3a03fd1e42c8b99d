"""Probes of a trained model: load a run's model (:meth:`RunDir.load_model`) and compute on it.

* :func:`eval_windows`: the fixed validation subset every model is probed on;
* :func:`uniform_gate_ablation`: force one routed layer's gate to uniform, loss change;
* :func:`expert_cosine` / :func:`cosine_summary`: how alike the K experts' outputs are;
* :func:`generations`: a few greedy samples per model for the same prompts.

Probes run in fp32 (autocast off), without dropout; ``device`` defaults to CUDA when available.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd
import torch

from studylib.config import preset_from_dict
from studylib.nn.dispatch import expert_mlp
from studylib.nn.precision import autocast
from studylib.data.windows import eval_subset
from studylib.data.pipeline import shared_data
from studylib.run.decode import generate
from studylib.run.evaluation import evaluate
from studylib.run.rundir import RunDir


def _device(device: Optional[str]) -> str:
    if device is not None:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def eval_windows(run_dir, n_windows: Optional[int] = None, data=None) -> tuple:
    """(data, window indices): a fixed subset of the run's validation windows (the trainer's
    :func:`studylib.data.windows.eval_subset`, so every model is probed on the same windows).
    ``data``: the run's token data when the caller has it loaded, else loaded from its config."""
    doc = RunDir(run_dir).read_config()
    if doc is None:
        raise FileNotFoundError(f"{run_dir}: not a run directory (no config.yaml)")
    preset = preset_from_dict(doc["preset"])
    if data is None:
        data = shared_data(preset.data)
    return data, eval_subset(data.val_idx, n_windows, preset.data.split_seed)


def _loss(model, data, idx, batch_size: int) -> float:
    device = next(model.parameters()).device
    return float(evaluate(model, data, idx, batch_size, device, None)["val_loss"])


def uniform_gate_ablation(run_dir, n_windows: Optional[int] = 64, data=None, batch_size: int = 16,
                          device: Optional[str] = None) -> pd.DataFrame:
    """Force one routed layer's gate to uniform at a time (``model.set_router_mode("uniform",
    layers=[i])``) and evaluate the loss on a fixed validation subset (fp32, no dropout).

    Returns one row per routed layer: layer / loss / delta (= loss - the learned-gate loss,
    ``attrs["base_loss"]``). For K=1 the gate is exactly 1 either way, so delta is 0."""
    loaded = RunDir(run_dir).load_model(device=_device(device))
    model = loaded.model
    data, idx = eval_windows(run_dir, n_windows, data)
    base = _loss(model, data, idx, batch_size)
    rows = []
    for layer in model.routed_layers():
        model.set_router_mode("uniform", layers=[layer])
        try:
            loss = _loss(model, data, idx, batch_size)
        finally:
            model.set_router_mode("learned")
        rows.append({"model": loaded.config.name, "layer": layer, "loss": loss, "delta": loss - base,
                     "base_loss": base})
    out = pd.DataFrame(rows, columns=["model", "layer", "loss", "delta", "base_loss"])
    out.attrs["base_loss"] = base
    out.attrs["n_windows"] = len(idx)
    return out


def _expert_similarity(ffn, h: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(K, K) cosine similarity of the K experts' ungated outputs on hidden states ``h``, summed
    over the tokens, and the number of tokens."""
    x_TD = h.reshape(-1, h.shape[-1]).float()
    outs = [expert_mlp(x_TD, ffn.w_in_EFD[e].float(), ffn.w_out_EDH[e].float())
            for e in range(ffn.w_in_EFD.shape[0])]
    o_KTD = torch.nn.functional.normalize(torch.stack(outs, 0), dim=-1)
    return torch.einsum("itd,jtd->ij", o_KTD, o_KTD), x_TD.shape[0]


def _cosine_sums(model, data, idx, batch_size: int) -> tuple[dict, dict]:
    """Per routed layer: the summed expert-output cosine matrix and the number of tokens, over
    the windows ``idx`` (each layer's FFN input captured by a hook on its ``ffn_norm``)."""
    device = next(model.parameters()).device
    layers = model.routed_layers()
    sums: dict = {}
    counts: dict = {i: 0 for i in layers}
    captured: dict = {}
    hooks = [model.blocks[i].ffn_norm.register_forward_hook(
        lambda mod, args, out, i=i: captured.__setitem__(i, out.detach())) for i in layers]
    try:
        with torch.no_grad(), autocast(device, None):
            for start in range(0, len(idx), batch_size):
                w = data.windows(idx[start:start + batch_size]).to(device)
                captured.clear()
                model(w[:, :-1], stats=False)
                for i in layers:
                    sim, n_tokens = _expert_similarity(model.blocks[i].ffn, captured[i])
                    sums[i] = sim if i not in sums else sums[i] + sim
                    counts[i] += n_tokens
    finally:
        for h in hooks:
            h.remove()
    return sums, counts


def expert_cosine(run_dir, n_windows: Optional[int] = 16, data=None, batch_size: int = 16,
                  device: Optional[str] = None) -> dict:
    """Per routed layer, the K x K matrix (DataFrame) of mean cosine similarity between the
    experts' outputs on the same hidden states (the ``ffn_norm`` outputs of the validation
    subset; each expert run with :func:`studylib.nn.dispatch.expert_mlp`).
    Ungated outputs: what each expert *would* contribute for every token."""
    model = RunDir(run_dir).load_model(device=_device(device)).model
    data, idx = eval_windows(run_dir, n_windows, data)
    sums, counts = _cosine_sums(model, data, idx, batch_size)
    out = {}
    for i in model.routed_layers():
        m = (sums[i] / max(counts[i], 1)).cpu().numpy()
        names = [f"e{k}" for k in range(m.shape[0])]
        out[i] = pd.DataFrame(m, index=names, columns=names)
    return out


def cosine_summary(mats: dict) -> pd.DataFrame:
    """Per layer: mean and max off-diagonal cosine of an :func:`expert_cosine` result."""
    rows = []
    for layer, m in mats.items():
        a = m.to_numpy()
        K = a.shape[0]
        off = a[~np.eye(K, dtype=bool)] if K > 1 else np.array([np.nan])
        rows.append({"layer": layer, "K": K, "mean_offdiag_cos": float(np.mean(off)),
                     "max_offdiag_cos": float(np.max(off))})
    return pd.DataFrame(rows).set_index("layer")


def generations(run_dirs: dict, prompts: Sequence[str], max_new_tokens: int = 48,
                temperature: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """A few samples per model (``name: run_dir``) for the same prompts (greedy by default;
    each prompt starts after an end-of-story token, like the training windows)."""
    rows = []
    for name, rd in run_dirs.items():
        loaded = RunDir(rd).load_model()
        tok, context = loaded.tokenizer, loaded.config.context
        if tok is None:
            raise FileNotFoundError(f"{rd}: the run's tokenizer was not found")
        for p in prompts:
            ids = [tok.eos_id()] + tok.encode(p)
            n_new = max(1, min(max_new_tokens, context - len(ids), context - 1))
            out = generate(loaded.model, ids, n_new, temperature=temperature, seed=seed, eos_id=tok.eos_id())
            rows.append({"prompt": p, "model": name, "continuation": tok.decode(out)})
    return pd.DataFrame(rows)
