"""Which kernels cuBLAS runs for the benchmark's shapes (their names carry tile, cluster and schedule), read with
torch.profiler on the GPU at hand: ``python scripts/probes/cublas_kernels.py``."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

CASES = [("fp16", 4096, 4096, 4096), ("fp16", 8192, 8192, 8192), ("fp16", 128, 4096, 4096), ("fp16", 2048, 2048, 2048),
         ("fp16", 8192, 8192, 1024), ("tf32nt", 4096, 4096, 4096)]


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    for kind, m, n, k in CASES:
        dtype = torch.float32 if kind.startswith("tf32") else torch.float16
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(n, k, device="cuda", dtype=dtype).t() if kind == "tf32nt" else \
            torch.randn(k, n, device="cuda", dtype=dtype)
        torch.mm(a, b)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.mm(a, b)
            torch.cuda.synchronize()
        names = {e.name for e in prof.events() if e.device_type.name == "CUDA"}
        print(f"{kind} {m}x{n}x{k}: " + " | ".join(sorted(names)))


if __name__ == "__main__":
    main()
