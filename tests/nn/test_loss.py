"""The fused chunked LM-head cross-entropy equals F.cross_entropy(h @ w.T) in value and gradients."""
import pytest
import torch
import torch.nn.functional as F

from studylib.nn.lm_loss import linear_cross_entropy


@pytest.mark.parametrize("chunk,rows", [(7, None), (64, 5), (1000, None), (1000, 16)])
@pytest.mark.parametrize("ignore", [False, True])
def test_matches_reference_fp32(chunk, rows, ignore):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(50, 16, generator=g, requires_grad=True)
    w = torch.randn(97, 16, generator=g, requires_grad=True)
    t = torch.randint(0, 97, (50,), generator=g)
    if ignore:
        t[::5] = -100
    ref = F.cross_entropy(h @ w.T, t, ignore_index=-100)
    gh_ref, gw_ref = torch.autograd.grad(ref * 3.0, (h, w))
    got = linear_cross_entropy(h, w, t, chunk=chunk, rows=rows)
    gh, gw = torch.autograd.grad(got * 3.0, (h, w))  # upstream gradient 3 is propagated
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gh, gh_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, gw_ref, rtol=1e-5, atol=1e-6)


def test_bf16_autocast_close_to_reference():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(64, 32, generator=g, requires_grad=True)
    w = (torch.randn(200, 32, generator=g) * 0.2).requires_grad_(True)
    t = torch.randint(0, 200, (64,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.cross_entropy((h @ w.T).float(), t)
        got = linear_cross_entropy(h, w, t, chunk=16)
    torch.testing.assert_close(got, ref, rtol=1e-2, atol=1e-2)
    gh, gw = torch.autograd.grad(got, (h, w))
    assert gh.dtype == h.dtype and gw.dtype == w.dtype


def test_no_grad_path():
    h, w = torch.randn(10, 8), torch.randn(11, 8)
    t = torch.randint(0, 11, (10,))
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, w, t, chunk=3), F.cross_entropy(h @ w.T, t))


def test_auto_rows_fit_the_cache_budget_and_blocks_match_reference():
    from studylib.nn.lm_loss import CHUNK_BYTES, auto_rows

    assert auto_rows(30008) == 256 and auto_rows(2048) == 4096
    for v in (101, 2048, 30008, 10**6):
        r = auto_rows(v)
        assert 64 <= r <= 8192 and r & (r - 1) == 0
        assert r == 64 or r * v * 4 <= CHUNK_BYTES
    g = torch.Generator().manual_seed(2)
    h = torch.randn(300, 8, generator=g, requires_grad=True)
    w = torch.randn(30008, 8, generator=g, requires_grad=True)
    t = torch.randint(0, 30008, (300,), generator=g)
    t[::7] = -100
    ref = F.cross_entropy(h @ w.T, t)
    gh_ref, gw_ref = torch.autograd.grad(ref, (h, w))
    for chunk, rows in ((2048, None), (128, 50), (300, 7)):  # blocks that do and don't divide
        got = linear_cross_entropy(h, w, t, chunk=chunk, rows=rows)
        gh, gw = torch.autograd.grad(got, (h, w))
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(gh, gh_ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gw, gw_ref, rtol=1e-5, atol=1e-6)


class _CountMatmuls(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.mm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.mm += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        return func(*args, **(kwargs or {}))


def test_evaluation_of_parameters_that_require_grad_computes_no_gradients():
    """Under torch.no_grad (evaluation) the head does one logits matmul per chunk, not three,
    even though the model's weights require grad."""
    h = torch.randn(12, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    t = torch.randint(0, 11, (12,))
    with torch.no_grad(), _CountMatmuls() as count:
        loss = linear_cross_entropy(h, w, t, chunk=4)
    assert count.mm == 3  # 3 chunks x 1 matmul
    torch.testing.assert_close(loss, F.cross_entropy(h.detach() @ w.detach().T, t))
    with _CountMatmuls() as count:
        linear_cross_entropy(h, w, t, chunk=4)
    assert count.mm == 9  # with grad mode: the gradients are computed while the chunk is at hand
