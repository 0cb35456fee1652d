"""The benchmark harness on CPU: the matmul config space and its pruning, tables, the run log, the CLIs, and one
matmul benchmark row end to end through the IR interpreter."""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks import common
from benchmarks import matmul as bench_matmul
from tilejit.configs import matmul_configs, matmul_prune, matmul_shared_bytes

REPO = Path(__file__).resolve().parents[2]
H100_MAX_DYNAMIC_SMEM = 227 * 1024


def _named(m: int, n: int, k: int) -> dict:
    return {"A": torch.empty(m, k, device="meta", dtype=torch.float16),
            "B": torch.empty(k, n, device="meta", dtype=torch.float16)}


def _tiles(configs) -> set[tuple[int, int]]:
    return {(c.kwargs["BM"], c.kwargs["BN"]) for c in configs}


def test_matmul_configs_fit_shared_memory_and_are_unique():
    configs = matmul_configs(stream_k=True)
    plain = [c for c in configs if c.split_k == 1 and not c.options.sm90a_only]
    specialized = [c for c in configs if c.warp_specialize]
    pingpong = [c for c in configs if c.pingpong]
    stream_k = [c for c in configs if c.stream_k]
    # stream-K: 4 warps, tiles up to 128x128 (it serves problems with few tiles)
    assert stream_k and all(c.num_warps == 4 and c.kwargs["BM"] * c.kwargs["BN"] <= 128 * 128 for c in stream_k)
    # pingpong: groups of 4 warps (8 leave too few registers), 128x128-element accumulators at most
    assert pingpong and all(c.num_warps == 4 and c.kwargs["BM"] * c.kwargs["BN"] <= 128 * 128 for c in pingpong)
    assert 12 <= len(plain) <= 20 and 4 <= len([c for c in configs if c.split_k > 1]) <= 16
    assert 4 <= len(specialized) <= 15 and all(c.split_k == 1 for c in specialized)
    # BK = 64, but for one 64x64 tile of 128-element K steps (small squares: fewer, larger copies in flight)
    assert [(c.kwargs["BM"], c.kwargs["BN"]) for c in specialized if c.kwargs["BK"] != 64] == [(64, 64)]
    # deep rings (more loads in flight per SM where tiles are few or K is short) only for tiles up to 128x128 on
    # 4 warps, and in the plain loop only for the 16-row tiles (mma.sync, decode-like problems)
    deep = [c for c in configs if c.num_stages > 4]
    assert deep and all(c.kwargs["BM"] * c.kwargs["BN"] <= 128 * 128 and c.num_warps == 4 for c in deep)
    assert not [c for c in deep if c in plain and c.kwargs["BM"] >= 64]
    thin = [c for c in configs if c.kwargs["BM"] < 64]
    assert thin and all(c.kwargs["BM"] == 16 and not c.options.sm90a_only for c in thin)
    assert len({c.identity for c in configs}) == len(configs)
    for c in configs:
        assert matmul_shared_bytes(c) <= H100_MAX_DYNAMIC_SMEM, c
        assert c.kwargs["BM"] in (16, 64, 128, 256) and c.kwargs["BN"] in (64, 128, 192, 256)
        assert c.kwargs["BK"] in ((32, 64, 128) if c.kwargs["BM"] == 16 or c.kwargs["BN"] == 64 else (32, 64))
        assert c.num_warps in (4, 8) and 2 <= c.num_stages <= 16 and c.split_k in (1, 2, 4)
        # at most 128 f32 accumulator registers per thread
        assert c.kwargs["BM"] * c.kwargs["BN"] // (32 * c.num_warps) <= 128, c
    assert (64, 64) in _tiles(configs) and (128, 256) in _tiles(configs)


def test_matmul_configs_budget_filters():
    small = matmul_configs(smem_budget=64 * 1024)
    assert small and len(small) < len(matmul_configs())
    assert all(matmul_shared_bytes(c) <= 64 * 1024 for c in small)


def test_matmul_shared_bytes_formula():
    c = matmul_configs()[0]
    bm, bn, bk = c.kwargs["BM"], c.kwargs["BN"], c.kwargs["BK"]
    assert matmul_shared_bytes(c) == c.num_stages * (bm * bk + bk * bn) * 2
    assert matmul_shared_bytes(c, scratch_bytes=512) == matmul_shared_bytes(c) + 512


@pytest.mark.parametrize("mnk", [(1, 4096, 4096), (16, 11008, 4096), (8192, 8192, 8192), (1000, 3000, 777),
                                 (1, 1, 1), (128, 4096, 11008)])
def test_matmul_prune_keeps_something_sensible(mnk):
    m, n, k = mnk
    configs = matmul_configs()
    kept = matmul_prune(configs, _named(m, n, k))
    assert kept, mnk
    assert all(c in configs for c in kept)
    if m <= 64:  # 16-row tiles only where M fits in them
        assert all(c.kwargs["BM"] == 64 or (c.kwargs["BM"] == 16 and m <= 16) for c in kept)
        assert (m <= 16 and k >= 128) == any(c.kwargs["BM"] == 16 for c in kept)  # (thin tiles take BK >= 64)
    if m == 128:
        assert all(c.kwargs["BM"] <= 128 for c in kept)


def test_matmul_prune_large_problem_drops_small_tiles():
    kept = matmul_prune(matmul_configs(), _named(8192, 8192, 8192))
    assert all(c.kwargs["BM"] * c.kwargs["BN"] >= 128 * 128 and c.num_stages <= 4 for c in kept)
    assert (128, 256) in _tiles(kept)
    everything = matmul_prune(matmul_configs(), _named(1000, 3000, 777))
    # meta tensors: no clusters, not an sm_90 GPU (so no split-K and no warp-specialized configs)
    assert everything == [c for c in matmul_configs()
                          if c.split_k == 1 and not c.options.sm90a_only and c.kwargs["BM"] >= 64]


def test_matmul_prune_thin_tiles_for_decode_only(monkeypatch):
    """16-row tiles for M <= 16 (split ones only with clusters, as every split-K config); a 17-row problem gets
    none, and a 1-row one on a GPU without clusters keeps the unsplit ones."""
    from tilejit import configs as cfg

    monkeypatch.setattr(cfg, "cluster_sm_count", lambda tensor: 132)
    decode = [c for c in matmul_prune(matmul_configs(), _named(1, 4096, 4096)) if c.kwargs["BM"] == 16]
    assert {c.split_k for c in decode} == {1, 2, 4}
    assert not [c for c in matmul_prune(matmul_configs(), _named(17, 4096, 4096)) if c.kwargs["BM"] < 64]
    monkeypatch.setattr(cfg, "cluster_sm_count", lambda tensor: 0)
    plain = [c for c in matmul_prune(matmul_configs(), _named(1, 4096, 4096)) if c.kwargs["BM"] == 16]
    assert plain and all(c.split_k == 1 for c in plain)


@pytest.mark.parametrize("limit", [163 * 1024, 99 * 1024], ids=["a100", "sm89"])
@pytest.mark.parametrize("mnk", [(1, 4096, 4096), (128, 4096, 4096), (4096, 4096, 4096)])
def test_matmul_prune_drops_rings_the_gpu_cannot_hold(monkeypatch, limit, mnk):
    """On a GPU with less shared memory per block than a config's ring, the config is dropped (the compiler would
    run it with fewer stages than it names); no GPU (meta tensors): nothing is dropped for it."""
    from tilejit import configs as cfg

    everything = matmul_prune(matmul_configs(), _named(*mnk))
    assert [c for c in everything if matmul_shared_bytes(c) > limit]
    monkeypatch.setattr(cfg, "shared_memory_per_block", lambda tensor: limit)
    kept = matmul_prune(matmul_configs(), _named(*mnk))
    assert kept and all(matmul_shared_bytes(c) <= limit for c in kept)
    assert [c for c in everything if matmul_shared_bytes(c) <= limit] == kept


def test_shared_memory_per_block_is_the_compilers_bound(monkeypatch):
    """The prune's bound is the one the compiler fits rings into (``Arch.max_shared_bytes``) for the GPU's compute
    capability; 0 off a GPU and on one tilejit does not compile for."""
    from tilejit import configs as cfg

    assert cfg.shared_memory_per_block(torch.empty(1, device="meta")) == 0
    monkeypatch.setattr(cfg, "_cuda_index", lambda tensor: 0)
    for capability, limit in (((9, 0), 227 * 1024), ((8, 0), 163 * 1024), ((8, 9), 99 * 1024), ((7, 5), 0)):
        monkeypatch.setattr(cfg, "_capability", lambda index, c=capability: c)
        assert cfg.shared_memory_per_block(None) == limit, capability


def test_matmul_prune_offers_warp_specialized_configs_on_sm90_only(monkeypatch):
    from tilejit import configs as cfg

    monkeypatch.setattr(cfg, "is_sm90", lambda tensor: True)
    kept = matmul_prune(matmul_configs(), _named(4096, 4096, 4096))
    assert {(128, 256), (256, 128), (128, 128)} <= _tiles([c for c in kept if c.warp_specialize])
    monkeypatch.setattr(cfg, "is_sm90", lambda tensor: False)
    assert not [c for c in matmul_prune(matmul_configs(), _named(4096, 4096, 4096)) if c.options.sm90a_only]


def test_matmul_prune_offers_split_k_only_where_tiles_leave_sms_idle(monkeypatch):
    """On a 132-SM GPU with clusters: split-K configs for M = 128 x 4096 x 4096 (32 to 128 tiles), none for 4096^3
    (thousands of tiles) or a short K (fewer than 4 K steps per program); without clusters, none at all."""
    from tilejit import configs as cfg

    monkeypatch.setattr(cfg, "cluster_sm_count", lambda tensor: 132)
    skinny = matmul_prune(matmul_configs(), _named(128, 4096, 4096))
    split = [c for c in skinny if c.split_k > 1]
    assert split and all(-(-4096 // c.kwargs["BN"]) * -(-128 // c.kwargs["BM"]) * c.split_k <= 264 for c in split)
    assert not [c for c in matmul_prune(matmul_configs(), _named(4096, 4096, 4096)) if c.split_k > 1]
    assert not [c for c in matmul_prune(matmul_configs(), _named(128, 4096, 256)) if c.split_k > 2]
    monkeypatch.setattr(cfg, "cluster_sm_count", lambda tensor: 0)
    assert not [c for c in matmul_prune(matmul_configs(), _named(128, 4096, 4096)) if c.split_k > 1]


def test_matmul_prune_offers_stream_k_only_for_few_tiles(monkeypatch):
    """On a 132-SM sm_90 GPU: stream-K configs for M = 16 or 128 x 4096 x 4096 (32 to 64 tiles of up to 128x128,
    64 K steps each), none for 4096^3, 1024^3 (64 tiles of 16 K steps: under 8 steps per program) or a 128-row
    problem of 3000 columns and 128x64 tiles (47 tiles; fine) with K = 256 (4 steps); none without clusters. The
    default space has none (``matmul_configs(stream_k=True)`` adds them; configs.py says why)."""
    from tilejit import configs as cfg

    assert not [c for c in matmul_configs() if c.stream_k]
    space = matmul_configs(stream_k=True)
    monkeypatch.setattr(cfg, "cluster_sm_count", lambda tensor: 132)
    monkeypatch.setattr(cfg, "is_sm90", lambda tensor: True)
    for m in (16, 128):
        assert [c for c in matmul_prune(space, _named(m, 4096, 4096)) if c.stream_k], m
    for mnk in [(4096, 4096, 4096), (1024, 1024, 1024), (128, 3000, 256)]:
        assert not [c for c in matmul_prune(space, _named(*mnk)) if c.stream_k], mnk
    monkeypatch.setattr(cfg, "cluster_sm_count", lambda tensor: 0)
    assert not [c for c in matmul_prune(space, _named(128, 4096, 4096)) if c.stream_k]


def test_matmul_prune_never_empty():
    only_big = [c for c in matmul_configs() if c.kwargs["BM"] == 256]
    kept = matmul_prune(only_big, _named(1, 64, 32))
    assert len(kept) == 1 and kept[0] in only_big
    only_split = [c for c in matmul_configs() if c.split_k > 1]
    assert matmul_prune(only_split, _named(8192, 8192, 8192))[0].split_k > 1  # nothing else to offer


def test_benchmark_kernel_uses_the_default_space():
    from benchmarks import kernels

    assert kernels.matmul.configs == matmul_configs()
    assert kernels.matmul.key == ["A", "B"]
    assert kernels.matmul.early_config_prune is matmul_prune
    assert kernels.matmul_grid({"A": torch.empty(1000, 7), "B": torch.empty(7, 300), "BM": 128, "BN": 64}) == (40,)


def test_markdown_table():
    text = common.markdown_table(["a", "b|c", "d"], [[1, 2.345, None], ["x", "y|z", 3]])
    assert text.splitlines() == [
        "| a | b\\|c | d |",
        "| --- | --- | --- |",
        "| 1 | 2.3 | n/a |",
        "| x | y\\|z | 3 |",
    ]
    with pytest.raises(ValueError, match="2 cells"):
        common.markdown_table(["a", "b", "c"], [[1, 2]])


def test_append_results(tmp_path):
    path = tmp_path / "runs.md"
    meta = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.1", "date": "2025-01-02T03:04:05+00:00",
            "versions": {"tilejit": "0.1.0", "triton": None}}
    common.append_results("matmul", "| a |\n| --- |\n| 1 |", meta, path, notes=["first note"])
    common.append_results("launch", "| b |\n| --- |\n| 2 |", {**meta, "gpu": "NVIDIA H200"}, path)
    text = path.read_text()
    assert text.startswith("# Benchmark runs")
    assert "## matmul — NVIDIA H100 80GB HBM3 (2025-01-02)" in text
    assert "## launch — NVIDIA H200 (2025-01-02)" in text
    assert text.index("| 1 |") < text.index("## launch") < text.index("| 2 |")
    assert "- first note" in text
    assert "GPU: NVIDIA H100 80GB HBM3 · driver 580.1" in text and "tilejit 0.1.0" in text
    assert "triton" not in text  # versions that are None are left out


def test_tflops_and_stamp():
    assert common.matmul_tflops(4096, 4096, 4096, 1.0) == pytest.approx(137.4389534, rel=1e-6)
    stamp = common.machine_stamp()
    assert set(stamp) == {"gpu", "driver", "cpu", "versions", "date"}
    assert stamp["versions"]["tilejit"] and stamp["versions"]["torch"] == torch.__version__


def test_shape_and_dtype_parsing():
    assert bench_matmul.parse_shapes("4096x4096x4096, 1x11008x4096") == [(4096, 4096, 4096), (1, 11008, 4096)]
    with pytest.raises(Exception, match="MxNxK"):
        bench_matmul.parse_shapes("4096x4096")
    assert bench_matmul.parse_dtypes("bf16") == ["bf16"]
    with pytest.raises(Exception, match="dtypes"):
        bench_matmul.parse_dtypes("fp32")
    quick, full = bench_matmul.all_shapes(True), bench_matmul.all_shapes(False)
    assert quick == [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (1000, 3000, 777)]
    assert full[:4] == quick and len(set(full)) == len(full)
    assert {(512, 512, 512), (1, 11008, 4096), (4096, 4096, 11008)} <= set(full)


def test_fp8_means_both_modes_each_against_its_like():
    assert bench_matmul.parse_dtypes("fp8") == ["fp8-precise", "fp8-fast"]
    assert bench_matmul.parse_dtypes("bf16,fp8-fast") == ["bf16", "fp8-fast"]
    precise = {"m": 4096, "n": 4096, "k": 4096, "dtype": "fp8-precise",
               "tilejit": {"status": "ok", "tflops": 1319.0, "err_f64": 0.00166},
               "cublas": {"status": "ok", "tflops": 1309.0, "err_f64": 0.00167},
               "triton": {"status": "n/a"}}
    fast = {**precise, "dtype": "fp8-fast", "cublas": {"status": "n/a", "reason": "r"},
            "tilejit": {"status": "FAIL", "rel_err": 0.5}}
    bf16 = {**precise, "dtype": "bf16"}
    rows = bench_matmul.fp8_rows([precise, fast, bf16])
    assert len(rows) == 2
    assert rows[0][:3] == ["4096x4096x4096", "precise", common.fmt(1319.0)] and rows[0][4] == common.fmt(1309.0)
    assert rows[0][3] == "_scaled_mm" and rows[0][5] == "1.01" and rows[0][6:9] == ["0.00166", "0.00167", None]
    assert rows[0][9:] == ["67%", "66%"]
    assert rows[1][1] == "fast" and rows[1][3] == "_scaled_mm use_fast_accum" and rows[1][5] is None
    assert rows[1][6] is None and rows[1][9] is None


def test_frobenius_error_against_float64():
    ref = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    assert bench_matmul.frobenius_error(torch.tensor([[3.0, 4.5]]), ref) == pytest.approx(0.1)
    assert bench_matmul.frobenius_error(torch.tensor([[float("nan"), 4.0]]), ref) is None


def test_table_rows_report_fail_and_ratios():
    row = {"m": 8, "n": 8, "k": 8, "dtype": "fp16",
           "tilejit": {"status": "FAIL", "rel_err": 0.5, "config": "64x64x32 w4 s3"},
           "cublas": {"status": "ok", "tflops": 10.0}, "triton": {"status": "n/a"}}
    ok = {**row, "tilejit": {"status": "ok", "tflops": 5.0, "config": "c"},
          "triton": {"status": "ok", "tflops": 4.0}}
    failed, good = bench_matmul.table_rows([row, ok])
    assert failed[2] == "FAIL (err 0.5)" and failed[5] is None and failed[4] == "n/a"
    assert good[5:7] == ["0.50", "1.25"]


def test_mn_major_rows_compare_tf32_with_cublas_and_8_bit_with_the_k_major_form():
    tf32 = {"m": 8, "n": 8, "k": 8, "dtype": "tf32", "tilejit": {"status": "ok", "tflops": 9.0},
            "cublas": {"status": "ok", "tflops": 10.0}, "triton": {"status": "n/a"},
            "tilejit_nn": {"status": "ok", "tflops": 9.5, "config": "c"},
            "tilejit_nn_copy": {"status": "ok", "tflops": 6.0}}
    fp8 = {**tf32, "dtype": "fp8", "tilejit": {"status": "ok", "tflops": 19.0}}
    del fp8["tilejit_nn_copy"]
    plain = {k: v for k, v in tf32.items() if not k.startswith("tilejit_nn")}
    rows = bench_matmul.mn_major_rows([tf32, fp8, plain])
    assert len(rows) == 2
    assert rows[0][2:8] == ["9.5", "cuBLAS tf32", "10.0", "0.95", "6.0", "c"]
    assert rows[1][3:7] == ["tilejit B N x K", "19.0", "0.50", "n/a"]


@pytest.mark.parametrize("module", ["benchmarks.matmul", "benchmarks.launch", "benchmarks.launch_model"])
def test_cli_help_without_gpu(module):
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: python -m " + module in proc.stdout


def test_matmul_benchmark_end_to_end_on_the_interpreter(tmp_path, monkeypatch):
    """main() on a small shape: configs tuned and run by the interpreter (no NVRTC), checked, written."""
    import tilejit.testing

    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(common, "gpu_name", lambda: "CPU interpreter")

    def wall_clock_bench(fn, *args, **kwargs):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    monkeypatch.setattr(tilejit.testing, "do_bench", wall_clock_bench)
    monkeypatch.setattr(bench_matmul, "bench_shape", functools.partial(bench_matmul.bench_shape, device="cpu"))
    run_log = tmp_path / "runs.md"
    rc = bench_matmul.main(["--shapes", "40x70x50", "--dtypes", "fp16", "--out", str(tmp_path),
                            "--results", str(run_log)])
    assert rc == 0
    data = json.loads((tmp_path / "matmul.json").read_text())
    assert data["complete"] and len(data["rows"]) == 1
    row = data["rows"][0]
    assert row["tilejit"]["status"] == "ok" and row["tilejit"]["rel_err"] <= bench_matmul.REL_TOL
    assert row["tilejit"]["timed"] >= 1 and row["cublas"]["status"] == "ok"
    assert "| 40x70x50 | fp16 |" in run_log.read_text()
    assert "CPU interpreter" in run_log.read_text()


def test_launch_overheads_take_turns_and_include_timers(monkeypatch):
    import torch

    from benchmarks import launch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    calls = {"a": 0, "b": 0}

    def make(name):
        def launch_once():
            calls[name] += 1
        return launch_once

    floor_counts = []
    result = launch.host_overheads({"a": make("a"), "b": make("b")}, launches=50, reps=4,
                                   timers={"floor": lambda n: floor_counts.append(n) or 1.25})
    assert set(result) == {"a", "b", "floor"}
    assert result["floor"]["us_per_launch"] == 1.25
    assert all(r["us_per_launch"] > 0 and r["min_us_per_launch"] <= r["us_per_launch"] for r in result.values())
    assert floor_counts.count(50) >= 4 and calls["a"] >= 4 * 50 and calls["b"] >= 4 * 50
    # The order rotates every repetition, so no launcher always runs first.
    timed: list[str] = []
    timers = {name: (lambda n, name=name: timed.append(name) or 1.0) for name in "xyz"}
    launch.host_overheads({}, launches=7, reps=4, timers=timers)
    assert timed[-12:] == list("xyzyzxzxyxyz")


@pytest.mark.parametrize("dtype, mnk, refused", [
    ("fp8", (4096, 4096, 4096), False), ("fp8", (1000, 3000, 777), True), ("fp8", (1000, 3008, 768), False),
    ("int8", (4096, 4096, 4096), False), ("int8", (16, 4096, 4096), True), ("int8", (1000, 3000, 777), True),
    ("tf32", (1000, 3000, 777), False),
])
def test_baseline_refusals_are_named_not_failures(dtype, mnk, refused):
    """A shape the library baseline documents it cannot take reads n/a with the reason (the benchmark's exit
    code counts only tilejit's and a running baseline's failures)."""
    reason = bench_matmul.baseline_refusal(dtype, *mnk)
    assert (reason is not None) == refused
    if refused:
        assert ("_scaled_mm" if dtype == "fp8" else "_int_mm") in reason
    assert bench_matmul.triton_refusal("fp8", 777) and not bench_matmul.triton_refusal("fp8", 4096)
    assert not bench_matmul.triton_refusal("int8", 777)


def test_attention_plot_from_stored_results(tmp_path):
    """``python -m benchmarks.attention --plot JSON`` redraws the PNGs of stored results without a GPU (or says
    that matplotlib is missing)."""
    from benchmarks import attention as bench_attention
    row = {"dim": 128, "seq": 4096, "batch": 4, "dtype": "bf16", "causal": False, "tilejit": 580.0,
           "config": "128x128 w8 ws s3", "SDPA flash": 340.0, "SDPA cuDNN": 590.0, "Triton": None}
    stored = tmp_path / "attention.json"
    stored.write_text(json.dumps({"meta": common.machine_stamp(), "results": [row], "backward": [dict(row)]}))
    assert bench_attention.main(["--plot", str(stored), "--out", str(tmp_path / "out")]) == 0
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert written == []
    else:
        assert written == ["attention_bwd.png", "attention_fwd.png"]


def test_interleave_retimes_in_rotating_rounds_and_keeps_the_median(monkeypatch):
    """Every implementation whose first timing is ok is timed ``rounds`` more times, each round starting with a
    different one; its figure becomes the median of its timings; failed ones are left alone."""
    import tilejit.testing
    from benchmarks.matmul import interleave

    order: list[str] = []
    times = {"a": iter([3.0, 1.0]), "b": iter([2.0, 9.0]), "c": iter([5.0, 5.0])}

    def fake_bench(run):
        order.append(run.__name__)
        return next(times[run.__name__])

    def named(name):
        def run():
            pass
        run.__name__ = name
        return run

    monkeypatch.setattr(tilejit.testing, "do_bench", fake_bench)
    timed = {name: (named(name), {"status": "ok", "ms": ms}) for name, ms in (("a", 2.0), ("b", 4.0), ("c", 1.0))}
    timed["x"] = (named("x"), {"status": "FAIL"})
    interleave(timed, 1000, 1000, 1000)
    assert order == ["b", "c", "a", "c", "a", "b"]
    assert [timed[n][1]["ms"] for n in "abc"] == [2.0, 4.0, 5.0]
    assert timed["a"][1]["ms_rounds"] == [2.0, 3.0, 1.0] and "ms" not in timed["x"][1]
    assert timed["a"][1]["tflops"] == pytest.approx(2 * 1000 ** 3 / 2e-3 / 1e12)


def test_config_runs_keep_their_own_grid():
    """Each config's launch is bound to that config's grid when it is made: the rounds of ``interleave`` run every
    launch again after all were made (they once all took the last config's grid, so a 128x256 tile's figure
    was that of twice its work, or of half)."""
    from benchmarks.configs import config_runs

    launches = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, kw["BM"], kw["BN"], kw.get("warp_specialize", False)))

    runs = config_runs(Kernel(), ("a", "b", "c"), {}, 1000, 1000, [(128, 256, 64, 8, 3), (64, 64, 32, 4, 3)],
                       ["off", "ws"])
    assert [(label, mode) for label, mode, _ in runs] == [
        ("128x256x64 w8 s3", "off"), ("128x256x64 w8 s3", "ws"), ("64x64x32 w4 s3", "off"), ("64x64x32 w4 s3", "ws")]
    for _, _, run in runs:
        run()
    assert launches == [((8 * 4,), 128, 256, False), ((8 * 4,), 128, 256, True), ((16 * 16,), 64, 64, False),
                        ((16 * 16,), 64, 64, True)]


def test_sm80_rows_put_the_pinned_path_next_to_the_native_kernel_and_cublas():
    from benchmarks import matmul as bench_matmul

    ok = {"status": "ok"}
    row = {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "tilejit": {**ok, "tflops": 700.0},
           "cublas": {**ok, "tflops": 720.0}, "triton": {"status": "n/a"},
           "tilejit_sm80": {**ok, "tflops": 450.0, "config": "128x128x64 w4 s3"}}
    plain = dict(row)
    del plain["tilejit_sm80"]
    assert bench_matmul.sm80_rows([plain]) == []
    assert bench_matmul.sm80_rows([row, plain]) == [
        ["4096x4096x4096", "bf16", "450.0", "700.0", "720.0", "0.62", "128x128x64 w4 s3"]]
    row["tilejit_sm80"] = {"status": "FAIL", "rel_err": 0.5}
    assert bench_matmul.sm80_rows([row])[0][2:6] == ["FAIL (err 0.5)", "700.0", "720.0", None]


def _expand_braces(name: str) -> list[str]:
    """``a_{x,y}_b.*`` -> [``a_x_b.*``, ``a_y_b.*``] (the file-name shorthand of RESULTS.md)."""
    start = name.find("{")
    if start < 0:
        return [name]
    end = name.index("}", start)
    return [full for part in name[start + 1:end].split(",")
            for full in _expand_braces(name[:start] + part + name[end + 1:])]


def test_results_md_holds_current_tables_with_their_stamps():
    """benchmarks/RESULTS.md stays a page of current tables: at most 400 lines, every workload's section stamped with
    its GPU and date, and every raw file it quotes present in benchmarks/results/."""
    text = (REPO / "benchmarks" / "RESULTS.md").read_text()
    assert len(text.splitlines()) <= 400
    sections = text.split("\n## ")[1:]
    assert len(sections) >= 6
    for section in sections:
        title, _, body = section.partition("\n")
        stamp = next((line for line in body.splitlines() if line.startswith("_")), "")
        assert "NVIDIA" in stamp and re.search(r"20\d\d-\d\d-\d\d", stamp), f"section {title!r} has no GPU/date stamp"
    quoted = set(re.findall(r"benchmarks/results/([\w.{},*-]+)", text))
    quoted |= set(re.findall(r"`([a-z0-9_{},]+_h[12]00[\w.{},*]*)`", text))
    assert quoted
    for name in quoted:
        for pattern in _expand_braces(name.rstrip(".")):
            pattern = pattern if "." in pattern else pattern + ".*"
            assert list((REPO / "benchmarks" / "results").glob(pattern)), f"RESULTS.md quotes {pattern}, not there"


def test_launch_rows_give_each_launchers_difference_from_the_plain_launch():
    times = {"plain": {"us_per_launch": 7.9, "min_us_per_launch": 7.5},
             "tuned": {"us_per_launch": 8.4, "min_us_per_launch": 8.0}}
    rows = bench_matmul.launch_rows(times)
    assert rows == [["plain", "7.90 us", "+0.00 us", "7.50 us"], ["tuned", "8.40 us", "+0.50 us", "8.00 us"]]
    times = {"plain (grid tuple)": {"us_per_launch": 7.9, "min_us_per_launch": 7.5},
             "plain (grid function)": {"us_per_launch": 11.0, "min_us_per_launch": 10.5},
             "tuned (grid tuple)": {"us_per_launch": 8.0, "min_us_per_launch": 7.6},
             "tuned (grid function)": {"us_per_launch": 11.7, "min_us_per_launch": 11.1}}
    assert [row[2] for row in bench_matmul.launch_rows(times)] == ["+0.00 us", "+0.00 us", "+0.10 us", "+0.70 us"]
