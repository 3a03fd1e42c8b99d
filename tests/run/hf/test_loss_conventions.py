"""The balance-loss convention, checked against the exported model's own auxiliary loss.

Ours (:mod:`studylib.nn.router_losses`): per layer ``E * sum_e f_e P_e`` with f summing to 1,
averaged over the MoE layers, times ``balance_coef``. transformers' Mixtral and Qwen2Moe
(``load_balancing_loss_func``) pool the layers' tokens into one f and one P and let f sum to k,
times ``router_aux_loss_coef`` (exported as ``balance_coef / top_k``). So:

* one MoE layer: HF ``aux_loss == top_k * balance_loss`` and the aux term HF adds to its loss,
  ``router_aux_loss_coef * aux_loss``, equals our ``balance_coef * balance_loss`` (exactly the
  documented factor);
* several layers: HF's pooled loss is ``top_k * E * sum_e mean_l(f) mean_l(P)``, ours is
  ``E * mean_l sum_e f P``: ``top_k * balance_loss - aux_loss = top_k * E * sum_e cov_l(f_e, P_e)``
  (the covariance over layers of each expert's load and probability), which these routers make
  nonzero;
* Glm4Moe (sigmoid routers) computes no auxiliary loss: its loss is the LM cross-entropy alone,
  and the router logits it reports are ours.

Our z-loss has no HF counterpart in any of the three (it is not exported). Each exported model
is read back with ``from_pretrained``; f and P come from our model's own routing (per-layer
``router_stats`` shares, and the router distribution of its recorded logits)."""
from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from _tiny import synthetic_data, tiny_preset  # noqa: E402

from studylib.nn import router  # noqa: E402
from studylib.run.hf import export as ex  # noqa: E402
from studylib.run.rundir import RunDir  # noqa: E402
from studylib.run.trainer import train_run  # noqa: E402

VOCAB = 300
BAL = {"balance_coef": 0.01, "z_coef": 0.001}
MODELS = {  # name: (model settings, HF architecture)
    "mixtral_1l": ({"n_layers": 1, "ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, **BAL}},
                   "MixtralForCausalLM"),
    "mixtral_3l": ({"n_layers": 3, "ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, **BAL}},
                   "MixtralForCausalLM"),
    "qwen_switch_1l": ({"n_layers": 1, "ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 1,
                                               "renormalize": False, **BAL}}, "Qwen2MoeForCausalLM"),
    "qwen_shared_2l": ({"n_layers": 2, "ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2,
                                               "n_shared": 1, "renormalize": False, **BAL}}, "Qwen2MoeForCausalLM"),
    "glm_2l": ({"n_layers": 2, "ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, "score": "sigmoid",
                                       "bias_balance": True, "bias_rate": 0.01, "n_shared": 1, **BAL}},
               "Glm4MoeForCausalLM"),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each model trained a few steps (routing away from its initialisation), exported, read back."""
    from transformers import AutoModelForCausalLM

    from studylib.data.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("conventions")
    rng = random.Random(0)
    words = "once upon a time there was a little girl named Lily who liked to play in the park".split()
    sp = root / "tok.model"
    train_tokenizer([" ".join(rng.choice(words) for _ in range(8)) + "." for _ in range(800)], VOCAB, sp, threads=1)
    preset = tiny_preset(data={"vocab_size": VOCAB}, train={"max_steps": 6, "eval_every": 6, "lr": 1e-2},
                         models={k: v for k, (v, _) in MODELS.items()})
    data = synthetic_data(vocab=VOCAB, n_windows=120)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    try:
        for name in MODELS:
            train_run(preset, name, 1, run_dir=root / name, progress=False, data=data)
            hf_dir = ex.export(root / name, root / f"{name}-hf", tokenizer=sp)
            hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
            ours = RunDir(root / name).load_model(tokenizer=sp).model.eval()
            out[name] = (ours, hf)
    finally:
        torch.set_num_threads(n)
    return out


BATCH = torch.randint(0, VOCAB, (4, 32), generator=torch.Generator().manual_seed(3))


def _ours_routing(ours, x):
    """Our forward on ``x`` (targets: the next tokens) and, per MoE layer, (f_E, P_E): the shares
    of the assignments (the model's ``router_stats``) and the mean router distribution of the
    logits it routed."""
    logits = []

    def record(ffn, args):
        x_TD = args[0].reshape(-1, args[0].shape[-1])
        logits.append(router.logits(x_TD, ffn.router.weight, ffn.cfg.router_scale).detach())

    hooks = [b.ffn.register_forward_pre_hook(record) for b in ours.blocks]
    try:
        with torch.no_grad():
            out = ours(x[:, :-1], x[:, 1:], stats=True)
    finally:
        for h in hooks:
            h.remove()
    f = [torch.tensor(s["shares"]) for s in out.router_stats]
    P = [router.distribution(lg, b.ffn.cfg.score).float().mean(0) for lg, b in zip(logits, ours.blocks)]
    return out, f, P, logits


def _hf(hf, x):
    with torch.no_grad():
        return hf(input_ids=x[:, :-1], labels=x[:, :-1], output_router_logits=True)  # HF shifts the labels


def _ce(hf_out, x):
    """HF's LM loss alone: its logits' cross-entropy on the tokens it predicts (it drops the last)."""
    lg = hf_out.logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[:, 1:-1].reshape(-1))


@pytest.mark.parametrize("name", ["mixtral_1l", "qwen_switch_1l"])
def test_one_layer_aux_loss_is_ours_times_top_k(exported, one_thread, name):
    ours, hf = exported[name]
    assert type(hf).__name__ == MODELS[name][1]
    k, coef = ours.cfg.ffn.top_k, ours.cfg.ffn.balance_coef
    mine, h = ours(BATCH[:, :-1], BATCH[:, 1:]), _hf(hf, BATCH)
    assert mine.balance_loss.item() > 1.0 + 1e-4  # routing not uniform: the check can fail
    assert h.aux_loss.item() == pytest.approx(k * mine.balance_loss.item(), rel=1e-5)
    assert hf.config.router_aux_loss_coef == pytest.approx(coef / k)
    # the term HF adds to its loss is our balance term (no z-loss on HF's side)
    assert (h.loss - _ce(h, BATCH)).item() == pytest.approx(coef * mine.balance_loss.item(), rel=1e-4)


@pytest.mark.parametrize("name", ["mixtral_3l", "qwen_shared_2l"])
def test_several_layers_hf_pools_them(exported, one_thread, name):
    ours, hf = exported[name]
    assert type(hf).__name__ == MODELS[name][1]
    k, E = ours.cfg.ffn.top_k, ours.cfg.ffn.num_experts
    mine, f, P, logits = _ours_routing(ours, BATCH)
    h = _hf(hf, BATCH)
    for lg_ours, lg_hf in zip(logits, h.router_logits):  # the same routing on both sides
        assert (lg_ours - lg_hf.reshape(lg_ours.shape)).abs().max().item() < 1e-5
    f_LE, P_LE = torch.stack(f), torch.stack(P)
    assert mine.balance_loss.item() == pytest.approx((E * (f_LE * P_LE).sum(-1)).mean().item(), rel=1e-5)
    pooled = k * E * (f_LE.mean(0) * P_LE.mean(0)).sum()  # HF: one f (summing to k) and one P over all layers
    assert h.aux_loss.item() == pytest.approx(pooled.item(), rel=1e-5)
    cov_E = ((f_LE - f_LE.mean(0)) * (P_LE - P_LE.mean(0))).mean(0)
    gap = k * mine.balance_loss.item() - h.aux_loss.item()
    assert abs(gap) > 1e-5  # the two conventions differ on this batch ...
    assert gap == pytest.approx(k * E * cov_E.sum().item(), rel=1e-3, abs=1e-7)  # ... by exactly this


def test_glm4moe_has_no_aux_loss(exported, one_thread):
    ours, hf = exported["glm_2l"]
    assert type(hf).__name__ == "Glm4MoeForCausalLM"
    mine, f, P, logits = _ours_routing(ours, BATCH)
    h = _hf(hf, BATCH)
    assert mine.balance_loss.item() > 0 and getattr(h, "aux_loss", None) is None
    assert h.loss.item() == pytest.approx(_ce(h, BATCH).item(), rel=1e-6)  # the LM loss alone
    for lg_ours, lg_hf in zip(logits, h.router_logits):  # its router logits are ours: recompute from them
        assert (lg_ours - lg_hf.reshape(lg_ours.shape)).abs().max().item() < 1e-5
