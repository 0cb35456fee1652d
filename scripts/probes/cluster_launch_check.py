"""Launches the DESIGN matmul with cluster=2 four times (the first through the Python launcher, the others through
the compiled one) on an even grid x, then once on an odd one, for ``ncu --section LaunchStats`` to show each
launch's cluster size (2, 2, 2, 2, then 0: no cluster):

    ncu --section LaunchStats python scripts/probes/cluster_launch_check.py
"""
import sys

import torch

sys.path.insert(0, "tests")
import tilejit  # noqa: E402
from kernels import matmul_staged  # noqa: E402

kw = dict(BM=128, BN=128, BK=64, num_warps=4, num_stages=4, cluster=2)
for m in (1024, 1024, 1024, 1024, 1152):  # 8 row blocks (even), then 9 (odd)
    a = torch.randn(m, 512, device="cuda", dtype=torch.float16)
    b = torch.randn(512, 256, device="cuda", dtype=torch.float16)
    c = torch.full((m, 256), float("nan"), device="cuda", dtype=torch.float16)
    matmul_staged[(tilejit.cdiv(m, 128), 2)](a, b, c, **kw)
    torch.cuda.synchronize()
    err = (c.double() - a.double() @ b.double()).abs().max().item()
    print(f"M={m}: grid x {tilejit.cdiv(m, 128)}, max abs err {err:.3g}")
