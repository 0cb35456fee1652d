"""The kernels whose CUDA ``backend_cuda/carried_loads.py`` changes, timed with the rewrite and without it (``--off``
turns it off by patching the loop emitter; run each in a fresh ``TILEJIT_CACHE_DIR``, the switch is not part of
the cache key), same GPU, graph-timed:

- ``fp8_blockscaled.blockscaled_mm`` at 4096x4096x7168, its default config (128x128 persistent);
- ``decode_attention`` (bf16, 64 / 8 heads, D=128, pages of 16 in shuffled order) at batch 32 and 128, context
  4k and 32k, as GB/s of cache read;
- ``attention_fp8`` with 128-row block scales (B=4, H=16, S=4096, D=128), causal and not, its default config.

    python scripts/probes/carried_loads_ab.py [--off]
"""
import argparse
import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tilejit.backend_cuda.lower_loops as lower_loops  # noqa: E402
import tilejit.ops.fp8_blockscaled as F  # noqa: E402
from benchmarks.decode_attention import decode_inputs  # noqa: E402
from benchmarks.fp8_blockscaled import quantize  # noqa: E402
from tilejit.testing import do_bench_cudagraph  # noqa: E402
import tilejit.ops.paged_decode as decode  # noqa: E402
fa = importlib.import_module("tilejit.ops.fp8_attention")


def _blockscaled(label):
    m, n, k = 4096, 4096, 7168
    torch.manual_seed(0)
    a, sa = quantize(torch.randn(m, k, device="cuda"), 1)
    b, sb = quantize(torch.randn(n, k, device="cuda"), 128)
    ref = F.reference(a, sa, b, sb)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    def run():
        F.fp8_blockscaled_matmul(a, sa, b, sb, out=out)
    out.fill_(float("nan"))
    run()
    err = float(((out.double() - ref).norm() / ref.norm()).item())
    for _ in range(3):
        ms = do_bench_cudagraph(run)
        print(f"| {label} | block-scaled fp8 {m}x{n}x{k} | {2 * m * n * k / ms / 1e9:.0f} TFLOP/s | err {err:.1e} |",
              flush=True)


def _decode(label, batch, context):
    q, k_pages, v_pages, lens, table = decode_inputs(batch, context)
    kv_heads, dim = k_pages.shape[2], k_pages.shape[3]
    want = decode.reference(q[:1], k_pages, v_pages, lens[:1], table[:1])
    got = decode.decode_attention(q, k_pages, v_pages, lens, table)
    want = want.double().to(got.device)
    err = float(((got[:1].double() - want).norm() / want.norm()).item())
    ms = do_bench_cudagraph(lambda: decode.decode_attention(q, k_pages, v_pages, lens, table))
    gbs = 2 * batch * context * kv_heads * dim * 2 / (ms * 1e-3) / 1e9
    print(f"| {label} | decode batch {batch} context {context} | {ms * 1e3:.1f} us | {gbs:.0f} GB/s | err {err:.1e} |",
          flush=True)


def _fp8_attention(label, causal):
    b, h, s, d = 4, 16, 4096, 128
    torch.manual_seed(1)
    raw = [torch.randn(b, h, s, d, device="cuda") for _ in range(3)]
    (q, qs), (k, ks), (v, vs) = (fa.quantize(t, True) for t in raw)
    vt = fa.transpose_v(v)
    out = torch.empty(q.shape, dtype=torch.bfloat16, device="cuda")

    def run():
        fa.attention_fp8(q, k, vt, q_scale=qs, k_scale=ks, v_scale=vs, causal=causal, v_transposed=True, out=out)
    ms = do_bench_cudagraph(run)
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    print(f"| {label} | fp8 attention block scales causal={causal} | {flops / ms / 1e9:.0f} TFLOP/s |", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--off", action="store_true")
    off = parser.parse_args().off
    if off:
        lower_loops.carried_loads = lambda *args, **kwargs: []
    label = "without carried loads" if off else "with carried loads"
    print(torch.cuda.get_device_name(), flush=True)
    _blockscaled(label)
    for batch, context in ((32, 4096), (32, 32768), (128, 4096), (128, 32768)):
        _decode(label, batch, context)
    for causal in (False, True):
        _fp8_attention(label, causal)


if __name__ == "__main__":
    main()
