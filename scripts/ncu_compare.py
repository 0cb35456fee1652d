"""tilejit against cuBLAS on the same problems, for ncu (each launched twice; profile the second of each):

    ncu -k regex:"tj_|nvjet|xmma" --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section WarpStateStats --section LaunchStats python scripts/ncu_compare.py

Cases: tf32 4096^3 with B given N x K (tilejit persistent 128x256x32 w8 s4, then cuBLAS tf32), fp16 4096^3
(tilejit persistent 256x128x64 w8 s4, then cuBLAS)."""
import torch

import tilejit
from benchmarks.kernels import matmul, tf32_mm_nt

torch.backends.cuda.matmul.allow_tf32 = True
n = 4096
a32 = torch.randn(n, n, device="cuda")
bt32 = torch.randn(n, n, device="cuda")
c32 = torch.empty(n, n, device="cuda")
kw = dict(BM=128, BN=256, BK=32, num_warps=8, num_stages=4, persistent=True)
for _ in range(2):
    tf32_mm_nt.kernel[(tilejit.cdiv(n, 128) * tilejit.cdiv(n, 256),)](a32, bt32, c32, **kw)
for _ in range(2):
    torch.mm(a32, bt32.t())
a = torch.randn(n, n, device="cuda", dtype=torch.float16)
b = torch.randn(n, n, device="cuda", dtype=torch.float16)
c = torch.empty(n, n, device="cuda", dtype=torch.float16)
kw = dict(BM=256, BN=128, BK=64, num_warps=8, num_stages=4, persistent=True)
for _ in range(2):
    matmul.kernel[(tilejit.cdiv(n, 256) * tilejit.cdiv(n, 128),)](a, b, c, **kw)
for _ in range(2):
    torch.mm(a, b)
torch.cuda.synchronize()
