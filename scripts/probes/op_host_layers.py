"""Host time per call of the model's ops at each layer of their stack, on the GPU: the bare kernel launch, the
op's implementation (allocation + launches), the registered operator without autograd, the public function with
autograd (the eager road of ``custom_ops.Operator`` and the registered operator), and torch's own op for scale.
Each row issues N calls without waiting and divides (the GPU time per call, from events, is printed beside it: a
row whose GPU time is larger measures the GPU, not the host). Then cProfile over the implementations, by own
time, to say where the Python goes."""
import cProfile
import pstats
import sys
import time

import torch
import torch.nn.functional as F

import tilejit
import tilejit.ops.linear_kernels as kernels
from tilejit.ops import linear_ops, norm, rotary

N = 300
dev = "cuda"
rows, dim, ffn = 256, 1024, 2816
x = torch.randn(rows, dim, device=dev, dtype=torch.bfloat16)
w = torch.randn(dim, dim, device=dev, dtype=torch.bfloat16) / 32
out = torch.empty(rows, dim, device=dev, dtype=torch.bfloat16)
nw = torch.ones(dim, device=dev, dtype=torch.bfloat16)
xg = x.clone().requires_grad_()
wg = w.clone().requires_grad_()
nwg = nw.clone().requires_grad_()
q = torch.randn(1, rows, 16, 64, device=dev, dtype=torch.bfloat16)
k = torch.randn(1, rows, 4, 64, device=dev, dtype=torch.bfloat16)
cos = torch.randn(rows, 32, device=dev)
sin = torch.randn(rows, 32, device=dev)


def per_call(fn):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(N):
        fn()
    host = (time.perf_counter() - start) / N * 1e6
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    e0.record()
    for _ in range(N):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return host, e0.elapsed_time(e1) * 1e3 / N


gemm = kernels.tuned_gemm(2, False, True, False, False)
kernels.matmul(x, w, out, trans_b=True)  # tunes
cfg = gemm.best_config
fixed = dict(cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
plain = kernels.gemm
flags = dict(TRANS_A=False, TRANS_B=True, ACC_IN=False, TWO=False)
grid = (tilejit.cdiv(rows, fixed["BM"]) * tilejit.cdiv(dim, fixed["BN"]),)
gridfn = kernels._tiles_grid(rows, dim)
args = (x, w, out, x, w)


def lin_grad():
    linear_ops.linear(xg, wg).sum  # noqa: B018 (the forward only: its autograd node is made)


def lin_fwd_bwd():
    y = linear_ops.linear(xg, wg)
    y.backward(out)


def op_fwd_bwd():
    y = linear_ops._OPS.linear.op(xg, wg)
    y.backward(out)


def torch_fwd_bwd():
    y = F.linear(xg, wg)
    y.backward(out)


rms_cfg = norm.launch_config(dim)
rows_ = [
    ("gemm: plain kernel, grid tuple", lambda: plain[grid](*args, **flags, **fixed)),
    ("gemm: tuned kernel, grid tuple", lambda: gemm[grid](*args, **flags)),
    ("gemm: tuned kernel, grid function", lambda: gemm[gridfn](*args, **flags)),
    ("kernels.matmul", lambda: kernels.matmul(x, w, out, trans_b=True)),
    ("linear impl (_linear_fwd)", lambda: linear_ops._linear_fwd(x, w)),
    ("linear operator, no grad", lambda: torch.ops.tilejit.linear_fwd(x, w)),
    ("linear(), autograd records", lin_grad),
    ("linear() fwd + bwd", lin_fwd_bwd),
    ("linear operator, autograd records", lambda: linear_ops._OPS.linear.op(xg, wg)),
    ("linear operator fwd + bwd", op_fwd_bwd),
    ("torch.mm", lambda: torch.mm(x, w.T)),
    ("F.linear fwd + bwd", torch_fwd_bwd),
    ("rms_norm_forward impl", lambda: norm.rms_norm_forward(x, nw)),
    ("rms_norm(), autograd records", lambda: norm.rms_norm(xg, nwg)),
    ("rms_norm operator, autograd records", lambda: norm._OPS.forward.op(xg, nwg, None, 1e-6)),
    ("rms_norm_backward impl", lambda: norm.rms_norm_backward(out, None, x, nw, torch.ones(rows, device=dev))),
    ("rotary_forward impl", lambda: rotary.rotary_forward(q, k, cos, sin)),
    ("torch.empty x3", lambda: (torch.empty(rows, dim, device=dev), torch.empty(rows, dim, device=dev),
                                torch.empty(rows, device=dev))),
]
print(torch.cuda.get_device_name(), "native launcher:", plain._dispatcher is not None,
      "tuned native:", gemm._native is not None)
print("| call | host us | GPU us |\n| --- | --- | --- |")
for name, fn in rows_:
    h, g = per_call(fn)
    print(f"| {name} | {h:.1f} | {g:.1f} |")

for name, fn in [("linear impl", lambda: linear_ops._linear_fwd(x, w)),
                 ("rms_norm_backward impl",
                  lambda: norm.rms_norm_backward(out, None, x, nw, torch.ones(rows, device=dev))),
                 ("linear() fwd + bwd", lin_fwd_bwd)]:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    profiler.disable()
    print(f"\n## cProfile: 200 x {name}")
    pstats.Stats(profiler, stream=sys.stdout).strip_dirs().sort_stats("tottime").print_stats(18)
