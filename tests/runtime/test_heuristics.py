"""tilejit.heuristics: constexprs computed from the launch arguments (Triton's triton.heuristics), alone and under
tilejit.autotune; T.multiple_of / T.max_contiguous are accepted hints."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


seen: list[tuple] = []


@tilejit.heuristics({
    "EVEN_K": lambda args: args["K"] % args["BK"] == 0,
    "HALF_BK": lambda args: args["BK"] // 2 if args["EVEN_K"] else args["BK"],  # sees EVEN_K, computed first
})
@tilejit.kernel
def row_sums(X, Out, K, BK: T.constexpr, EVEN_K: T.constexpr, HALF_BK: T.constexpr):
    acc = T.zeros((BK,), T.float32)
    for k0 in range(0, K, BK):
        acc += X[0, k0:k0 + BK]
    Out[0] = T.sum(acc, 0) + (1000.0 if EVEN_K else 0.0) + HALF_BK


def test_heuristics_compute_constexprs(interpret):
    x = torch.randn(1, 96)
    out = torch.zeros(1)
    row_sums[(1,)](x, out, 96, BK=32)
    torch.testing.assert_close(out, x.sum(1) + 1000.0 + 16)
    x = torch.randn(1, 100)
    row_sums[(1,)](x, out, 100, BK=32)
    torch.testing.assert_close(out, x.sum(1) + 32)


def test_heuristics_reach_the_ir():
    ir = row_sums.ir(torch.empty(1, 96, device="meta"), torch.empty(1, device="meta"), 96, BK=32)
    assert "EVEN_K = true" in ir and "HALF_BK = 16" in ir
    ir = row_sums.ir(torch.empty(1, 100, device="meta"), torch.empty(1, device="meta"), 100, BK=32)
    assert "EVEN_K = false" in ir and "HALF_BK = 32" in ir


def test_heuristics_reject_a_passed_value(interpret):
    with pytest.raises(TypeError, match="EVEN_K are computed by tilejit.heuristics"):
        row_sums[(1,)](torch.zeros(1, 8), torch.zeros(1), 8, BK=8, EVEN_K=True)


def test_heuristics_name_unknown_parameters():
    with pytest.raises(ValueError, match="not parameters"):
        tilejit.heuristics({"NOPE": lambda args: 1})(row_sums.kernel)


def test_heuristics_under_autotune(interpret, tmp_path, monkeypatch):
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))
    calls = []

    def even_k(args):
        calls.append((args["BK"], args["num_warps"]))
        return args["K"] % args["BK"] == 0

    @tilejit.autotune(configs=[tilejit.Config({"BK": 32}, num_warps=4), tilejit.Config({"BK": 64}, num_warps=8)],
                      key=["K"], bench_fn=lambda run: (run(), 1.0)[1])
    @tilejit.heuristics({"EVEN_K": even_k})
    @tilejit.kernel
    def k(X, Out, K, BK: T.constexpr, EVEN_K: T.constexpr):
        acc = T.zeros((BK,), T.float32)
        for k0 in range(0, K, BK):
            acc += X[0, k0:k0 + BK]
        Out[0] = T.sum(acc, 0) + (1000.0 if EVEN_K else 0.0)

    x = torch.randn(1, 96)
    out = torch.zeros(1)
    k[(1,)](x, out, 96)
    chosen = k.best_config.kwargs["BK"]
    torch.testing.assert_close(out, x.sum(1) + (1000.0 if 96 % chosen == 0 else 0.0))
    assert {bk for bk, _ in calls} == {32, 64}  # the heuristic saw each config's BK
    assert all(w == (4 if bk == 32 else 8) for bk, w in calls if w is not None)


def test_multiple_of_is_an_accepted_hint(interpret):
    @tilejit.kernel
    def k(X, Y, n, B: T.constexpr):
        i0 = T.multiple_of(T.program_id(0) * B, 16)
        offs = T.max_contiguous(T.arange(0, B), B)
        Y[i0:i0 + B] = X[i0:i0 + B] + offs.to(T.float32) + T.multiple_of(n, (16,))

    x = torch.randn(64)
    y = torch.zeros(64)
    k[(4,)](x, y, 32, B=16)
    torch.testing.assert_close(y, x + torch.arange(16).repeat(4).float() + 32)


def test_multiple_of_needs_a_positive_int():
    @tilejit.kernel
    def k(X, B: T.constexpr):
        X[0:B] = T.multiple_of(T.arange(0, B), 0).to(T.float32)

    with pytest.raises(tilejit.CompilationError, match="the hint needs a positive compile-time int"):
        k.ir(torch.empty(16, device="meta"), B=16)
