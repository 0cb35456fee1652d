"""The test suite's own rules: CPU layers import no GPU test module, and every compile goes to the run's
private kernel cache (tests/conftest.py), never to the user's."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import torch

import tilejit
import tilejit.language as T
from tilejit import knobs

from conftest import cache_snapshot

TESTS = Path(__file__).resolve().parent
GPU_MODULES = {p.stem for p in (TESTS / "gpu").glob("*.py")}


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (imports inside functions count)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_no_cpu_test_module_imports_a_gpu_test_module():
    """The CPU layers run where tests/gpu is never collected; a kernel both need lives in tests/kernels.py."""
    assert {"test_gpu_kernels", "gemm_checks"} <= GPU_MODULES
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        if "gpu" in path.relative_to(TESTS).parts[:-1]:
            continue
        gpu_imports = sorted(m for m in imported_modules(path)
                             if m.split(".")[0] in GPU_MODULES or m.startswith(("tests.gpu", "gpu.")))
        if gpu_imports:
            offenders[str(path.relative_to(TESTS))] = gpu_imports
    assert not offenders, f"CPU test modules import GPU test modules: {offenders}"


def test_compiles_go_to_the_runs_private_cache(private_kernel_cache, user_kernel_caches):
    assert knobs.cache_dir() == private_kernel_cache
    assert os.environ["TILEJIT_CACHE_DIR"] == str(private_kernel_cache)  # what subprocesses inherit
    assert (Path.home() / ".cache" / "tilejit").resolve() in user_kernel_caches
    assert not any(private_kernel_cache.resolve().is_relative_to(d) for d in user_kernel_caches)
    before = {d: cache_snapshot(d) for d in user_kernel_caches}
    x = torch.empty(256, dtype=torch.float16, device="meta")
    compiled = tilejit.kernel(_scale.fn).compile(x, x, BN=256, arch="sm_80")
    assert compiled.entry.path.resolve().is_relative_to(private_kernel_cache.resolve())
    assert {d: cache_snapshot(d) for d in user_kernel_caches} == before


def test_a_write_into_a_cache_changes_its_snapshot(tmp_path):
    """What the end-of-run check of tests/conftest.py compares: a new entry, a touched file and a missing
    directory all show."""
    root = tmp_path / "cache"
    assert cache_snapshot(root) is None
    (root / "ab").mkdir(parents=True)
    empty = cache_snapshot(root)
    (root / "ab" / "entry").write_bytes(b"cubin")
    with_entry = cache_snapshot(root)
    assert with_entry != empty
    os.utime(root / "ab" / "entry", ns=(1, 1))
    assert cache_snapshot(root) != with_entry


@tilejit.kernel
def _scale(X, Y, BN: T.constexpr):
    Y[0:BN] = X[0:BN] * 2
