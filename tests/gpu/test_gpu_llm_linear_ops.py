"""tilejit.ops.linear, swiglu_linear and linear_cross_entropy on the GPU (autotuned GEMMs): forward and backward
against float64 torch on fresh random inputs over ragged and LLM shapes, NaN-poisoned outputs of every GEMM
layout, peak memory of the chunked cross-entropy below the full logits, torch.compile(fullgraph=True), and
``linear`` replayed in a CUDA graph after a warm-up call.

Run on a machine with a GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_llm_linear_ops.py``.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tilejit.ops import linear, linear_cross_entropy, swiglu_linear
from tilejit.ops import linear_kernels as kernels

pytestmark = pytest.mark.gpu

#: Error bound relative to the reference's largest magnitude: the output's rounding plus float32 sums (tf32
#: products for float32 operands).
TOL = {torch.bfloat16: 1.6e-2, torch.float16: 3e-3, torch.float32: 4e-3}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def check(got, ref, dtype, what):
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert torch.isfinite(got).all(), f"{what}: non-finite values (unwritten elements?)"
    err = (got.double() - ref).abs().max().item()
    bound = TOL[dtype] * (ref.abs().max().item() + 1e-3)
    assert err <= bound, f"{what}: max abs error {err:.3g} > {bound:.3g}"


def leaf(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, device="cuda", dtype=torch.float64) * scale).to(dtype).requires_grad_()


def as64(t):
    return t.detach().double().requires_grad_()


#: Each (shape, dtype) tunes three GEMM forms (forward, dX, dW) on first use: the decode and ragged shapes run in
#: every dtype, the LLM-sized ones (an up- and a down-projection) in one 16-bit dtype each.
LINEAR_CASES = ([(dtype, *shape) for dtype in DTYPES for shape in [(1, 1024, 4096), (77, 300, 1000), (200, 136, 777)]]
                + [(torch.bfloat16, 2048, 2816, 1024), (torch.float16, 2048, 1024, 2816)])


@pytest.mark.parametrize("dtype, m, n, k", LINEAR_CASES, ids=lambda v: str(v))
def test_linear(dtype, m, n, k):
    x, w = leaf(m, k, dtype=dtype), leaf(n, k, dtype=dtype, scale=k ** -0.5)
    y = linear(x, w)
    dy = torch.randn_like(y)
    y.backward(dy)
    x64, w64 = as64(x), as64(w)
    y64 = x64 @ w64.T
    y64.backward(dy.double())
    check(y, y64, dtype, "y")
    check(x.grad, x64.grad, dtype, "dx")
    check(w.grad, w64.grad, dtype, "dw")


@pytest.mark.parametrize("layout", [dict(trans_b=True), dict(), dict(trans_a=True), dict(trans_a=True, trans_b=True)],
                         ids=["nt", "nn", "tn", "tt"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_gemm_layouts_poisoned(layout, accumulate):
    m, n, k = 333, 517, 250
    a_logical = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b_logical = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    a = a_logical.T.contiguous() if layout.get("trans_a") else a_logical
    b = b_logical.T.contiguous() if layout.get("trans_b") else b_logical
    ref = a_logical.double() @ b_logical.double()
    if accumulate:
        c = torch.randn(m, n, device="cuda")
        ref = ref + c.double()
    else:
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    kernels.matmul(a, b, c, accumulate=accumulate, **layout)
    check(c, ref, torch.bfloat16, "c")


#: Ragged shapes in every dtype; a decode batch (the 16-row tiles) and the LLM-sized one (its forward and
#: backward tune five GEMM forms) in bf16 only.
SWIGLU_CASES = ([(dtype, *shape) for dtype in DTYPES for shape in [(77, 256, 688), (300, 520, 1000)]]
                + [(torch.bfloat16, 5, 512, 1000), (torch.bfloat16, 2048, 1024, 2816)])


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("dtype, m, d, f", SWIGLU_CASES, ids=lambda v: str(v))
def test_swiglu_linear(dtype, recompute, m, d, f):
    x = leaf(m, d, dtype=dtype)
    wg, wu = leaf(f, d, dtype=dtype, scale=d ** -0.5), leaf(f, d, dtype=dtype, scale=d ** -0.5)
    y = swiglu_linear(x, wg, wu, recompute=recompute)
    dy = torch.randn_like(y)
    y.backward(dy)
    x64, wg64, wu64 = as64(x), as64(wg), as64(wu)
    y64 = F.silu(x64 @ wg64.T) * (x64 @ wu64.T)
    y64.backward(dy.double())
    check(y, y64, dtype, "y")
    check(x.grad, x64.grad, dtype, "dx")
    check(wg.grad, wg64.grad, dtype, "dw_gate")
    check(wu.grad, wu64.grad, dtype, "dw_up")


def test_swiglu_kernels_poisoned():
    m, d, f = 301, 200, 450
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    wg, wu = (torch.randn(f, d, device="cuda", dtype=torch.bfloat16) / 14 for _ in range(2))
    out, gate, up = (torch.full((m, f), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(3))
    kernels.swiglu_forward(x, wg, wu, out, gate, up)
    g64, u64 = x.double() @ wg.double().T, x.double() @ wu.double().T
    check(out, F.silu(g64) * u64, torch.bfloat16, "out")
    check(gate, g64, torch.bfloat16, "gate")
    check(up, u64, torch.bfloat16, "up")
    d_out = torch.randn(m, f, device="cuda", dtype=torch.bfloat16)
    s = torch.sigmoid(g64)
    for saved in (True, False):
        d_gate, d_up = (torch.full((m, f), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2))
        kernels.swiglu_backward_gates(x, wg, wu, gate if saved else None, up if saved else None, d_out, d_gate, d_up)
        check(d_up, d_out.double() * g64 * s, torch.bfloat16, "d_up")
        check(d_gate, d_out.double() * u64 * s * (1 + g64 * (1 - s)), torch.bfloat16, "d_gate")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, dim, vocab, chunk", [(1000, 256, 32000, None), (333, 200, 5001, 64),
                                                     (1024, 512, 256, None), (77, 128, 50257, 32)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_linear_cross_entropy(dtype, rows, dim, vocab, chunk, reduction):
    h, w = leaf(rows, dim, dtype=dtype), leaf(vocab, dim, dtype=dtype, scale=dim ** -0.5)
    targets = torch.randint(0, vocab, (rows,), device="cuda")
    targets[::9] = -100
    loss = linear_cross_entropy(h, w, targets, reduction=reduction, chunk_rows=chunk)
    loss.backward()
    h64, w64 = as64(h), as64(w)
    loss64 = F.cross_entropy(h64 @ w64.T, targets, reduction=reduction)
    loss64.backward()
    assert abs(loss.item() - loss64.item()) <= 2e-3 * abs(loss64.item())
    check(h.grad, h64.grad, dtype, "dh")
    check(w.grad, w64.grad, dtype, "dw")


def test_cross_entropy_peak_memory_is_below_the_full_logits():
    rows, dim, vocab = 8192, 1024, 32000
    h = torch.randn(rows, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(vocab, dim, device="cuda", dtype=torch.bfloat16) / 32).requires_grad_()
    targets = torch.randint(0, vocab, (rows,), device="cuda")
    linear_cross_entropy(h, w, targets).backward()  # tunes the GEMMs first
    h.grad = w.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    linear_cross_entropy(h, w, targets).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    # what it holds: dh, the float32 dW and its bf16 cast, the scaled gradients and one chunk of logits (about
    # 0.3 GB); the full bf16 logits alone are 0.5 GB (eager torch also keeps their float32 softmax)
    assert extra < rows * vocab * 2, extra


def test_under_torch_compile_fullgraph():
    def step(x, w, wg, wu, head, targets):
        hidden = swiglu_linear(linear(x, w), wg, wu)
        return linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), head, targets)

    leaves = [leaf(4, 100, 256, dtype=torch.bfloat16), leaf(256, 256, dtype=torch.bfloat16, scale=1 / 16),
              leaf(688, 256, dtype=torch.bfloat16, scale=1 / 16), leaf(688, 256, dtype=torch.bfloat16, scale=1 / 16),
              leaf(1000, 688, dtype=torch.bfloat16, scale=1 / 26)]
    targets = torch.randint(0, 1000, (400,), device="cuda")
    torch._dynamo.reset()
    loss = torch.compile(step, fullgraph=True)(*leaves, targets)
    loss.backward()
    grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    eager = step(*leaves, targets)
    eager.backward()
    assert loss.item() == eager.item()
    for got, tensor in zip(grads, leaves):
        assert torch.equal(got, tensor.grad)


def test_linear_in_a_cuda_graph():
    x = torch.randn(32, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3000, 1024, device="cuda", dtype=torch.bfloat16) / 32
    with torch.no_grad():
        expected = linear(x, w)  # tunes before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = linear(x, w)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
    check(out, x.double() @ w.double().T, torch.bfloat16, "replayed")
    assert not torch.equal(out, expected)


@pytest.mark.parametrize("rows, vocab", [(8192, 256), (1000, 130), (77, 1000), (256, 32000), (33, 128256)],
                         ids=lambda v: str(v))
def test_cross_entropy_chunk_rows_and_gradient(rows, vocab):
    """The chunk kernel alone, at each block shape ``cross_entropy_config`` picks (rows packed by 8 at vocab 256,
    one row a program past 1024 columns): NaN-poisoned losses, ignored rows, the first and last class."""
    logits = (torch.randn(rows, vocab, device="cuda") * 3).to(torch.bfloat16)
    ref = logits.double()
    targets = torch.randint(0, vocab, (rows,), device="cuda")
    targets[1::7] = -100
    targets[0], targets[-1] = 0, vocab - 1
    loss_rows = torch.full((rows,), float("nan"), device="cuda")
    kernels.cross_entropy_chunk(logits, targets, loss_rows, torch.tensor([0.5], device="cuda"), -100)
    expected = F.cross_entropy(ref, targets, reduction="none")
    grad = (torch.softmax(ref, 1) - F.one_hot(targets.clamp(min=0), vocab)) * 0.5
    grad[targets == -100] = 0
    assert torch.isfinite(loss_rows).all()
    assert (loss_rows.double() - expected).abs().max().item() <= 1e-4 * (expected.abs().max().item() + 1)
    check(logits, grad, torch.bfloat16, "grad")
