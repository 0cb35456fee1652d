"""``tilejit port`` on the patterns of Triton's tutorials that the first fixture missed: a persistent softmax with
a ``num_stages`` constexpr and ``tl.range(num_stages=)``, a ``@triton.jit`` helper, a lock-and-counter layer-norm
backward (bare scalar offsets, atomics, a spin ``while``), a row-by-N 2-D offset, and ``@triton.autotune``."""
from __future__ import annotations

import pytest
import torch

from tilejit.port import MARK, port_source

SOURCE = '''
import torch
import triton
import triton.language as tl


@triton.jit
def rows_softmax(Out, X, stride_x, stride_o, n_rows, n_cols, BLOCK: tl.constexpr, num_stages: tl.constexpr):
    first = tl.program_id(0)
    for r in tl.range(first, n_rows, tl.num_programs(0), num_stages=num_stages):
        cols = tl.arange(0, BLOCK)
        v = tl.load(X + r * stride_x + cols, mask=cols < n_cols, other=-float("inf"))
        e = tl.exp(v - tl.max(v, axis=0))
        tl.store(Out + r * stride_o + cols, e / tl.sum(e, axis=0), mask=cols < n_cols)


@triton.jit
def halve_negatives(v):
    return tl.where(v >= 0, v, 0.5 * v)


@triton.jit
def act_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, halve_negatives(tl.load(X + offs, mask=offs < n)), mask=offs < n)


@triton.jit
def grouped_rows(X, Acc, Lock, n, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    g = row % GROUPS
    Lock += g
    Seen = Lock + GROUPS
    Acc = Acc + g * n + cols
    v = tl.load(X + row * n + cols, mask=cols < n, other=0.)
    while tl.atomic_cas(Lock, 0, 1) == 1:
        pass
    if tl.load(Seen) == 0:
        tl.atomic_xchg(Seen, 1)
    else:
        v += tl.load(Acc, mask=cols < n)
    tl.store(Acc, v, mask=cols < n)
    tl.atomic_xchg(Lock, 0)


@triton.jit
def column_sums(P, Out, M, N, BM: tl.constexpr, BN: tl.constexpr):
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for i in range(0, M, BM):
        rows = i + tl.arange(0, BM)
        acc += tl.load(P + rows[:, None] * N + cols[None, :], mask=(rows[:, None] < M) & (cols[None, :] < N), other=0.)
    tl.store(Out + cols, tl.sum(acc, axis=0), mask=cols < N)


def configs():
    return [triton.Config({"BLOCK": 64}, num_warps=2)]


@triton.autotune(configs=configs(), key=["n"])
@triton.jit
def tuned_copy(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


@triton.jit
def refused_then_read(X, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for i in range(2):
        k = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [offs], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(Y + offs, tl.load(X + offs) + k)
'''


@pytest.fixture(scope="module")
def ported(tmp_path_factory):
    text = port_source(SOURCE)
    path = tmp_path_factory.mktemp("port") / "ported_tutorials.py"
    path.write_text(text)
    namespace: dict = {"__name__": "ported_tutorials", "configs": lambda: [__import__("tilejit").Config(
        {"BLOCK": 64}, num_warps=2)]}
    exec(compile(text, str(path), "exec"), namespace)
    return text, namespace


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def test_num_stages_parameter_and_tl_range_keyword(ported):
    text, ns = ported
    assert "stages=num_stages_" in text and "num_stages_: T.constexpr" in text
    x = torch.randn(9, 37)
    out = torch.empty_like(x)
    ns["rows_softmax"][(4,)](out, x, x.stride(0), out.stride(0), 9, 37, 64, 2)
    torch.testing.assert_close(out.double(), torch.softmax(x.double(), 1), atol=1e-6, rtol=1e-5)


def test_a_helper_becomes_a_func_and_keeps_its_return(ported):
    text, ns = ported
    assert "@tilejit.func\ndef halve_negatives" in text and "return T.where" in text
    x = torch.randn(100)
    y = torch.empty_like(x)
    ns["act_kernel"][(2,)](x, y, 100, BLOCK=64)
    ref = x.double()
    torch.testing.assert_close(y.double(), torch.where(ref >= 0, ref, 0.5 * ref))


def test_lock_counter_and_bare_offsets_index_one_dim(ported):
    text, ns = ported
    assert "Lock[g + GROUPS]" in text and "T.atomic_cas(Lock[g], 0, 1)" in text
    x = torch.randn(7, 20)
    acc = torch.randn(3, 20)  # overwritten by the first row of each group
    lock = torch.zeros(6, dtype=torch.int32)
    ns["grouped_rows"][(7,)](x, acc, lock, 20, GROUPS=3, BLOCK=32)
    ref = torch.stack([x[g::3].double().sum(0) for g in range(3)])
    torch.testing.assert_close(acc.double(), ref, atol=1e-5, rtol=1e-5)
    assert lock[:3].tolist() == [0, 0, 0] and lock[3:].tolist() == [1, 1, 1]


def test_rows_times_n_plus_unit_stride_columns(ported):
    _, ns = ported
    p = torch.randn(45, 70)
    out = torch.empty(70)
    ns["column_sums"][(3,)](p, out, 45, 70, BM=16, BN=32)
    torch.testing.assert_close(out.double(), p.double().sum(0), atol=1e-5, rtol=1e-5)


def test_autotune_becomes_tilejits(ported):
    text, ns = ported
    assert "@tilejit.autotune(configs=configs(), key=['n'])" in text and "reads configs" in text
    x = torch.randn(130)
    y = torch.empty_like(x)
    ns["tuned_copy"][lambda meta: ((130 + meta["BLOCK"] - 1) // meta["BLOCK"],)](x, y, 130)
    assert torch.equal(x, y)


def test_a_name_whose_assignment_is_refused_is_not_read_later(ported):
    text, _ = ported
    body = text[text.index("def refused_then_read"):]
    assert f"{MARK} line " in body
    assert "k is not translated (its assignment, line" in body
    assert "\n        pass" in body  # the loop whose only statement was refused is still a block
