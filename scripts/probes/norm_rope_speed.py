"""Memory-bound ops of the example LLM (examples/llm/model.py) against torch.compile'd torch: RMSNorm forward and
backward, with and without the residual add, and the rotary embedding, at one training step's shapes.

    python scripts/probes/norm_rope_speed.py [--rows 8192] [--dim 1024] [--batch 8] [--seq 1024]
                                             [--q-heads 16] [--k-heads 4] [--head-dim 64]

Each case: ``tilejit.testing.do_bench`` (CUDA events, L2 flushed before each run, median) of the tilejit call and
of the compiled torch function, the mean GPU time of the kernels each launches (the profiler's records, launch
overhead excluded), the bytes the op must move (every input read once, every output written once) over that
kernel time as GB/s, and the largest difference between the two implementations' outputs. Prints a Markdown
table headed by the GPU's name.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tilejit.ops import norm, rotary  # noqa: E402
from tilejit.testing import do_bench  # noqa: E402

EPS = 1e-5


def kernel_us(fn, runs=30):
    """Mean GPU time (us) per call of the kernels ``fn`` launches, each call after an L2 flush."""
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    total = [e.device_time for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA and "fill" not in e.name.lower()]
    return sum(total) / runs if total else float("nan")


def torch_norm_forward(x, w, residual):
    s = x if residual is None else x + residual
    s32 = s.float()
    rstd = torch.rsqrt(s32.square().mean(-1) + EPS)
    return (s32 * rstd[:, None] * w.float()).to(x.dtype), s, rstd


def torch_norm_backward(dy, ds, x, w, rstd):
    xhat = x.float() * rstd[:, None]
    g = dy.float() * w.float()
    dx = rstd[:, None] * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    if ds is not None:
        dx = dx + ds.float()
    return dx.to(x.dtype), (dy.float() * xhat).sum(0).to(w.dtype)


def torch_rotary_(q, k, cos, sin):
    seq = q.shape[1]
    c, s = cos[:seq][None, :, None, :], sin[:seq][None, :, None, :]
    for x in (q, k):
        x1, x2 = x.float().chunk(2, dim=-1)
        x.copy_(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1))
    return q, k


def norm_cases(rows, dim, dtype):
    x, r, dy, ds = (torch.randn(rows, dim, device="cuda", dtype=dtype) for _ in range(4))
    w = torch.randn(dim, device="cuda", dtype=dtype)
    item, cases = x.element_size(), []
    fwd = torch.compile(torch_norm_forward)
    bwd = torch.compile(torch_norm_backward)
    for residual in (None, r):
        y, s, rstd = norm.rms_norm_forward(x, w, EPS, residual)
        ours = (y, rstd) if residual is None else (y, s, rstd)
        want = fwd(x, w, residual)
        theirs = (want[0], want[2]) if residual is None else want
        tensors = 2 if residual is None else 4
        cases.append((f"rms_norm fwd{' + residual' if residual is not None else ''}",
                      lambda residual=residual: norm.rms_norm_forward(x, w, EPS, residual),
                      lambda residual=residual: fwd(x, w, residual), tensors * rows * dim * item + 4 * rows,
                      _max_error(ours, theirs)))
    _, s, rstd = norm.rms_norm_forward(x, w, EPS, r)
    for grad_s in (None, ds):
        ours = norm.rms_norm_backward(dy, grad_s, s, w, rstd)
        theirs = bwd(dy, grad_s, s, w, rstd)
        tensors = 3 if grad_s is None else 4
        cases.append((f"rms_norm bwd{' + dS' if grad_s is not None else ''}",
                      lambda grad_s=grad_s: norm.rms_norm_backward(dy, grad_s, s, w, rstd),
                      lambda grad_s=grad_s: bwd(dy, grad_s, s, w, rstd), tensors * rows * dim * item + 4 * rows,
                      _max_error(ours, theirs)))
    return cases


def rotary_cases(batch, seq, q_heads, k_heads, head_dim, dtype):
    """In place on q and k as views of one fused qkv projection output, as the model calls it."""
    qkv = torch.randn(batch, seq, q_heads + 2 * k_heads, head_dim, device="cuda", dtype=dtype)
    angles = torch.randn(seq, head_dim // 2, device="cuda")
    cos, sin = angles.cos(), angles.sin()
    views = (qkv[:, :, :q_heads], qkv[:, :, q_heads:q_heads + k_heads])
    compiled = torch.compile(torch_rotary_)
    ours = rotary.rotary_forward(*views, cos, sin)
    theirs = compiled(views[0].clone(), views[1].clone(), cos, sin)
    moved = 2 * batch * seq * (q_heads + k_heads) * head_dim * qkv.element_size()
    return [("rotary in place (q, k)", lambda: rotary.rotary_forward(*views, cos, sin, q_out=views[0], k_out=views[1]),
             lambda: compiled(*views, cos, sin), moved, _max_error(ours, theirs))]


def _max_error(ours, theirs):
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(ours, theirs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--q-heads", type=int, default=16)
    parser.add_argument("--k-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    torch.manual_seed(0)
    dtype = torch.bfloat16
    cases = norm_cases(args.rows, args.dim, dtype)
    cases += rotary_cases(args.batch, args.seq, args.q_heads, args.k_heads, args.head_dim, dtype)
    print(f"GPU: {torch.cuda.get_device_name()}; bfloat16; rms_norm {args.rows} x {args.dim}; rotary q "
          f"({args.batch}, {args.seq}, {args.q_heads}, {args.head_dim}), k ({args.batch}, {args.seq}, "
          f"{args.k_heads}, {args.head_dim})\n")
    print("| op | MB moved | tilejit do_bench us | tilejit kernels us | tilejit GB/s | torch.compile do_bench us | "
          "torch.compile kernels us | torch.compile GB/s | max abs diff |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, ours, theirs, moved, error in cases:
        times = []
        for fn in (ours, theirs):
            event_us = 1000 * do_bench(fn)
            kernels = kernel_us(fn)
            times += [f"{event_us:.1f}", f"{kernels:.1f}", f"{moved / kernels / 1e3:.0f}"]
        print(f"| {name} | {moved / 1e6:.1f} | " + " | ".join(times) + f" | {error:.3g} |")
    print("\nGB/s: the bytes the op must move over its kernels' GPU time (H100 SXM HBM3 peak 3350 GB/s, "
          "H200 4800). The tilejit backward's time includes its column_sums launch (dweight).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
