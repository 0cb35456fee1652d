"""tilejit.ops.rms_norm and tilejit.ops.rotary_embedding: forward and backward through the interpreter against
the float64 definitions (``reference`` of tilejit/ops/norm.py and tilejit/ops/rotary.py, which the GPU tests
use too) over ragged shapes, every output written (NaN-poisoned), in place without autograd and out of place with
it, inside torch.compile(fullgraph=True), the users' mistakes as typed errors, and the kernels' compilation for
sm_80, sm_90a and sm_100a."""
from __future__ import annotations

import pytest
import torch

import tilejit
from tilejit.backend_cuda.nvrtc import nvrtc_supports
from tilejit.ops import custom_ops, norm
from tilejit.ops import rotary

ARCHS = [a for a in ("sm_80", "sm_90a", "sm_100a") if nvrtc_supports(a)]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=4e-3, atol=4e-3),
       torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.fixture
def interpret(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _close(got, want, dtype, name, scale=1.0):
    assert not torch.isnan(got).any(), f"{name}: some elements were never written"
    tol = TOL[dtype]
    torch.testing.assert_close(got.double(), want, rtol=tol["rtol"], atol=tol["atol"] * scale,
                               msg=lambda m: f"{name}: {m}")


def _norm_reference_grads(x, w, r, dy, ds, eps):
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    r64 = None if r is None else r.detach().double().requires_grad_()
    out = norm.reference(x64, w64, eps, r64)
    if r is None:
        (out * dy.double()).sum().backward()
        return out.detach(), None, x64.grad, w64.grad, None
    (out[0] * dy.double() + out[1] * ds.double()).sum().backward()
    return out[0].detach(), out[1].detach(), x64.grad, w64.grad, r64.grad


NORM_CASES = [((7, 37), torch.float32, False), ((3, 5, 37), torch.float32, True), ((2, 19, 100), torch.bfloat16, True),
              ((70, 40), torch.float16, True), ((300,), torch.float32, False), ((9, 1030), torch.bfloat16, False),
              ((5, 1024), torch.bfloat16, True), ((11, 256), torch.float16, False)]


@pytest.mark.parametrize("shape, dtype, residual", NORM_CASES, ids=[f"{s}-{str(d)[6:]}-{r}" for s, d, r in NORM_CASES])
def test_rms_norm_matches_float64_autograd(interpret, shape, dtype, residual):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype) * 2 + 0.3
    w = torch.randn(shape[-1], dtype=dtype)
    r = torch.randn(shape, dtype=dtype) if residual else None
    dy, ds = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, w, r)]
    out = norm.rms_norm(leaves[0], leaves[1], eps=1e-5, residual=leaves[2])
    y, s = out if residual else (out, None)
    assert y.dtype == dtype and y.shape == x.shape
    (y * dy + (s * ds if residual else 0)).sum().backward()
    want = _norm_reference_grads(x, w, r, dy, ds, 1e-5)
    _close(y, want[0], dtype, "y")
    _close(leaves[0].grad, want[2], dtype, "dx", want[2].abs().max().item())
    # dweight sums over every row: relative to its scale
    _close(leaves[1].grad, want[3], dtype, "dweight", want[3].abs().max().item())
    if residual:
        _close(s, want[1], dtype, "s")
        _close(leaves[2].grad, want[4], dtype, "dresidual", want[4].abs().max().item())


def test_rms_norm_float32_weight_with_bfloat16_activations(interpret):
    torch.manual_seed(1)
    x = torch.randn(6, 50, dtype=torch.bfloat16)
    w = torch.randn(50, dtype=torch.float32, requires_grad=True)
    y = norm.rms_norm(x, w)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert w.grad.dtype == torch.float32
    want = _norm_reference_grads(x, w, None, torch.ones(6, 50), None, 1e-6)
    _close(y, want[0], torch.bfloat16, "y")
    _close(w.grad, want[3], torch.bfloat16, "dweight", want[3].abs().max().item())


def test_rms_norm_launches_write_every_output(interpret):
    """Outputs poisoned with NaN: every element is written; the backward's programs walk several row blocks
    (100 rows of 16 per block, 4 programs on CPU), so the partial dweight sums cover every row."""
    torch.manual_seed(2)
    rows, dim = 100, 40
    x, r, dy, ds = (torch.randn(rows, dim) for _ in range(4))
    w = torch.randn(dim)
    y, s, rstd = (torch.full(shape, float("nan")) for shape in ((rows, dim), (rows, dim), (rows,)))
    norm.rms_norm_forward(x, w, 1e-6, r, out=y, residual_out=s, rstd=rstd)
    dx, dweight = torch.full((rows, dim), float("nan")), torch.full((dim,), float("nan"))
    norm.rms_norm_backward(dy, ds, s, w, rstd, dx=dx, dweight=dweight)
    want = _norm_reference_grads(x, w, r, dy, ds, 1e-6)
    _close(y, want[0], torch.float32, "y")
    _close(s, want[1], torch.float32, "s")
    _close(rstd, torch.rsqrt(want[1].pow(2).mean(-1) + 1e-6), torch.float32, "rstd")
    _close(dx, want[2], torch.float32, "dx", want[2].abs().max().item())
    _close(dweight, want[3], torch.float32, "dweight", want[3].abs().max().item())


def _rotary_inputs(batch, seq, q_heads, k_heads, dim, dtype, positions_dtype=None, max_positions=64, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(batch, seq, q_heads, dim, dtype=dtype)
    k = torch.randn(batch, seq, k_heads, dim, dtype=dtype)
    angles = torch.randn(max_positions, dim // 2) * 3
    positions = None
    if positions_dtype is not None:
        positions = torch.randint(0, max_positions, (batch, seq), dtype=positions_dtype)
    return q, k, angles.cos(), angles.sin(), positions


ROPE_CASES = [(2, 3, 5, 2, 20, torch.float32, None), (3, 1, 4, 4, 16, torch.bfloat16, torch.int64),
              (2, 4, 6, 3, 300, torch.float16, torch.int32), (1, 5, 2, 1, 2, torch.float32, torch.int64),
              (2, 70, 2, 1, 8, torch.float32, torch.int32), (2, 70, 3, 1, 8, torch.bfloat16, torch.int64)]


@pytest.mark.parametrize("case", ROPE_CASES, ids=[f"{c[:5]}-{str(c[5])[6:]}-{c[6]}" for c in ROPE_CASES])
def test_rotary_in_place_matches_float64(interpret, case):
    """Without autograd: q and k are rotated in place and returned. Head dim 300 (halves of 150 in 256-wide
    tiles, 4 heads a step) walks the heads in two steps; S = 1 with one position per batch entry is decode."""
    *shape, dtype, positions_dtype = case
    q, k, cos, sin, positions = _rotary_inputs(*shape, dtype, positions_dtype)
    want_q, want_k = rotary.reference(q, k, cos, sin, positions)
    q_in, k_in = q.clone(), k.clone()
    got_q, got_k = rotary.rotary_embedding(q_in, k_in, cos, sin, positions=positions)
    assert got_q is q_in and got_k is k_in
    _close(got_q, want_q, dtype, "q")
    _close(got_k, want_k, dtype, "k")


def test_rotary_in_place_on_strided_views(interpret):
    """q and k as views of one fused qkv projection (row strides larger than the heads): rotated where they lie,
    the rest of the buffer untouched."""
    torch.manual_seed(3)
    qkv = torch.randn(2, 3, 4 + 2 + 2, 16)
    q, k = qkv[:, :, :4], qkv[:, :, 4:6]
    _, _, cos, sin, _ = _rotary_inputs(2, 3, 4, 2, 16, torch.float32)
    want_q, want_k = rotary.reference(q, k, cos, sin)
    v_before = qkv[:, :, 6:].clone()
    rotary.rotary_embedding(q, k, cos, sin)
    _close(qkv[:, :, :4], want_q, torch.float32, "q")
    _close(qkv[:, :, 4:6], want_k, torch.float32, "k")
    assert torch.equal(qkv[:, :, 6:], v_before)


@pytest.mark.parametrize("dtype, positions_dtype", [(torch.float32, torch.int64), (torch.bfloat16, None)])
def test_rotary_backward_matches_float64_autograd(interpret, dtype, positions_dtype):
    """With autograd: fresh tensors come back (q and k unchanged), and the gradients are the inverse rotation."""
    q, k, cos, sin, positions = _rotary_inputs(2, 5, 3, 1, 12, dtype, positions_dtype, seed=4)
    q_leaf, k_leaf = q.clone().requires_grad_(), k.clone().requires_grad_()
    got_q, got_k = rotary.rotary_embedding(q_leaf, k_leaf, cos, sin, positions=positions)
    assert got_q is not q_leaf and torch.equal(q_leaf.detach(), q) and torch.equal(k_leaf.detach(), k)
    dq, dk = torch.randn_like(got_q), torch.randn_like(got_k)
    ((got_q * dq).sum() + (got_k * dk).sum()).backward()
    q64, k64 = q.double().requires_grad_(), k.double().requires_grad_()
    want_q, want_k = rotary.reference(q64, k64, cos, sin, positions)
    ((want_q * dq.double()).sum() + (want_k * dk.double()).sum()).backward()
    _close(got_q, want_q.detach(), dtype, "q")
    _close(got_k, want_k.detach(), dtype, "k")
    _close(q_leaf.grad, q64.grad, dtype, "dq")
    _close(k_leaf.grad, k64.grad, dtype, "dk")


def test_rotary_launch_writes_every_output(interpret):
    q, k, cos, sin, positions = _rotary_inputs(2, 3, 5, 3, 26, torch.float32, torch.int64, seed=5)
    q_out, k_out = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    rotary.rotary_forward(q, k, cos, sin, positions, q_out=q_out, k_out=k_out)
    want_q, want_k = rotary.reference(q, k, cos, sin, positions)
    _close(q_out, want_q, torch.float32, "q")
    _close(k_out, want_k, torch.float32, "k")
    back_q, back_k = rotary.rotary_forward(q_out, k_out, cos, sin, positions, inverse=True)
    _close(back_q, q.double(), torch.float32, "inverse q")
    _close(back_k, k.double(), torch.float32, "inverse k")


def _block(h, residual, w, wq, wk, cos, sin):
    """A sliver of a Llama block: residual add + RMSNorm, q/k projections, rotary."""
    x, residual = tilejit.ops.rms_norm(h, w, eps=1e-5, residual=residual)
    batch, seq, _ = x.shape
    q = (x @ wq).view(batch, seq, 2, 8)
    k = (x @ wk).view(batch, seq, 1, 8)
    q, k = tilejit.ops.rotary_embedding(q, k, cos, sin)
    return (q.sum(2) * k.sum(2)).sum() + residual.square().mean()


def test_both_ops_in_fullgraph_compile_forward_and_backward(interpret):
    torch.manual_seed(6)
    h, residual = torch.randn(2, 5, 24), torch.randn(2, 5, 24)
    w, wq, wk = torch.randn(24), torch.randn(24, 16) / 5, torch.randn(24, 8) / 5
    _, _, cos, sin, _ = _rotary_inputs(2, 5, 2, 1, 8, torch.float32)
    compiled = torch.compile(_block, fullgraph=True, backend="aot_eager")
    eager_leaves = [t.clone().requires_grad_() for t in (h, residual, w, wq)]
    compiled_leaves = [t.clone().requires_grad_() for t in (h, residual, w, wq)]
    eager = _block(*eager_leaves, wk, cos, sin)
    got = compiled(*compiled_leaves, wk, cos, sin)
    torch.testing.assert_close(got, eager)
    eager.backward()
    got.backward()
    for a, b in zip(compiled_leaves, eager_leaves):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad, b.grad)
    # the float64 definition agrees with both
    leaves64 = [t.double().requires_grad_() for t in (h, residual, w, wq)]
    x64, r64 = norm.reference(leaves64[0], leaves64[2], 1e-5, leaves64[1])
    q64 = (x64 @ leaves64[3]).view(2, 5, 2, 8)
    k64 = (x64 @ wk.double()).view(2, 5, 1, 8)
    q64, k64 = rotary.reference(q64, k64, cos, sin)
    want = (q64.sum(2) * k64.sum(2)).sum() + r64.square().mean()
    want.backward()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    for a, b in zip(compiled_leaves, leaves64):
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-4, atol=1e-4)
    explanation = torch._dynamo.explain(_block)(h, residual, w, wq, wk, cos, sin)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_in_place_rotary_in_fullgraph_compile_without_grad(interpret):
    q, k, cos, sin, positions = _rotary_inputs(3, 1, 4, 2, 16, torch.float32, torch.int32, seed=7)

    def decode_step(q, k, positions):
        q, k = tilejit.ops.rotary_embedding(q, k, cos, sin, positions=positions)
        return q * 2, k

    compiled = torch.compile(decode_step, fullgraph=True, backend="aot_eager")
    q_in, k_in = q.clone(), k.clone()
    with torch.no_grad():
        got_q, got_k = compiled(q_in, k_in, positions)
    want_q, want_k = rotary.reference(q, k, cos, sin, positions)
    _close(got_q, 2 * want_q, torch.float32, "q")
    _close(got_k, want_k, torch.float32, "k")
    _close(q_in, want_q, torch.float32, "q rotated in place")


def test_opcheck(interpret):
    """torch.library.opcheck: schemas, fake kernels against the real ones, autograd registration."""
    x, r = torch.randn(4, 24), torch.randn(4, 24)
    w = torch.randn(24, requires_grad=True)
    torch.library.opcheck(norm._OPS.forward.op, (x, w, r, 1e-6))
    torch.library.opcheck(norm._OPS.forward.op, (x, w, None, 1e-6))
    q, k, cos, sin, positions = _rotary_inputs(2, 3, 2, 1, 8, torch.float32, torch.int64)
    torch.library.opcheck(rotary._OPS.rotate.op, (q.requires_grad_(), k, cos, sin, positions, False))
    torch.library.opcheck(rotary._OPS.rotate_.op, (q.detach().clone(), k, cos, sin, None))


def test_rms_norm_errors():
    x = torch.randn(4, 24)
    w = torch.randn(24)
    cases = [
        (TypeError, "float16, bfloat16 or float32", dict(x=x.long(), weight=w)),
        (TypeError, "must be tensors", dict(x=x.tolist(), weight=w)),
        (ValueError, r"weight must have shape \(24,\)", dict(x=x, weight=torch.randn(23))),
        (ValueError, "at most 8192", dict(x=torch.randn(2, 8193), weight=torch.randn(8193))),
        (ValueError, "non-empty last dim", dict(x=torch.randn(3, 0), weight=torch.randn(0))),
        (ValueError, "residual must have x's shape, dtype", dict(x=x, weight=w, residual=torch.randn(4, 25))),
        (ValueError, "residual must have x's shape, dtype", dict(x=x, weight=w, residual=x.half())),
        (ValueError, "eps must be a number >= 0", dict(x=x, weight=w, eps=-1.0)),
    ]
    for error, message, kwargs in cases:
        with pytest.raises(error, match=message):
            norm.rms_norm(**kwargs)


def test_rotary_errors():
    q, k, cos, sin, positions = _rotary_inputs(2, 3, 4, 2, 8, torch.float32, torch.int64)
    cases = [
        (ValueError, r"must be \(B, S, H, D\)", dict(q=q[0])),
        (TypeError, "share one dtype", dict(k=k.half())),
        (TypeError, "share one dtype", dict(q=q.long(), k=k.long())),
        (ValueError, "k must be \\(B, S, Hkv, D\\) with q's B, S and D", dict(k=k[:, :2])),
        (ValueError, "head dim must be even", dict(q=q[..., :7], k=k[..., :7])),
        (ValueError, "last stride of 1", dict(q=torch.randn(2, 3, 4, 16)[..., ::2])),
        (ValueError, r"cos must be float32 \(max_positions, 4\)", dict(cos=cos.double())),
        (ValueError, r"sin must be float32 \(max_positions, 4\)", dict(sin=sin[:, :3])),
        (ValueError, r"positions must be an int32 or int64 tensor \(2, 3\)", dict(positions=positions.float())),
        (ValueError, r"positions must be an int32 or int64 tensor \(2, 3\)", dict(positions=positions[:1])),
        (ValueError, "3 positions but cos and sin have 2 rows", dict(cos=cos[:2], sin=sin[:2], positions=None)),
        (TypeError, "cos must be a tensor", dict(cos=1.0)),
    ]
    base = dict(q=q, k=k, cos=cos, sin=sin, positions=positions)
    for error, message, kwargs in cases:
        args = {**base, **kwargs}
        with pytest.raises(error, match=message):
            rotary.rotary_embedding(args.pop("q"), args.pop("k"), args.pop("cos"), args.pop("sin"), **args)


def _check_compiled(compiled, arch, spill_bytes=0):
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
    assert compiled.meta["spills"] <= spill_bytes, compiled.meta


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dim", [100, 1024, 4096, 8192])
def test_rms_norm_kernels_compile(fresh_compile_cache, arch, dim):
    config = norm.launch_config(dim)
    chunks, bc = dim // config["BC"], config["BC"]
    x, rstd = _meta(1000, chunks, bc), _meta(1000, dtype=torch.float32)
    partial = _meta(528, chunks, bc, dtype=torch.float32)
    weight = _meta(1, chunks, bc).expand(1000, chunks, bc)
    forward = norm.rms_norm_fwd.compile(x, x, weight, x, x, rstd, 1e-6, RESIDUAL=True, arch=arch, **config)
    _check_compiled(forward, arch)
    backward = norm.rms_norm_bwd.compile(x, x, x, weight[:config["BM"]], rstd, x, partial, HAS_DS=True, arch=arch,
                                         **config)
    _check_compiled(backward, arch)
    if arch == "sm_90a":
        # every access is a whole vector (the views' last extent is promised), and each thread reads the rstd of
        # its own rows: the only trips through shared memory are the two passes of each row sum (and dweight's)
        for compiled in (forward, backward):
            assert "no element-wise variant" in compiled.asm["cuda"]
            assert "broadcast through shared memory" not in compiled.asm["cuda"]
        assert backward.asm["cuda"].count("through shared memory") == 3
    sums = norm.column_sums_config(dim)
    _check_compiled(norm.column_sums.compile(partial[:, :, 0], _meta(dim, dtype=torch.float32), arch=arch, **sums),
                    arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dim, q_heads, k_heads", [(128, 32, 8), (64, 8, 8), (96, 5, 1)])
def test_rotary_kernel_compiles(fresh_compile_cache, arch, dim, q_heads, k_heads):
    q, k = _meta(2, 7, q_heads, 2, dim // 2), _meta(2, 7, k_heads, 2, dim // 2)
    table, positions = _meta(100, dim // 2, dtype=torch.float32), _meta(2, 7, dtype=torch.int64)
    compiled = rotary.rotary_kernel.compile(q, k, q, k, table, table, positions, POSITIONS=True, INVERSE=False,
                                            arch=arch, **rotary.launch_config(dim, q_heads, k_heads, 7))
    _check_compiled(compiled, arch)
    # cos and sin are spread over the heads once per head step (text: once in q's loop, once in k's), not at each
    # use; on sm_80 the positions reach the gathers' rows through shared memory too (once each)
    assert compiled.asm["cuda"].count("broadcast through shared memory") <= (6 if arch == "sm_80" else 4)
    # head dims whose half is a multiple of 8: only the vector accesses of q and k are generated
    assert compiled.asm["cuda"].count("no element-wise variant") == 8


def test_launch_configs():
    assert norm.launch_config(1024) == dict(BM=2, BR=32, BC=32, num_warps=4)
    assert norm.launch_config(4096) == dict(BM=1, BR=64, BC=64, num_warps=8)
    assert norm.launch_config(8192) == dict(BM=1, BR=128, BC=64, num_warps=16)
    assert norm.launch_config(40) == dict(BM=16, BR=8, BC=8, num_warps=2)
    assert norm.launch_config(100) == dict(BM=16, BR=32, BC=4, num_warps=4)
    assert norm.launch_config(37) == dict(BM=16, BR=64, BC=1, num_warps=2)
    assert norm.launch_config(2050) == dict(BM=1, BR=2048, BC=2, num_warps=8)
    assert norm.column_sums_config(1024) == dict(BM=128, BN=8, num_warps=4)
    assert rotary.launch_config(64, 16, 4, 1024) == dict(BT=4, BHQ=16, BHK=4, BHALF=32, HALF_DIVISOR=8, num_warps=4)
    assert rotary.launch_config(128, 32, 8, 1000) == dict(BT=1, BHQ=32, BHK=8, BHALF=64, HALF_DIVISOR=8,
                                                          num_warps=4)
    assert rotary.launch_config(300, 6, 3, 9) == dict(BT=1, BHQ=8, BHK=4, BHALF=256, HALF_DIVISOR=2, num_warps=4)
    assert rotary.launch_config(16, 2, 1, 3) == dict(BT=4, BHQ=2, BHK=1, BHALF=8, HALF_DIVISOR=8, num_warps=4)


def test_rms_norm_backward_programs_fit_the_sms_at_once(fresh_compile_cache, monkeypatch):
    """The backward launches as many programs as the SMs hold at once, from the compiled kernel's registers: at
    the example LLM's D = 1024 (2 rows a step, 4 warps) that is BACKWARD_PROGRAMS_PER_SM (4) per SM, one wave."""
    from types import SimpleNamespace

    monkeypatch.setenv("TILEJIT_ARCH", "sm_90a")
    hopper = SimpleNamespace(regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=228 * 1024,
                             max_threads_per_multi_processor=2048, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: hopper)
    monkeypatch.setattr(norm, "_RESIDENT", {})
    monkeypatch.setattr(custom_ops, "_SM_COUNTS", {})
    config = norm.launch_config(1024)
    x = _meta(8192, 1024 // config["BC"], config["BC"])
    weight = _meta(1, 1024 // config["BC"], config["BC"]).expand(config["BM"], -1, -1)
    args = (x, x, x, weight, _meta(8192, dtype=torch.float32), x, _meta(528, 32, 32, dtype=torch.float32))
    cuda = torch.device("cuda", 0)
    resident = norm._resident_per_sm(args, config, True, cuda)
    assert resident >= norm.BACKWARD_PROGRAMS_PER_SM == 4
    assert norm._programs_for_backward(8192, 2, cuda, resident) == 528
    assert norm._programs_for_backward(8192, 2, cuda, 3) == 396  # fewer fit: fewer programs, still one wave
    assert norm._programs_for_backward(100, 2, cuda, resident) == 50


def test_column_sums_over_many_steps(interpret):
    """Partial rows past several 4 x BM steps, neither rows nor columns a multiple of the tile."""
    torch.manual_seed(8)
    partial = torch.randn(1000, 37)
    out = torch.full((37,), float("nan"))
    norm.column_sums[(tilejit.cdiv(37, 8),)](partial, out, BM=16, BN=8, num_warps=4)
    torch.testing.assert_close(out.double(), partial.double().sum(0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 64])
@pytest.mark.parametrize("dim, step", [(1024, 1), (1024, 2), (32, 1), (37, 3), (8192, 1)])
def test_weight_rows_are_the_view_the_kernels_took(rows, dim, step):
    """``_weight_rows`` (one as_strided) has the shape, strides and offset of the view + expand it replaced, so
    the kernels' arguments and specializations are unchanged (rows == 1 keeps the viewed stride, not 0)."""
    bc = norm.launch_config(dim)["BC"]
    weight = torch.randn(dim * step + 5)[5::step]
    got = norm._weight_rows(weight, rows, bc)
    want = weight.view(1, dim // bc, bc).expand(rows, dim // bc, bc)
    assert (got.shape, got.stride(), got.storage_offset()) == (want.shape, want.stride(), want.storage_offset())
    assert torch.equal(got, want)

