"""Block-scaled fp8 matmul with DeepSeek-V3's scales through ``tilejit.ops.fp8_blockscaled_matmul``: bf16
activations (M, K) quantized to e4m3 with one float32 scale per 1x128 block of a row, bf16 weights (N, K) with one
per 128x128 block (each block's largest magnitude mapped to e4m3's 448). The product is compared with the float64
product of the dequantized operands (what the kernel computes; its own error) and with the unquantized bf16
product (what quantizing costs). On a GPU if there is one, else through the interpreter at a small size.

    python examples/fp8_matmul.py
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # run from a checkout
from tilejit.ops import fp8_blockscaled_matmul  # noqa: E402

E4M3, E4M3_MAX, BLOCK = torch.float8_e4m3fn, 448.0, 128


def quantize(x, rows_per_block):
    """x (R, C) -> (e4m3 (R, C), float32 scales (cdiv(R, rows_per_block), cdiv(C, 128))): x ~ x8 * scale."""
    rows, cols = x.shape
    rb, cb = -(-rows // rows_per_block), -(-cols // BLOCK)
    blocks = F.pad(x.float(), (0, cb * BLOCK - cols, 0, rb * rows_per_block - rows)).view(rb, rows_per_block, cb,
                                                                                           BLOCK)
    scales = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / E4M3_MAX
    x8 = (blocks / scales[:, None, :, None]).to(E4M3).view(rb * rows_per_block, cb * BLOCK)[:rows, :cols]
    return x8.contiguous(), scales


def dequantize(x8, scales, rows_per_block):
    """float64 x8 * scale, each scale over its block."""
    s = scales.double().repeat_interleave(rows_per_block, 0).repeat_interleave(BLOCK, 1)
    return x8.double() * s[:x8.shape[0], :x8.shape[1]]


def relative_error(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def main() -> None:
    gpu = torch.cuda.is_available() and os.environ.get("TILEJIT_INTERPRET") != "1"
    if not gpu:
        os.environ["TILEJIT_INTERPRET"] = "1"
    device = "cuda" if gpu else "cpu"
    m, n, k = (1000, 1536, 7168) if gpu else (70, 136, 300)        # ragged: not multiples of the blocks
    where = torch.cuda.get_device_name() if gpu else "CPU (interpreter)"
    torch.manual_seed(0)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = (torch.randn(n, k, device=device) * torch.rand(n, 1, device=device) * 0.05).to(torch.bfloat16)
    x8, x_scales = quantize(x, 1)                                   # activations: 1x128 blocks, (M, cdiv(K, 128))
    w8, w_scales = quantize(w, BLOCK)                               # weights: 128x128 blocks
    out = fp8_blockscaled_matmul(x8, x_scales, w8, w_scales)        # (M, N) bf16
    exact = dequantize(x8, x_scales, 1) @ dequantize(w8, w_scales, BLOCK).T
    unquantized = x.double() @ w.double().T
    kernel_err = relative_error(out, exact)
    quant_err = relative_error(out, unquantized)
    bf16_err = relative_error(x @ w.T, unquantized)
    print(f"fp8_blockscaled_matmul {m}x{k} @ {k}x{n} on {where}: relative error {kernel_err:.2e} against the "
          f"dequantized float64 product, {quant_err:.2e} against the unquantized one (bf16 matmul: {bf16_err:.2e})")
    if not (kernel_err < 1e-2 and quant_err < 1e-1):
        sys.exit(f"fp8_blockscaled_matmul: error {kernel_err:.2e} / {quant_err:.2e} is too large")


if __name__ == "__main__":
    main()
