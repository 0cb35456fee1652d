"""Whether the one-loop forward and ``attention()``'s kernel differ in the kernel or in the timing: the same tiles
(D = 64, S = 1024, B = 16, H = 16, bf16) timed with ``do_bench`` (L2 flushed before each call, host in the gaps)
and from a CUDA graph, each kernel launched directly (a probe)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tilejit  # noqa: E402
from benchmarks.kernels import attention_one_loop  # noqa: E402
from tilejit.ops import fused_attention  # noqa: E402
from tilejit.testing import do_bench, do_bench_cudagraph  # noqa: E402


def main():
    print(torch.cuda.get_device_name())
    torch.manual_seed(0)
    for seq, batch in ((1024, 16), (4096, 4)):
        heads, dim = 16, 64
        q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        lens = torch.empty(1, dtype=torch.int32, device="cuda")
        for causal in (False, True):
            flops = 4 * batch * heads * seq * seq * dim / (2 if causal else 1)
            for bm, bn, warps in ((64, 128, 4), (64, 64, 4), (128, 64, 8)):
                def one():
                    attention_one_loop[(tilejit.cdiv(seq, bm), heads, batch)](
                        q, k, v, out, dim ** -0.5, BM=bm, BN=bn, D=dim, CAUSAL=causal, num_warps=warps)

                def tuned():
                    fused_attention.attn_fwd[(tilejit.cdiv(seq, bm), batch * heads)](
                        q, k, v, out, lens, lens, dim ** -0.5, heads, GROUP=1, BM=bm, BN=bn, D=dim, CAUSAL=causal,
                        VARLEN=False, num_warps=warps)

                def api():
                    fused_attention.attention(q, k, v, causal=causal, BM=bm, BN=bn, num_warps=warps)

                cells = []
                for name, run in (("one loop", one), ("attn_fwd", tuned), ("attention()", api)):
                    run()
                    cells.append(f"{name} {flops / do_bench(run) / 1e9:.1f} / {flops / do_bench_cudagraph(run) / 1e9:.1f}")
                print(f"| S={seq} causal={causal} {bm}x{bn} w{warps} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
