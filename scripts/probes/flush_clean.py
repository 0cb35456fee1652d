"""``do_bench``'s L2 flush with and without its read-back: decode over a paged cache (what reads the most bytes per
FLOP) and a bf16 matmul (what reads the fewest), timed both ways in one process, alternating.

    python scripts/probes/flush_clean.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.decode_attention import decode_inputs  # noqa: E402
from tilejit.testing import _CudaTiming, do_bench  # noqa: E402
import tilejit.ops.paged_decode as decode  # noqa: E402


class _WriteOnly(_CudaTiming):
    """The flush before the read-back: a write of four L2s, which leaves the L2 dirty."""

    def flush_l2(self) -> None:
        self._flush_buffer.zero_()


def main() -> None:
    name = torch.cuda.get_device_name()
    clean, dirty = _CudaTiming(), _WriteOnly()
    print(f"{name}: microseconds, median of do_bench runs (write-only flush | write and read-back flush)")
    for batch, context in ((32, 4096), (64, 4096), (128, 4096), (32, 16384), (8, 4096)):
        q, k_pages, v_pages, lens, table = decode_inputs(batch, context)
        gb = 2 * batch * context * k_pages.shape[2] * k_pages.shape[3] * 2 / 1e9
        run = lambda: decode.decode_attention(q, k_pages, v_pages, lens, table)  # noqa: E731
        times = {"write": [], "clean": []}
        for _ in range(3):
            times["write"].append(do_bench(run, _timing=dirty))
            times["clean"].append(do_bench(run, _timing=clean))
        w, c = (sorted(v)[1] * 1e3 for v in times.values())
        print(f"decode {batch} x {context}: {w:.1f} us ({gb / w * 1e3:.2f} TB/s) | {c:.1f} us "
              f"({gb / c * 1e3:.2f} TB/s)", flush=True)
    for n in (4096, 8192):
        a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        run = lambda: torch.matmul(a, b)  # noqa: E731
        w, c = do_bench(run, _timing=dirty) * 1e3, do_bench(run, _timing=clean) * 1e3
        print(f"cuBLAS bf16 {n}^3: {w:.1f} us | {c:.1f} us", flush=True)


if __name__ == "__main__":
    main()
