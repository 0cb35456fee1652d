"""decode_attention's split combine alone (``decode_combine``: a head a program, its partials loaded before the
log-sum-exps are reduced) in 1, 2 and 4 warps, against the earlier launch (``combine_heads``: BH heads a program,
one after another, each loading its log-sum-exps first), graph-timed (a probe, not a benchmark).

    python scripts/probes/decode_combine.py

Shapes are the combines the default plan launches on an H200 at 64 query heads, D = 128: batch 32 (2 splits),
8 (8 splits) and 1 (64 splits); the workspace is random (the log-sum-exps spread over a few units, some -inf).
"""
from __future__ import annotations


import torch

import tilejit
import tilejit.language as T
from tilejit.testing import do_bench_cudagraph
import tilejit.ops.paged_decode as decode


@tilejit.kernel
def combine_heads(OPart, LsePart, O, BH: T.constexpr, NSPLIT: T.constexpr, D: T.constexpr):
    """The earlier ``decode_combine``: grid (cdiv(Hq, BH), batch), BH heads a program."""
    b = T.program_id(1)
    for i in T.static_range(BH):
        h = T.program_id(0) * BH + i
        lse = LsePart[b, h, 0:NSPLIT]
        top = T.max(lse, 0)
        top = T.where(top == float("-inf"), 0.0, top)
        weight = T.exp2(lse - top)
        total = T.sum(weight, 0)
        part = OPart[b, h, 0:NSPLIT, 0:D]
        acc = T.sum(part * weight[:, None], 0)
        O[b, h, 0:D] = acc / T.where(total > 0.0, total, 1.0)


def main() -> None:
    name = torch.cuda.get_device_name()
    heads, dim = 64, 128
    print("| batch | splits | launch | us (graph) | device |\n" + "| --- " * 5 + "|")
    for batch, splits in [(32, 2), (64, 2), (8, 8), (16, 4), (1, 64)]:
        torch.manual_seed(batch)
        part = torch.randn(batch, heads, splits, dim, device="cuda")
        lse = torch.randn(batch, heads, splits, device="cuda") * 3
        lse[lse < -4] = float("-inf")
        weight = torch.exp2(lse.double() - lse.double().amax(-1, keepdim=True).nan_to_num(0.0, 0.0, 0.0))
        weight = weight.nan_to_num(0.0)
        want = (part.double() * weight[..., None]).sum(2) / weight.sum(-1, keepdim=True).clamp_min(1e-300)
        out = torch.empty(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
        launches = {f"decode_combine, {w} warps{' (chosen)' if w == decode.combine_warps(splits, dim) else ''}":
                    (lambda w=w: decode.decode_combine[(heads, batch)](part, lse, out, NSPLIT=splits, D=dim,
                                                                       num_warps=w)) for w in (1, 2, 4)}
        for bh in (4, 2):
            launches[f"combine_heads BH={bh}, 4 warps"] = (
                lambda bh=bh: combine_heads[(heads // bh, batch)](part, lse, out, BH=bh, NSPLIT=splits, D=dim,
                                                                  num_warps=4))
        for label, run in launches.items():
            out.fill_(float("nan"))
            run()
            err = (out.double() - want).abs().max().item()
            assert err < 2e-2, f"{label}: max error {err:.3g}"
            us = do_bench_cudagraph(run) * 1e3
            print(f"| {batch} | {splits} | {label} | {us:.2f} | {name} |", flush=True)


if __name__ == "__main__":
    main()
