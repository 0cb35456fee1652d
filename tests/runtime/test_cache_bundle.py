"""``tilejit cache export`` / ``import``: real NVRTC entries shipped in a tar to a fresh cache directory, which
then finds them without calling NVRTC; damaged or hostile bundles refused member by member, each one named."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest
import torch

import tilejit
from tilejit import cli
from tilejit.autotuner import Autotuner
from tilejit.backend_cuda import nvrtc
from tilejit.cache import kernel_cache
from tilejit.errors import BackendUnavailableError

from test_autotune import FakeBench, FakeKernel, configs_for, launch  # noqa: E402  (tests/runtime is on the path)
from test_cache_kernels import compile_matmul, compile_scale, cubin_sm  # noqa: E402


@pytest.fixture
def use_dir(monkeypatch):
    """Point the process at a cache directory, forgetting the in-memory cache (as a new process would)."""
    for name in ("TILEJIT_ALWAYS_COMPILE", "TILEJIT_ARCH", "TILEJIT_REMOTE_CACHE"):
        monkeypatch.delenv(name, raising=False)

    def use(path):
        monkeypatch.setenv("TILEJIT_CACHE_DIR", str(path))
        monkeypatch.setattr(kernel_cache, "_default_cache", None)
        return path
    return use


def no_nvrtc(monkeypatch) -> None:
    def absent(*args, **kwargs):
        raise AssertionError("NVRTC was called for a kernel the bundle holds")
    monkeypatch.setattr(nvrtc, "_run_nvrtc", absent)


@pytest.fixture
def warm_bundle(tmp_path, use_dir):
    """A cache with two kernels (scale for sm_80 and sm_90a, matmul for sm_90a) and an autotune record,
    exported whole; (bundle path, {arch: scale's cubin}, matmul's cubin)."""
    use_dir(tmp_path / "built")
    cubins = {arch: compile_scale(arch).asm["cubin"] for arch in ("sm_80", "sm_90a")}
    matmul_cubin = compile_matmul("sm_90a").asm["cubin"]
    kernel = FakeKernel("bundled")
    launch(Autotuner(kernel, configs_for(32, 64), key=["M"], bench_fn=FakeBench(kernel, {32: 2.0, 64: 1.0})))
    bundle = tmp_path / "kernels.tar.gz"
    assert cli.main(["cache", "export", str(bundle)]) == 0
    return bundle, cubins, matmul_cubin


def test_an_imported_cache_needs_no_nvrtc(tmp_path, monkeypatch, use_dir, warm_bundle, capsys):
    bundle, cubins, matmul_cubin = warm_bundle
    use_dir(tmp_path / "shipped")
    assert cli.main(["cache", "import", str(bundle)]) == 0
    assert "imported 3 entries, 1 autotune records" in capsys.readouterr().out
    use_dir(tmp_path / "shipped")  # a process started after the import
    no_nvrtc(monkeypatch)
    for arch, cubin in cubins.items():
        loaded = compile_scale(arch)
        assert loaded.origin == "disk" and loaded.asm["cubin"] == cubin
    matmul = compile_matmul("sm_90a")
    assert matmul.origin == "disk" and matmul.asm["cubin"] == matmul_cubin and cubin_sm(matmul_cubin) == 90
    # The tuned choice came along: a tuner here times nothing.
    kernel = FakeKernel("bundled")
    bench = FakeBench(kernel, {32: 0.1, 64: 9.0})
    tuner = Autotuner(kernel, configs_for(32, 64), key=["M"], bench_fn=bench)
    launch(tuner)
    assert tuner.best_config.kwargs["BM"] == 64 and bench.timed == []


def no_nvrtc_library(monkeypatch) -> None:
    """As on a machine where libnvrtc cannot be loaded at all: every question to the library fails."""
    def unloadable():
        raise BackendUnavailableError("cannot load the NVRTC library: libnvrtc.so.13: not found")
    monkeypatch.setattr(nvrtc, "_nvrtc", unloadable)
    for cached in (nvrtc.nvrtc_version, nvrtc._library_version):
        cached.cache_clear()
    monkeypatch.setattr(nvrtc, "_recorded_version", lambda: None)


def test_an_imported_cache_launches_where_nvrtc_cannot_load(tmp_path, monkeypatch, use_dir, warm_bundle, capsys):
    bundle, cubins, matmul_cubin = warm_bundle
    shipped = use_dir(tmp_path / "shipped")
    assert cli.main(["cache", "import", str(bundle)]) == 0
    assert json.loads((shipped / "nvrtc-imported.json").read_text())["versions"] == [list(nvrtc.nvrtc_version())]
    use_dir(shipped)
    no_nvrtc_library(monkeypatch)
    for arch, cubin in cubins.items():
        loaded = compile_scale(arch)
        assert loaded.origin == "disk" and loaded.asm["cubin"] == cubin
    assert compile_matmul("sm_90a").asm["cubin"] == matmul_cubin
    # A kernel the bundle does not hold needs NVRTC, and says so.
    with pytest.raises(BackendUnavailableError, match="cannot load the NVRTC library"):
        compile_scale("sm_100a")


def test_without_nvrtc_or_an_import_the_error_says_how_to_get_nvrtc(tmp_path, monkeypatch, use_dir):
    use_dir(tmp_path / "empty")
    no_nvrtc_library(monkeypatch)
    with pytest.raises(BackendUnavailableError, match="cannot load the NVRTC library"):
        compile_scale("sm_80")


def test_export_of_named_kernels_only(tmp_path, use_dir, warm_bundle, capsys):
    use_dir(tmp_path / "built")
    only = tmp_path / "scale.tar"
    assert cli.main(["cache", "export", str(only), "--kernel", "scale"]) == 0
    with tarfile.open(only) as tar:
        keys = {name.split("/")[1] for name in tar.getnames() if name.startswith("entries/")}
        metas = [json.loads(tar.extractfile(f"entries/{key}/meta.json").read()) for key in keys]
        assert not any(name.startswith("autotune/") for name in tar.getnames())
    assert len(keys) == 2 and {meta["kernel"] for meta in metas} == {"scale"}


def test_importing_twice_keeps_what_is_there(tmp_path, use_dir, warm_bundle, capsys):
    bundle, _, _ = warm_bundle
    use_dir(tmp_path / "shipped")
    assert cli.main(["cache", "import", str(bundle)]) == 0
    assert cli.main(["cache", "import", str(bundle)]) == 0
    assert "imported 3 entries, 0 autotune records" in capsys.readouterr().out.splitlines()[-1]
    assert len(list((tmp_path / "shipped" / "autotune").iterdir())) == 1


# ---- damaged and hostile bundles ----------------------------------------------------------------------------------

def members(bundle) -> dict[str, bytes]:
    with tarfile.open(bundle) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def write_tar(path, files: dict[str, bytes], extra=()) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)


def entry_of(files: dict[str, bytes], kernel: str, arch: str) -> str:
    for name, data in files.items():
        if name.endswith("/meta.json"):
            meta = json.loads(data)
            if meta["kernel"] == kernel and meta["arch"] == arch:
                return name.rsplit("/", 1)[0]
    raise AssertionError(f"no {kernel} for {arch} in the bundle")


def _flip_a_cubin_byte(files, entry):
    cubin = bytearray(files[f"{entry}/kernel.cubin"])
    cubin[len(cubin) // 2] ^= 0xFF
    files[f"{entry}/kernel.cubin"] = bytes(cubin)
    return "kernel.cubin does not match its digest"


def _meta_changed(files, entry):
    meta = json.loads(files[f"{entry}/meta.json"])
    meta["threads"] = 64
    files[f"{entry}/meta.json"] = json.dumps(meta).encode()
    return "meta.json does not match meta.sha256"


def _meta_invalid_with_its_digest_redone(files, entry):
    meta = json.loads(files[f"{entry}/meta.json"])
    meta["shared_bytes"] = -1
    files[f"{entry}/meta.json"] = data = json.dumps(meta).encode()
    files[f"{entry}/meta.sha256"] = hashlib.sha256(data).hexdigest().encode()
    return "shared_bytes"


def _file_missing(files, entry):
    del files[f"{entry}/kernel.cu"]
    return "are not those meta.json lists"


def _extra_file(files, entry):
    files[f"{entry}/kernel.so"] = b"\x7fELF planted"
    return "are not those meta.json lists"


def _under_another_key(files, entry):
    other = entry[:-1] + ("0" if entry[-1] != "0" else "1")
    for name in [n for n in files if n.startswith(entry + "/")]:
        files[other + name[len(entry):]] = files.pop(name)
    return "does not describe this key"


@pytest.mark.parametrize("damage", [_flip_a_cubin_byte, _meta_changed, _meta_invalid_with_its_digest_redone,
                                    _file_missing, _extra_file, _under_another_key])
def test_a_damaged_entry_is_refused_by_name_and_the_rest_imported(tmp_path, monkeypatch, use_dir, warm_bundle,
                                                                  capsys, damage):
    bundle, cubins, _ = warm_bundle
    files = members(bundle)
    bad = entry_of(files, "scale", "sm_80")
    why = damage(files, bad)
    damaged = tmp_path / "damaged.tar"
    write_tar(damaged, files)
    use_dir(tmp_path / "shipped")
    assert cli.main(["cache", "import", str(damaged)]) == 1
    out, err = capsys.readouterr()
    refused = [line for line in err.splitlines() if line.startswith("tilejit: refused")]
    assert len(refused) == 1 and "entries/" in refused[0] and why in refused[0], err
    assert "imported 2 entries" in out and "refused 1" in out
    use_dir(tmp_path / "shipped")
    no_nvrtc(monkeypatch)
    assert compile_scale("sm_90a").asm["cubin"] == cubins["sm_90a"]


def _link(name: str, target: str, kind=tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize("hostile", [
    {"name": "../outside.txt"},
    {"name": "/tmp/absolute.txt"},
    {"name": "entries/../../outside.txt"},
    {"name": "entries/abcd/../../outside.txt"},
    {"name": "autotune/../outside.json"},
    {"name": "entries/ABCD/kernel.cubin"},
    {"name": "entries/abcd/.hidden"},
    {"name": "native/launch.so"},
    {"link": _link("entries/abcd/kernel.cubin", "/etc/passwd")},
    {"link": _link("autotune/x-ab.json", "/etc/passwd", tarfile.LNKTYPE)},
    {"link": _link("extents/ab.json", "", tarfile.FIFOTYPE)},
])
def test_hostile_members_are_refused_and_nothing_lands_outside(tmp_path, use_dir, warm_bundle, capsys, hostile):
    bundle, _, _ = warm_bundle
    files = members(bundle)
    extra = []
    if "name" in hostile:
        files[hostile["name"]] = b"planted"
        name = hostile["name"]
    else:
        extra.append(hostile["link"])
        name = hostile["link"].name
    evil = tmp_path / "sub" / "evil.tar"
    evil.parent.mkdir()
    write_tar(evil, files, extra)
    shipped = use_dir(tmp_path / "sub" / "shipped")
    assert cli.main(["cache", "import", str(evil)]) == 1
    out, err = capsys.readouterr()
    assert f"refused {name}:" in err and "imported 3 entries" in out, err
    assert not (tmp_path / "outside.txt").exists() and not (tmp_path / "sub" / "outside.txt").exists()
    assert not (tmp_path / "sub" / "outside.json").exists()
    assert not any(p.is_symlink() for p in shipped.rglob("*"))
    assert not (shipped / "native").exists()


def test_a_file_that_is_no_tar_is_one_error(tmp_path, use_dir, capsys):
    use_dir(tmp_path / "shipped")
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    assert cli.main(["cache", "import", str(junk)]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_a_truncated_bundle_is_one_error(tmp_path, use_dir, warm_bundle, capsys):
    bundle, _, _ = warm_bundle
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(bundle.read_bytes()[:len(bundle.read_bytes()) // 2])
    use_dir(tmp_path / "shipped")
    assert cli.main(["cache", "import", str(cut)]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_bad_autotune_records_are_refused(tmp_path, use_dir, warm_bundle, capsys):
    bundle, _, _ = warm_bundle
    files = members(bundle)
    (name,) = [n for n in files if n.startswith("autotune/")]
    records = json.loads(files[name])
    (key,) = records
    records[key]["timings_ms"] = {"a": -1.0}
    files[name] = json.dumps(records).encode()
    damaged = tmp_path / "records.tar"
    write_tar(damaged, files)
    use_dir(tmp_path / "shipped")
    assert cli.main(["cache", "import", str(damaged)]) == 1
    out, err = capsys.readouterr()
    assert "timings_ms" in err and name in err and "imported 3 entries, 0 autotune records" in out
