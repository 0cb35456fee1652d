"""Packed variable-length prefill TFLOP/s: tilejit.ops.attention_varlen against the padded forward
(tilejit.ops.attention) on the same tokens.

    python -m benchmarks.varlen_attention [--dims 64,128] [--seqs 1024,4096] [--heads 16] [--dtypes bf16]
    python -m benchmarks.attention --mode varlen [same options]

16k tokens per row, 16 heads, causal and not, each kernel with the config it takes when given none. Two batches
per sequence length S:

- ``equal``: 16384 // S sequences of S tokens, packed for the varlen op and as (B, H, S, D) for the padded one:
  the same work, so the ratio varlen / padded is the cost of the packed layout (target: at least 0.95).
- ``ragged``: lengths drawn uniformly from S/4 .. 7S/4 (seeded) until 16k tokens, the last one cut to fit. The
  padded column is what a caller without varlen pays: the batch padded to its longest sequence with ``lens``.
  Both columns count only the sequences' own FLOPs.

FLOPs: 4 * H * D * sum(L_i^2) (halved when causal). Every timing goes through ``tilejit.testing.do_bench``;
the varlen output is checked against the padded op's (equal) or the float64 reference on the first sequence
(ragged) before it is timed.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch

from benchmarks.common import DEFAULT_OUT, append_results, machine_stamp, markdown_table, write_json

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HEADERS = ["D", "lengths", "dtype", "causal", "varlen TFLOP/s", "padded TFLOP/s", "varlen / padded"]
TOKENS = 16384


def ragged_lengths(seq: int, tokens: int = TOKENS, seed: int = 0) -> list[int]:
    """Lengths uniform in seq/4 .. 7seq/4 summing to ``tokens`` (the last one cut to fit)."""
    rng = random.Random(seed + seq)
    lengths = []
    while sum(lengths) < tokens:
        lengths.append(min(rng.randint(seq // 4, 7 * seq // 4), tokens - sum(lengths)))
    return lengths


def _tflops(lengths, heads, dim, causal, ms):
    flops = 4.0 * heads * dim * sum(n * n for n in lengths) * (0.5 if causal else 1.0)
    return flops / (ms * 1e-3) / 1e12


def _padded(packed: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """(total, H, D) packed rows as a (B, H, max(lengths), D) zero-padded batch."""
    longest = max(lengths)
    out = packed.new_zeros(len(lengths), packed.shape[1], longest, packed.shape[2])
    start = 0
    for b, n in enumerate(lengths):
        out[b, :, :n] = packed[start:start + n].transpose(0, 1)
        start += n
    return out


def measure(lengths: list[int], heads: int, dim: int, dtype: torch.dtype, causal: bool,
            device: str = "cuda") -> tuple[float, float]:
    """(varlen TFLOP/s, padded TFLOP/s) on one batch, both checked first."""
    from tilejit.ops import attention, attention_varlen
    from tilejit.ops import varlen_attention
    from tilejit.testing import do_bench

    torch.manual_seed(sum(lengths) + dim)
    q, k, v = (torch.randn(sum(lengths), heads, dim, device=device, dtype=dtype) for _ in range(3))
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)
    longest = max(lengths)
    padded = [_padded(t, lengths) for t in (q, k, v)]
    lens = None if len(set(lengths)) == 1 else torch.tensor(lengths, dtype=torch.int32, device=device)
    out = attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal)
    want = attention(*padded, causal=causal, lens=lens)
    if lens is None:
        err = (_padded(out, lengths).double() - want.double()).abs().max().item()
    else:
        first = slice(0, lengths[0])
        ref = varlen_attention.reference(q[first, :2], k[first, :2], v[first, :2], cu[:2], cu[:2], causal)
        err = (out[first, :2].double() - ref).abs().max().item()
    if err > 3e-2:
        raise AssertionError(f"attention_varlen is wrong on {len(lengths)} sequences: max |err| {err}")
    ms_varlen = do_bench(lambda: attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal))
    padded_out = torch.empty_like(padded[0])
    ms_padded = do_bench(lambda: attention(*padded, causal=causal, lens=lens, out=padded_out))
    return (_tflops(lengths, heads, dim, causal, ms_varlen), _tflops(lengths, heads, dim, causal, ms_padded))


def run(dims: list[int], seqs: list[int], heads: int, dtypes: list[str], out: Path, device: str = "cuda") -> int:
    rows = []
    for dim in dims:
        for seq in seqs:
            batches = {f"equal {TOKENS // seq} x {seq}": [seq] * (TOKENS // seq)}
            ragged = ragged_lengths(seq)
            batches[f"ragged {len(ragged)} in {min(ragged)}..{max(ragged)}"] = ragged
            for label, lengths in batches.items():
                for dtype in dtypes:
                    for causal in (False, True):
                        varlen, padded = measure(lengths, heads, dim, DTYPES[dtype], causal, device)
                        rows.append([dim, label, dtype, causal, varlen, padded, f"{varlen / padded:.3f}"])
                        print(markdown_table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)
    table = markdown_table(HEADERS, rows)
    print(table)
    meta = machine_stamp()
    append_results(f"Packed variable-length prefill, {'/'.join(dtypes)}, {heads} heads, {TOKENS // 1024}k tokens",
                   table, meta, notes=["varlen: tilejit.ops.attention_varlen; padded: tilejit.ops.attention on the "
                                       "same tokens (ragged: padded to the longest, with lens); both default "
                                       "configs, FLOPs of the sequences' own work."])
    write_json(out / "varlen_attention.json", {"meta": meta, "headers": HEADERS, "results": rows})
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options this benchmark shares with benchmarks.attention (which passes them on under --mode varlen)."""
    parser.add_argument("--dtypes", default="bf16", help="bf16, fp16 or bf16,fp16")
    parser.add_argument("--seqs", default="1024,4096")
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    ns = parser.parse_args(argv)
    dtypes = ns.dtypes.split(",")
    if not dtypes or set(dtypes) - set(DTYPES):
        parser.error(f"--dtypes takes {', '.join(DTYPES)}, not {ns.dtypes!r}")
    return run([int(d) for d in ns.dims.split(",")], [int(s) for s in ns.seqs.split(",")], ns.heads, dtypes,
               ns.out)


if __name__ == "__main__":
    raise SystemExit(main())
