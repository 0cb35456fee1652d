"""tilejit against cuBLAS on the same problems, for ncu (each launched twice; profile the second of each):

    ncu -k regex:"tj_|nvjet|xmma" --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section WarpStateStats --section LaunchStats python scripts/probes/ncu_compare.py [CASE ...]

A CASE is ``DTYPE:MxNxK:BMxBNxBKwWsS[:OPTION...]`` with DTYPE fp16, bf16 or tf32nt (float32, B given N x K) and
options among ``ws``, ``persistent``, ``pingpong``, ``c2`` (a cluster of 2), ``sk2`` / ``sk4`` (split-K). Without
cases: tf32 4096^3 with B given N x K (tilejit persistent 128x256x32 w8 s4, then cuBLAS tf32) and fp16 4096^3
(tilejit persistent 256x128x64 w8 s4, then cuBLAS).
"""
import re
import sys

import torch

import tilejit
from benchmarks.kernels import matmul, tf32_mm_nt

DEFAULT_CASES = ["tf32nt:4096x4096x4096:128x256x32w8s4:persistent", "fp16:4096x4096x4096:256x128x64w8s4:persistent"]
OPTIONS = {"ws": {"warp_specialize": True}, "persistent": {"persistent": True}, "pingpong": {"pingpong": True},
           "c2": {"cluster": 2}, "sk2": {"split_k": 2}, "sk4": {"split_k": 4}}


def parse_case(case: str) -> tuple[str, tuple[int, int, int], dict]:
    """``DTYPE:MxNxK:BMxBNxBKwWsS[:OPTION...]`` -> (dtype name, (M, N, K), the launch's keyword arguments)."""
    dtype_name, shape, config, *options = case.split(":")
    m, n, k = (int(x) for x in shape.split("x"))
    bm, bn, bk, warps, stages = (int(g) for g in re.match(r"(\d+)x(\d+)x(\d+)w(\d+)s(\d+)$", config).groups())
    kw = dict(BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages)
    for option in options:
        kw.update(OPTIONS[option])
    return dtype_name, (m, n, k), kw


def run_case(case: str) -> None:
    dtype_name, (m, n, k), kw = parse_case(case)
    grid = (tilejit.cdiv(m, kw["BM"]) * tilejit.cdiv(n, kw["BN"]),)
    if dtype_name == "tf32nt":
        torch.backends.cuda.matmul.allow_tf32 = True
        a, bt = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
        c = torch.empty(m, n, device="cuda")
        for _ in range(2):
            tf32_mm_nt.kernel[grid](a, bt, c, **kw)
        for _ in range(2):
            torch.mm(a, bt.t())
        return
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    a, b = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.empty(m, n, device="cuda", dtype=dtype)
    for _ in range(2):
        matmul.kernel[grid](a, b, c, **kw)
    for _ in range(2):
        torch.mm(a, b)


if __name__ == "__main__":
    for spec in sys.argv[1:] or DEFAULT_CASES:
        run_case(spec)
    torch.cuda.synchronize()
