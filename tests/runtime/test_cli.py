"""The `tilejit` console command: every sub-command, its errors, and 80-column human output."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tilejit import cli
from tilejit.cache import KernelCache
from test_cache import write_meta

REPO = Path(__file__).resolve().parents[2]
# Two keys sharing the prefix "ab" (ambiguous), one elsewhere.
KEYS = ["ab" + "0" * 62, "ab" + "1" * 62, "cd" + "2" * 62]
LONG_KERNEL = "fused_attention_forward_kernel_with_a_very_long_name"
LONG_SIGNATURE = ", ".join(["*fp16:16"] * 12 + ["i32"] * 6)


def _store(cache: KernelCache, key: str, kernel: str, sass: bool = False, ptx: bool = True):
    files = {"kernel.cubin": b"\x7fELF" + key.encode(), "kernel.cu": f"__global__ void {kernel}() {{}}\n",
             "kernel.ir": f"func {kernel}()\n"}
    if ptx:
        files["kernel.ptx"] = ".version 8.0\n"
    if sass:
        files["kernel.sass"] = "        /*0000*/  MOV R1, c[0x0][0x28] ;\n"
    meta = {"kernel": kernel, "signature": LONG_SIGNATURE, "arch": "sm_100a", "threads": 384,
            "shared_bytes": 232448, "registers": 168, "spills": 0, "compile_seconds": 1.25,
            "versions": {"tilejit": "0.1.0", "nvrtc": "12.8", "torch": "2.6.0"}, "binary": "kernel.cubin"}
    return cache.store(key, files, meta)


@pytest.fixture
def root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(root))
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal, like CI
    monkeypatch.setenv("COLUMNS", "80")  # `cache list` fits the terminal: an 80-column one, whatever runs pytest
    return root


@pytest.fixture
def filled(root):
    cache = KernelCache()
    _store(cache, KEYS[0], LONG_KERNEL, sass=True)
    _store(cache, KEYS[1], "add", ptx=False)
    _store(cache, KEYS[2], "matmul")
    record = root / "autotune" / f"matmul-{'e' * 64}.json"  # named as the autotuner names them
    record.parent.mkdir()
    record.write_text(json.dumps({
        "kernel": "matmul", "key": [4096, 4096, 4096, "float16"],
        "config": {"kwargs": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}, "num_warps": 8, "num_stages": 4},
        "timings_ms": {"cfg0": 1.75, "cfg1": 1.5}, "created": time.time() - 3 * 86400}))
    return root


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_fits_80_columns(text: str, except_lines: tuple[str, ...] = ()) -> None:
    for line in text.splitlines():
        if line not in except_lines:
            assert len(line) <= 80, f"{len(line)} columns: {line!r}"


def test_version(capsys):
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out.startswith("tilejit ") and out.split()[1][0].isdigit()


def test_module_entry_point_runs_without_importing_heavy_modules(root):
    code = ("import sys; import tilejit.cache; before = set(sys.modules); import tilejit.cli; "
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('torch', 'tilejit')))")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    imported = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "['tilejit.cli']"
    done = subprocess.run([sys.executable, "-m", "tilejit.cli", "cache", "path"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == str(root)


def test_no_command_prints_help_and_fails(capsys, root):
    rc, out, _ = run(capsys)
    assert rc == 1 and "cache" in out
    rc, out, _ = run(capsys, "cache")
    assert rc == 1 and "prune" in out


def test_a_warning_during_a_command_prints_as_one_line(capsys, root, monkeypatch):
    import warnings

    def path_that_warns(args):
        warnings.warn("tilejit: a cache warning", RuntimeWarning)
        warnings.warn("something else", UserWarning)
        return 0

    monkeypatch.setattr(cli, "_cmd_path", path_that_warns)
    assert cli.main(["cache", "path"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == ["tilejit: a cache warning", "tilejit: warning: something else"], err
    assert warnings.showwarning is not cli._show_warning  # put back after the command


def test_path(capsys, root):
    assert run(capsys, "cache", "path") == (0, f"{root}\n", "")


def test_list_tables_fit_80_columns(capsys, filled):
    rc, out, err = run(capsys, "cache", "list")
    assert rc == 0 and err == ""
    assert_fits_80_columns(out)
    lines = out.splitlines()
    assert lines[0].split() == ["KEY", "KERNEL", "ARCH", "SIGNATURE", "SIZE", "AGE"]
    rows = {line.split()[0]: line for line in lines[1:4]}
    assert set(rows) == {k[:12] for k in KEYS}
    assert "sm_100a" in rows[KEYS[0][:12]] and "fused_attention" in rows[KEYS[0][:12]]
    assert rows[KEYS[2][:12]].split()[1] == "matmul" and rows[KEYS[2][:12]].endswith("0s")
    assert lines[4].startswith("3 kernels, ")
    autotune = lines[lines.index("") + 1:]
    assert autotune[0].split()[0] == "AUTOTUNED"
    assert autotune[1].split()[0] == "matmul" and "BLOCK_M=128" in autotune[1]
    assert autotune[1].split()[-2:] == ["1.5", "3d"]


def _store_big(root) -> str:
    """An entry of about 405 KiB with the long signature; returns its key."""
    key = "ef" + "3" * 62
    entry = _store(KernelCache(), key, "matmul")
    (entry.path / "kernel.cubin").write_bytes(b"\0" * 415_000)
    return key


@pytest.mark.parametrize("columns", [40, 80, 120])
def test_list_never_cuts_a_number_and_fits_the_terminal(capsys, filled, monkeypatch, columns):
    key = _store_big(filled)
    monkeypatch.setenv("COLUMNS", str(columns))
    rc, out, _ = run(capsys, "cache", "list")
    row = next(line for line in out.splitlines() if line.startswith(key[:12]))
    size = format_size_of(filled, key)
    assert row.split()[-3:-1] == size.split() and row.split()[-1] == "0s", row  # size and age whole
    assert key[:12] in row and "sm_100a" in row
    if columns >= 80:  # below that even the columns that are never cut do not fit
        assert all(len(line) <= columns for line in out.splitlines())
    assert "..." in row and out.rstrip().endswith(f"(cut to {columns} columns; --wide shows every column whole)")


def format_size_of(root, key) -> str:
    entry = next(e for e in KernelCache().entries() if e.key == key)
    return cli.format_size(entry.size_bytes())


def test_list_shows_the_whole_signature_when_there_is_room(capsys, filled, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    rc, out, _ = run(capsys, "cache", "list")
    assert rc == 0 and "..." not in out and "cut to" not in out
    rows = [line for line in out.splitlines() if line[:12] in {k[:12] for k in KEYS}]
    assert len(rows) == 3 and all(LONG_SIGNATURE in row for row in rows)
    assert any(LONG_KERNEL in row for row in rows)


def test_list_wide_never_cuts(capsys, filled, monkeypatch):
    _store_big(filled)
    rc, out, _ = run(capsys, "cache", "list", "--wide")
    assert rc == 0 and "..." not in out and "cut to" not in out
    assert sum(LONG_SIGNATURE in line for line in out.splitlines()) == 4
    assert "BLOCK_M=128 BLOCK_N=256 BLOCK_K=64 num_warps=8 num_stages=4" in out


def test_list_empty(capsys, root):
    rc, out, _ = run(capsys, "cache", "list")
    assert rc == 0 and out == "no cached kernels\n"


def test_list_json(capsys, filled):
    rc, out, _ = run(capsys, "cache", "list", "--json")
    listing = json.loads(out)
    assert rc == 0 and listing["root"] == str(filled)
    assert sorted(e["key"] for e in listing["entries"]) == sorted(KEYS)
    first = next(e for e in listing["entries"] if e["key"] == KEYS[0])
    assert first["meta"]["kernel"] == LONG_KERNEL and first["size_bytes"] > 0
    assert Path(first["path"]).is_dir()
    assert [r["kernel"] for r in listing["autotune"]] == ["matmul"]
    assert listing["autotune"][0]["timings_ms"] == {"cfg0": 1.75, "cfg1": 1.5}


def test_show_by_unique_prefix(capsys, filled):
    rc, out, err = run(capsys, "cache", "show", "cd")
    entry_dir = filled / "cd" / KEYS[2]
    assert rc == 0 and err == ""
    assert_fits_80_columns(out, except_lines=(str(entry_dir),))
    fields = {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines() if line[:1].isalpha()}
    assert fields["key"] == KEYS[2] and fields["kernel"] == "matmul" and fields["arch"] == "sm_100a"
    assert fields["registers"] == "168" and "nvrtc=12.8" in fields["versions"]
    lines = out.splitlines()
    listed = [line.split()[0] for line in lines[lines.index(str(entry_dir)) + 1:]]
    assert listed == ["kernel.cu", "kernel.cubin", "kernel.ir", "kernel.ptx", "meta.json", "meta.sha256"]


def test_show_wraps_long_signatures_within_80_columns(capsys, filled):
    rc, out, _ = run(capsys, "cache", "show", KEYS[0][:8] + "0")
    assert rc == 0 and "signature" in out
    assert_fits_80_columns(out, except_lines=(str(filled / "ab" / KEYS[0]),))
    assert "".join(out.split()).count("*fp16:16") == 12


@pytest.mark.parametrize("flag, expected", [("--cuda", "__global__ void matmul() {}\n"),
                                            ("--ir", "func matmul()\n"), ("--ptx", ".version 8.0\n")])
def test_show_prints_one_file(capsys, filled, flag, expected):
    assert run(capsys, "cache", "show", KEYS[2], flag) == (0, expected, "")


def test_show_several_files_gets_headers(capsys, filled):
    rc, out, _ = run(capsys, "cache", "show", KEYS[2], "--cuda", "--ir")
    assert rc == 0
    assert out == "// ---- kernel.cu ----\n__global__ void matmul() {}\n// ---- kernel.ir ----\nfunc matmul()\n"


def test_show_sass_stored(capsys, filled):
    rc, out, _ = run(capsys, "cache", "show", KEYS[0], "--sass")
    assert rc == 0 and "MOV R1" in out


def test_show_sass_runs_cuobjdump_on_the_cubin(capsys, filled, tmp_path, monkeypatch):
    tools = tmp_path / "bin"
    tools.mkdir()
    fake = tools / "cuobjdump"
    fake.write_text('#!/bin/sh\necho "disassembled $1"; read -r cubin < "$2"; echo "$cubin"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tools))
    rc, out, _ = run(capsys, "cache", "show", KEYS[2], "--sass")
    # The tool reads a private copy of the checked cubin (not the entry's file, which could be a link or a FIFO).
    assert rc == 0 and out == f"disassembled -sass\n\x7fELF{KEYS[2]}\n"


def test_show_sass_without_tools_says_how_to_get_them(capsys, filled, monkeypatch):
    import tilejit.backend_cuda.sass as sass

    monkeypatch.setattr(sass, "find_tool", lambda name: None)
    rc, out, err = run(capsys, "cache", "show", KEYS[2], "--sass")
    assert rc == 1 and out == "" and len(err.splitlines()) == 1
    assert "pip install nvidia-cuda-cuobjdump" in err


@pytest.mark.parametrize("argv, message", [
    (["show", "ff"], "no cache entry"),
    (["show", "not-hex"], "no cache entry"),
    (["show", "ab"], "matches 2 entries"),
    (["show", KEYS[1], "--ptx"], "has no kernel.ptx"),
])
def test_show_errors_are_one_line_without_traceback(capsys, filled, argv, message):
    rc, out, err = run(capsys, "cache", *argv)
    assert rc == 1 and out == ""
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err
    assert_fits_80_columns(err)


def test_clear_needs_yes_without_a_terminal(capsys, filled):
    rc, out, err = run(capsys, "cache", "clear")
    assert rc == 1 and "--yes" in err and len(KernelCache().entries()) == 3


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("answer, remaining", [("n\n", 3), ("y\n", 0)])
def test_clear_asks_on_a_terminal(capsys, filled, monkeypatch, answer, remaining):
    monkeypatch.setattr(sys, "stdin", _Terminal(answer))
    rc, out, _ = run(capsys, "cache", "clear")
    assert rc == 0 and len(KernelCache().entries()) == remaining


def test_clear_yes_removes_entries_and_autotune_records(capsys, filled):
    rc, out, _ = run(capsys, "cache", "clear", "--yes")
    assert rc == 0 and out == "removed 4 entries (kernels and autotune records)\n"
    assert KernelCache().entries() == [] and KernelCache().autotune_records() == []
    assert run(capsys, "cache", "list")[1] == "no cached kernels\n"


def test_prune_older_than(capsys, filled):
    old = filled / "ab" / KEYS[1] / "meta.json"
    meta = json.loads(old.read_text())
    meta["created"] = time.time() - 31 * 86400
    write_meta(old.parent, meta)
    rc, out, _ = run(capsys, "cache", "prune", "--older-than", "30d")
    assert rc == 0 and out == "removed 1 entry older than 30d\n"
    assert sorted(e.key for e in KernelCache().entries()) == [KEYS[0], KEYS[2]]
    rc, out, _ = run(capsys, "cache", "prune", "--older-than", "2d")  # the 3-day-old autotune record
    assert rc == 0 and out == "removed 1 entry older than 2d\n" and KernelCache().autotune_records() == []


def test_prune_rejects_a_bad_duration(capsys, root):
    rc, _, err = run(capsys, "cache", "prune", "--older-than", "soon")
    assert rc == 2 and "bad duration 'soon'" in err


@pytest.mark.parametrize("text, why", [("-5", "(an age cannot be negative)"), ("-5d", "(an age cannot be negative)"),
                                       ("nan", "(not a finite number)"), ("inf", "(not a finite number)"),
                                       ("9" * 400, "(too long: more seconds than a float holds)")])
def test_prune_refuses_a_negative_or_endless_duration_saying_why(capsys, root, text, why):
    rc, out, err = run(capsys, "cache", "prune", f"--older-than={text}")
    assert rc == 2 and out == "" and "bad duration '" in err and why in err and "use e.g. 30d" in err, err
    assert len(err.splitlines()[-1]) < 200  # a long number is cut, not echoed whole


@pytest.mark.parametrize("text, shown", [("99999999999999999999999w", "6.048e+28s"), ("1.5h", "1.5h"),
                                         ("86399", "86399s"), ("90", "1.5m"), ("2w", "14d"), ("0", "0s")])
def test_prune_says_the_age_it_was_given(capsys, filled, text, shown):
    rc, out, err = run(capsys, "cache", "prune", "--older-than", text)
    assert rc == 0 and err == "" and out.rstrip("\n").endswith(f" older than {shown}"), out


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("45m", 2700), ("12h", 43200), ("30d", 2592000),
                                           ("2w", 1209600), ("1.5h", 5400), ("10", 10)])
def test_parse_duration(text, seconds):
    assert cli.parse_duration(text) == seconds


@pytest.mark.parametrize("seconds, shown", [(0, "0s"), (59, "59s"), (60, "1m"), (7200, "2h"), (5 * 86400, "5d")])
def test_format_duration(seconds, shown):
    assert cli.format_duration(seconds) == shown


@pytest.mark.parametrize("size, shown", [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (5 << 20, "5.0 MiB")])
def test_format_size(size, shown):
    assert cli.format_size(size) == shown
