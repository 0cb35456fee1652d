"""How many 2-CTA clusters of the benchmark matmul (persistent, cluster=2) the GPU holds at once, as the driver
says (cuOccupancyMaxActiveClusters): a persistent kernel of more programs than 2x that runs a second wave."""
import ctypes

import torch

import tilejit
from benchmarks.kernels import matmul
from tilejit.runtime import libcuda
from tilejit.runtime.launch import launcher_for

a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
c = torch.empty_like(a)
for bm, bn in [(128, 256), (256, 128)]:
    kw = dict(BM=bm, BN=bn, BK=64, num_warps=8, num_stages=4, persistent=True, cluster=2)
    compiled = matmul.kernel.compile(a, a, c, **kw)
    launcher = launcher_for(compiled, 0)
    inner = getattr(launcher, "launcher", launcher)
    config = libcuda.cluster_launch_config(inner.block, inner.dynamic_smem_bytes, (2, 1, 1))
    config.grid[0], config.grid[1], config.grid[2] = 132, 1, 1
    n = ctypes.c_int()
    err = libcuda.function("cuOccupancyMaxActiveClusters")(ctypes.byref(n), inner.loaded.function,
                                                           ctypes.addressof(config))
    print(f"{bm}x{bn}: max active 2-CTA clusters {n.value} (err {err}), SMs "
          f"{torch.cuda.get_device_properties(0).multi_processor_count}, smem {inner.dynamic_smem_bytes}")
