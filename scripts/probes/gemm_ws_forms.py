"""Which forms of ``tilejit.ops``' ``gemm`` (x @ W^T, dY @ W, dY^T @ X, the accumulating dW += ..., the two-product
form) run with warp-specialized configs (a producer warpgroup filling the TMA ring): each form and config in a
process of its own (a launch failure poisons its CUDA context), on the example LLM's shapes and on a ragged one,
checked against torch in float32 and timed (``do_bench``, median) beside the same tile without warp
specialization.

    python scripts/probes/gemm_ws_forms.py
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORMS = ["nt", "nn", "tn", "tn-acc", "nn-two"]
TILES = [(128, 256, 64, 8, 4), (128, 128, 64, 8, 4)]
SHAPES = [(8192, 1024, 1024), (1000, 904, 520)]  # (M, N, K) of C (M x N) = op(A) @ op(B)


def case(form: str, tile: tuple, shape: tuple) -> str:
    import torch

    sys.path.insert(0, str(ROOT))
    import tilejit
    import tilejit.ops.linear_kernels as kernels
    from tilejit.testing import do_bench

    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(1)

    def rand(*s):
        return torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=gen)

    trans_a, trans_b = form.startswith("t"), form == "nt"
    acc, two = form.endswith("acc"), form.endswith("two")
    a = rand(k, m) if trans_a else rand(m, k)
    b = rand(n, k) if trans_b else rand(k, n)
    a2, b2 = (rand(m, k), rand(k, n)) if two else (a, b)
    c = torch.randn(m, n, device="cuda", generator=gen) if acc else torch.full((m, n), float("nan"), device="cuda",
                                                                              dtype=torch.bfloat16)
    c0 = c.clone()
    expect = (a.float().T if trans_a else a.float()) @ (b.float().T if trans_b else b.float())
    if two:
        expect += a2.float() @ b2.float()
    if acc:
        expect += c0
    bm, bn, bk, w, s = tile
    grid = (tilejit.cdiv(m, bm) * tilejit.cdiv(n, bn),)
    out = []
    for ws in (False, True):
        c.copy_(c0)

        def run():
            kernels.gemm[grid](a, b, c, a2, b2, TRANS_A=trans_a, TRANS_B=trans_b, ACC_IN=acc, TWO=two, BM=bm, BN=bn,
                               BK=bk, num_warps=w, num_stages=s, warp_specialize=ws)
        run()
        torch.cuda.synchronize()
        error = ((c.float() - expect).norm() / expect.norm()).item()
        ms = do_bench(run) if not acc else float("nan")  # the accumulating form adds again each run
        out.append(f"{error:.1e} {2 * m * n * k * (2 if two else 1) / ms / 1e9:.0f}")
    return " | ".join(out)


def main():
    if len(sys.argv) > 1:
        form, tile = sys.argv[1], eval(sys.argv[2])  # noqa: S307 - our own arguments
        for shape in SHAPES:
            print(f"{'x'.join(map(str, shape))} | {case(form, tile, shape)}", flush=True)
        return
    import torch
    print(torch.cuda.get_device_name())
    print("| form | tile | M x N x K | plain: rel. error, TFLOP/s | warp-specialized: rel. error, TFLOP/s |")
    print("| --- | --- | --- | --- | --- |")
    for form in FORMS:
        for tile in TILES:
            done = subprocess.run([sys.executable, __file__, form, repr(tile)], capture_output=True, text=True,
                                  timeout=300)
            for line in done.stdout.strip().splitlines():
                print(f"| {form} | {tile} | {line} |", flush=True)
            if done.returncode:
                print(f"| {form} | {tile} | failed: {(done.stderr.strip().splitlines() or ['?'])[-1][:150]} |")


if __name__ == "__main__":
    main()
