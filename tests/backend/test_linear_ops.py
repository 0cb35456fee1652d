"""tilejit.ops.linear, swiglu_linear and linear_cross_entropy (tilejit/ops/linear_ops.py): forward and backward
through the interpreter against float64 torch over ragged shapes, NaN-poisoned kernel outputs, ignore_index,
torch.compile(fullgraph=True), typed errors, and the kernels compiled for sm_80, sm_90a and sm_100a."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import tilejit
from tilejit.backend_cuda.nvrtc import nvrtc_supports
from tilejit.ops import linear, linear_cross_entropy, swiglu_linear
from tilejit.ops import linear_kernels as kernels
from tilejit.ops import linear_ops

ARCHS = [a for a in ("sm_80", "sm_90a", "sm_100a") if nvrtc_supports(a)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
#: Error bound relative to the reference's largest magnitude (float32 runs as tf32 products).
TOL = {torch.bfloat16: 1.6e-2, torch.float16: 3e-3, torch.float32: 4e-3}


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def assert_close64(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    err = (got.double() - ref).abs().max().item()
    bound = TOL[dtype] * (ref.abs().max().item() + 1e-3)
    assert err <= bound, f"{what}: max abs error {err:.3g} > {bound:.3g}"


def leaf(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float64) * scale).to(dtype).requires_grad_()


def as64(t):
    return t.detach().double().requires_grad_()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead, k, n", [((37,), 29, 45), ((2, 19), 64, 33), ((3, 1, 5), 7, 70)])
def test_linear_forward_backward(interpret, dtype, lead, k, n):
    torch.manual_seed(1)
    x, w = leaf(*lead, k, dtype=dtype), leaf(n, k, dtype=dtype, scale=k ** -0.5)
    y = linear(x, w)
    dy = torch.randn_like(y)
    y.backward(dy)
    x64, w64 = as64(x), as64(w)
    y64 = x64 @ w64.T
    y64.backward(dy.double())
    assert y.dtype == dtype and y.shape == (*lead, n)
    assert_close64(y, y64, dtype, "y")
    assert_close64(x.grad, x64.grad, dtype, "dx")
    assert_close64(w.grad, w64.grad, dtype, "dw")


def test_linear_weight_only_grad_skips_dx(interpret):
    x = torch.randn(9, 20, dtype=torch.bfloat16)
    w = leaf(11, 20, dtype=torch.bfloat16)
    linear(x, w).sum().backward()
    assert x.grad is None
    assert_close64(w.grad, torch.ones(9, 11, dtype=torch.float64).T @ x.double(), torch.bfloat16, "dw")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("recompute", [False, True])
def test_swiglu_linear_forward_backward(interpret, dtype, recompute):
    torch.manual_seed(2)
    x = leaf(2, 21, 40, dtype=dtype)
    wg, wu = leaf(52, 40, dtype=dtype, scale=40 ** -0.5), leaf(52, 40, dtype=dtype, scale=40 ** -0.5)
    y = swiglu_linear(x, wg, wu, recompute=recompute)
    dy = torch.randn_like(y)
    y.backward(dy)
    x64, wg64, wu64 = as64(x), as64(wg), as64(wu)
    y64 = F.silu(x64 @ wg64.T) * (x64 @ wu64.T)
    y64.backward(dy.double())
    assert_close64(y, y64, dtype, "y")
    for got, ref, name in ((x.grad, x64.grad, "dx"), (wg.grad, wg64.grad, "dw_gate"), (wu.grad, wu64.grad, "dw_up")):
        assert_close64(got, ref, dtype, name)


def test_swiglu_saves_products_only_when_a_gradient_is_wanted(interpret, monkeypatch):
    stored = []
    forward = kernels.swiglu_forward
    monkeypatch.setattr(kernels, "swiglu_forward", lambda x, wg, wu, out, g, u: (stored.append(g is not None),
                                                                                 forward(x, wg, wu, out, g, u)))
    x, w = torch.randn(5, 16), torch.randn(24, 16)
    with torch.no_grad():
        swiglu_linear(x.requires_grad_(), w, w)
    swiglu_linear(x, w, w)
    swiglu_linear(x, w, w, recompute=True)
    assert stored == [False, True, False]


CE_CASES = [(50, 29, 70, 16, "mean"), (50, 29, 70, 16, "sum"), (33, 40, 130, 7, "mean"), (8, 16, 64, 1000, "mean")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, dim, vocab, chunk, reduction", CE_CASES)
def test_linear_cross_entropy(interpret, dtype, rows, dim, vocab, chunk, reduction):
    torch.manual_seed(3)
    h, w = leaf(rows, dim, dtype=dtype), leaf(vocab, dim, dtype=dtype, scale=dim ** -0.5)
    targets = torch.randint(0, vocab, (rows,))
    targets[::5] = -100
    loss = linear_cross_entropy(h, w, targets, reduction=reduction, chunk_rows=chunk)
    loss.backward()
    h64, w64 = as64(h), as64(w)
    loss64 = F.cross_entropy(h64 @ w64.T, targets, reduction=reduction)
    loss64.backward()
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert abs(loss.item() - loss64.item()) <= 2e-3 * abs(loss64.item())
    assert_close64(h.grad, h64.grad, dtype, "dh")
    assert_close64(w.grad, w64.grad, dtype, "dw")
    assert h.grad.dtype == dtype and w.grad.dtype == dtype


def test_cross_entropy_custom_ignore_index_and_upstream_scale(interpret):
    torch.manual_seed(4)
    h, w = leaf(20, 12, dtype=torch.float32), leaf(30, 12, dtype=torch.float32)
    targets = torch.randint(0, 30, (20,))
    targets[3:9] = 7  # the ignored value is also a valid class: only the rows naming it are ignored
    (linear_cross_entropy(h, w, targets, ignore_index=7, chunk_rows=8) * 3.0).backward()
    h64, w64 = as64(h), as64(w)
    (F.cross_entropy(h64 @ w64.T, targets, ignore_index=7) * 3.0).backward()
    assert torch.all(h.grad[3:9] == 0)
    assert_close64(h.grad, h64.grad, torch.float32, "dh")
    assert_close64(w.grad, w64.grad, torch.float32, "dw")


def test_cross_entropy_every_row_ignored(interpret):
    h, w = leaf(6, 8, dtype=torch.bfloat16), leaf(10, 8, dtype=torch.bfloat16)
    targets = torch.full((6,), -100)
    mean = linear_cross_entropy(h, w, targets)
    assert torch.isnan(mean)  # as torch: 0 / 0
    total = linear_cross_entropy(h, w, targets, reduction="sum")
    total.backward()
    assert total.item() == 0.0 and torch.all(h.grad == 0) and torch.all(w.grad == 0)


def test_cross_entropy_never_holds_more_than_a_chunk_of_logits(interpret, monkeypatch):
    shapes = []
    chunk = kernels.cross_entropy_chunk
    monkeypatch.setattr(kernels, "cross_entropy_chunk",
                        lambda logits, *rest: (shapes.append(tuple(logits.shape)), chunk(logits, *rest)))
    h, w = torch.randn(45, 8, requires_grad=True), torch.randn(40, 8)
    linear_cross_entropy(h, w, torch.randint(0, 40, (45,)), chunk_rows=16).backward()
    assert shapes == [(16, 40), (16, 40), (13, 40)]
    assert linear_ops.default_chunk_rows(8192, 1024, 128256) == 64
    assert linear_ops.default_chunk_rows(8192, 4096, 2048) == 16384


def test_cross_entropy_without_grad_runs_no_gradient_gemm(interpret, monkeypatch):
    calls = []
    matmul = kernels.matmul
    monkeypatch.setattr(kernels, "matmul", lambda *a, **kw: (calls.append(kw), matmul(*a, **kw)))
    h, w = torch.randn(10, 8), torch.randn(12, 8) / 3
    targets = torch.randint(0, 12, (10,))
    loss = linear_cross_entropy(h, w, targets)
    assert calls == [{"trans_b": True}]
    expected = F.cross_entropy(h.double() @ w.double().T, targets).item()
    assert abs(loss.item() - expected) <= 2e-3 * expected  # tf32 logits


LAYOUTS = [dict(trans_b=True), dict(), dict(trans_a=True), dict(trans_a=True, trans_b=True)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "".join(sorted(d)) or "nn")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gemm_layouts_write_every_element(interpret, layout, dtype):
    torch.manual_seed(5)
    m, n, k = 37, 45, 29
    a_logical, b_logical = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    a = a_logical.T.contiguous() if layout.get("trans_a") else a_logical
    b = b_logical.T.contiguous() if layout.get("trans_b") else b_logical
    c = torch.full((m, n), float("nan"), dtype=dtype)
    kernels.matmul(a, b, c, **layout)
    assert_close64(c, a_logical.double() @ b_logical.double(), dtype, "c")
    acc = torch.randn(m, n)
    expected = acc.double() + a_logical.double() @ b_logical.double()
    kernels.matmul(a, b, acc, accumulate=True, **layout)
    assert_close64(acc, expected, dtype, "c + a @ b")


def test_gemm_two_products_and_swiglu_kernels_write_every_element(interpret):
    torch.manual_seed(6)
    a, a2 = torch.randn(33, 20, dtype=torch.float16), torch.randn(33, 20, dtype=torch.float16)
    b, b2 = torch.randn(20, 41, dtype=torch.float16), torch.randn(20, 41, dtype=torch.float16)
    c = torch.full((33, 41), float("nan"))
    kernels.matmul(a, b, c, a2=a2, b2=b2)
    assert_close64(c, a.double() @ b.double() + a2.double() @ b2.double(), torch.float16, "two products")
    x, wg, wu = torch.randn(33, 20), torch.randn(41, 20) / 5, torch.randn(41, 20) / 5
    out, gate, up = (torch.full((33, 41), float("nan")) for _ in range(3))
    kernels.swiglu_forward(x, wg, wu, out, gate, up)
    g64, u64 = x.double() @ wg.double().T, x.double() @ wu.double().T
    for got, ref, name in ((out, F.silu(g64) * u64, "out"), (gate, g64, "gate"), (up, u64, "up")):
        assert_close64(got, ref, torch.float32, name)
    d_out = torch.randn(33, 41)
    for saved in (True, False):
        d_gate, d_up = torch.full((33, 41), float("nan")), torch.full((33, 41), float("nan"))
        kernels.swiglu_backward_gates(x, wg, wu, gate if saved else None, up if saved else None, d_out, d_gate,
                                      d_up)
        s = torch.sigmoid(g64)
        assert_close64(d_up, d_out.double() * g64 * s, torch.float32, "d_up")
        assert_close64(d_gate, d_out.double() * u64 * s * (1 + g64 * (1 - s)), torch.float32, "d_gate")


def test_cross_entropy_kernel_writes_every_row(interpret):
    logits = torch.randn(7, 130)
    targets = torch.tensor([0, 129, -100, 64, 63, 5, 128])
    loss_rows = torch.full((7,), float("nan"))
    expected = F.cross_entropy(logits.double(), targets, reduction="none")
    grad = torch.softmax(logits.double(), 1) - F.one_hot(targets.clamp(min=0), 130)
    grad[2] = 0
    kernels.cross_entropy_chunk(logits, targets, loss_rows, torch.tensor([0.5]), -100)
    assert_close64(loss_rows, expected, torch.float32, "loss")
    assert_close64(logits, grad * 0.5, torch.float32, "grad")


def test_under_torch_compile_fullgraph(interpret):
    torch.manual_seed(7)

    def step(x, w, wg, wu, head, targets):
        hidden = swiglu_linear(linear(x, w), wg, wu)
        return linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), head, targets)

    leaves = [leaf(2, 5, 16, dtype=torch.bfloat16), leaf(24, 16, dtype=torch.bfloat16, scale=0.25),
              leaf(20, 24, dtype=torch.bfloat16, scale=0.2), leaf(20, 24, dtype=torch.bfloat16, scale=0.2),
              leaf(33, 20, dtype=torch.bfloat16, scale=0.2)]
    targets = torch.randint(0, 33, (10,))
    targets[4] = -100
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    loss = compiled(*leaves, targets)
    loss.backward()
    grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    eager = step(*leaves, targets)
    eager.backward()
    assert loss.item() == eager.item()
    for got, tensor in zip(grads, leaves):
        assert torch.equal(got, tensor.grad)
    refs = [as64(t) for t in leaves]
    hidden = F.silu(refs[0] @ refs[1].T @ refs[2].T) * (refs[0] @ refs[1].T @ refs[3].T)
    loss64 = F.cross_entropy(hidden.reshape(10, 20) @ refs[4].T, targets)
    assert abs(loss.item() - loss64.item()) <= 2e-2 * abs(loss64.item())


def test_errors_are_typed_and_say_what_to_fix():
    x, w = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(6, 8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="w_up is torch.float16 but x is torch.bfloat16"):
        swiglu_linear(x, w, w.half())
    with pytest.raises(TypeError, match="int32; the kernels take float16, bfloat16 or float32"):
        linear(x.to(torch.int32), w.to(torch.int32))
    with pytest.raises(ValueError, match=r"weight must be 2-D \(N, K\) with K = x.shape\[-1\] = 8, got shape \(6, 7\)"):
        linear(x, w[:, :7])
    with pytest.raises(ValueError, match="w_up \\(5, 8\\) must have w_gate's shape \\(6, 8\\)"):
        swiglu_linear(x, w, w[:5])
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        linear(x, [[1.0]])
    targets = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"targets must be an int64 tensor of shape \(4,\), got torch.int32"):
        linear_cross_entropy(x, w, targets.int())
    with pytest.raises(TypeError, match=r"shape \(4,\), got torch.int64 \(3,\)"):
        linear_cross_entropy(x, w, targets[:3])
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum', got 'none'"):
        linear_cross_entropy(x, w, targets, reduction="none")
    with pytest.raises(ValueError, match=r"h must be \(N, D\)"):
        linear_cross_entropy(x[None], w, targets)
    with pytest.raises(ValueError, match="chunk_rows must be a positive int, got 0"):
        linear_cross_entropy(x, w, targets, chunk_rows=0)
    for error in (tilejit.errors.UsageTypeError, tilejit.errors.UsageValueError):
        assert issubclass(error, tilejit.errors.TilejitError)


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _compile_cases():
    m, n, k = 1000, 3000, 776
    plain = dict(ACC_IN=False, TWO=False)
    return {
        "nt": (kernels.gemm, (_meta(m, k), _meta(n, k), _meta(m, n), _meta(m, k), _meta(n, k)),
               dict(TRANS_A=False, TRANS_B=True, **plain)),
        "nn-two": (kernels.gemm, (_meta(m, n), _meta(n, k), _meta(m, k), _meta(m, n), _meta(n, k)),
                   dict(TRANS_A=False, TRANS_B=False, ACC_IN=False, TWO=True)),
        "tn-acc": (kernels.gemm, (_meta(m, n), _meta(m, k), _meta(n, k, dtype=torch.float32), _meta(m, n),
                                  _meta(m, k)), dict(TRANS_A=True, TRANS_B=False, ACC_IN=True, TWO=False)),
        "swiglu-fwd": (kernels.swiglu_fwd, (_meta(m, k), _meta(n, k), _meta(n, k)) + (_meta(m, n),) * 3,
                       dict(STORE_GU=True)),
        "swiglu-bwd": (kernels.swiglu_bwd, (_meta(m, k), _meta(n, k), _meta(n, k)) + (_meta(m, n),) * 5,
                       dict(RECOMPUTE=True)),
    }


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(_compile_cases()))
def test_kernels_compile(fresh_compile_cache, arch, name):
    kernel, args, flags = _compile_cases()[name]
    tiles = dict(BM=128, BN=64, BK=64, num_warps=8, num_stages=3)
    compiled = kernel.compile(*args, arch=arch, **flags, **tiles)
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
    assert 0 < compiled.shared_bytes <= tilejit.target.Arch.parse(arch).max_shared_bytes
    assert compiled.asm["ir"].count("tj.gemm") == (2 if name.startswith(("swiglu", "nn-two")) else 1)
    if arch == "sm_90a":
        assert compiled.meta["spills"] == 0, compiled.meta
        assert "wgmma" in compiled.asm["ptx"]


@pytest.mark.parametrize("arch", ARCHS)
def test_elementwise_kernels_compile(fresh_compile_cache, arch):
    _, args, _ = _compile_cases()["swiglu-bwd"]
    compiled = kernels.swiglu_bwd.compile(*args, arch=arch, RECOMPUTE=False, **kernels.SWIGLU_BWD_LOADED)
    assert compiled.asm["cubin"][:4] == b"\x7fELF" and compiled.meta["spills"] == 0
    for vocab in (256, 50000):
        compiled = kernels.cross_entropy_rows.compile(_meta(64, vocab), _meta(64, dtype=torch.int64),
                                                      _meta(64, dtype=torch.float32), _meta(1, dtype=torch.float32),
                                                      -100, arch=arch, **kernels.cross_entropy_config(vocab))
        assert compiled.asm["cubin"][:4] == b"\x7fELF" and compiled.meta["spills"] == 0, (vocab, compiled.meta)


def test_config_spaces_fit_their_kernels():
    for size in (2, 4):
        for config in kernels.swiglu_configs(size):
            k = config.kwargs
            assert 2 * k["BM"] * k["BN"] <= 128 * 32 * config.num_warps
        assert all(2 * c.kwargs["BM"] * c.kwargs["BN"] <= 64 * 32 * c.num_warps
                   for c in kernels.swiglu_recompute_configs(size))
    a, b = _meta(300, 64), _meta(2000, 64)  # op(A) = 300 x 64, op(B) = b.T = 64 x 2000
    configs = kernels.tuned_gemm(2, True, True, False, False).configs
    kept = kernels._gemm_prune(configs, {"A": a.T, "B": b, "TRANS_A": True, "TRANS_B": True})
    assert kept == kernels.matmul_prune(configs, {"A": a, "B": b.T})


def test_tuning_an_accumulating_gemm_adds_once(interpret):
    """The autotuner times ``C += A @ B`` several times; C is restored after each run, so the launch adds once."""
    torch.manual_seed(8)
    a, b, c = torch.randn(128, 40), torch.randn(40, 128), torch.randn(128, 128)
    expected = c.double() + a.double() @ b.double()
    tuned = kernels.tuned_gemm(4, False, False, True, False)
    assert len(kernels._gemm_prune(tuned.configs, {"A": a, "B": b})) > 1  # so it is tuned, not just launched
    tuned[kernels._tiles_grid(128, 128)](a, b, c, a, b, TRANS_A=False, TRANS_B=False, ACC_IN=True, TWO=False)
    assert_close64(c, expected, torch.float32, "c + a @ b")


@pytest.mark.parametrize("form", ["plain", "accumulate", "two", "trans_a"])
def test_tuned_configs_are_plain_and_fit(form, monkeypatch):
    """The GEMM space the ops tune over on an H100 (sm_90, 132 SMs), from the whole matmul space and from the ops'
    own: no persistent/pingpong/stream-K walk (it would bypass the grouped tile order), no split-K for the
    two-product form (two K loops), and an accumulating form's ring fits beside its float32 C tile (no cut, no
    warning); warp-specialized and split configs are among what the ops' own space offers."""
    import tilejit.configs as cfg
    from tilejit.configs import SMEM_BUDGET_BYTES, matmul_configs, matmul_shared_bytes

    monkeypatch.setattr(cfg, "is_sm90", lambda tensor: True)
    monkeypatch.setattr(cfg, "cluster_sm_count", lambda tensor: 132)
    a = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    c = torch.empty(4096, 4096, dtype=torch.float32 if form == "accumulate" else torch.bfloat16, device="meta")
    named = dict(A=a, B=a, C=c, A2=a, B2=a, TRANS_A=form == "trans_a", TRANS_B=True, ACC_IN=form == "accumulate",
                 TWO=form == "two")
    kept = kernels._gemm_prune(matmul_configs(elem_bytes=2), named)
    assert kept
    own = kernels._gemm_prune(kernels.gemm_configs(2, accumulate=form == "accumulate"), named)
    assert any(k.warp_specialize for k in own)
    kept += own
    assert not any(k.persistent or k.pingpong or k.stream_k for k in kept)
    if form == "two":
        assert all(k.split_k == 1 for k in kept)
    if form == "accumulate":
        assert all(matmul_shared_bytes(k, 2) + k.kwargs["BM"] * k.kwargs["BN"] * 4 <= SMEM_BUDGET_BYTES for k in kept)
    assert all(k.split_k == 1 for k in kernels.swiglu_configs(2))
    skinny = dict(A=torch.empty(8192, 1024, dtype=torch.bfloat16, device="meta"), B=a[:8192, :1024],
                  C=torch.empty(1024, 1024, dtype=torch.bfloat16, device="meta"), TRANS_A=True, TRANS_B=False)
    assert any(k.split_k > 1 for k in kernels._gemm_prune(kernels.gemm_configs(2), skinny))


#: Every config space the ops tune over, by form: (kernel, arguments at 16 bits, flags, its configs).
def _tuned_spaces():
    cases = _compile_cases()
    m, n, k = 1000, 3000, 776
    one = dict(ACC_IN=False, TWO=False)
    return {"nt": (*cases["nt"], kernels.gemm_configs(2)),
            "nn": (kernels.gemm, cases["nn-two"][1], dict(TRANS_A=False, TRANS_B=False, **one),
                   kernels.gemm_configs(2)),
            "nn-two": (*cases["nn-two"], kernels.gemm_configs(2)),
            "tn": (kernels.gemm, (_meta(m, n), _meta(m, k), _meta(n, k), _meta(m, n), _meta(m, k)),
                   dict(TRANS_A=True, TRANS_B=False, **one), kernels.gemm_configs(2)),
            "tn-acc": (*cases["tn-acc"], kernels.gemm_configs(2, accumulate=True)),
            "swiglu-fwd": (*cases["swiglu-fwd"], kernels.swiglu_configs(2)),
            "swiglu-bwd": (*cases["swiglu-bwd"], kernels.swiglu_recompute_configs(2))}


def test_tuned_spaces_are_short_plain_and_fit_their_budgets(monkeypatch):
    """At most 8 plain configs a form, the 2 split ones of ``GEMM_SPLIT_TILES`` and 2 warp-specialized ones (a first
    training step tunes every form and shape), none of the excluded launch options, and none that a fit rule drops
    on every problem: the ring (``SMEM_BUDGET_BYTES``), the accumulating form's float32 C tile beside it, swiglu's
    two weight tiles a stage."""
    from tilejit.configs import SMEM_BUDGET_BYTES, matmul_shared_bytes

    for name, (_, _, flags, configs) in _tuned_spaces().items():
        plain = [c for c in configs if c.split_k == 1 and not c.warp_specialize]
        split = [c for c in configs if c.split_k > 1]
        assert 2 <= len(plain) <= 8 and len(split) <= 2, (name, len(configs))
        assert len(configs) - len(plain) - len(split) <= 2, name
        assert configs == kernels._plain(configs, split=True), name
        assert len({(tuple(sorted(c.kwargs.items())), c.num_warps, c.num_stages, c.split_k, c.warp_specialize)
                    for c in configs}) == len(configs)
        for config in configs:
            if name.startswith("swiglu"):
                assert kernels.swiglu_ring_bytes(config, 2) <= SMEM_BUDGET_BYTES, (name, config)
            else:
                assert matmul_shared_bytes(config, 2) <= SMEM_BUDGET_BYTES, (name, config)
            if flags.get("ACC_IN"):
                assert kernels._fits_beside_c(config, 2, 4), (name, config)
    a, b, c32 = _meta(8192, 1024), _meta(32000, 1024), _meta(32000, 1024, dtype=torch.float32)
    named = dict(A=a, B=b, C=c32, TRANS_A=True, TRANS_B=False, ACC_IN=True)  # dW += dLogits^T @ h
    assert kernels._gemm_prune(kernels.gemm_configs(2, accumulate=True), named)
    # split-K: offered to a weight's gradient with few output tiles (1024 x 1024 over 8192 tokens: 64 tiles of
    # 128 x 128), never to a large output, a short K or the two-product form (two K loops); on an H100's 132 SMs
    import tilejit.configs as cfg

    monkeypatch.setattr(cfg, "cluster_sm_count", lambda tensor: 132)
    dw = dict(A=_meta(8192, 1024), B=_meta(8192, 1024), C=_meta(1024, 1024), TRANS_A=True, TRANS_B=False)
    assert any(c.split_k > 1 for c in kernels._gemm_prune(kernels.gemm_configs(2), dw))
    assert not any(c.split_k > 1 for c in kernels._gemm_prune(kernels.gemm_configs(2), {**dw, "TWO": True}))
    assert not any(c.split_k > 1 for c in kernels._gemm_prune(kernels.gemm_configs(2), dict(
        A=_meta(8192, 1024), B=_meta(1024, 4096), C=_meta(8192, 4096))))
    assert not any(c.split_k > 1 for c in kernels._gemm_prune(kernels.gemm_configs(2), dict(
        A=_meta(1024, 256), B=_meta(256, 1024), C=_meta(1024, 1024))))
    for m in (1, 16):  # decode: the 16-row tiles are offered
        kept = kernels._gemm_prune(kernels.gemm_configs(2), dict(A=_meta(m, 4096), B=_meta(4096, 4096)))
        assert any(c.kwargs["BM"] == 16 for c in kept) and all(c.kwargs["BM"] <= 64 for c in kept)
        kept = kernels._swiglu_prune(kernels.swiglu_configs(2), dict(X=_meta(m, 4096), Wg=_meta(11008, 4096)))
        assert any(c.kwargs["BM"] == 16 for c in kept)


@pytest.mark.skipif("sm_90a" not in ARCHS, reason="NVRTC here cannot compile for sm_90a")
@pytest.mark.parametrize("form", list(_tuned_spaces()))
def test_every_tuned_config_compiles_without_spills(fresh_compile_cache, form):
    """Each config of each form's space, bf16 on sm_90a: compiled with the stages it names, in the arch's shared
    memory, with no register spilled (a spilling candidate costs its tuning time and loses)."""
    kernel, args, flags, configs = _tuned_spaces()[form]
    max_shared = tilejit.target.Arch.parse("sm_90a").max_shared_bytes
    for config in configs:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = kernel.compile(*args, arch="sm_90a", **flags, **config.kwargs, num_warps=config.num_warps,
                                      num_stages=config.num_stages)
        assert not [w for w in caught if "compiled with" in str(w.message)], (form, config)  # no ring cut
        assert compiled.meta["spills"] == 0, (form, config, compiled.meta["spills"])
        assert 0 < compiled.shared_bytes <= max_shared, (form, config, compiled.shared_bytes)


@pytest.mark.parametrize("rows, vocab, bm, bv", [(37, 100, 8, 32), (5, 70, 4, 128), (9, 256, 16, 256)])
def test_cross_entropy_blocks_of_rows(interpret, rows, vocab, bm, bv):
    """Several rows a program, ragged in rows and columns, one block or several: every row's loss and gradient."""
    torch.manual_seed(9)
    logits = torch.randn(rows, vocab, dtype=torch.bfloat16) * 4
    targets = torch.randint(0, vocab, (rows,))
    targets[1::4] = -100
    targets[0], targets[2] = vocab - 1, 0
    loss_rows = torch.full((rows,), float("nan"))
    ref = logits.double()
    expected = F.cross_entropy(ref, targets, reduction="none")
    grad = torch.softmax(ref, 1) - F.one_hot(targets.clamp(min=0), vocab)
    grad[targets == -100] = 0
    kernels.cross_entropy_rows[(tilejit.cdiv(rows, bm),)](logits, targets, loss_rows, torch.tensor([0.25]), -100,
                                                           BM=bm, BV=bv, num_warps=4)
    assert_close64(loss_rows, expected, torch.float32, "loss")
    assert_close64(logits, grad * 0.25, torch.bfloat16, "grad")


def test_cross_entropy_config_fits_the_row():
    assert kernels.cross_entropy_config(256) == dict(BM=8, BV=256, num_warps=8)
    assert kernels.cross_entropy_config(32000) == dict(BM=1, BV=1024, num_warps=4)
    assert kernels.cross_entropy_config(50) == dict(BM=32, BV=64, num_warps=8)
    assert kernels.cross_entropy_config(3) == dict(BM=32, BV=16, num_warps=2)
    assert kernels.cross_entropy_config(1000) == dict(BM=2, BV=1024, num_warps=8)


@pytest.mark.skipif("sm_90a" not in ARCHS, reason="NVRTC here cannot compile for sm_90a")
@pytest.mark.parametrize("form", ["tn", "tn-acc"])
def test_float32_weight_gradient_configs_compile_uncut(fresh_compile_cache, form):
    """float32 (tf32) dW = dY^T @ X (A stored K x M), plain and accumulating: every config the prune keeps for a
    ragged problem compiles on sm_90a with the stages it names (no "compiled with N stages" warning), and the
    prune drops the 4-stage 128x256 / 128x128 rings that the compiler would cut."""
    kernel, args, flags, _ = _tuned_spaces()[form]
    args32 = tuple(torch.empty(a.shape, dtype=torch.float32, device="meta") for a in args)
    configs = kernels.gemm_configs(4, accumulate=flags["ACC_IN"])
    named = dict(zip(("A", "B", "C", "A2", "B2"), args32), **flags)
    kept = kernels._gemm_prune(configs, named)
    assert kept and not any(c.kwargs["BM"] * c.kwargs["BN"] >= 128 * 128 and c.num_stages >= 4 for c in kept)
    for config in kept:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kernel.compile(*args32, arch="sm_90a", **flags, **config.kwargs, num_warps=config.num_warps,
                           num_stages=config.num_stages)
        assert not [w for w in caught if "compiled with" in str(w.message)], (form, config)
