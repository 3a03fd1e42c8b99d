"""Every dispatch path == a deliberately naive per-token reference (outputs and gradients, fp32)."""
import pytest
import torch
import torch.nn.functional as F

from studylib.config import FFNConfig
from studylib.nn.dispatch import PATHS, grouped_mm_supported, moe_experts
from studylib.nn.ffn import DenseFFN, SoftMoE, SparseMoE


def reference_moe(x_TD, idx_TK, w_TK, w_in_EFD, w_out_EDH):
    """Per token, per chosen expert, written out with plain matrix-vector products."""
    rows = []
    H = w_out_EDH.shape[2]
    for t in range(x_TD.shape[0]):
        acc = torch.zeros(x_TD.shape[1], dtype=x_TD.dtype)
        for k in range(idx_TK.shape[1]):
            e = int(idx_TK[t, k])
            h = w_in_EFD[e] @ x_TD[t]
            acc = acc + w_TK[t, k] * (w_out_EDH[e] @ (F.silu(h[:H]) * h[H:]))
        rows.append(acc)
    return torch.stack(rows)


def _case(T=37, D=16, H=24, E=5, K=2, seed=0, empty_expert=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g, dtype=torch.float64).float()
    scores = torch.rand(T, E, generator=g)
    if empty_expert is not None:
        scores[:, empty_expert] = -1.0  # never chosen
    idx = scores.topk(K, dim=-1).indices
    w = torch.rand(T, K, generator=g)
    w = w / w.sum(-1, keepdim=True)
    w_in = torch.randn(E, 2 * H, D, generator=g) / D ** 0.5
    w_out = torch.randn(E, D, H, generator=g) / H ** 0.5
    return x, idx, w, w_in, w_out


def _grads(fn, x, w, w_in, w_out, gy):
    leaves = [t.clone().requires_grad_(True) for t in (x, w, w_in, w_out)]
    y = fn(leaves[0], leaves[1], leaves[2], leaves[3])
    (y * gy).sum().backward()
    return y.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("K,empty,T", [(1, None, 37), (2, None, 37), (2, 3, 37), (3, 0, 37),
                                       (2, None, 1), (3, 1, 1)])  # T = 1: a single token
def test_paths_match_per_token_reference(path, K, empty, T):
    x, idx, w, w_in, w_out = _case(T=T, K=K, empty_expert=empty)
    if empty is not None:
        assert not (idx == empty).any()  # the case really has an expert with no token
    gy = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    y_ref, g_ref = _grads(lambda a, b, c, d: reference_moe(a, idx, b, c, d), x, w, w_in, w_out, gy)
    y, g = _grads(lambda a, b, c, d: moe_experts(a, idx, b, c, d, path=path, grouped_mm="off"),
                  x, w, w_in, w_out, gy)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    for name, a, b in zip(("x", "weights", "w_in", "w_out"), g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"grad of {name} ({path})")
    if empty is not None:  # the unused expert gets exactly zero gradient
        assert torch.count_nonzero(g[2][empty]) == 0


@pytest.mark.skipif(not grouped_mm_supported(torch.zeros(2, 16), torch.zeros(2, 2, 16)),
                    reason="torch._grouped_mm not available for fp32 on this build/device")
def test_grouped_mm_matches_reference():
    x, idx, w, w_in, w_out = _case(D=16, H=32, E=4, K=2, empty_expert=2)
    gy = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    y_ref, g_ref = _grads(lambda a, b, c, d: reference_moe(a, idx, b, c, d), x, w, w_in, w_out, gy)
    y, g = _grads(lambda a, b, c, d: moe_experts(a, idx, b, c, d, path="grouped", grouped_mm="on"),
                  x, w, w_in, w_out, gy)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_paths_agree_under_bf16_autocast():
    x, idx, w, w_in, w_out = _case(T=64, D=32, H=48, E=4, K=2)
    outs = []
    for path in PATHS:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs.append(moe_experts(x, idx, w, w_in, w_out, path=path, grouped_mm="off").float())
    ref = reference_moe(x, idx, w, w_in, w_out)
    for o in outs:
        torch.testing.assert_close(o, ref, rtol=5e-2, atol=5e-2)  # bf16 rounding only


def _moe(E, K, H=24, D=16, dispatch="grouped"):
    torch.manual_seed(0)
    m = SparseMoE(D, FFNConfig(kind="moe", hidden=H, num_experts=E, top_k=K, dispatch=dispatch))
    torch.nn.init.normal_(m.w_in_EFD, std=0.3)
    torch.nn.init.normal_(m.w_out_EDH, std=0.3)
    torch.nn.init.normal_(m.router.weight, std=0.5)
    return m


@pytest.mark.parametrize("path", PATHS)
def test_moe_layer_paths_identical_including_router_grads(path):
    x = torch.randn(3, 11, 16)
    ref = _moe(4, 2, dispatch="naive")
    other = _moe(4, 2, dispatch=path)
    outs = []
    for m in (ref, other):
        xx = x.clone().requires_grad_(True)
        y, r = m(xx)
        (y.square().sum() + r.balance + r.z).backward()
        outs.append((y, xx.grad, m.router.weight.grad, m.w_in_EFD.grad, m.w_out_EDH.grad))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert outs[0][2].abs().sum() > 0  # the router really receives gradient through the weights


@pytest.mark.parametrize("path", PATHS)
def test_single_expert_top1_equals_dense(path):
    moe = _moe(1, 1, H=40, dispatch=path)
    dense = DenseFFN(16, 40)
    with torch.no_grad():
        dense.w_in.weight.copy_(moe.w_in_EFD[0])
        dense.w_out.weight.copy_(moe.w_out_EDH[0])
    x = torch.randn(2, 9, 16)
    torch.testing.assert_close(moe(x)[0], dense(x)[0], rtol=0, atol=0)


def _soft(K, H):
    torch.manual_seed(0)
    m = SoftMoE(16, FFNConfig(kind="soft", hidden=H, num_experts=K))
    torch.nn.init.normal_(m.w_in_EFD, std=0.3)
    torch.nn.init.normal_(m.w_out_EDH, std=0.3)
    torch.nn.init.normal_(m.router.weight, std=0.5)
    return m


def test_soft_k1_equals_dense():
    soft = _soft(1, 40)
    dense = DenseFFN(16, 40)
    with torch.no_grad():
        dense.w_in.weight.copy_(soft.w_in_EFD[0])
        dense.w_out.weight.copy_(soft.w_out_EDH[0])
    x = torch.randn(2, 9, 16)
    torch.testing.assert_close(soft(x)[0], dense(x)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("K", [2, 4, 6])
def test_soft_uniform_gate_equals_scaled_wide_dense(K):
    H = 12
    soft = _soft(K, H)
    soft.router.mode = "uniform"
    wide = DenseFFN(16, K * H)
    with torch.no_grad():  # wide gate rows = all experts' gate rows, then all up rows
        gate = soft.w_in_EFD[:, :H].reshape(K * H, 16)
        up = soft.w_in_EFD[:, H:].reshape(K * H, 16)
        wide.w_in.weight.copy_(torch.cat([gate, up]))
        wide.w_out.weight.copy_(soft.w_out_EDH.permute(1, 0, 2).reshape(16, K * H))
    x = torch.randn(2, 9, 16)
    torch.testing.assert_close(soft(x)[0], wide(x)[0] / K, rtol=1e-5, atol=1e-6)
    soft.router.mode = "learned"  # and the learned (non-uniform) gate really differs
    assert not torch.allclose(soft(x)[0], wide(x)[0] / K, atol=1e-4)


def test_balanced_mode_assigns_evenly_and_uniform_mode_weights_equally():
    m = _moe(4, 2)
    x = torch.randn(1, 40, 16)
    m.router.mode = "balanced"
    _, r = m(x, stats=True)
    assert r.stats["shares"] == pytest.approx([0.25] * 4)
    m.router.mode = "uniform"
    _, r = m(x, stats=True)
    assert r.balance.item() == pytest.approx(1.0)
    assert r.stats["top1"] == pytest.approx(0.25)
