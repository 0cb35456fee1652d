"""The kernel cache with real kernels: NVRTC cubins stored, found again across processes, recovered when
damaged, listed by the CLI, and exposed as ``compiled.asm``. CPU only (NVRTC compiles without a GPU).

tests/runtime/test_cache.py covers the cache's protocol with a stand-in compiler; these tests check that the runtime
uses it as promised: ``kernel.compile(..., arch=...)`` on meta tensors writes the same entry a launch finds.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit import cli
from tilejit.backend_cuda import nvrtc
from tilejit.cache import kernel_cache
from tilejit.cache import KernelCache
from tilejit.backend_cuda.sass import find_tool

REPO = Path(__file__).resolve().parents[2]
EM_CUDA = 190  # ELF e_machine of NVIDIA cubins


@tilejit.kernel
def scale(X, Y, s, n, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK] * s + n


from kernels import matmul  # noqa: E402  (the matmul of examples/matmul.py, shared by the test layers)


def compile_scale(arch: str = "sm_80", device: str = "meta"):
    """Compile ``scale`` through a fresh Kernel object (no in-memory hit from an earlier test)."""
    x = torch.empty(4096, device=device)
    return tilejit.kernel(scale.fn).compile(x, x, 0.5, 3, BLOCK=256, arch=arch)


def compile_matmul(arch: str, device: str = "meta"):
    a = torch.empty(512, 512, dtype=torch.float16, device=device)
    return tilejit.kernel(matmul.fn).compile(a, a, a, BM=128, BN=128, BK=32, num_warps=4, arch=arch)


def cubin_sm(cubin: bytes) -> int:
    """The SM number an sm_80..sm_90a cubin is built for (ELF e_flags' low byte); -1 if it is no cubin."""
    if cubin[:4] != b"\x7fELF" or int.from_bytes(cubin[18:20], "little") != EM_CUDA:
        return -1
    return int.from_bytes(cubin[48:52], "little") & 0xFF


def count_nvrtc_calls(record) -> None:
    """Wrap NVRTC's entry point so each compile calls ``record()`` first."""
    real = nvrtc._run_nvrtc

    def counted(*args, **kwargs):
        record()
        return real(*args, **kwargs)

    nvrtc._run_nvrtc = counted


@pytest.fixture
def root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(root))
    for name in ("TILEJIT_ALWAYS_COMPILE", "TILEJIT_KEEP_PTX", "TILEJIT_ARCH", "TILEJIT_LOCK_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(kernel_cache, "_default_cache", None)
    monkeypatch.setattr(kernel_cache, "_warned_unwritable", False)
    return root


@pytest.fixture
def nvrtc_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(nvrtc, "_run_nvrtc", nvrtc._run_nvrtc)  # restored after the test
    count_nvrtc_calls(lambda: calls.append(1))
    return lambda: len(calls)


def new_process_state(monkeypatch) -> None:
    """Forget the in-memory cache, as a new process would (the disk stays)."""
    monkeypatch.setattr(kernel_cache, "_default_cache", None)


def child_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TILEJIT_ALWAYS_COMPILE", "TILEJIT_KEEP_PTX")}
    env["TILEJIT_CACHE_DIR"] = str(root)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return env


# Compiles `scale` for sm_80 (optionally after waiting for a go-file), records each NVRTC call in a marker
# file, and prints what it got as JSON.
_CHILD = """
import hashlib, json, os, sys, time
sys.path[:0] = {tests!r}
import test_cache_kernels as t
t.count_nvrtc_calls(lambda: open({marker!r}, "a").write(str(os.getpid()) + chr(10)))
ready, go = {ready!r}, {go!r}
if go:
    open(ready + str(os.getpid()), "w").close()
    while not os.path.exists(go):
        time.sleep(0.002)
compiled = t.compile_scale("sm_80")
cubin = compiled.asm["cubin"]
print(json.dumps({{"from_disk": compiled.from_disk, "key": compiled.key, "sha256": hashlib.sha256(cubin).hexdigest(),
                  "meta_sha256": compiled.meta["sha256"], "sm": t.cubin_sm(cubin), "pid": os.getpid()}}))
"""


def _child_code(marker: Path, ready: str = "", go: str = "") -> str:
    return _CHILD.format(tests=[str(REPO / "tests" / "runtime"), str(REPO / "tests")], marker=str(marker), ready=ready, go=go)


def _pids(marker: Path) -> list[int]:
    return [int(line) for line in marker.read_text().split()] if marker.exists() else []


def test_hit_across_processes_does_not_run_nvrtc(root, tmp_path):
    marker = tmp_path / "nvrtc_calls"
    results = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _child_code(marker)], env=child_env(root),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        results.append(json.loads(done.stdout))
    first, second = results
    assert (first["from_disk"], second["from_disk"]) == (False, True)
    assert first["key"] == second["key"] and first["sha256"] == second["sha256"] == second["meta_sha256"]
    assert first["sm"] == second["sm"] == 80
    assert set(_pids(marker)) == {first["pid"]}  # the second process never called NVRTC
    entry = KernelCache(root).load(first["key"])
    assert entry is not None and hashlib.sha256(entry.binary).hexdigest() == first["sha256"]


def test_eight_processes_compile_once_and_all_get_the_cubin(root, tmp_path):
    marker, go, ready = tmp_path / "nvrtc_calls", tmp_path / "go", str(tmp_path / "ready-")
    code = _child_code(marker, ready=ready, go=str(go))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=child_env(root), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]
    try:
        deadline = time.monotonic() + 300
        while len(list(tmp_path.glob("ready-*"))) < 8:  # all imported and waiting: start them together
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a child died early"
            time.sleep(0.05)
        go.touch()
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * 8, "\n".join(err for _, err in outs)
    got = [json.loads(out) for out, _ in outs]
    compilers = set(_pids(marker))
    assert len(compilers) == 1
    assert sorted(r["from_disk"] for r in got) == [False] + [True] * 7
    assert [r["pid"] for r in got if not r["from_disk"]] == list(compilers)
    assert len({r["key"] for r in got}) == 1 and len({r["sha256"] for r in got}) == 1
    assert all(r["sha256"] == r["meta_sha256"] and r["sm"] == 80 for r in got)
    shard = root / got[0]["key"][:2]
    assert [p.name for p in shard.iterdir()] == [got[0]["key"]]  # no lock, temp or trash left behind


def _truncate_cubin(path: Path) -> None:
    data = (path / "kernel.cubin").read_bytes()
    (path / "kernel.cubin").write_bytes(data[:len(data) // 2])


def _flip_a_cubin_byte(path: Path) -> None:
    data = bytearray((path / "kernel.cubin").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / "kernel.cubin").write_bytes(bytes(data))


def _wrong_checksum(path: Path) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta["sha256"] = hashlib.sha256(b"something else").hexdigest()
    (path / "meta.json").write_text(json.dumps(meta))


def _half_written_meta(path: Path) -> None:
    text = (path / "meta.json").read_text()
    (path / "meta.json").write_text(text[:len(text) // 2])


def _meta_missing(path: Path) -> None:
    (path / "meta.json").unlink()


def _only_a_temp_dir(path: Path) -> None:
    # A writer killed before its rename leaves a temp dir and no entry.
    path.rename(path.with_name(f"{path.name}.tmp-99999-0badf00d"))
    (path.with_name(f"{path.name}.tmp-99999-0badf00d") / "meta.json").unlink()


def _garbage_cuda_source(path: Path) -> None:
    (path / "kernel.cu").write_text("garbage\n")


def _cuda_source_missing(path: Path) -> None:
    (path / "kernel.cu").unlink()


@pytest.mark.parametrize("damage", [_truncate_cubin, _flip_a_cubin_byte, _wrong_checksum, _half_written_meta,
                                    _meta_missing, _only_a_temp_dir, _garbage_cuda_source, _cuda_source_missing])
def test_damaged_real_entry_is_recompiled(root, nvrtc_calls, monkeypatch, damage):
    first = compile_scale()
    good = first.asm["cubin"]
    assert nvrtc_calls() == 1 and cubin_sm(good) == 80
    damage(first.entry.path)
    new_process_state(monkeypatch)
    again = compile_scale()
    assert not again.from_disk and nvrtc_calls() == 2
    assert again.asm["cubin"] == good and again.key == first.key
    new_process_state(monkeypatch)
    third = compile_scale()
    assert third.from_disk and nvrtc_calls() == 2 and third.asm["cubin"] == good
    assert hashlib.sha256(third.entry.binary).hexdigest() == third.meta["sha256"]
    assert "__global__" in again.asm["cuda"] and third.asm["cuda"] == again.asm["cuda"]


def _unwritable_root(kind: str, tmp_path: Path) -> Path:
    if kind == "read_only_dir":
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        if os.access(ro, os.W_OK):
            pytest.skip("chmod 0500 does not stop this user (root); the under_a_file case covers it")
        return ro
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a regular file, so no cache can be created under it")
    return blocker / "cache"


@pytest.mark.parametrize("kind", ["read_only_dir", "under_a_file"])
def test_unwritable_cache_dir_compiles_into_memory_with_one_warning(root, tmp_path, monkeypatch, nvrtc_calls,
                                                                    kind):
    unwritable = _unwritable_root(kind, tmp_path)
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(unwritable))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = compile_scale("sm_80")
        b = compile_scale("sm_90a")
        again = compile_scale("sm_80")
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1, [str(w.message) for w in caught]
    assert str(unwritable) in str(runtime[0].message) and "TILEJIT_CACHE_DIR" in str(runtime[0].message)
    assert nvrtc_calls() == 2  # the third call is served from memory
    assert a.entry.path is None and b.entry.path is None and again.key == a.key
    assert cubin_sm(a.asm["cubin"]) == 80 and cubin_sm(b.asm["cubin"]) == 90
    assert "tj_scale" in a.asm["cuda"] and ".target sm_80" in a.asm["ptx"] and "scale" in a.asm["ir"]
    if kind == "read_only_dir":
        assert list(unwritable.iterdir()) == []


def test_read_only_cache_that_is_already_warm_is_used(root, tmp_path, monkeypatch, nvrtc_calls):
    warm = compile_scale()
    assert nvrtc_calls() == 1
    for path in [root, *root.rglob("*")]:
        path.chmod(0o500 if path.is_dir() else 0o400)
    try:
        if os.access(root, os.W_OK):
            pytest.skip("chmod does not stop this user (root)")
        new_process_state(monkeypatch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hit = compile_scale()
        assert hit.from_disk and nvrtc_calls() == 1 and hit.asm["cubin"] == warm.asm["cubin"]
        assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
    finally:
        for path in [root, *root.rglob("*")]:
            path.chmod(0o700 if path.is_dir() else 0o600)


def test_aot_warm_up_on_meta_tensors_is_what_a_launch_finds(root, nvrtc_calls, monkeypatch, capsys):
    from tilejit.target import Arch

    assert Arch.for_capability(9, 0).name == "sm_90a"  # what an H100/H200 launch compiles for
    aot = compile_matmul("sm_90a")
    assert not aot.from_disk and nvrtc_calls() == 1 and cubin_sm(aot.asm["cubin"]) == 90
    # A later process with real (16-byte aligned, row-major) tensors of other sizes hits that entry.
    new_process_state(monkeypatch)
    a, b, c = torch.empty(300, 200, dtype=torch.float16), torch.empty(200, 96, dtype=torch.float16), \
        torch.empty(300, 96, dtype=torch.float16)
    hit = tilejit.kernel(matmul.fn).compile(a, b, c, BM=128, BN=128, BK=32, num_warps=4, arch="sm_90a")
    assert hit.from_disk and hit.key == aot.key and nvrtc_calls() == 1

    assert cli.main(["cache", "list"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    row = next(r for r in rows if r and r[0] == aot.key[:12])
    assert row[1:3] == ["matmul", "sm_90a"]
    assert cli.main(["cache", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["entries"]
    assert [(e["key"], e["meta"]["arch"], e["meta"]["sha256"]) for e in listed] == \
        [(aot.key, "sm_90a", hashlib.sha256(aot.asm["cubin"]).hexdigest())]
    assert cli.main(["cache", "show", aot.key[:12], "--cuda"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == aot.asm["cuda"].rstrip("\n")
    assert cli.main(["cache", "show", aot.key[:12]]) == 0
    shown = capsys.readouterr().out
    assert "matmul" in shown and "sm_90a" in shown and str(aot.entry.path) in shown


def test_asm_holds_ir_cuda_ptx_cubin(root, monkeypatch):
    compiled = compile_scale("sm_80")
    asm = compiled.asm
    for name in ("ir", "cuda", "ptx", "cubin"):
        assert name in asm
    assert isinstance(asm["cubin"], bytes) and cubin_sm(asm["cubin"]) == 80
    assert "tj.func @scale" in asm["ir"]
    assert 'extern "C"' in asm["cuda"] and "tj_scale" in asm["cuda"]
    assert ".target sm_80" in asm["ptx"] and ".entry tj_scale" in asm["ptx"]
    with pytest.raises(KeyError):
        asm["llvm"]
    # Read back from disk in a new process: the same artifacts.
    new_process_state(monkeypatch)
    loaded = compile_scale("sm_80")
    assert loaded.from_disk
    assert {n: loaded.asm[n] for n in ("ir", "cuda", "ptx", "cubin")} == \
        {n: asm[n] for n in ("ir", "cuda", "ptx", "cubin")}


def test_asm_sass_is_present_exactly_when_a_disassembler_is(root):
    asm = compile_scale("sm_80").asm
    have_tool = find_tool("cuobjdump") is not None or find_tool("nvdisasm") is not None
    assert ("sass" in asm) == have_tool
    if have_tool:
        assert "tj_scale" in asm["sass"]
    else:
        assert asm.get("sass") is None
        with pytest.raises(KeyError):
            asm["sass"]


def test_ptx_is_absent_when_not_kept(root, monkeypatch):
    monkeypatch.setenv("TILEJIT_KEEP_PTX", "0")
    asm = compile_scale("sm_80").asm
    assert "ptx" not in asm and "cuda" in asm and cubin_sm(asm["cubin"]) == 80
    with pytest.raises(KeyError):
        asm["ptx"]


# ---- compile-time extents: a disk hit needs no frontend ---------------------------------------------------

@tilejit.kernel
def double_rows(X, Y, BM: T.constexpr):
    m0 = T.program_id(0) * BM
    Y[m0:m0 + BM, :] = X[m0:m0 + BM, :] * 2.0  # a full ':' slice: X's and Y's extent 1 is compiled in


def compile_double_rows(cols: int):
    x = torch.empty(256, cols, device="meta")
    return tilejit.kernel(double_rows.fn).compile(x, x, BM=32, arch="sm_80")


def test_compile_time_extents_are_recorded_so_a_disk_hit_skips_the_frontend(root, monkeypatch, nvrtc_calls):
    first = compile_double_rows(64)
    assert not first.from_disk and nvrtc_calls() == 1
    record = KernelCache().read_extents(tilejit.kernel(double_rows.fn).source_hash())
    assert record == {"X": [1], "Y": [1]}

    new_process_state(monkeypatch)
    frontend_runs = []
    import tilejit.frontend.visitor as visitor

    real_build = visitor.build_function
    monkeypatch.setattr(visitor, "build_function",
                        lambda *a, **k: frontend_runs.append(1) or real_build(*a, **k))
    again = compile_double_rows(64)
    assert again.from_disk and again.key == first.key and frontend_runs == [] and nvrtc_calls() == 1

    # Another extent is another kernel: a miss, compiled (with the frontend), under its own key.
    other = compile_double_rows(32)
    assert not other.from_disk and other.key != first.key and frontend_runs and nvrtc_calls() == 2


def test_a_lost_extents_record_costs_a_frontend_run_not_a_wrong_kernel(root, monkeypatch, nvrtc_calls):
    first = compile_double_rows(64)
    new_process_state(monkeypatch)
    for path in (root / "extents").iterdir():
        path.unlink()
    again = compile_double_rows(64)
    assert again.from_disk and again.key == first.key and nvrtc_calls() == 1
    assert KernelCache().read_extents(tilejit.kernel(double_rows.fn).source_hash()) == {"X": [1], "Y": [1]}
