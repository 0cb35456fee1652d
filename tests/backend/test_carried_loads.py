"""Register loads in a loop whose windows move by a constant per iteration (backend_cuda/carried_loads.py): their
pointers set up before the loop and stepped in its header, for per-row vectors and single elements, forward and
backward loops; the starts whose change is not a known constant, and vectors of many distinct elements, keep the
address math in the loop. Cubins for sm_80, sm_90a and sm_100a; the numbers on the GPU are in
tests/gpu/test_gpu_carried_loads.py."""
from __future__ import annotations

import re

import pytest
import torch

import tilejit
import tilejit.language as T


@tilejit.kernel
def row_scaled_sum(X, S, Tab, Out, BM: T.constexpr, BK: T.constexpr, DIV: T.constexpr, REVERSE: T.constexpr):
    """Out[m, j] = sum over the blocks kb of BK columns of X[m, kb * BK + j] * S[m, k0 // DIV] * Tab[k0 // DIV],
    the blocks walked forward or backward."""
    M, K = X.shape
    m0 = T.program_id(0) * BM
    acc = T.zeros((BM, BK), T.float32)
    lo, hi, step = 0, K, BK
    if REVERSE:
        lo, hi, step = (K - 1) // BK * BK, -1, -BK
    for k0 in T.range(lo, hi, step):
        kb = k0 // DIV
        s = S[m0:m0 + BM, kb]
        acc += X[m0:m0 + BM, k0:k0 + BK] * s[:, None] * Tab[kb]
    Out[m0:m0 + BM, 0:BK] = acc


@tilejit.kernel
def indirect_rows(X, Idx, S, Out, BM: T.constexpr, BK: T.constexpr):
    """A start read from memory (Idx[kb]): its change per iteration is not known."""
    M, K = X.shape
    m0 = T.program_id(0) * BM
    acc = T.zeros((BM, BK), T.float32)
    for k0 in T.range(0, K, BK):
        s = S[m0:m0 + BM, Idx[k0 // BK]]
        acc += X[m0:m0 + BM, k0:k0 + BK] * s[:, None]
    Out[m0:m0 + BM, 0:BK] = acc


@tilejit.kernel
def column_scaled_sum(X, S, Out, BM: T.constexpr, BN: T.constexpr):
    """A per-column vector: a thread holds many of its elements."""
    M, N = X.shape
    n0 = T.program_id(0) * BN
    acc = T.zeros((BM, BN), T.float32)
    for m0 in T.range(0, M, BM):
        s = S[m0 // BM, n0:n0 + BN]
        acc += X[m0:m0 + BM, n0:n0 + BN] * s[None, :]
    Out[0:BM, n0:n0 + BN] = acc


@tilejit.kernel
def scaled_two_products(Q, K, V, Scale, O, BM: T.constexpr, BN: T.constexpr, D: T.constexpr):
    """O = ((Q @ K_j^T) * Scale[j]) @ V_j summed over key blocks j: a warp-specialized loop whose second product is
    issued one iteration late (its first iteration emitted on its own before the loop)."""
    S = K.shape[0]
    m0 = T.program_id(0) * BM
    q = Q[m0:m0 + BM, 0:D]
    acc = T.zeros((BM, D), T.float32)
    for n0 in T.range(0, S, BN, stages=3, warp_specialize=True):
        s = T.gemm(q, K[n0:n0 + BN, 0:D], T.zeros((BM, BN), T.float32), transpose_b=True)
        p = s * Scale[n0 // BN]
        acc = T.gemm(p.to(Q.dtype), V[n0:n0 + BN, 0:D], acc)
    O[m0:m0 + BM, 0:D] = acc


def _meta(*shape):
    return torch.empty(*shape, device="meta")


def _cuda(kernel, *args, arch="sm_90a", **kw) -> str:
    return kernel.compile(*args, arch=arch, stop_after="cuda", **kw).cuda


def _header(text: str) -> str:
    """The header of the loop that carries pointers (the producer warpgroup's loop, first in a specialized
    kernel, carries none)."""
    return next(line for line in text.splitlines() if line.lstrip().startswith("for (int64_t") and "tj_cl" in line)


@pytest.mark.parametrize("reverse", [False, True])
def test_a_row_vector_and_an_element_carry_their_pointers(reverse):
    text = _cuda(row_scaled_sum, _meta(300, 1000), _meta(300, 32), _meta(32), _meta(300, 32), BM=64, BK=32, DIV=32,
                 REVERSE=reverse, num_warps=4)
    lines = text.splitlines()
    pointers = sorted(set(re.findall(r"const float\* (tj_cl\d+_p\d+) = ", text)))
    header = _header(text)
    assert len(pointers) >= 2 and all(f"{p} += " in header for p in pointers)
    steps = [line for line in lines if re.search(r"const int64_t tj_cl\d+_step = ", line)]
    assert len(steps) == 2 and all(f"(int64_t){-1 if reverse else 1} * " in line for line in steps)
    # in the loop: the pointers read, only the moving dim's bounds tested (the rows' were tested before the loop)
    body = lines[lines.index(header):]
    reads = [line for line in body if re.search(r"\? \*tj_cl\d+_p\d+ : float\{\};", line)]
    assert len(reads) == len(pointers)
    assert not any("_size0" in line for line in reads if "v1_S" in line or "S_size" in line)
    assert not any("* v1_S_stride0" in line for line in body[:40] if "tj_cl" not in line)


def test_a_start_that_moves_by_a_fraction_of_a_trip_keeps_its_address_math():
    """k0 // 48 in a loop by 32 moves by 0 or 1: not a constant."""
    text = _cuda(row_scaled_sum, _meta(300, 1000), _meta(300, 32), _meta(32), _meta(300, 32), BM=64, BK=32, DIV=48,
                 REVERSE=False, num_warps=4)
    assert "tj_cl" not in text


def test_a_start_read_from_memory_keeps_its_address_math():
    text = _cuda(indirect_rows, _meta(300, 1000), torch.empty(32, dtype=torch.int32, device="meta"),
                 _meta(300, 64), _meta(300, 32), BM=64, BK=32, num_warps=4)
    pointers = set(re.findall(r"const \w+\* (tj_cl\d+_p\d+) = ", text))
    assert len(pointers) == 1  # Idx[k0 // BK] itself moves by one element a trip; S's window does not qualify
    assert "const int32_t* tj_cl" in text and "const float* tj_cl" not in text


def test_a_vector_of_many_elements_per_thread_keeps_its_address_math():
    text = _cuda(column_scaled_sum, _meta(1000, 256), _meta(16, 256), _meta(64, 256), BM=64, BN=128, num_warps=4)
    assert "tj_cl" not in text


def test_a_loop_whose_first_iteration_runs_on_its_own_steps_the_pointers_after_it():
    bf16 = torch.bfloat16
    compiled = scaled_two_products.compile(torch.empty(1000, 128, dtype=bf16, device="meta"),
                                           torch.empty(900, 128, dtype=bf16, device="meta"),
                                           torch.empty(900, 128, dtype=bf16, device="meta"), _meta(15),
                                           _meta(1000, 128), BM=128, BN=64, D=128, num_warps=8, arch="sm_90a")
    lines = [line.strip() for line in compiled.asm["cuda"].splitlines()]
    first = lines.index("++tj_it; tj_cl2_p0 += tj_cl2_step;")  # the end of the first iteration, on its own
    loop = next(i for i, line in enumerate(lines) if line.startswith("for (int64_t") and "tj_cl2_p0 +=" in line)
    assert first < loop and " + v7;" in lines[loop]  # the loop proper starts at the second iteration
    assert compiled.meta["spills"] == 0


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
def test_carried_loads_compile_for_every_arch(arch):
    compiled = row_scaled_sum.compile(_meta(300, 1000), _meta(300, 32), _meta(32), _meta(300, 32), BM=64, BK=32,
                                      DIV=32, REVERSE=True, num_warps=4, arch=arch)
    assert "tj_cl" in compiled.asm["cuda"] and compiled.meta["spills"] == 0


def test_the_block_scaled_loop_carries_its_scale_pointers():
    """The block-scaled fp8 main loop (the reason for the rewrite): both scales' pointers step in the math warps'
    loop header and no scale address is recomputed from the window's start inside it."""
    import tilejit.ops.fp8_blockscaled as F

    e4m3 = torch.float8_e4m3fn
    text = _cuda(F.blockscaled_mm, torch.empty(4096, 7168, dtype=e4m3, device="meta"), _meta(4096, 56),
                 torch.empty(4096, 7168, dtype=e4m3, device="meta"), _meta(32, 56),
                 torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta"), BM=128, BN=128, STAGES=4,
                 num_warps=8, persistent=True)
    header = _header(text)
    assert header.count(" += tj_cl") == 3  # two rows of activation scales, one weight scale
    assert "v1_SA + ((int64_t)" not in text.split(header)[1][:6000]
