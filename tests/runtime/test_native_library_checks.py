"""The launcher library is checked as a loadable ELF shared object of the recorded size before ``dlopen``.

A digest file rewritten to match damaged bytes must not let them reach ``dlopen``: a truncated library killed
the process with SIGBUS, random bytes raised an uncaught ImportError. The loading runs in a subprocess, so a
crash shows as a signal and fails the test.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tilejit.runtime import native, shared_object

try:
    native.compiler()
    _MISSING = None
except native.NativeBuildError as _error:
    _MISSING = str(_error)
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"cannot build the native launcher here: {_MISSING}")

E_MACHINE_OFFSET = 18
HOST = shared_object.host_identity()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> bytes:
    """The bytes of a launcher library built from the package's source."""
    root = tmp_path_factory.mktemp("native-check") / "cache"
    run_loader(root, "build")
    return native.library_path(root / "native").read_bytes()


def other_machine(data: bytes) -> bytes:
    order = "<" if data[5] == 1 else ">"
    machine = struct.unpack_from(order + "H", data, E_MACHINE_OFFSET)[0]
    patched = bytearray(data)
    struct.pack_into(order + "H", patched, E_MACHINE_OFFSET, 183 if machine != 183 else 62)  # aarch64 / x86-64
    return bytes(patched)


DAMAGE = {
    "truncated": lambda good: good[: len(good) * 2 // 3],
    "random bytes": lambda good: os.urandom(len(good)),
    "wrong machine": other_machine,
}

LOADER = textwrap.dedent("""
    import json, sys, warnings
    from tilejit.runtime import native

    if sys.argv[1] == "no compiler":
        def no_build(path):
            raise native.NativeBuildError("no C compiler in this test")
        native.build = no_build
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = native.load(), native.load()
    print(json.dumps({"loaded": first is not None, "same": first is second, "failure": native.failure(),
                      "warnings": [str(w.message) for w in caught if "native launcher" in str(w.message)]}))
""")


def run_loader(root: Path, mode: str) -> dict:
    env = {**os.environ, "TILEJIT_CACHE_DIR": str(root), "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("TILEJIT_NATIVE_LAUNCH", None)
    done = subprocess.run([sys.executable, "-c", LOADER, mode], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"the loading process ended with {done.returncode}:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def plant(root: Path, good: bytes, data: bytes) -> Path:
    """Put ``data`` where the library belongs, with a digest file rewritten to match it."""
    library = native.library_path(root / "native")
    library.parent.mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    library.write_bytes(data)
    os.chmod(library, 0o700)
    digest = library.with_name(library.name + ".sha256")
    digest.write_text(f"{hashlib.sha256(data).hexdigest()} {len(data)}\n")
    os.chmod(digest, 0o600)
    return library


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_library_with_a_matching_digest_is_rebuilt_not_loaded(built, tmp_path, damage):
    root = tmp_path / "cache"
    library = plant(root, built, DAMAGE[damage](built))
    report = run_loader(root, "build")
    assert report["loaded"] and report["same"] and report["warnings"] == [], report
    rebuilt = library.read_bytes()
    assert shared_object.loading_problem(rebuilt, HOST) is None
    assert library.with_name(library.name + ".sha256").read_text() == \
        f"{hashlib.sha256(rebuilt).hexdigest()} {len(rebuilt)}\n"


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_library_that_cannot_be_rebuilt_falls_back_with_one_warning(built, tmp_path, damage):
    root = tmp_path / "cache"
    plant(root, built, DAMAGE[damage](built))
    report = run_loader(root, "no compiler")
    assert not report["loaded"] and len(report["warnings"]) == 1, report
    assert "no C compiler in this test" in report["failure"] and "cannot be loaded" in report["failure"]
    assert "Python path" in report["warnings"][0]


def test_a_size_other_than_the_recorded_one_is_refused(built, tmp_path):
    library = plant(tmp_path / "cache", built, built)
    library.with_name(library.name + ".sha256").write_text(f"{hashlib.sha256(built).hexdigest()} {len(built) + 1}\n")
    with pytest.raises(native.NativeBuildError, match="bytes; it was built with"):
        native.load_verified(library)
    library.with_name(library.name + ".sha256").write_text(hashlib.sha256(built).hexdigest() + "\n")
    with pytest.raises(native.NativeBuildError, match="a digest and a size"):
        native.load_verified(library)


def test_the_built_library_passes(built):
    assert shared_object.loading_problem(built, HOST) is None


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99])
def test_every_truncation_is_refused(built, fraction):
    for cut in (int(len(built) * fraction), len(built) - 1):
        assert shared_object.loading_problem(built[:cut], HOST) is not None, cut


def test_headers_that_point_past_the_end_are_refused(built):
    order = "<" if built[5] == 1 else ">"
    sixty_four = built[4] == 2
    phoff_at, shoff_at = (32, 40) if sixty_four else (28, 32)
    address = order + ("Q" if sixty_four else "I")
    for field in (phoff_at, shoff_at):
        patched = bytearray(built)
        struct.pack_into(address, patched, field, len(built) - 8)
        assert "truncated" in shared_object.loading_problem(bytes(patched), HOST)


def test_the_wrong_machine_class_or_type_is_refused(built):
    assert "machine" in shared_object.loading_problem(other_machine(built), HOST)
    wrong_class = bytearray(built)
    wrong_class[4] = 1 if built[4] == 2 else 2
    assert "bit" in shared_object.loading_problem(bytes(wrong_class), HOST)
    executable = bytearray(built)
    struct.pack_into("<H" if built[5] == 1 else ">H", executable, 16, 2)  # ET_EXEC
    assert "not a shared object" in shared_object.loading_problem(bytes(executable), HOST)
    assert "no ELF magic" in shared_object.loading_problem(b"\x00" * 4096, HOST)
