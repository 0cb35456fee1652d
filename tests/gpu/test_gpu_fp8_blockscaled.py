"""Block-scaled float8 products on the GPU (``tilejit.ops.fp8_blockscaled``): dense and grouped (MoE), e4m3 with
1x128 activation and 128x128 weight scales, against the float64 product of the dequantized operands; ragged M, N
and K, fresh random inputs and scales over a wide range, NaN-poisoned outputs. The bound: bf16 out rounds to 8
significant bits (relative error about 2^-9 per element); float32 out leaves only the tensor cores' sums inside
each 128-block, well under 1e-3. Every config form the op offers on Hopper runs (128x128 warp-specialized,
64-row tiles for small M, persistent, 128x256 tiles whose column halves take a weight scale each).

Run on a machine with a GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_fp8_blockscaled.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.ops.fp8_blockscaled as F

pytestmark = pytest.mark.gpu

E4M3 = torch.float8_e4m3fn
#: config name -> overrides of ``default_config``
CONFIGS = {
    "default": {},
    "128x128-persistent": dict(BM=128, BN=128, STAGES=4, num_warps=8, persistent=True),
    "128x256-persistent": dict(BM=128, BN=256, STAGES=4, num_warps=8, persistent=True),
    "128x256-ws": dict(BM=128, BN=256, STAGES=4, num_warps=8, warp_specialize=True),
    "64x64": dict(BM=64, BN=64, STAGES=4, num_warps=4),
    "128x128-ws": dict(BM=128, BN=128, STAGES=4, num_warps=8, warp_specialize=True),
    "64x64-split2": dict(BM=64, BN=64, STAGES=4, num_warps=4, split_k=2),
    "64x128-ws-split4": dict(BM=64, BN=128, STAGES=4, num_warps=4, warp_specialize=True, split_k=4),
}


def _fp8_machine() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


needs_fp8 = pytest.mark.skipif(not _fp8_machine(), reason="needs a GPU with float8 tensor cores (sm_89+)")


def _operands(m: int, n: int, k: int, experts: int | None = None):
    """DeepGEMM-style quantized operands: random values, each 1x128 / 128x128 block scaled to e4m3's range, its
    scale kept; ``experts`` gives B (E, N, K)."""
    torch.manual_seed(m * 31 + n * 7 + k + (experts or 0))
    x = torch.randn(m, k, device="cuda") * torch.exp2(torch.randint(-6, 7, (m, 1), device="cuda").float())
    w = torch.randn(*((experts,) if experts else ()), n, k, device="cuda")
    kb, nb = tilejit.cdiv(k, 128), tilejit.cdiv(n, 128)
    xp = torch.nn.functional.pad(x, (0, kb * 128 - k)).view(m, kb, 128)
    sa = xp.abs().amax(-1).clamp_min(1e-4) / 448.0
    a = (xp / sa[..., None]).view(m, kb * 128)[:, :k].to(E4M3)
    lead = w.shape[:-2]
    wp = torch.nn.functional.pad(w, (0, kb * 128 - k, 0, nb * 128 - n)).view(*lead, nb, 128, kb, 128)
    sb = wp.abs().amax((-3, -1)).clamp_min(1e-4) / 448.0
    b = (wp / sb[..., :, None, :, None]).view(*lead, nb * 128, kb * 128)[..., :n, :k].to(E4M3)
    return a.contiguous(), sa.contiguous(), b.contiguous(), sb.contiguous()


def _error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any(), "an output was left unwritten"
    return ((out.double() - ref).norm() / ref.norm()).item()


@needs_fp8
@pytest.mark.parametrize("config", CONFIGS, ids=list(CONFIGS))
@pytest.mark.parametrize("m,n,k", [(128, 7168, 2048), (1000, 2112, 7168), (4096, 4096, 7168), (77, 200, 300),
                                   (1, 136, 1000), (513, 4096, 640), (100, 2112, 4100)])
def test_dense_against_the_dequantized_float64_product(m, n, k, config):
    if CONFIGS[config].get("persistent") and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("persistent loops are sm_90a's")
    if CONFIGS[config].get("split_k") and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("split-K sums over a thread-block cluster (sm_90+)")
    a, sa, b, sb = _operands(m, n, k)
    ref = F.reference(a, sa, b, sb)
    out = torch.full((m, n), float("nan"), device="cuda")
    F.fp8_blockscaled_matmul(a, sa, b, sb, out=out, **CONFIGS[config])
    assert _error(out, ref) < 5e-4
    bf16 = F.fp8_blockscaled_matmul(a, sa, b, sb, **CONFIGS[config])
    assert bf16.dtype == torch.bfloat16 and _error(bf16, ref) < 4e-3


@needs_fp8
@pytest.mark.parametrize("config", ["default", "64x64", "128x256-ws"])
@pytest.mark.parametrize("counts", [[256, 0, 37, 1, 700, 128, 3, 900], [0, 0, 5, 0], [1000]])
def test_grouped_against_each_experts_product(counts, config):
    """Experts with no rows, one row, ragged and whole tiles; rows past the last expert stay poisoned."""
    n, k = 4096, 7168 if len(counts) < 8 else 2048
    m = sum(counts) + 11  # 11 trailing rows belong to no expert
    a, sa, b, sb = _operands(m, n, k, experts=len(counts))
    offsets = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int32, device="cuda")
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    F.fp8_blockscaled_grouped_matmul(a, sa, b, sb, offsets, out=out, **CONFIGS[config])
    ref = F.grouped_reference(a, sa, b, sb, offsets)
    used = ~ref[:, 0].isnan()
    assert out[~used].isnan().all(), "rows of no expert were written"
    assert _error(out[used], ref[used]) < 4e-3
    for e, (lo, hi) in enumerate(zip(offsets.tolist(), offsets.tolist()[1:])):
        if hi > lo:  # each expert on its own, so that a wrong expert's weights cannot hide in the total
            assert _error(out[lo:hi], ref[lo:hi]) < 4e-3, e


@needs_fp8
def test_grouped_launch_reads_no_offsets_on_the_host():
    """The grouped op runs under CUDA graph capture (no host sync on group_offsets) and replays with new
    offsets."""
    m, n, k, experts = 600, 2048, 1024, 4
    a, sa, b, sb = _operands(m, n, k, experts=experts)
    offsets = torch.tensor([0, 100, 100, 400, 600], dtype=torch.int32, device="cuda")
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    F.fp8_blockscaled_grouped_matmul(a, sa, b, sb, offsets, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        F.fp8_blockscaled_grouped_matmul(a, sa, b, sb, offsets, out=out)
    offsets.copy_(torch.tensor([0, 300, 310, 310, 600], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _error(out, F.grouped_reference(a, sa, b, sb, offsets)) < 4e-3
