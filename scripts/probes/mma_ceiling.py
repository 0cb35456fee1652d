"""The mma.sync m16n8k16 ceiling of this GPU: a kernel that issues only mma.sync on operands in registers (16
independent accumulators per warp, 16 warps per SM, operands changed every iteration so the data toggles), to
compare the sm_80 path's GEMMs with. ``ceiling_launch()`` gives (launch, flops) for
``scripts/probes/clock_probe.py mma80``, which times it back to back next to the GEMMs and reads the SM clock.

    python scripts/probes/mma_ceiling.py            # TFLOP/s by do_bench (L2 flushed between runs)
"""
from __future__ import annotations

import torch

from tilejit.backend_cuda import nvrtc
from tilejit.runtime import driver

ITERS, WARPS, ATOMS = 4096, 8, 16

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256) tj_mma_ceiling(float* out, int iters) {
  // bf16 pairs of normal numbers near 1 that differ per lane (register bit patterns, no memory reads)
  unsigned a0 = 0x3f803f80u ^ (threadIdx.x & 0x007f007fu), a1 = a0 ^ 0x00150015u, a2 = a0 ^ 0x002a002au,
           a3 = a0 ^ 0x00330033u, b0 = 0x3f003f00u ^ (threadIdx.x * 0x00050003u & 0x007f007fu), b1 = b0 ^ 0x00110011u;
  float d[16][4];
  #pragma unroll
  for (int j = 0; j < 16; ++j) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
  for (int i = 0; i < iters; ++i) {
    #pragma unroll
    for (int j = 0; j < 16; ++j)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                   "{%8, %9}, {%0, %1, %2, %3};"
                   : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    a0 ^= (unsigned)(i & 0x7f) * 0x00010001u;  // the operands change every iteration
    b1 ^= (unsigned)(i & 0x3f) * 0x00010001u;
  }
  float s = 0.0f;
  #pragma unroll
  for (int j = 0; j < 16; ++j) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""


def ceiling_launch():
    """(launch, flops of one launch) for the ceiling kernel on the current GPU: 2 blocks of 8 warps per SM."""
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}" + ("a" if major >= 9 else "")
    built = nvrtc.compile_cuda(SOURCE, name="mma_ceiling.cu", arch=arch)
    device = torch.cuda.current_device()
    loaded = driver.load_cubin(built.cubin, "tj_mma_ceiling", device)
    launcher = driver.make_launcher(loaded, ["ptr", "i32"], (32 * WARPS, 1, 1))
    blocks = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    out = torch.empty(blocks * 32 * WARPS, device="cuda")

    def launch():
        launcher((blocks, 1, 1), torch.cuda.current_stream().cuda_stream, [out.data_ptr(), ITERS])

    return launch, 2.0 * 16 * 8 * 16 * ATOMS * ITERS * WARPS * blocks


def main() -> None:
    from tilejit.testing import do_bench

    launch, flops = ceiling_launch()
    ms = do_bench(launch)
    print(f"{torch.cuda.get_device_name()}: mma.sync m16n8k16 bf16 register-only {flops / ms / 1e9:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
