"""One launch of the benchmark matmul, persistent 256x128x64 w8 s4, 4096^3 fp16 (after a warm-up launch), for ncu:

    ncu --launch-skip 1 --launch-count 1 -k regex:tj_matmul --section SpeedOfLight ... python scripts/probes/ncu_persistent.py
"""
import torch

import tilejit
from benchmarks.kernels import matmul

a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
c = torch.empty(4096, 4096, device="cuda", dtype=torch.float16)
kw = dict(BM=256, BN=128, BK=64, num_warps=8, num_stages=4, persistent=True)
for _ in range(2):
    matmul.kernel[(tilejit.cdiv(4096, 256) * tilejit.cdiv(4096, 128),)](a, b, c, **kw)
torch.cuda.synchronize()
