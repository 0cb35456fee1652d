"""Longest programs first (``passes/program_order.py``): which kernels get their program order mirrored along an
axis, the mirrored ids in the printed IR and the generated code for every arch, and the interpreter's results of
the mirrored and the original IR, bit for bit."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.interpreter import interpret
from tilejit.ops.fused_attention import attn_fwd
from tilejit.passes.program_order import order_programs
from tilejit.target import Target

from filecheck import filecheck
from benchmarks.kernels import attention_one_loop
from kernels import meta


@tilejit.kernel
def prefix_rows(X, Y, BM: T.constexpr):
    """Y[i] = sum of X[0:(i // BM + 1) * BM]: program p sums p + 1 blocks (a triangular loop)."""
    m0 = T.program_id(0) * BM
    acc = T.zeros((BM,), T.float32)
    for k0 in T.range(0, m0 + BM, BM):
        acc += X[k0:k0 + BM]
    Y[m0:m0 + BM] = acc


@tilejit.kernel
def suffix_rows(X, Y, BM: T.constexpr):
    """The loop starts at the program's block: the first programs are already the longest."""
    m0 = T.program_id(0) * BM
    acc = T.zeros((BM,), T.float32)
    for k0 in T.range(m0, X.shape[0], BM):
        acc += X[k0:k0 + BM]
    Y[m0:m0 + BM] = acc


@tilejit.kernel
def window_rows(X, Y, BM: T.constexpr):
    """Both bounds move with the program id: every program runs the same count."""
    m0 = T.program_id(0) * BM
    acc = T.zeros((BM,), T.float32)
    for k0 in T.range(m0, m0 + 2 * BM, BM):
        acc += X[k0:k0 + BM]
    Y[m0:m0 + BM] = acc


@tilejit.kernel
def loaded_length(X, Lens, Y, BM: T.constexpr):
    """The bound is read from memory at the program's index: its trend is unknown."""
    p = T.program_id(0)
    acc = T.zeros((BM,), T.float32)
    for k0 in T.range(0, Lens[p], BM):
        acc += X[k0:k0 + BM]
    Y[p * BM:p * BM + BM] = acc


@tilejit.kernel
def prefix_rows_counted(X, Y, Count, BM: T.constexpr):
    """The triangular loop, and an atomic counter other programs may wait on."""
    m0 = T.program_id(0) * BM
    acc = T.zeros((BM,), T.float32)
    for k0 in T.range(0, m0 + BM, BM):
        acc += X[k0:k0 + BM]
    Y[m0:m0 + BM] = acc
    T.atomic_add(Count[0], 1)


def _attention(seq=200, dim=64):
    return [meta(2, 2, seq, dim) for _ in range(4)] + [0.125]


def _mirrored(fn) -> int | None:
    return fn.attrs.get("longest_first")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
def test_causal_one_loop_runs_its_last_query_blocks_first(arch):
    st = attention_one_loop.compile(*_attention(), BM=64, BN=64, D=64, CAUSAL=True, num_warps=4, arch=arch,
                                    stop_after="cuda")
    assert _mirrored(st.fn) == 0
    filecheck(st.final_ir, r"""
        CHECK: [[PID:%[0-9]+]] = tj.program_id {axis = 0} : i32
        CHECK-NEXT: [[N:%[0-9]+]] = tj.num_programs {axis = 0} : i32
        CHECK-NEXT: [[ONE:%[0-9]+]] = tj.constant {value = 1} : i32
        CHECK-NEXT: [[LAST:%[0-9]+]] = tj.binary [[N]], [[ONE]] {op = sub} : i32
        CHECK-NEXT: [[MIRROR:%[0-9]+]] = tj.binary [[LAST]], [[PID]] {op = sub} : i32
        CHECK-NOT: tj.program_id {axis = 0}
        CHECK: %m0 = tj.binary [[MIRROR]]
        CHECK: tj.for {{.*}}peeled = unmasked
    """)
    assert "gridDim.x" in st.cuda


@pytest.mark.parametrize("kernel,args", [
    (prefix_rows, lambda: (meta(1000, dtype=torch.float32), meta(1000, dtype=torch.float32))),
])
def test_a_loop_that_lengthens_with_the_id_is_mirrored(kernel, args):
    fn = kernel.compile(*args(), BM=64, arch="sm_90a", stop_after="passes").fn
    assert _mirrored(fn) == 0


@pytest.mark.parametrize("kernel,args", [
    (suffix_rows, lambda: (meta(1000, dtype=torch.float32), meta(1000, dtype=torch.float32))),
    (window_rows, lambda: (meta(1000, dtype=torch.float32), meta(1000, dtype=torch.float32))),
    (loaded_length, lambda: (meta(1000, dtype=torch.float32), meta(16, dtype=torch.int32),
                             meta(1000, dtype=torch.float32))),
    (prefix_rows_counted, lambda: (meta(1000, dtype=torch.float32), meta(1000, dtype=torch.float32),
                                   meta(1, dtype=torch.int32))),
])
def test_other_orders_are_left_as_the_grid_gives_them(kernel, args):
    fn = kernel.compile(*args(), BM=64, arch="sm_90a", stop_after="passes").fn
    assert _mirrored(fn) is None
    assert sum(op.kind.mnemonic == "program_id" for op in fn.walk()) >= 1
    assert not any(op.kind.mnemonic == "num_programs" for op in fn.walk())


def test_non_causal_hand_ordered_and_switched_off_stay_in_grid_order():
    plain = attention_one_loop.compile(*_attention(), BM=64, BN=64, D=64, CAUSAL=False, arch="sm_90a",
                                       stop_after="passes").fn
    off = attention_one_loop.compile(*_attention(), BM=64, BN=64, D=64, CAUSAL=True, arch="sm_90a",
                                     stop_after="passes", longest_first=False).fn
    lens = meta(2, dtype=torch.int32)
    q = meta(2, 2, 200, 64)
    # tilejit.ops.fused_attention's forward starts its last query blocks first by hand: its loops shorten
    tuned = attn_fwd.compile(q, q, q, q, lens, lens, 0.125, 2, GROUP=1, BM=64, BN=64, D=64, CAUSAL=True,
                             VARLEN=False, arch="sm_90a", stop_after="passes").fn
    assert _mirrored(plain) is None and _mirrored(off) is None and _mirrored(tuned) is None


def test_split_k_and_clusters_keep_the_grid_order():
    fn = prefix_rows.compile(meta(1000, dtype=torch.float32), meta(1000, dtype=torch.float32), BM=64,
                             arch="sm_90a", stop_after="ir").fn
    order_programs(fn, Target.of("sm_90a", cluster=2))
    assert _mirrored(fn) is None


@pytest.mark.parametrize("seq,causal", [(200, True), (37, True), (64, True)])
def test_interpreted_mirrored_order_is_bit_identical(seq, causal):
    torch.manual_seed(seq)
    q, k, v = (torch.randn(1, 2, seq, 32, dtype=torch.float16) for _ in range(3))
    grid = (-(-seq // 32), 2, 1)
    outs = []
    for mirror in (False, True):
        fn = attention_one_loop.compile(*[x.to("meta") for x in (q, k, v, q)], 0.125, BM=32, BN=16, D=32,
                                        CAUSAL=causal, arch="sm_80", stop_after="ir").fn
        if mirror:
            order_programs(fn, Target.of("sm_80"))
            assert _mirrored(fn) == 0
        values = {"Q": q, "K": k, "V": v, "O": torch.full_like(q, float("nan")), "sm_scale": 0.125}
        interpret(fn, grid, values)
        outs.append(values["O"])
    assert torch.equal(outs[0], outs[1])
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                                           scale=0.125)
    assert (outs[1].double() - ref).abs().max().item() < 2e-2
