"""benchmarks/varlen_attention.py without a GPU: its batches (ragged lengths summing to the token count) and
main() end to end on the interpreter at a small size, through benchmarks/attention.py --mode varlen: both
kernels checked, timed, the table and JSON written."""
from __future__ import annotations

import functools
import json
import time

from benchmarks import attention as bench_attention
from benchmarks import common
from benchmarks import varlen_attention as bench_varlen


def test_ragged_lengths_fill_the_tokens_within_the_range():
    for seq in (256, 1024, 4096):
        lengths = bench_varlen.ragged_lengths(seq)
        assert sum(lengths) == bench_varlen.TOKENS
        assert all(seq // 4 <= n <= 7 * seq // 4 for n in lengths[:-1]) and 0 < lengths[-1] <= 7 * seq // 4
        assert bench_varlen.ragged_lengths(seq) == lengths  # seeded


def test_main_end_to_end_on_the_interpreter(tmp_path, monkeypatch):
    import tilejit.testing

    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(common, "gpu_name", lambda: "CPU interpreter")
    monkeypatch.setattr(bench_varlen, "TOKENS", 96)

    def wall_clock_bench(fn, *args, **kwargs):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    monkeypatch.setattr(tilejit.testing, "do_bench", wall_clock_bench)
    run_log = tmp_path / "runs.md"
    monkeypatch.setattr(bench_varlen, "append_results", functools.partial(common.append_results, path=run_log))
    monkeypatch.setattr(bench_varlen, "run", functools.partial(bench_varlen.run, device="cpu"))
    out = tmp_path / "out"
    assert bench_attention.main(["--mode", "varlen", "--dims", "16", "--seqs", "48", "--heads", "2",
                                 "--dtypes", "bf16", "--out", str(out)]) == 0
    rows = json.loads((out / "varlen_attention.json").read_text())["results"]
    # equal and ragged batches, causal and not
    assert [(r[1].split()[0], r[3]) for r in rows] == [("equal", False), ("equal", True), ("ragged", False),
                                                      ("ragged", True)]
    assert all(r[4] > 0 and r[5] > 0 for r in rows)
    assert "Packed variable-length prefill" in run_log.read_text()
