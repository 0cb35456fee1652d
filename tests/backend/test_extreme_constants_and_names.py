"""Float constants outside float's range and non-ASCII names compile (NVRTC, no GPU) to what the interpreter runs.

A float constant is rounded to its type as the interpreter rounds it (IEEE round to nearest: past the largest
finite value to infinity, below the smallest subnormal to a signed zero, subnormals kept); a kernel, tensor, scalar
or local named in any script is spelled in ASCII in the CUDA source, distinct names staying distinct.
"""
from __future__ import annotations

import re
import struct

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.backend_cuda.emitter import ascii_identifier, float_literal, kernel_symbol

from filecheck import filecheck

EXTREME = [1e39, -1e39, 1e308, 5e-324, -5e-324, 1e-40, 1e-45, 1e-46, 3.4028235e38, 3.4028236e38, 2.0 ** -126,
           float("inf"), float("-inf"), 0.0, -0.0, 0.5]


@tilejit.kernel
def scale_by_constexpr(X, Z, C: T.constexpr, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Z[i:i + BLOCK] = X[i:i + BLOCK] * C


def _literal_value(text: str) -> float:
    """The float a literal written by float_literal denotes."""
    bits = re.fullmatch(r"__int_as_float\(0x([0-9a-f]{8})\)", text)
    if bits:
        return struct.unpack("<f", struct.pack("<I", int(bits.group(1), 16)))[0]
    assert text.endswith("f"), text
    return struct.unpack("<f", struct.pack("<f", float(text[:-1])))[0]


@pytest.mark.parametrize("value", EXTREME)
def test_a_float_literal_is_the_interpreters_float32_constant(value):
    expected = torch.tensor(value, dtype=torch.float32)
    got = torch.tensor(_literal_value(float_literal(value, False)), dtype=torch.float32)
    assert got.view(torch.int32).item() == expected.view(torch.int32).item(), (value, float_literal(value, False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("value", [1e39, 1e308, 5e-324, -5e-324, 3.4028236e38, 1e-46])
def test_constexprs_out_of_floats_range_compile_with_nvrtc(value, dtype):
    x = torch.zeros(64, dtype=dtype)
    stages = scale_by_constexpr.compile(x, x, C=value, BLOCK=64, arch="sm_90a", stop_after="ptx")
    assert stages.ptx


def test_an_overflowing_constant_is_written_as_infinity_and_an_underflowing_one_as_zero():
    x = torch.zeros(64)
    cuda = scale_by_constexpr.compile(x, x, C=1e308, BLOCK=64, arch="sm_90a", stop_after="cuda").cuda
    filecheck(cuda, "CHECK: __int_as_float(0x7f800000)")
    cuda = scale_by_constexpr.compile(x, x, C=-5e-324, BLOCK=64, arch="sm_90a", stop_after="cuda").cuda
    filecheck(cuda, "CHECK: __int_as_float(0x80000000)")
    cuda = scale_by_constexpr.compile(x, x, C=0.5, BLOCK=64, arch="sm_90a", stop_after="cuda").cuda
    filecheck(cuda, "CHECK: 0.5f")


@pytest.mark.parametrize("value", [1e39, 5e-324, 1e-40])
def test_the_interpreter_rounds_constants_the_same_way(value, monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    x, z = torch.ones(64), torch.empty(64)
    scale_by_constexpr[(1,)](x, z, C=value, BLOCK=64)
    assert torch.equal(z, torch.full((64,), _literal_value(float_literal(value, False))))


def test_ascii_names_are_kept_and_others_are_mangled_apart():
    assert ascii_identifier("tile_m") == "tile_m"
    others = ["ядро", "ядро_", "я_дро", "xя", "я", "я__"]
    mangled = [ascii_identifier(n) for n in others]
    assert all(m.isascii() and m.replace("_", "a").isalnum() for m in mangled)
    assert len(set(mangled)) == len(others)
    assert kernel_symbol("gemm") == "tj_gemm"
    ascii_lookalikes = [m for m in mangled] + ["u_" + m for m in mangled]
    symbols = {kernel_symbol(n) for n in others + ascii_lookalikes}
    assert len(symbols) == len(others) + len(ascii_lookalikes)


@tilejit.kernel
def ядро(Икс, Зет, масштаб, БЛОК: T.constexpr):
    i = T.program_id(0) * БЛОК
    величина = Икс[i:i + БЛОК] * масштаб
    Зет[i:i + БЛОК] = величина


def test_non_ascii_names_compile_with_nvrtc_and_run_in_the_interpreter(monkeypatch):
    kernel = ядро
    x = torch.arange(64, dtype=torch.float32)
    stages = kernel.compile(x, x, 2.0, БЛОК=64, arch="sm_90a", stop_after="ptx")
    assert stages.cuda.isascii()
    assert "tju_" in stages.ptx
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    z = torch.empty(64)
    kernel[(1,)](x, z, 2.0, БЛОК=64)
    assert torch.equal(z, x * 2)
