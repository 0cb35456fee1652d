"""Shared pytest setup: `gpu` tests run only where torch sees a CUDA GPU; `requires_sm(major)` gates by arch.

Every test compiles into a kernel cache of the run's own (``private_kernel_cache``): the suite never writes the
user's cache, the configured one (``$TILEJIT_CACHE_DIR``) nor the default (``~/.cache/tilejit``,
``$XDG_CACHE_HOME/tilejit``). The process that runs the session (the controller under pytest-xdist) records
those directories and points ``TILEJIT_CACHE_DIR`` at the private cache in ``pytest_configure``, before test
modules are collected (their imports and skip conditions may already ask NVRTC its version, which is recorded
in the cache) and before the workers start (they inherit it); it fails the run if the user's caches changed
(``pytest_sessionfinish``).
"""
from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

#: The user's kernel caches as the run found them (path -> ``cache_snapshot``), kept by the controlling process.
_USER_CACHES = pytest.StashKey[dict]()
_USER_CACHE_DIRS = pytest.StashKey[list]()
#: Set by the controlling process for its workers: the user's cache directories (os.pathsep-separated), found
#: before TILEJIT_CACHE_DIR was pointed at the private cache.
_USER_CACHE_DIRS_ENV = "TILEJIT_TESTS_USER_CACHE_DIRS"


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


def user_cache_dirs() -> list[Path]:
    """The kernel caches a tilejit process of this user would write outside the test suite: the configured one
    and the defaults (``~/.cache/tilejit``, and ``$XDG_CACHE_HOME/tilejit`` when set)."""
    dirs = [Path.home() / ".cache" / "tilejit"]
    if os.environ.get("XDG_CACHE_HOME"):
        dirs.append(Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "tilejit")
    if os.environ.get("TILEJIT_CACHE_DIR"):
        dirs.append(Path(os.environ["TILEJIT_CACHE_DIR"]).expanduser())
    return list(dict.fromkeys(d.resolve() for d in dirs))


def cache_snapshot(directory: Path) -> frozenset[tuple[str, int, int]] | None:
    """Every file and folder under ``directory`` with its mtime and size (None when it does not exist): a test
    run that compiled into it, touched an entry or swept it changes the snapshot."""
    if not directory.exists():
        return None
    found = set()
    for parent, folders, files in os.walk(directory):
        for name in folders + files:
            path = os.path.join(parent, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            found.add((os.path.relpath(path, directory), st.st_mtime_ns, st.st_size))
    st = os.lstat(directory)
    found.add((".", st.st_mtime_ns, 0))
    return frozenset(found)


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _is_xdist_worker(config):  # the controller found the user's caches and set the private one
        config.stash[_USER_CACHE_DIRS] = [Path(d) for d in os.environ[_USER_CACHE_DIRS_ENV].split(os.pathsep)]
    else:  # recorded before any module is collected (and any worker starts)
        config.stash[_USER_CACHE_DIRS] = user_cache_dirs()
        config.stash[_USER_CACHES] = {d: cache_snapshot(d) for d in config.stash[_USER_CACHE_DIRS]}
        os.environ[_USER_CACHE_DIRS_ENV] = os.pathsep.join(str(d) for d in config.stash[_USER_CACHE_DIRS])
        os.environ["TILEJIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="tilejit-test-cache-")
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")
    config.addinivalue_line("markers", "requires_sm(major): needs a GPU of compute capability >= major (80, 90, ...)")
    config.addinivalue_line("markers", "sm90a(what): runs only on an sm_90 GPU (kernels built for sm_90a's wgmma and "
                                       "TMA); ``what`` names the feature in the skip reason")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_USER_CACHES, None)
    if before is None:  # an xdist worker: the controller checks once every worker is done
        return
    shutil.rmtree(os.environ["TILEJIT_CACHE_DIR"], ignore_errors=True)
    changed = [str(d) for d, snapshot in before.items() if cache_snapshot(d) != snapshot]
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (f"the test suite wrote the user's kernel cache {', '.join(changed)}: every compile must go to "
                   "the private cache of tests/conftest.py (private_kernel_cache), and a subprocess must inherit "
                   "its TILEJIT_CACHE_DIR")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"ERROR: {message}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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


@pytest.fixture(scope="session", autouse=True)
def private_kernel_cache() -> Path:
    """The run's own kernel cache, set as TILEJIT_CACHE_DIR for every test and the processes they start. The
    workers of one pytest-xdist run share it (the cache is safe across processes), so a kernel compiled by one
    worker is a hit for the others; each run starts with it empty."""
    root = Path(os.environ["TILEJIT_CACHE_DIR"])  # made by pytest_configure, before collection
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEJIT_CACHE_DIR", str(root))  # a test that changes it is undone at the end of the run
        yield root


@pytest.fixture
def user_kernel_caches(request) -> list[Path]:
    """The user's kernel cache directories as the run found them (``user_cache_dirs`` before any test)."""
    return request.config.stash[_USER_CACHE_DIRS]


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
    """A kernel cache of the module's own, for modules whose compiles must start cold (every test already
    compiles into the run's private cache, ``private_kernel_cache``), with the compile-changing knobs unset.
    Use with ``pytestmark = pytest.mark.usefixtures("fresh_compile_cache")``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEJIT_CACHE_DIR", str(tmp_path_factory.mktemp("tilejit-cache")))
        for knob in _COMPILE_KNOBS:
            mp.delenv(knob, raising=False)
        yield


_LLM_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llm"
_LLM_MODULES = ("model", "data", "plot_loss", "train", "generate")


@pytest.fixture(scope="module")
def llm():
    """The modules of examples/llm by name, imported from there (they import each other by file name) and removed
    from sys.modules and sys.path afterwards, so no other test sees a module called ``model`` or ``data``."""
    import importlib
    import sys

    saved_path = list(sys.path)
    sys.path.insert(0, str(_LLM_EXAMPLE))
    try:
        yield {name: importlib.import_module(name) for name in _LLM_MODULES}
    finally:
        for name in _LLM_MODULES:
            sys.modules.pop(name, None)
        sys.path[:] = saved_path


@pytest.fixture
def interpret_torch(monkeypatch, tmp_path):
    """tilejit.ops on CPU tensors through the IR interpreter, a kernel cache of the test's own, and torch.compile's
    state reset before and after (no graph compiled by another test is reused)."""
    import torch

    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
