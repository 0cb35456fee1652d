"""Cold-path budgets from the kernel-cache issue, measured on CPU (NVRTC needs no GPU).

* NVRTC compile of the DESIGN matmul (sm_80, nothing cached): measured 0.26-0.29 s for the whole
  ``kernel.compile`` on one 2-core machine, 0.49 s on another with NVRTC 12.9 (0.488 s of it inside NVRTC), and
  1.09 s inside NVRTC (fastest of 3) on a CI machine running the same code and NVRTC. NVRTC's speed is the
  machine's, so the suite bounds what tilejit decides: one NVRTC run, tilejit's own part outside NVRTC, and the
  size of the PTX handed to ptxas (what a doubled-up or bloated emission grows); the wall time only very loosely.
  The 0.3 s target is a benchmark figure (``python -m benchmarks.launch``, "cold compile").
* ``import tilejit`` on top of ``import torch``: <= 150 ms (median of 3 fresh processes).

Both fresh-process timings run with tilejit's bytecode compiled, as ``pip install`` leaves a package (into a
private ``PYTHONPYCACHEPREFIX``, so the checkout is not written). Without it (``PYTHONDONTWRITEBYTECODE=1``, as on
the CI machines) every import compiles each module's source again: 55 ms became 150-190 ms for the import and a
disk hit's 4 ms became 23 ms on the 2-core machine, which measures CPython's compiler, not tilejit.
* A fresh process finding the entry on disk: ``kernel.compile`` returns in <= 20 ms beyond imports (the
  issue's 20 ms-to-first-launch budget; loading the cubin needs a GPU to check, this is the CPU half). Measured
  on the 2-core machine: ~35 ms when every hit ran the frontend (importing the AST visitor and the IR) and
  loaded NVRTC to build the key; 3-5 ms now that neither happens on a hit.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.backend_cuda import nvrtc
from tilejit.cache import kernel_cache

REPO = Path(__file__).resolve().parents[2]
# Measured on the 2-core CPU machine (NVRTC 12.9), kernel.compile of DESIGN's matmul for sm_80 with a cold
# cache: 0.26-0.29 s, all but ~7 ms of it in NVRTC (NVVM ~0.14 s, ptxas ~0.11 s; the PTX is ~3.6k lines).
# It was 0.5-0.55 s (PTX ~6.9k lines) while the epilogue's element-wise store fallback was 128 unrolled
# predicated stores and each element-wise global->shared copy was inlined at all 6 of its sites.
MEASURED_COLD_COMPILE_S = 0.28
# The PTX of that compile: 3,522 lines (NVRTC 12.9); the bloated epilogue above made 6.9k.
MEASURED_PTX_LINES = 3522


@tilejit.kernel
def matmul(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    M, K = A.shape
    N = B.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=3):          # software-pipelined loop
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


def compile_design_matmul(arch: str = "sm_80"):
    a = torch.empty(4096, 4096, dtype=torch.float16, device="meta")
    return tilejit.kernel(matmul.fn).compile(a, a, a, BM=128, BN=128, BK=32, num_warps=4, arch=arch)


def child_env(**extra: str) -> dict[str, str]:
    # no knob set, but the suite's private kernel cache kept (tests/conftest.py)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILEJIT_") or k == "TILEJIT_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**env, **extra}


def run_child(code: str, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], env=child_env(**env), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def compiled_bytecode(tmp_path_factory) -> dict[str, str]:
    """The environment of a child that imports tilejit from bytecode, as an installed package does: compiled
    once here into a private prefix (the checkout stays unwritten), with bytecode writing allowed."""
    prefix = tmp_path_factory.mktemp("pycache")
    done = subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "tilejit")],
                          env={**child_env(PYTHONPYCACHEPREFIX=str(prefix)), "PYTHONDONTWRITEBYTECODE": ""},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    env = {"PYTHONPYCACHEPREFIX": str(prefix), "PYTHONDONTWRITEBYTECODE": ""}
    run_child(_IMPORT_COST, **env)  # torch's and the standard library's bytecode into the prefix, untimed
    return env


@pytest.fixture
def cold_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TILEJIT_ALWAYS_COMPILE", raising=False)
    monkeypatch.delenv("TILEJIT_KEEP_PTX", raising=False)
    monkeypatch.setattr(kernel_cache, "_default_cache", None)
    return tmp_path / "cache"


def _timed_cold_compile(monkeypatch, runs: int = 1) -> tuple[float, float, int]:
    """(wall seconds of kernel.compile, seconds inside NVRTC, NVRTC calls) of the fastest of ``runs`` cold
    compiles."""
    inside, calls = [0.0], [0]
    real = nvrtc._run_nvrtc

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            inside[0] += time.perf_counter() - start
            calls[0] += 1

    monkeypatch.setattr(nvrtc, "_run_nvrtc", timed)
    compile_design_matmul("sm_80")  # warm NVRTC's library load and the frontend's imports, not the kernel
    monkeypatch.setenv("TILEJIT_ALWAYS_COMPILE", "1")
    best = None
    for _ in range(runs):
        monkeypatch.setattr(kernel_cache, "_default_cache", None)
        inside[0], calls[0] = 0.0, 0
        start = time.perf_counter()
        compiled = compile_design_matmul("sm_80")
        wall = time.perf_counter() - start
        assert not compiled.from_disk
        if best is None or wall < best[0]:
            best = (wall, inside[0], calls[0])
    return best


@pytest.mark.timing
def test_cold_compile_runs_nvrtc_once_within_a_generous_bound(cold_cache, monkeypatch):
    # the fastest of 3: a compile's own cost, not a busy host's pauses (which only ever add time)
    wall, in_nvrtc, calls = _timed_cold_compile(monkeypatch, runs=3)
    assert calls == 1  # cubin and PTX from one NVRTC run, not a second pass for the PTX
    assert wall - in_nvrtc <= 0.25, f"{wall - in_nvrtc:.3f}s of the cold compile is outside NVRTC"
    # NVRTC's share scales with the code it is given: a deterministic bound, where a wall bound would be the host's
    ptx_lines = len(compile_design_matmul("sm_80").asm["ptx"].splitlines())
    assert ptx_lines <= 1.3 * MEASURED_PTX_LINES, f"the DESIGN matmul's PTX grew to {ptx_lines} lines"
    # 15x the 2-core machine's figure: only a compile gone badly wrong, on any host CI has used
    assert wall <= 15 * MEASURED_COLD_COMPILE_S, f"cold compile took {wall:.2f}s ({in_nvrtc:.2f}s in NVRTC)"


_IMPORT_COST = """
import json, time
import torch
start = time.perf_counter()
import tilejit
import tilejit.language
print(json.dumps({"ms": (time.perf_counter() - start) * 1000}))
"""


@pytest.mark.timing
def test_import_tilejit_adds_at_most_150ms_to_import_torch(compiled_bytecode):
    added = statistics.median(run_child(_IMPORT_COST, **compiled_bytecode)["ms"] for _ in range(3))
    assert added <= 150, f"import tilejit added {added:.1f} ms after import torch"


_IMPORT_IS_LAZY = """
import json, sys
import torch
before = set(sys.modules)
import tilejit, tilejit.language
new = sorted(m for m in set(sys.modules) - before if m.startswith(("tilejit.backend_cuda", "tilejit.passes",
             "tilejit.frontend.visitor", "tilejit.autotuner", "tilejit.interpreter", "cuda.")))
print(json.dumps({"new": new}))
"""


def test_import_tilejit_loads_no_compiler_backend():
    # What keeps the import cheap: the AST visitor, passes, NVRTC and the CUDA driver load on first use.
    assert run_child(_IMPORT_IS_LAZY)["new"] == []


_DISK_HIT = """
import json, sys, time
sys.path[:0] = {tests!r}
import torch
import tilejit
from tilejit.backend_cuda import nvrtc
import test_cold_paths as t
calls = []
real = nvrtc._run_nvrtc
nvrtc._run_nvrtc = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
start = time.perf_counter()
compiled = t.compile_design_matmul("sm_80")
ms = (time.perf_counter() - start) * 1000
print(json.dumps({{"ms": ms, "from_disk": compiled.from_disk, "nvrtc_calls": len(calls), "key": compiled.key,
                  "frontend": "tilejit.frontend.visitor" in sys.modules,
                  "nvrtc_loaded": nvrtc._nvrtc.cache_info().currsize > 0}}))
"""


@pytest.mark.timing
def test_fresh_process_finds_the_entry_on_disk_quickly(cold_cache, compiled_bytecode):
    warm = compile_design_matmul("sm_80")
    code = _DISK_HIT.format(tests=[str(REPO / "tests" / "runtime"), str(REPO / "tests")])
    # (the first run writes the bytecode of what a hit imports beyond `import tilejit`; the next three are timed)
    runs = [run_child(code, TILEJIT_CACHE_DIR=str(cold_cache), **compiled_bytecode) for _ in range(4)][1:]
    assert all(r["from_disk"] and r["nvrtc_calls"] == 0 and r["key"] == warm.key for r in runs), runs
    # What made a hit slow: the frontend (to learn compile-time extents) and NVRTC (for its version).
    assert not any(r["frontend"] or r["nvrtc_loaded"] for r in runs), runs
    ms = statistics.median(r["ms"] for r in runs)
    assert ms <= 20, f"kernel.compile on a disk hit took {ms:.1f} ms in a fresh process ({runs})"


# ---- the NVRTC version record ------------------------------------------------------------------------------

def test_nvrtc_version_record_is_trusted_only_while_nothing_that_picks_the_library_changed(cold_cache,
                                                                                            monkeypatch):
    real = nvrtc.nvrtc_version()
    nvrtc._record_version(real)
    record_path = cold_cache / "nvrtc.json"
    record = json.loads(record_path.read_text())
    assert record["version"] == list(real) and Path(record["library"][0]).name.startswith("libnvrtc")
    assert nvrtc._recorded_version() == real

    # The same file replaced (another mtime or size), or a record from another library: not trusted.
    for damage in ({"library": [record["library"][0], 1, 2]}, {"library": ["/nonexistent/libnvrtc.so", 1, 2]},
                   {"version": "12.9"}, {"probe": {}}):
        record_path.write_text(json.dumps({**record, **damage}))
        assert nvrtc._recorded_version() is None, damage
    record_path.write_text("{not json")
    assert nvrtc._recorded_version() is None

    # Anything that steers the library search (here LD_LIBRARY_PATH) invalidates it.
    record_path.write_text(json.dumps(record))
    assert nvrtc._recorded_version() == real
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/another-cuda/lib64")
    assert nvrtc._recorded_version() is None
