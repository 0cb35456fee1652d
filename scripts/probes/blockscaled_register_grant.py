"""Whether the registers ``setmaxnreg`` grants the math warps decide the block-scaled 128x256 loop's spills and
speed (a probe). ptxas spills the 128x256 scaled forms of ``blockscaled_loop_forms.py`` under the default grant
(232 a thread beside a 40-register producer) but not under 216; the grant is patched per run.

    python scripts/probes/blockscaled_register_grant.py [--grants 232,224,216,208] [--shapes 4096x4096x7168,...]

Each grant runs in its own process with its own kernel cache. Rows: the op's 128x128 kernel, the "wide" and
"two halves" 128x256 forms (persistent and specialized), torch's block-wise ``_scaled_mm``; spills from ptxas's
report, TFLOP/s graph-timed, error against the float64 product of the dequantized operands.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def one_grant(grant: int, shapes: list[tuple[int, int, int]]) -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts" / "probes"))
    import torch

    import tilejit
    from tilejit.backend_cuda import lower_specialized

    if grant:
        lower_specialized.consumer_registers = lambda consumers, producers: grant
    import blockscaled_loop_forms as forms
    import tilejit.ops.fp8_blockscaled as F
    from benchmarks.fp8_blockscaled import _torch_blockwise, quantize
    from tilejit.testing import do_bench_cudagraph

    for m, n, k in shapes:
        torch.manual_seed(0)
        a, sa = quantize(torch.randn(m, k, device="cuda"), 1)
        b, sb = quantize(torch.randn(n, k, device="cuda"), 128)
        ref = F.reference(a, sa, b, sb)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        g128 = (tilejit.cdiv(m, 128) * tilejit.cdiv(n, 128),)  # (the op's kernel walks a 1-D grid)
        g256 = (tilejit.cdiv(m, 128), tilejit.cdiv(n, 256))
        rows = [("torch block-wise _scaled_mm", None, None, None, None)]
        for opts in (dict(persistent=True), dict(warp_specialize=True)):
            tag = "persistent" if opts.get("persistent") else "ws"
            rows += [
                (f"op 128x128 {tag}", F.blockscaled_mm, g128, (a, sa, b, sb, out),
                 dict(BM=128, BN=128, STAGES=4, num_warps=8, **opts)),
                (f"wide 128x256 {tag}", forms.wide, g256, (a, sa, b, sb, out),
                 dict(BM=128, BN=256, STAGES=4, num_warps=8, **opts)),
                (f"two halves 128x256 {tag}", forms.halves, g256, (a, sa, b, sb, out),
                 dict(BM=128, STAGES=3, num_warps=8, **opts)),
            ]
        for label, kern, grid, args, cfg in rows:
            if kern is None:
                run = _torch_blockwise(a, sa, b, sb, out)
            else:
                def run(kern=kern, grid=grid, args=args, cfg=cfg):
                    kern[grid](*args, **cfg)
            try:
                out.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                err = float(((out.double() - ref).norm() / ref.norm()).item())
                ms = do_bench_cudagraph(run)
                spills = "-" if kern is None else kern.compile(*args, **cfg).meta.get("spills")
            except Exception as e:  # noqa: BLE001 - a row that does not build is a row
                print(f"| {grant} | {m}x{n}x{k} | {label} | {type(e).__name__}: {str(e).splitlines()[0][:160]} |",
                      flush=True)
                continue
            print(f"| {grant} | {m}x{n}x{k} | {label} | {spills} | {2 * m * n * k / ms / 1e9:.0f} | {err:.1e} |",
                  flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--grants", default="232,224,216,208")
    parser.add_argument("--shapes", default="4096x4096x7168,4096x7168x2048,4096x2112x7168")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    if args.one is not None:
        one_grant(args.one, shapes)
        return
    import torch

    print(torch.cuda.get_device_name())
    print("| grant | shape | form | spill bytes | TFLOP/s | error |\n| --- | --- | --- | --- | --- | --- |", flush=True)
    for grant in map(int, args.grants.split(",")):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TILEJIT_CACHE_DIR=cache)
            subprocess.run([sys.executable, __file__, "--one", str(grant), "--shapes", args.shapes], env=env,
                           check=False)


if __name__ == "__main__":
    main()
