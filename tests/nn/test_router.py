"""studylib.nn.router: the Router module (its weight, selection bias and load counts, one routing
record per forward) and the router variants (issue #21): sigmoid scores, the aux-loss-free selection bias, the route
scale, shared experts and the sequence-wise balance loss. Every dispatch path of a whole MoE layer
equals a per-token reference written out here (outputs and every gradient, fp32), and the bias
follows its rules: selection only, one update per optimizer step from the whole step's loads,
never moved by evaluation or decoding, saved and restored exactly."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from _tiny import synthetic_data, tiny_preset
from studylib.config import FFNConfig, ModelConfig, count_params
from studylib.nn import router_losses
from studylib.nn.dispatch import PATHS
from studylib.nn.ffn import SparseMoE
from studylib.nn.model import Decoder
from studylib.nn.router import Router

VARIANTS = {
    "reference": {},
    "sigmoid": {"score": "sigmoid"},
    "sigmoid_unnormalised": {"score": "sigmoid", "renormalize": False},
    "bias": {"bias_balance": True},
    "sigmoid_bias_scaled": {"score": "sigmoid", "bias_balance": True, "route_scale": 2.5},
    "shared1": {"n_shared": 1},
    "shared2_top1": {"n_shared": 2, "top_k": 1},
    "everything": {"score": "sigmoid", "bias_balance": True, "route_scale": 1.5, "n_shared": 1,
                   "seq_balance_coef": 0.01},
}


def _layer(variant: dict, dispatch: str, D=16, H=12, E=5, K=2, seed=0) -> SparseMoE:
    opts = dict(variant)
    cfg = FFNConfig(kind="moe", hidden=H, num_experts=E, top_k=opts.pop("top_k", K), dispatch=dispatch,
                    grouped_mm="off", **opts)
    torch.manual_seed(seed)
    layer = SparseMoE(D, cfg)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.3)
        if cfg.bias_balance:  # a bias large enough to change which experts are chosen
            layer.router.bias_E.copy_(torch.tensor([0.3, -0.2, 0.0, 0.25, -0.1])[:E])
    return layer


def reference_layer(layer: SparseMoE, x_TD: torch.Tensor) -> torch.Tensor:
    """Per token: score every expert, pick the k best of score + bias, weight the picks by their
    unbiased scores (normalised, scaled), add the shared experts one by one."""
    cfg, H = layer.cfg, layer.cfg.hidden
    Wr, w_in, w_out = layer.router.weight, layer.w_in_EFD, layer.w_out_EDH
    rows = []
    for t in range(x_TD.shape[0]):
        logit = (Wr @ x_TD[t]) * cfg.router_scale
        s = torch.softmax(logit, -1) if cfg.score == "softmax" else torch.sigmoid(logit)
        pick = s + layer.router.bias_E if cfg.bias_balance else s
        chosen = sorted(range(cfg.num_experts), key=lambda e: -float(pick[e]))[:cfg.top_k]
        w = torch.stack([s[e] for e in chosen])
        if cfg.renormalize:
            w = w / w.sum()
        w = w * cfg.route_scale
        acc = torch.zeros_like(x_TD[t])
        for k, e in enumerate(chosen):
            h = w_in[e] @ x_TD[t]
            acc = acc + w[k] * (w_out[e] @ (F.silu(h[:H]) * h[H:]))
        if layer.shared is not None:  # n_shared experts of width H, from the one fused SwiGLU
            n = cfg.n_shared
            g_in, g_out = layer.shared.w_in.weight, layer.shared.w_out.weight  # (2nH, D), (D, nH)
            for j in range(n):
                gate = g_in[j * H:(j + 1) * H] @ x_TD[t]
                up = g_in[n * H + j * H:n * H + (j + 1) * H] @ x_TD[t]
                acc = acc + g_out[:, j * H:(j + 1) * H] @ (F.silu(gate) * up)
        rows.append(acc)
    return torch.stack(rows)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_and_path_matches_the_per_token_reference(name, path):
    layer = _layer(VARIANTS[name], path)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 9, 16, generator=g)
    gy = torch.randn(2, 9, 16, generator=g)
    _assert_matches_reference(layer, x, gy, lambda xr: reference_layer(layer, xr),
                              lambda xp: layer(xp, aux=False)[0], f"{name}, {path}")


def _assert_matches_reference(layer, x, gy, reference, forward, label: str) -> None:
    """``forward`` (the layer on ``x``) against ``reference`` (per token, on ``x`` flattened to
    rows): the outputs, the input's gradient and every parameter's gradient of ``sum(y * gy)``."""
    xr = x.clone().requires_grad_(True)
    ref = reference(xr.reshape(-1, x.shape[-1]))
    (ref * gy.reshape(-1, x.shape[-1])).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    xp = x.clone().requires_grad_(True)
    y = forward(xp)
    (y * gy).sum().backward()
    torch.testing.assert_close(y.reshape(ref.shape), ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xp.grad, xr.grad, rtol=1e-5, atol=1e-5)
    for n, p in layer.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[n], rtol=1e-5, atol=1e-5, msg=f"grad of {n} ({label})")


def test_the_bias_picks_the_experts_but_not_their_weights():
    layer = _layer({"bias_balance": True}, "grouped")
    with torch.no_grad():
        layer.router.bias_E.copy_(torch.tensor([10.0, 10.0, 0.0, 0.0, 0.0]))  # experts 0 and 1, always
    x = torch.randn(1, 7, 16)
    _, out = layer(x, stats=True, aux=False)
    w = out.routing.combine_TE()  # (T, E) combine weights
    assert (w[:, 2:] == 0).all() and (w[:, :2] > 0).all()
    p = torch.softmax(x.reshape(-1, 16) @ layer.router.weight.T, -1)[:, :2]
    torch.testing.assert_close(w[:, :2], p / p.sum(-1, keepdim=True))  # the unbiased scores, renormalised
    full = torch.softmax(x.reshape(-1, 16) @ layer.router.weight.T, -1)
    in_top2 = (full.argsort(-1, descending=True)[:, :2, None] == torch.arange(2)).any(1)  # (T, 2): 0, 1 in top-2?
    assert out.stats["bias_picked"] == pytest.approx(float((~in_top2).float().mean()))  # of the T x 2 picks
    assert 0 < out.stats["bias_picked"] <= 1


def test_picked_by_bias_marks_the_chosen_experts_outside_the_top_k():
    from studylib.nn.router import picked_by_bias

    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]])
    chosen = torch.tensor([[0, 3], [3, 2]])  # token 0: expert 3 is 4th; token 1: its own top-2
    assert picked_by_bias(probs, chosen).tolist() == [[False, True], [False, False]]
    ref = _layer({}, "grouped")
    _, out = ref(torch.randn(1, 7, 16), stats=True, aux=False)
    assert "bias_picked" not in out.stats  # only routers with a selection bias report it


def test_shared_experts_are_counted_as_active_parameters():
    for opts in ({"n_shared": 1}, {"n_shared": 2, "top_k": 1}, {"bias_balance": True}):
        f = FFNConfig(kind="moe", hidden=24, num_experts=4, top_k=opts.pop("top_k", 2), **opts)
        cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, context=16, ffn=f)
        m = Decoder(cfg)
        assert count_params(cfg).total == sum(p.numel() for p in m.parameters())  # the bias is a buffer
        one = 3 * 32 * 24
        assert count_params(cfg).ffn_active == 2 * one * (f.top_k + f.n_shared)


def test_sequence_balance_loss_is_the_per_sequence_switch_loss():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(3, 10, 4, generator=g), -1)
    idx = p.topk(2, -1).indices
    f = [torch.tensor([float((idx[b] == e).sum()) for e in range(4)]) / idx[b].numel() for b in range(3)]
    per_seq = [router_losses.balance_loss(p[b], f[b]) for b in range(3)]
    torch.testing.assert_close(router_losses.sequence_balance_loss(p, idx), torch.stack(per_seq).mean())
    uniform = torch.full((2, 8, 4), 0.25)
    even = (torch.arange(16).reshape(2, 8, 1) * 2 + torch.arange(2)) % 4  # every expert equally often
    assert float(router_losses.sequence_balance_loss(uniform, even)) == pytest.approx(1.0)


def test_variants_refused_outside_the_routed_moe():
    from studylib.config import ConfigError

    with pytest.raises(ConfigError, match="ffn.score: a router variant of the routed MoE"):
        FFNConfig(kind="soft", num_experts=2, score="sigmoid").validate()
    with pytest.raises(ConfigError, match="ffn.bias_rate: must be > 0"):
        FFNConfig(kind="moe", num_experts=2, bias_balance=True, bias_rate=0).validate()


# --------------------------------------------------------------------------------------------
# the bias during training
# --------------------------------------------------------------------------------------------
BIAS_MOE = {"ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, "bias_balance": True,
                    "bias_rate": 0.01}}


@pytest.fixture(scope="module")
def data():
    return synthetic_data()


def _preset(**train):
    return tiny_preset(models={"bias": BIAS_MOE}, train={"max_steps": 6, "eval_every": 3, **train})


def test_one_update_per_optimizer_step_from_the_whole_steps_loads(tmp_path, data, monkeypatch, one_thread):
    from studylib.run import trainer as T

    calls = []
    update = Router.update_bias

    def spy(self, load_E):
        calls.append(load_E.clone())
        return update(self, load_E)

    monkeypatch.setattr(Router, "update_bias", spy)
    p = _preset(grad_accum=2)
    T.train_run(p, "bias", 1, run_dir=tmp_path / "r", progress=False, data=data)
    L = p.model_config("bias").n_layers
    assert len(calls) == 6 * L  # once per step and layer, not per micro-batch, not at evaluation
    per_step = p.train.batch_size * p.train.grad_accum * (data.context - 1) * 2  # windows x tokens x k
    assert all(int(c.sum()) == per_step for c in calls)


def test_eval_and_decoding_leave_the_bias_and_a_checkpoint_holds_it(tmp_path, data, one_thread, monkeypatch):
    from studylib.run import checkpoint as C
    from studylib.run import trainer as T
    from studylib.run.decode import generate
    from studylib.run.rundir import RunDir

    loads, update = [], Router.update_bias

    def spy(self, load_E):
        loads.append(load_E.clone())
        return update(self, load_E)

    monkeypatch.setattr(Router, "update_bias", spy)  # 5 steps: an odd count of +-rate moves
    T.train_run(_preset(max_steps=5), "bias", 1, run_dir=tmp_path / "r", progress=False, data=data)
    rd = RunDir(tmp_path / "r")
    state = C.load(rd.checkpoints / C.LATEST)
    bias = [v for k, v in state["model"].items() if k.endswith("ffn.router.bias_E")]
    L, rate = len(bias), BIAS_MOE["ffn"]["bias_rate"]
    expected = [sum(torch.sign(x.mean() - x) for x in loads[i::L]) * rate for i in range(L)]  # one step per layer and step
    assert bias and all(torch.allclose(b.double(), e, atol=1e-7) for b, e in zip(bias, expected))  # saved as it moved
    assert any(b.abs().sum() > 0 for b in bias)
    m = Decoder(_preset().model_config("bias"))
    m.load_state_dict(state["model"])
    before = [b.ffn.router.bias_E.clone() for b in m.blocks]
    m.eval()
    with torch.no_grad():
        m(data.windows(data.val_idx[:4])[:, :-1], data.windows(data.val_idx[:4])[:, 1:])
    generate(m, [1, 2, 3], 5, temperature=0.0)
    with m.routing_step(lambda: []):  # a step with no forward counts nothing: no move
        pass
    assert all(torch.equal(a, b.ffn.router.bias_E) for a, b in zip(before, m.blocks))


def _crash_and_resume(p, model, run_dir, data, monkeypatch) -> None:
    """Train ``model`` into ``run_dir``, killed in step 6 (checkpoint at 3), then resumed to the end."""
    from studylib.run import trainer as T
    import studylib.nn.model as M

    forward, calls = M.Decoder.forward, {"n": 0}

    def crash(self, *a, **kw):
        if self.training:
            calls["n"] += 1
            if calls["n"] > 2 * 5:  # dies in step 6 (checkpoint at 3)
                raise KeyboardInterrupt
        return forward(self, *a, **kw)

    with monkeypatch.context() as mp:
        mp.setattr(M.Decoder, "forward", crash)
        with pytest.raises(KeyboardInterrupt):
            T.train_run(p, model, 1, run_dir=run_dir, progress=False, data=data)
    T.train_run(p, model, 1, run_dir=run_dir, progress=False, data=data)


def test_resume_with_the_bias_is_bit_exact(tmp_path, data, monkeypatch, one_thread):
    from studylib.run import checkpoint as C
    from studylib.run import trainer as T
    from studylib.run.rundir import RunDir

    p = _preset(max_steps=8)
    T.train_run(p, "bias", 1, run_dir=tmp_path / "ref", progress=False, data=data)
    _crash_and_resume(p, "bias", tmp_path / "res", data, monkeypatch)
    a, b = (C.load(RunDir(tmp_path / n).checkpoints / C.LATEST)["model"] for n in ("ref", "res"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert RunDir(tmp_path / "res").summary()["best_val_loss"] == RunDir(tmp_path / "ref").summary()["best_val_loss"]


# --------------------------------------------------------------------------------------------
# the global-batch balance loss (balance_scope: global)
# --------------------------------------------------------------------------------------------
def _moe_preset(scope: str, accum: int):
    moe = {"ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, "balance_coef": 0.05,
                   "balance_scope": scope}}
    return tiny_preset(models={"m": moe}, model={"dropout": 0.0},
                       train={"max_steps": 4, "eval_every": 2, "batch_size": 8 // accum, "grad_accum": accum})


def test_global_balance_with_one_micro_batch_equals_the_micro_batch_loss(tmp_path, data, one_thread):
    """One micro-batch, one rank: the pre-pass routes exactly what the training forward routes, so
    every record equals the micro-batch-scope run's."""
    from _tiny import comparable
    from studylib.run import trainer as T
    from studylib.run.rundir import RunDir

    for scope in ("micro", "global"):
        T.train_run(_moe_preset(scope, 1), "m", 1, run_dir=tmp_path / scope, progress=False, data=data)
    a, b = (comparable(RunDir(tmp_path / s).read_metrics()) for s in ("micro", "global"))
    assert a == b and len(a) > 4


def test_global_balance_counts_the_loads_of_the_whole_step(tmp_path, data, monkeypatch, one_thread):
    """Two micro-batches: both use the shares of their union (the training forwards' own routing),
    which differ from each micro-batch's own."""
    from studylib.run import trainer as T

    calls = []
    loss = router_losses.balance_loss

    def spy(probs_TE, f_E):
        if torch.is_grad_enabled():  # training forwards only
            calls.append(f_E.clone())
        return loss(probs_TE, f_E)

    records = []
    forward = Router.forward

    def record(self, x_TD, ids_T=None):
        rec = forward(self, x_TD, ids_T)
        if torch.is_grad_enabled():
            records.append(rec.idx_TK.clone())
        return rec

    monkeypatch.setattr(router_losses, "balance_loss", spy)
    monkeypatch.setattr(Router, "forward", record)
    p = _moe_preset("global", 2)
    T.train_run(p, "m", 1, run_dir=tmp_path / "g", progress=False, data=data)
    L = p.model_config("m").n_layers
    (i0, f0), (i1, f1) = (records[0], calls[0]), (records[L], calls[L])  # layer 0 of micro-batches 0, 1 of step 1
    union = torch.bincount(torch.cat([i0, i1]).reshape(-1), minlength=4).float()
    torch.testing.assert_close(f0, union / union.sum())
    assert torch.equal(f0, f1)
    own = torch.bincount(i0.reshape(-1), minlength=4).float()
    assert not torch.allclose(own / own.sum(), f0)  # the micro-batch's own loads differ


# --------------------------------------------------------------------------------------------
# the router module: its routing record, its state's keys and its draws
# --------------------------------------------------------------------------------------------
ROUTERS = {"reference": {}, "sigmoid_bias": {"score": "sigmoid", "bias_balance": True, "route_scale": 2.0}}


def _routed_model(variant: dict, **ffn) -> Decoder:
    f = FFNConfig(kind="moe", hidden=24, num_experts=5, top_k=2, router_scale=1.5, **variant, **ffn)
    torch.manual_seed(0)
    m = Decoder(ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, context=16, ffn=f))
    with torch.no_grad():
        for b in m.blocks:
            b.ffn.router.weight.normal_(0, 0.5)
            if f.bias_balance:  # large enough to move the selection
                b.ffn.router.bias_E.copy_(torch.tensor([0.4, -0.3, 0.0, 0.35, -0.1]))
    return m.eval()


def reference_choice(ffn, x_TD: torch.Tensor) -> tuple[list, list]:
    """Per token, written out: the k experts of largest score (+ bias) and their weights."""
    cfg = ffn.cfg
    chosen, weights = [], []
    for t in range(x_TD.shape[0]):
        logit = (ffn.router.weight @ x_TD[t]) * cfg.router_scale
        s = torch.softmax(logit, -1) if cfg.score == "softmax" else torch.sigmoid(logit)
        pick = s + ffn.router.bias_E if cfg.bias_balance else s
        c = sorted(range(cfg.num_experts), key=lambda e: -float(pick[e]))[:cfg.top_k]
        w = torch.stack([s[e] for e in c])
        w = w / w.sum() * cfg.route_scale if cfg.renormalize else w * cfg.route_scale
        chosen.append(c), weights.append(w)
    return chosen, weights


def layer_inputs(m: Decoder, x_BS: torch.Tensor) -> dict:
    """The input (T, D) each routed FFN saw in a forward, by forward pre-hooks."""
    seen = {}
    hooks = [b.ffn.register_forward_pre_hook(lambda mod, a, i=i: seen.__setitem__(i, a[0].reshape(-1, a[0].shape[-1])))
             for i, b in enumerate(m.blocks)]
    with torch.no_grad():
        m(x_BS)
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.parametrize("name", ROUTERS)
def test_the_forward_records_the_experts_it_used(name):
    """ModelOutput.routing holds each layer's choice: the experts of the per-token reference,
    their weights, and the counts of those assignments."""
    m = _routed_model(ROUTERS[name])
    x = torch.randint(0, 64, (3, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = m(x)
    seen = layer_inputs(m, x)
    moved = 0
    for i, rec in enumerate(out.routing):
        chosen, weights = reference_choice(m.blocks[i].ffn, seen[i])
        assert rec.idx_TK.tolist() == chosen  # same experts, in the top-k's order
        torch.testing.assert_close(rec.w_TK, torch.stack(weights))
        assert rec.counts_E.tolist() == torch.bincount(torch.tensor(chosen).reshape(-1), minlength=5).tolist()
        moved += int(rec.probs_TE.topk(2, -1).indices.sort(-1).values.ne(rec.idx_TK.sort(-1).values).any())
    assert (moved > 0) == (name == "sigmoid_bias")  # the bias really moved some choices


def test_a_checkpoint_with_the_old_bias_key_loads():
    """Weights saved with the bias as ``<layer>.expert_bias_E`` (before it moved into the router)
    load into ``<layer>.router.bias_E``; the current key loads as well."""
    m = _routed_model(ROUTERS["sigmoid_bias"])
    state = m.state_dict()
    assert [k for k in state if "bias" in k] == ["blocks.0.ffn.router.bias_E", "blocks.1.ffn.router.bias_E"]
    old = {k.replace("ffn.router.bias_E", "ffn.expert_bias_E"): v for k, v in state.items()}
    for sd in (old, state):
        fresh = Decoder(m.cfg)
        fresh.load_state_dict(sd)  # strict
        assert all(torch.equal(a.ffn.router.bias_E, b.ffn.router.bias_E) for a, b in zip(fresh.blocks, m.blocks))
        assert float(fresh.blocks[0].ffn.router.bias_E.abs().sum()) > 0


def _reference_init(m: Decoder, key: int) -> dict:
    """The whole model's initial state written out as one loop over its named parameters: each
    tensor N(0, its std) from a generator seeded by hashing ``key`` and its keyed name (a dense
    FFN as expert 0, each expert on its own), the soft gate 0, norms 1."""
    import hashlib
    import math

    def fill(shape, std, name):
        seed = int.from_bytes(hashlib.blake2b(f"{key}/{name}".encode(), digest_size=8).digest(), "little") >> 1
        return torch.empty(shape).normal_(0.0, std, generator=torch.Generator().manual_seed(seed))

    cfg = m.cfg
    std, out_std, fan_in = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers), cfg.expert_init == "fan_in"
    out = {}
    for name, p in m.named_parameters():
        parts = name.split(".")
        if name == "tok_emb.weight":
            out[name] = fill(p.shape, std, "tok_emb")
        elif parts[-2].endswith("norm") or name == "norm.weight":
            out[name] = torch.ones(p.shape)
        elif parts[2] == "attn":
            out[name] = fill(p.shape, std if parts[3] == "wqkv" else out_std, ".".join(parts[:4]))
        elif parts[3] == "router":
            out[name] = torch.zeros(p.shape) if m.blocks[int(parts[1])].ffn.router.soft else fill(p.shape, std, ".".join(parts[:4]))
        else:  # an FFN's weights: the experts (E, ...), a dense FFN or the shared experts (each as expert 0)
            shared = parts[3] == "shared"
            prefix = ".".join(parts[:3] + (["shared"] if shared else []))
            w_in = parts[-1].startswith("w_in") or parts[-2] == "w_in"
            stacked = p.shape if p.dim() == 3 else (1, *p.shape)
            expert_std = 1 / math.sqrt(stacked[2] if w_in or not shared else cfg.ffn_for_layer(int(parts[1])).hidden)
            s = expert_std if fan_in and (p.dim() == 3 or shared) else std if w_in else out_std
            rows = [fill(stacked[1:], s, f"{prefix}.{'w_in' if w_in else 'w_out'}.{e}") for e in range(stacked[0])]
            out[name] = torch.stack(rows).reshape(p.shape)
    return out


INITS = {
    "dense": dict(ffn=FFNConfig(kind="dense", hidden=40)),
    "moe_mixed": dict(ffn=FFNConfig(kind="moe", hidden=24, num_experts=4, top_k=2, layers=(1,))),
    "moe_shared_fan_in": dict(ffn=FFNConfig(kind="moe", hidden=24, num_experts=4, top_k=1, n_shared=2,
                                            bias_balance=True), expert_init="fan_in"),
    "soft_fan_in": dict(ffn=FFNConfig(kind="soft", hidden=24, num_experts=3), expert_init="fan_in"),
    "soft": dict(ffn=FFNConfig(kind="soft", hidden=24, num_experts=3)),
}


@pytest.mark.parametrize("name", INITS)
def test_the_modules_draw_each_tensor_from_its_keyed_generator(name):
    cfg = ModelConfig(vocab_size=64, d_model=16, n_layers=3, n_heads=2, n_kv_heads=1, context=16, **INITS[name])
    torch.manual_seed(5)
    key = int(torch.randint(0, 2**62, (1,)).item())  # the model's first draw
    torch.manual_seed(5)
    m = Decoder(cfg)
    assert m.init_key == key
    ref = _reference_init(m, key)
    assert ref.keys() == dict(m.named_parameters()).keys()
    assert all(torch.equal(p, ref[k]) for k, p in m.named_parameters()), name


# --------------------------------------------------------------------------------------------
# the router controls: the hash router (experts by token id) and the frozen router
# --------------------------------------------------------------------------------------------
from studylib.config import ConfigError  # noqa: E402
from studylib.nn.router import HASH_SEED, hash_table  # noqa: E402

HASH = {"ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, "router": "hash"}}
FROZEN = {"ffn": {"kind": "moe", "hidden": 32, "num_experts": 4, "top_k": 2, "balance_coef": 0.01,
                  "z_coef": 0.001, "router": "frozen"}}


def test_the_hash_table_deals_every_pair_of_experts_to_an_equal_share_of_the_vocabulary():
    V, E, K = 101, 4, 2
    t = hash_table(V, E, K)
    assert torch.equal(t, hash_table(V, E, K, seed=HASH_SEED))  # one fixed draw
    assert not torch.equal(t, hash_table(V, E, K, seed=HASH_SEED + 1))  # it is a draw, not an order
    assert t.shape == (V, K) and bool((t[:, 0] < t[:, 1]).all())  # K distinct experts per id
    pairs = torch.bincount(t[:, 0] * E + t[:, 1], minlength=E * E)
    used = pairs[pairs > 0]
    assert len(used) == 6 and set(used.tolist()) <= {V // 6, V // 6 + 1}  # binom(4, 2) pairs, dealt evenly
    per_expert = torch.bincount(t.reshape(-1), minlength=E)
    assert int(per_expert.max() - per_expert.min()) <= 3  # each expert: half the ids, up to the remainder


def _enumerated_table(V, E, K, seed=HASH_SEED):
    """The table as it was built before: every K-subset enumerated (itertools), dealt by the permutation."""
    import itertools

    subsets = torch.tensor(list(itertools.combinations(range(E), K)), dtype=torch.long)
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(seed))
    return subsets[perm % len(subsets)]


@pytest.mark.parametrize("V,E,K", [(101, 4, 2), (53, 4, 2), (320, 4, 2), (384, 4, 1), (50, 9, 1), (7, 7, 7),
                                   (20, 6, 6), (20, 6, 3), (5, 6, 3), (924, 12, 6), (1000, 16, 8), (3, 1, 1)])
def test_the_hash_table_is_the_enumerated_one(V, E, K):
    """Computed subset by subset (the combinatorial number system), the table of every (V, E, K)
    is the one the enumeration of all binom(E, K) subsets gave: hash runs keep their routing."""
    assert torch.equal(hash_table(V, E, K), _enumerated_table(V, E, K))


def test_the_hash_table_of_32_of_64_experts_is_built_without_enumerating_them(one_thread):
    """binom(64, 32) ~ 1.8e18 subsets: enumerating them was a MemoryError. An id takes subset
    perm[v] < V, one of the first V in lexicographic order (enumerable here)."""
    import itertools
    import time

    V = 5000
    t0 = time.perf_counter()
    t = hash_table(V, 64, 32)
    assert time.perf_counter() - t0 < 5.0
    first = list(itertools.islice(itertools.combinations(range(64), 32), V))
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(HASH_SEED))
    assert t.tolist() == [list(first[int(i)]) for i in perm]


def _hash_model(dispatch="grouped"):
    cfg = ModelConfig(name="h", vocab_size=53, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, context=24,
                      dropout=0.0, ffn=FFNConfig(kind="moe", hidden=12, num_experts=4, top_k=2, router="hash",
                                                 dispatch=dispatch, grouped_mm="off"))
    torch.manual_seed(0)
    return Decoder(cfg)


def test_the_hash_router_routes_by_the_token_id_alone_with_equal_weights():
    m = _hash_model().eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 53, (3, 20), generator=g)
    ids[1, 5] = ids[0, 2] = ids[2, 19] = 7  # one id at several positions and in several sequences
    other = torch.randint(0, 53, (3, 20), generator=g)
    other[:, 4] = 7  # the same id in other contexts
    table = hash_table(53, 4, 2)
    for batch in (ids, other):
        out = m(batch, stats=True)
        for rec in out.routing:
            assert torch.equal(rec.idx_TK, table[batch.reshape(-1)])  # a function of the id only
            assert bool((rec.w_TK == 0.5).all())  # equal gates 1/K
            assert torch.equal(rec.counts_E, torch.bincount(rec.idx_TK.reshape(-1), minlength=4))
        assert float(out.balance_loss) == float(out.z_loss) == float(out.aux_loss) == 0.0  # no scores, no losses
    assert all(b.ffn.router.weight is None for b in m.blocks)  # parameter-free
    assert "router" not in " ".join(n for n, _ in m.named_parameters())
    assert not any("table" in k for k in m.state_dict())  # rebuilt from the seed, never saved
    c = count_params(m.cfg)
    assert c.router == 0 and c.total == sum(p.numel() for p in m.parameters())


def reference_hash_layer(layer: SparseMoE, x_TD: torch.Tensor, ids_T: torch.Tensor) -> torch.Tensor:
    """Per token: its id's two experts from the table, each weighted 1/2, written out."""
    H, table = layer.cfg.hidden, hash_table(53, 4, 2)
    w_in, w_out = layer.w_in_EFD, layer.w_out_EDH
    rows = []
    for t in range(x_TD.shape[0]):
        acc = torch.zeros_like(x_TD[t])
        for e in table[int(ids_T[t])].tolist():
            h = w_in[e] @ x_TD[t]
            acc = acc + 0.5 * (w_out[e] @ (F.silu(h[:H]) * h[H:]))
        rows.append(acc)
    return torch.stack(rows)


@pytest.mark.parametrize("path", PATHS)
def test_the_hash_router_on_every_dispatch_path_matches_the_per_token_reference(path):
    layer = _hash_model(path).blocks[0].ffn
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.3)
    g = torch.Generator().manual_seed(1)
    x, gy = torch.randn(2, 9, 16, generator=g), torch.randn(2, 9, 16, generator=g)
    ids = torch.randint(0, 53, (2, 9), generator=g)
    _assert_matches_reference(layer, x, gy, lambda xr: reference_hash_layer(layer, xr, ids.reshape(-1)),
                              lambda xp: layer(xp, ids_BS=ids)[0], path)
    with pytest.raises(ValueError, match="routes by token id"):
        layer(x)  # no ids: refused, never routed by something else


@pytest.mark.parametrize("field,value", [("balance_coef", 0.01), ("z_coef", 0.001), ("bias_balance", True),
                                         ("seq_balance_coef", 0.01), ("score", "sigmoid")])
def test_the_hash_router_refuses_the_losses_and_variants_of_scores(field, value):
    with pytest.raises(ConfigError, match=f"ffn.{field}: the hash router has no scores"):
        FFNConfig(kind="moe", hidden=8, num_experts=4, top_k=2, router="hash", **{field: value}).validate("ffn")
    with pytest.raises(ConfigError, match="ffn.router: a router variant of the routed MoE"):
        FFNConfig(kind="dense", hidden=8, router="frozen").validate("ffn")


def test_the_hash_seed_draws_the_table_and_belongs_to_the_hash_router_only():
    """``ffn.hash_seed``: the router's table is that seed's draw (another seed, another table; the
    default the fixed HASH_SEED); any other router refuses a non-default seed, one line."""
    V = 97
    cfg = FFNConfig(kind="moe", hidden=8, num_experts=4, top_k=2, router="hash")
    assert torch.equal(Router(16, cfg, vocab_size=V).table_VK, hash_table(V, 4, 2, HASH_SEED))
    other = dataclasses.replace(cfg, hash_seed=7)
    other.validate("ffn")
    assert torch.equal(Router(16, other, vocab_size=V).table_VK, hash_table(V, 4, 2, 7))
    assert not torch.equal(hash_table(V, 4, 2, 7), hash_table(V, 4, 2, HASH_SEED))
    with pytest.raises(ConfigError, match=r"^ffn.hash_seed: the hash router's table, but this router is 'learned'"):
        dataclasses.replace(cfg, router="learned", hash_seed=7).validate("ffn")
    with pytest.raises(ConfigError, match=r"^ffn.hash_seed: expected a non-negative integer"):
        dataclasses.replace(cfg, hash_seed=-1).validate("ffn")


def test_a_hash_model_trains_and_decodes_with_a_cache(tmp_path, data, one_thread):
    from studylib.nn.model import KVCache
    from studylib.run import checkpoint as C
    from studylib.run import trainer as T
    from studylib.run.rundir import RunDir

    p = tiny_preset(models={"hash": HASH}, train={"max_steps": 4, "eval_every": 2})
    s = T.train_run(p, "hash", 1, run_dir=tmp_path / "r", progress=False, data=data)
    assert math.isfinite(s["best_val_loss"])
    from studylib.tools.explorer.diagnostics import diagnostics_over_training

    diag = diagnostics_over_training(tmp_path / "r")  # no scores: NaN, not the ln E of its stand-in logits
    assert len(diag) and diag[list(router_losses.SCORE_STATS)].isna().all().all() and diag["busiest"].notna().all()
    assert set(diag["note"]) == {"hash router: no scores"}
    m = Decoder(p.model_config("hash")).eval()
    m.load_state_dict(C.load(RunDir(tmp_path / "r").checkpoints / C.LATEST)["model"])
    idx = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    cache = KVCache(m.cfg, 2, "cpu")
    with torch.no_grad():
        full = m(idx).logits
        steps = [m(idx[:, :5], cache=cache).logits] + [m(idx[:, t:t + 1], cache=cache).logits for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)  # one token: its own id routes


def _initial_model(preset, name: str, seed: int) -> Decoder:
    """The run's model at step 0: the trainer seeds everything with the run's seed, then builds it."""
    from studylib.run.dist import seed_everything

    seed_everything(seed)
    return Decoder(preset.model_config(name))


def test_the_frozen_router_stays_at_its_initial_weight_while_the_experts_move(tmp_path, data, one_thread):
    from studylib.run import checkpoint as C
    from studylib.run import trainer as T
    from studylib.run.rundir import RunDir

    p = tiny_preset(models={"frozen": FROZEN}, train={"max_steps": 6, "eval_every": 3, "weight_decay": 0.5})
    T.train_run(p, "frozen", 1, run_dir=tmp_path / "r", progress=False, data=data)
    init = _initial_model(p, "frozen", 1).state_dict()
    final = C.load(RunDir(tmp_path / "r").checkpoints / C.LATEST)["model"]
    routers = [k for k in final if k.endswith("ffn.router.weight")]
    assert len(routers) == p.model_config("frozen").n_layers
    assert all(torch.equal(final[k], init[k]) for k in routers)  # bit-identical: no step, no decay
    assert all(not torch.equal(final[k], init[k]) for k in final if "w_in_EFD" in k or "w_out_EDH" in k)
    m = Decoder(p.model_config("frozen"))
    m.load_state_dict(final)
    assert not any(r.weight.requires_grad for r in m.routers())  # a loaded model keeps it frozen


def test_resume_with_a_frozen_router_is_bit_exact(tmp_path, data, monkeypatch, one_thread):
    from studylib.run import checkpoint as C
    from studylib.run import trainer as T
    from studylib.run.rundir import RunDir

    p = tiny_preset(models={"frozen": FROZEN}, train={"max_steps": 8, "eval_every": 3})
    T.train_run(p, "frozen", 1, run_dir=tmp_path / "ref", progress=False, data=data)
    _crash_and_resume(p, "frozen", tmp_path / "res", data, monkeypatch)
    a, b = (C.load(RunDir(tmp_path / n).checkpoints / C.LATEST)["model"] for n in ("ref", "res"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_one_expert_moe_trains_with_its_losses_on(tmp_path, data, one_thread):
    from studylib.run import trainer as T

    one = {"ffn": {"kind": "moe", "hidden": 64, "num_experts": 1, "top_k": 1, "balance_coef": 0.01,
                   "z_coef": 0.001}}
    p = tiny_preset(models={"one": one}, train={"max_steps": 4, "eval_every": 2})
    s = T.train_run(p, "one", 1, run_dir=tmp_path / "r", progress=False, data=data)
    assert math.isfinite(s["best_val_loss"])
    assert count_params(p.model_config("one")).ffn_total == count_params(p.model_config("dense")).ffn_total
