"""Stream-K on sm_90a (the ``stream_k`` launch option): a persistent kernel whose last one or two waves of output
tiles are shared out as equal runs of K iterations, partial sums handed through a per-stream global workspace to
the program that starts each tile. Checked against float64 references (int64 for int8) with NaN-poisoned outputs
on grids with and without a partial last wave, fewer tiles than SMs (a tile cut over many programs), a K loop of
one iteration or none, 3-D grids, the grouped launch order, fused epilogues, every dtype family, many launches
back to back (the flags must be left at 0), two streams at once and CUDA-graph replays.

Run on an sm_90 GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_stream_k.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
from gemm_checks import check_close, check_linear_relu_launches, check_lowp_launch
from kernels import bmm_grid3, matmul_staged as matmul

pytestmark = [pytest.mark.gpu, pytest.mark.sm90a("stream-K")]

TILES = {"128x256": (128, 256, 64, 8, 4), "256x128": (256, 128, 64, 8, 4), "128x128": (128, 128, 64, 4, 4)}



def _stream_k(compiled) -> None:
    assert compiled.meta["stream_k"] > 0, compiled.meta
    assert compiled.meta["spills"] == 0 and not compiled.meta["wgmma_serialized"], compiled.meta


def _kw(tiles):
    bm, bn, bk, warps, stages = TILES[tiles]
    return dict(BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages, stream_k=True)


# 4096^3 with 128x256 tiles: 512 tiles, 3.9 waves on 132 SMs; 1536 x 2816: 132 tiles, no partial wave (no runs);
# 128 x 4096: fewer tiles than SMs (each cut over several programs); K = 8 < BK: loops of no whole iteration
SHAPES = [(4096, 4096, 4096), (1000, 3000, 776), (1100, 520, 320), (1536, 2816, 512), (128, 4096, 4096),
          (200, 136, 8), (64, 64, 64), (2000, 4000, 200), (3000, 1000, 64)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("tiles", list(TILES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_design_matmul(dtype, tiles, shape):
    m, n, k = shape
    kw = _kw(tiles)
    torch.manual_seed(m + 7 * n + k)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    _stream_k(matmul.compile(a, b, c, **kw))
    matmul[(tilejit.cdiv(m, kw["BM"]), tilejit.cdiv(n, kw["BN"]))](a, b, c, **kw)
    torch.cuda.synchronize()
    check_close(c, a.double() @ b.double())


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (1000, 3000, 776), (8192, 2048, 1024), (64, 64, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_grouped_order(shape):
    """The benchmark kernel: a 1-D grid walked in grouped order."""
    from benchmarks.kernels import matmul as tuned

    m, n, k = shape
    kw = _kw("128x256")
    torch.manual_seed(m + 3 * n + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    _stream_k(tuned.kernel.compile(a, b, c, **kw))
    tuned.kernel[(tilejit.cdiv(m, 128) * tilejit.cdiv(n, 256),)](a, b, c, **kw)
    torch.cuda.synchronize()
    check_close(c, a.double() @ b.double())


@pytest.mark.parametrize("batch,m,n,k", [(3, 1000, 520, 264), (41, 256, 512, 128), (5, 130, 312, 2000)])
def test_3d_grid(batch, m, n, k):
    """A 3-D grid (x: N tiles, y: M tiles, z: batch) that reads T.num_programs: the kernel is launched with one
    program per SM and told the grid."""
    torch.manual_seed(batch + m)
    a = torch.randn(batch, m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(batch, k, n, device="cuda", dtype=torch.float16)
    c = torch.full((batch, m, n), float("nan"), device="cuda", dtype=torch.float16)
    kw = _kw("128x128")
    _stream_k(bmm_grid3.compile(a, b, c, **kw))
    bmm_grid3[(tilejit.cdiv(n, 128), tilejit.cdiv(m, 128), batch)](a, b, c, **kw)
    torch.cuda.synchronize()
    check_close(c, a.double() @ b.double(), rel=2e-3)


def test_fused_epilogue_and_repeated_launches():
    """Twenty launches back to back on shapes with and without runs: every flag must be back at 0 after each."""
    for shape in [(2048, 1000, 1000), (300, 712, 3000)]:
        check_linear_relu_launches(shape, dict(num_warps=4, num_stages=4, stream_k=True), _stream_k, check_each=True)


@pytest.mark.parametrize("shape", [(1000, 300, 784), (4096, 2048, 1024), (100, 72, 4000)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["fp8", "int8", "tf32"])
def test_other_dtypes(kind, shape):
    check_lowp_launch(kind, shape, dict(num_warps=4, num_stages=4, stream_k=True), _stream_k)


def test_two_streams_at_once():
    """Launches on two streams may run at the same time: each stream has its own workspace and flags."""
    m, n, k = 2000, 3000, 1512
    torch.manual_seed(3)
    kw = _kw("128x256")
    grid = (tilejit.cdiv(m, 128), tilejit.cdiv(n, 256))
    pairs = [(torch.randn(m, k, device="cuda", dtype=torch.float16), torch.randn(k, n, device="cuda",
                                                                                 dtype=torch.float16))
             for _ in range(2)]
    outs = [torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16) for _ in range(2)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    for _ in range(10):
        for (a, b), c, s in zip(pairs, outs, streams):
            with torch.cuda.stream(s):
                matmul[grid](a, b, c, **kw)
    torch.cuda.synchronize()
    for (a, b), c in zip(pairs, outs):
        check_close(c, a.double() @ b.double())


def test_cuda_graph_replays():
    m, n, k = 1000, 3000, 776
    torch.manual_seed(5)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    kw = _kw("128x256")
    grid = (tilejit.cdiv(m, 128), tilejit.cdiv(n, 256))
    matmul[grid](a, b, c, **kw)  # warm: compiled, workspace made
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        matmul[grid](a, b, c, **kw)
    for seed in range(3):
        torch.manual_seed(seed)
        a.copy_(torch.randn_like(a))
        c.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_close(c, a.double() @ b.double())


def test_python_and_compiled_launchers_agree():
    """The compiled launcher hands a stream-K launch to the Python one (which adds the workspace): both paths."""
    m, n, k = 1000, 3000, 776
    torch.manual_seed(9)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    kw = _kw("128x256")
    grid = (tilejit.cdiv(m, 128), tilejit.cdiv(n, 256))
    for _ in range(3):  # the first launch takes the slow path; later ones the compiled launcher's entry
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        matmul[grid](a, b, c, **kw)
        torch.cuda.synchronize()
        check_close(c, a.double() @ b.double())


def test_workspace_is_zeroed_on_the_launch_stream(monkeypatch):
    """The counters' zero fill runs on the launch's own stream, ordered before the kernel, also for torch's default
    stream (handle 0: torch.cuda.ExternalStream(0) is a fresh pooled stream, pytorch/pytorch#182960, and a fill
    there once landed while the kernel counted, leaving tiles unwritten when the GPU was shared)."""
    from tilejit.runtime import launch

    monkeypatch.setattr(launch, "_WORKSPACES", {})
    seen = []
    real_zeros = torch.zeros

    def zeros(*args, **kwargs):
        seen.append(torch.cuda.current_stream().cuda_stream)
        return real_zeros(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", zeros)
    side = torch.cuda.Stream()
    for stream in (torch.cuda.default_stream(), side):
        launch.stream_k_workspace(torch.cuda.current_device(), stream.cuda_stream, 1 << 20, 264)
        assert seen[-1] == stream.cuda_stream
    assert seen[0] == 0 and len(seen) == 2
