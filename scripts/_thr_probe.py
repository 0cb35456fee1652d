import concurrent.futures as cf
import torch
from benchmarks.kernels import matmul
from tilejit.configs import matmul_configs
from tilejit.backend_cuda import nvrtc
orig = nvrtc._run_nvrtc
logs = {}
def spy(*a, **k):
    out = orig(*a, **k)
    logs[len(logs)] = out[2]
    return out
nvrtc._run_nvrtc = spy
cfgs = [c for c in matmul_configs() if c.warp_specialize or c.persistent or c.pingpong or c.stream_k]
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
def one(c):
    ck = matmul.kernel.compile(a, a, a, **c.all_kwargs())
    return c, ck.meta["spills"], ck.meta["registers"]
with cf.ThreadPoolExecutor(8) as pool:
    for c, s, r in pool.map(one, cfgs):
        print(c, s, r)
for i, log in logs.items():
    if "spill" not in log:
        print("---- log without spill line:\n", log[:1500])
        break
