"""Shared pytest setup: `gpu` tests run only where torch sees a CUDA GPU; `requires_sm(major)` gates by arch."""
from __future__ import annotations

import functools

import pytest


@functools.cache
def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _capability() -> tuple[int, int]:
    import torch

    return tuple(torch.cuda.get_device_capability(0))  # type: ignore[return-value]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")
    config.addinivalue_line("markers", "requires_sm(major): needs a GPU of compute capability >= major (80, 90, ...)")
    config.addinivalue_line("markers", "sm90a(what): runs only on an sm_90 GPU (kernels built for sm_90a's wgmma and "
                                       "TMA); ``what`` names the feature in the skip reason")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        needs_gpu = item.get_closest_marker("gpu") is not None or item.get_closest_marker("requires_sm") is not None
        if needs_gpu and not _cuda_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)"))
            continue
        hopper = item.get_closest_marker("sm90a")
        if hopper is not None and _capability() != (9, 0):
            item.add_marker(pytest.mark.skip(reason=f"{hopper.args[0]} run(s) on sm_90a"))
            continue
        sm = item.get_closest_marker("requires_sm")
        if sm is not None:
            major, minor = _capability()
            need = int(sm.args[0])
            if major * 10 + minor < need:
                item.add_marker(pytest.mark.skip(reason=f"needs sm_{need}+, this GPU is sm_{major}{minor}"))


@pytest.fixture
def requires_sm():
    """Call ``requires_sm(90)`` inside a test to skip it unless the GPU is sm_90 or newer."""

    def check(need: int) -> None:
        if not _cuda_available():
            pytest.skip("needs a CUDA GPU")
        major, minor = _capability()
        if major * 10 + minor < need:
            pytest.skip(f"needs sm_{need}+, this GPU is sm_{major}{minor}")

    return check


@pytest.fixture(autouse=True)
def _fresh_compiler_fingerprint():
    """Every cache key hashes tilejit's own source, read once per process. The tree may be edited while the
    suite runs, so each test hashes it afresh (at its first compile): a test and the child processes it starts
    then agree on the keys."""
    from tilejit import compiler

    compiler.compiler_fingerprint.cache_clear()


#: Knobs that change what a kernel compiles to; a test module with its own kernel cache runs with none of them set.
_COMPILE_KNOBS = ("TILEJIT_INTERPRET", "TILEJIT_ARCH", "TILEJIT_GEMM_LOWERING")


@pytest.fixture(scope="module")
def fresh_compile_cache(tmp_path_factory):
    """A kernel cache of the module's own (its compiles start cold and leave the user's cache alone), with the
    compile-changing knobs unset. Use with ``pytestmark = pytest.mark.usefixtures("fresh_compile_cache")``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEJIT_CACHE_DIR", str(tmp_path_factory.mktemp("tilejit-cache")))
        for knob in _COMPILE_KNOBS:
            mp.delenv(knob, raising=False)
        yield
