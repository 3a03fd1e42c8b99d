"""The decoder: causality, GQA, router losses, identities at model level, parameter accounting."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from studylib.nn import router_losses as routing
from studylib.config import count_params
from studylib.config import FFNConfig, ModelConfig
from studylib.nn.model import Attention, Decoder, KVCache, rope_tables

FFNS = {
    "dense": FFNConfig(kind="dense", hidden=96),
    "moe": FFNConfig(kind="moe", hidden=48, num_experts=4, top_k=2, balance_coef=0.01, z_coef=0.001),
    "moe_mixed": FFNConfig(kind="moe", hidden=48, num_experts=3, top_k=1, layers=(1,)),
    "soft": FFNConfig(kind="soft", hidden=32, num_experts=3),
}


def tiny(ffn="dense", **kw):
    base = dict(name="t", vocab_size=101, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, context=24,
                dropout=0.0, ffn=FFNS[ffn])
    base.update(kw)
    torch.manual_seed(0)
    return Decoder(ModelConfig(**base)).eval()


@pytest.mark.parametrize("ffn", list(FFNS))
def test_accounting_equals_numel(ffn):
    m = tiny(ffn)
    c = count_params(m.cfg)
    assert c.total == sum(p.numel() for p in m.parameters()) == m.cfg.num_params.total
    routers = sum(b.ffn.router.weight.numel() for b in m.blocks if hasattr(b.ffn, "router"))
    assert c.router == routers
    emb = m.tok_emb.weight.numel()
    ffn_params = sum(p.numel() for b in m.blocks for n, p in b.ffn.named_parameters() if "router" not in n)
    assert (c.embedding, c.ffn_total, c.non_ffn) == (emb, ffn_params, c.total - emb - ffn_params - routers)
    assert all(p.dim() != 1 or "norm" in n for n, p in m.named_parameters())  # no biases anywhere


@pytest.mark.parametrize("ffn", list(FFNS))
def test_causal(ffn):
    m = tiny(ffn)
    idx = torch.randint(0, 101, (2, 20))
    idx2 = idx.clone()
    idx2[:, 12] = (idx2[:, 12] + 7) % 101
    a, b = m(idx).logits, m(idx2).logits
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_gqa_with_all_kv_heads_is_plain_mha():
    cfg = ModelConfig(d_model=64, n_heads=4, n_kv_heads=4, context=16)
    att = Attention(cfg)
    x = torch.randn(2, 16, 64)
    cos, sin = rope_tables(16, 16, 10000.0)
    q, k, v = att.wqkv(x).split(64, -1)
    from studylib.nn.model import apply_rope
    q = apply_rope(q.view(2, 16, 4, 16).transpose(1, 2), cos, sin)
    k = apply_rope(k.view(2, 16, 4, 16).transpose(1, 2), cos, sin)
    v = v.view(2, 16, 4, 16).transpose(1, 2)
    s = (q @ k.transpose(-1, -2)) / 4.0
    s = s.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    ref = att.wo((s.softmax(-1) @ v).transpose(1, 2).reshape(2, 16, 64))
    torch.testing.assert_close(att(x, cos, sin), ref, rtol=1e-5, atol=1e-5)


def test_gqa_shares_kv_heads():
    """With 2 kv heads for 4 q heads, q heads 0,1 use kv head 0 and q heads 2,3 kv head 1."""
    cfg = ModelConfig(d_model=64, n_heads=4, n_kv_heads=2, context=8)
    gqa = Attention(cfg)
    mha = Attention(dataclasses.replace(cfg, n_kv_heads=4))
    with torch.no_grad():
        wq, wk, wv = gqa.wqkv.weight.split([64, 32, 32])
        rep = lambda w: w.view(2, 16, 64).repeat_interleave(2, 0).reshape(64, 64)
        mha.wqkv.weight.copy_(torch.cat([wq, rep(wk), rep(wv)]))
        mha.wo.weight.copy_(gqa.wo.weight)
    x = torch.randn(1, 8, 64)
    cos, sin = rope_tables(16, 8, 10000.0)
    torch.testing.assert_close(gqa(x, cos, sin), mha(x, cos, sin), rtol=1e-5, atol=1e-5)


def test_loss_is_next_token_ce_and_aux_zero_for_dense():
    m = tiny("dense")
    idx = torch.randint(0, 101, (2, 17))
    out = m(idx[:, :-1], idx[:, 1:], return_logits=True)
    ref = F.cross_entropy(out.logits.reshape(-1, 101), idx[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, ref)
    fused = m(idx[:, :-1], idx[:, 1:])  # default: chunked LM head + CE, no logits kept
    assert fused.logits is None
    torch.testing.assert_close(fused.loss, ref)
    assert out.aux_loss.item() == 0.0 and out.router_stats == [None, None]


def test_moe_aux_loss_weighting_and_stats():
    m = tiny("moe")
    idx = torch.randint(0, 101, (2, 17))
    out = m(idx[:, :-1], idx[:, 1:], stats=True)
    expect = 0.01 * out.balance_loss + 0.001 * out.z_loss
    torch.testing.assert_close(out.aux_loss, expect)
    assert out.balance_loss.item() >= 1.0 - 1e-6
    s = out.router_stats[1]
    assert sum(s["shares"]) == pytest.approx(1.0)
    assert 0 <= s["entropy"] <= math.log(4) + 1e-6 and 0.25 <= s["top1"] <= 1 and s["margin"] >= 0


def test_mixed_layer_pattern():
    m = tiny("moe_mixed")
    assert m.routed_layers() == [1]
    out = m(torch.randint(0, 101, (1, 8)), stats=True)
    assert out.router_stats[0] is None and out.router_stats[1] is not None


def test_balance_loss_one_at_uniform_and_larger_when_skewed():
    T, E = 64, 4
    probs = torch.full((T, E), 1 / E)
    idx = (torch.arange(T)[:, None] * 2 + torch.arange(2)) % E
    assert routing.balance_loss(probs, _shares(idx, E)).item() == pytest.approx(1.0)
    skew_p = torch.tensor([[0.7, 0.1, 0.1, 0.1]]).repeat(T, 1)
    skew_i = torch.zeros(T, 1, dtype=torch.long)
    assert routing.balance_loss(skew_p, _shares(skew_i, E)).item() == pytest.approx(4 * 0.7)


def _shares(idx_TK, E):
    """f_e, counted here: the share of the assignments that went to each expert."""
    return torch.tensor([float((idx_TK == e).sum()) for e in range(E)]) / idx_TK.numel()


def test_z_loss_formula():
    logits = torch.randn(10, 4)
    expect = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits.tolist()) / 10
    assert routing.z_loss(logits).item() == pytest.approx(expect, rel=1e-5)


def test_router_mode_switches():
    """``uniform`` forces the soft gate to 1/K: with a trained (non-zero) router it changes the
    output, and it equals the model whose router weights are zero (exactly uniform softmax)."""
    m = tiny("soft").eval()
    with torch.no_grad():
        for blk in m.blocks:
            blk.ffn.router.weight.normal_(0, 1.0)
    idx = torch.randint(0, 101, (1, 12))
    learned = m(idx).logits
    m.set_router_mode("uniform")
    uniform = m(idx).logits
    assert (uniform - learned).abs().max() > 1e-3
    m.set_router_mode("learned")
    torch.testing.assert_close(m(idx).logits, learned)
    with torch.no_grad():
        for blk in m.blocks:
            blk.ffn.router.weight.zero_()
    torch.testing.assert_close(m(idx).logits, uniform, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="sparse MoE only"):
        m.set_router_mode("balanced")
    with pytest.raises(ValueError, match="router mode"):
        m.set_router_mode("random")


def _load_dense_weights(model, dense) -> None:
    """``dense``'s weights into ``model`` (a one-expert MoE or soft MoE of the same shape): its expert
    takes the dense FFN's matrices; the router keeps its own."""
    sd = dense.state_dict()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in sd:
                p.copy_(sd[name])
            elif "w_in_EFD" in name:
                p.copy_(sd[name.replace("w_in_EFD", "w_in.weight")][None])
            elif "w_out_EDH" in name:
                p.copy_(sd[name.replace("w_out_EDH", "w_out.weight")][None])


@pytest.mark.parametrize("ffn", ["moe", "soft"])
def test_model_e1_k1_equals_dense_model(ffn):
    """Whole-model identity: a one-expert top-1 MoE (or K=1 soft) model == the dense model."""
    dense = tiny("dense")
    kind = {"moe": FFNConfig(kind="moe", hidden=96, num_experts=1, top_k=1),
            "soft": FFNConfig(kind="soft", hidden=96, num_experts=1)}[ffn]
    other = Decoder(dataclasses.replace(dense.cfg, ffn=kind)).eval()
    _load_dense_weights(other, dense)
    idx = torch.randint(0, 101, (2, 16))
    torch.testing.assert_close(other(idx).logits, dense(idx).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ffn", list(FFNS))
def test_kv_cache_matches_full_recompute(ffn):
    m = tiny(ffn)
    idx = torch.randint(0, 101, (2, 14))
    full = m(idx).logits
    cache = KVCache(m.cfg, 2, "cpu")
    steps = [m(idx[:, :6], cache=cache).logits]
    for t in range(6, 14):
        steps.append(m(idx[:, t:t + 1], cache=cache).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ffn", ["moe", "soft"])
def test_routing_records_returned(ffn):
    m = tiny(ffn)
    x = torch.randint(0, 101, (2, 7))
    out = m(x, stats=True)
    E = m.cfg.ffn.num_experts
    for rec in out.routing:
        tw = rec.combine_TE()
        assert tw.shape == (14, E) and not tw.requires_grad
        torch.testing.assert_close(tw.sum(-1), torch.ones(14))  # weights of each token sum to 1
        if ffn == "moe":
            assert ((tw > 0).sum(-1) == 2).all()  # exactly top-2 experts carry weight
            assert rec.counts_E.sum() == 14 * 2
        else:  # the soft MoE uses every expert, with its gate
            assert rec.counts_E is None and rec.idx_TK.tolist() == [list(range(E))] * 14
    plain = m(x).routing  # without stats too: the same decisions
    assert all(torch.equal(a.idx_TK, b.idx_TK) and torch.equal(a.w_TK, b.w_TK) for a, b in zip(plain, out.routing))
    assert tiny("dense")(x).routing == [None, None]


def test_last_only_logits_equal_last_row():
    m = tiny("moe")
    idx = torch.randint(0, 101, (2, 9))
    torch.testing.assert_close(m(idx, last_only=True).logits, m(idx).logits[:, -1:], rtol=1e-5, atol=1e-6)


def test_decode_head_cache_follows_weight_updates():
    m = tiny("dense")
    idx = torch.randint(0, 101, (1, 5))
    with torch.no_grad():
        a = m(idx, last_only=True).logits
        torch.testing.assert_close(a, m(idx).logits[:, -1:], rtol=1e-5, atol=1e-6)
        m.tok_emb.weight.mul_(2.0)  # an in-place update (as the optimizer does) invalidates the copy
        b = m(idx, last_only=True).logits
        torch.testing.assert_close(b, m(idx).logits[:, -1:], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(a, b)


def test_aux_losses_off_leaves_logits_and_zeroes_the_losses():
    m = tiny("moe")
    idx = torch.randint(0, 101, (2, 9))
    on, off = m(idx), m(idx, aux_losses=False)
    torch.testing.assert_close(off.logits, on.logits, rtol=0, atol=0)
    assert on.aux_loss.item() > 0 and on.balance_loss.item() >= 1.0 - 1e-6
    assert off.aux_loss.item() == 0 and off.balance_loss.item() == 0 and off.z_loss.item() == 0


def test_single_row_inference_uses_fresh_transposed_weights():
    from studylib.nn import gemv

    lin = gemv.Linear(16, 8)
    x = torch.randn(1, 1, 16)
    with torch.no_grad():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight), rtol=1e-5, atol=1e-6)
        assert "weight" in lin._transposed_cache  # the single-row path was taken
        lin.weight.mul_(3.0)  # an in-place update must not be served from the stale copy
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight), rtol=1e-5, atol=1e-6)
    assert "_transposed_cache" not in str(lin.state_dict().keys())
    y = lin(x)  # grad enabled: plain F.linear, differentiable
    y.sum().backward()
    assert lin.weight.grad is not None


@pytest.mark.parametrize("ffn", ["dense", "moe"])
def test_one_token_decode_step_equals_batched_forward(ffn):
    m = tiny(ffn)
    idx = torch.randint(0, 101, (1, 7))
    with torch.no_grad():
        full = m(idx).logits[:, -1]
        cache = KVCache(m.cfg, 1, "cpu")
        m(idx[:, :-1], cache=cache)
        step = m(idx[:, -1:], cache=cache, last_only=True, aux_losses=False).logits[:, -1]
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)


def test_top1_renormalised_gate_gives_the_router_no_gradient_switch_gate_does():
    """Mixtral-style renormalisation makes a top-1 gate exactly 1: without aux losses the router
    learns nothing from the LM loss. ``renormalize=False`` (Switch style: gate = probability) does."""
    grads = {}
    for renorm in (True, False):
        ffn = FFNConfig(kind="moe", hidden=48, num_experts=4, top_k=1, renormalize=renorm)
        torch.manual_seed(0)
        m = Decoder(ModelConfig(name="t", vocab_size=101, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                context=24, dropout=0.0, ffn=ffn))
        idx = torch.randint(0, 101, (4, 24), generator=torch.Generator().manual_seed(1))
        out = m(idx[:, :-1], idx[:, 1:])
        (out.loss + out.aux_loss).backward()
        grads[renorm] = float(m.blocks[0].ffn.router.weight.grad.abs().max())
        experts = float(m.blocks[0].ffn.w_in_EFD.grad.abs().max())
        assert experts > 1e-5
    assert grads[True] < 1e-8 < 1e-5 < grads[False]


# --------------------------------------------------------------------------------------------
# initialisation: the default is unchanged; seed 003's fan-in expert init
# --------------------------------------------------------------------------------------------
def _init_cfg(ffn: FFNConfig, **kw) -> ModelConfig:
    return ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, context=16,
                       ffn=ffn, **kw)


def _checksum(model) -> str:
    import hashlib

    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# sha256 of every parameter after torch.manual_seed(1234) under the keyed draws (studylib.nn.init,
# INIT keyed/v1; torch 2.13 CPU RNG): a change here changes every run's numbers, so it must come
# with a new studylib.config.identity.INIT (finished runs are then another run, never reused)
DEFAULT_INIT_CHECKSUMS = {
    "dense": (FFNConfig(kind="dense", hidden=64), "54111bbaea18e076"),
    "moe": (FFNConfig(kind="moe", hidden=32, num_experts=4, top_k=2), "4b8b47396d10e3c2"),
    "soft": (FFNConfig(kind="soft", hidden=32, num_experts=3), "14efd1de19dc7f47"),
}


@pytest.mark.parametrize("kind", list(DEFAULT_INIT_CHECKSUMS))
def test_the_initial_weights_of_a_seed_are_pinned(kind):
    ffn, expected = DEFAULT_INIT_CHECKSUMS[kind]
    torch.manual_seed(1234)
    assert _checksum(Decoder(_init_cfg(ffn))) == expected
    torch.manual_seed(1234)
    assert _checksum(Decoder(_init_cfg(ffn, expert_init="normal"))) == expected


@pytest.mark.parametrize("ffn", [FFNConfig(kind="soft", hidden=512, num_experts=2),
                                 FFNConfig(kind="moe", hidden=256, num_experts=4, top_k=2, layers=(1,))])
def test_fan_in_expert_init_std_is_one_over_sqrt_fan_in_and_nothing_else_changes(ffn):
    """Seed 003's fan-in init: each expert's w_in (fan-in d_model) has std 1/sqrt(d_model), w_out
    (fan-in = the expert's hidden) 1/sqrt(hidden); routers, dense layers, attention and embeddings
    get exactly the default's values (same RNG draws). Soft router stays 0 (uniform gate)."""
    cfg = ModelConfig(vocab_size=101, d_model=256, n_layers=2, n_heads=4, n_kv_heads=2, context=16, ffn=ffn)
    torch.manual_seed(7)
    fan = Decoder(dataclasses.replace(cfg, expert_init="fan_in"))
    torch.manual_seed(7)
    ref = Decoder(cfg)
    D, H = cfg.d_model, ffn.hidden
    experts = {"w_in_EFD", "w_out_EDH"}
    checked = 0
    for (name, p), (name_r, p_r) in zip(fan.named_parameters(), ref.named_parameters()):
        assert name == name_r
        p, p_r = p.detach(), p_r.detach()
        if name.rsplit(".", 1)[-1] not in experts:
            assert torch.equal(p, p_r), name  # routers, dense FFN layers, attention, norms, embedding
            continue
        fan_in = D if name.endswith("w_in_EFD") else H
        n = p.numel()
        # sample std of n normal draws: relative standard error 1/sqrt(2n); allow 5 of them
        assert abs(float(p.std()) * math.sqrt(fan_in) - 1.0) < 5 / math.sqrt(2 * n), name
        assert abs(float(p.mean())) < 5 / math.sqrt(fan_in * n), name
        checked += 1
    assert checked == 2 * len(fan.routed_layers())
    for i in fan.routed_layers():
        f = fan.blocks[i].ffn
        if ffn.kind == "soft":
            assert torch.count_nonzero(f.router.weight) == 0
        else:  # the routed MoE's router keeps N(0, init_std)
            assert abs(float(f.router.weight.detach().std()) / cfg.init_std - 1) < 0.1
    # the default's expert std, for contrast: init_std and init_std / sqrt(2L)
    f0 = ref.blocks[fan.routed_layers()[0]].ffn
    assert float(f0.w_in_EFD.detach().std()) == pytest.approx(cfg.init_std, rel=0.02)
    assert float(f0.w_out_EDH.detach().std()) == pytest.approx(cfg.init_std / math.sqrt(4), rel=0.02)


@pytest.mark.parametrize("dispatch", ["naive", "grouped", "stacked"])
def test_one_expert_moe_with_gate_one_is_its_dense_twin_exactly(dispatch):
    """The one-expert control (E = 1, k = 1, balance and z losses on) against the dense FFN of the
    same hidden size, given the same weights: the gate is exactly 1, so the LM loss, the logits and
    every gradient of the LM loss are bit-identical; the router's own weight gets no LM gradient."""
    dense = tiny("dense", dropout=0.0).train()
    one = FFNConfig(kind="moe", hidden=96, num_experts=1, top_k=1, balance_coef=0.01, z_coef=0.001,
                    dispatch=dispatch, grouped_mm="off")
    moe = Decoder(dataclasses.replace(dense.cfg, ffn=one)).train()
    _load_dense_weights(moe, dense)
    idx = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    out_d, out_m = dense(idx, idx.roll(-1, 1)), moe(idx, idx.roll(-1, 1))
    assert all(bool((rec.w_TK == 1).all()) for rec in out_m.routing)
    assert torch.equal(out_m.loss, out_d.loss)
    out_d.loss.backward()
    out_m.loss.backward()  # the LM loss alone: the router losses are the MoE's own terms
    grads = dict(dense.named_parameters())
    for name, p in moe.named_parameters():
        if "router" in name:
            assert p.grad is None or torch.count_nonzero(p.grad) == 0
            continue
        ref = grads[name.replace("w_in_EFD", "w_in.weight").replace("w_out_EDH", "w_out.weight")].grad
        assert torch.equal(p.grad, ref[None] if "EFD" in name or "EDH" in name else ref), name
    assert out_m.balance_loss.item() == 1.0 and out_m.z_loss.item() > 0  # on: balance constant, z moves x
