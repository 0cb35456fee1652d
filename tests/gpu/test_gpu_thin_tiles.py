"""The default space's 16-row tiles (``tilejit.configs._THIN_TILES``: mma.sync on 10- to 16-stage rings, unsplit and
split-K) on decode-like problems: one to sixteen rows, K not a multiple of BK, N not a multiple of BN, every
operand dtype the benchmarks tune (fp16, bf16 on the DESIGN matmul; fp8, int8, tf32 with B given N x K), against
float64 references (int64 for int8) with poisoned outputs.

Run on an sm_90 GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_thin_tiles.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
from gemm_checks import check_benchmark_matmul, check_lowp, lowp_operands
from tilejit.configs import matmul_configs

pytestmark = [pytest.mark.gpu, pytest.mark.sm90a("split-K thin tiles run on clusters")]


def _thin(elem_bytes: int):
    return [c for c in matmul_configs(elem_bytes=elem_bytes) if c.kwargs["BM"] < 64]


def _ids(config) -> str:
    return config.identity.replace(" ", "")


@pytest.mark.parametrize("config", _thin(2), ids=_ids)
@pytest.mark.parametrize("shape", [(1, 520, 4096), (16, 3000, 2056), (7, 1000, 1000), (13, 264, 776)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_benchmark_kernel(dtype, shape, config):
    def check(compiled):
        assert compiled.meta["spills"] == 0 and compiled.meta["split_k"] == config.split_k
        assert "mma.sync.aligned.m16n8k16" in compiled.asm["ptx"]

    check_benchmark_matmul(dtype, shape, config.all_kwargs(), check)


_LOWP = [(kind, config) for kind, elem in (("fp8", 1), ("int8", 1), ("tf32", 4)) for config in _thin(elem)]


@pytest.mark.parametrize("kind,config", _LOWP, ids=[f"{kind}-{_ids(c)}" for kind, c in _LOWP])
@pytest.mark.parametrize("shape", [(1, 264, 4096), (11, 1000, 1040)], ids=lambda s: "x".join(map(str, s)))
def test_other_dtypes(kind, config, shape):
    from kernels import matmul_any

    m, n, k = shape
    a, bt, c, acc = lowp_operands(kind, m, n, k)
    kw = dict(config.all_kwargs(), TA=False, TB=True, ACC=acc)
    compiled = matmul_any.compile(a, bt, c, **kw)
    assert compiled.meta["spills"] == 0 and compiled.meta["split_k"] == config.split_k
    matmul_any[(tilejit.cdiv(m, kw["BM"]), tilejit.cdiv(n, kw["BN"]))](a, bt, c, **kw)
    torch.cuda.synchronize()
    check_lowp(kind, a, bt, c)
