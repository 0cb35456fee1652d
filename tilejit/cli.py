"""The ``tilejit`` console command: inspect and maintain the kernel cache.

Only the cache and the knobs are imported: ``tilejit cache list`` must stay quick, so nothing here pulls in
torch or the compiler. Human output fits an 80-column terminal (paths excepted, which are never cut); ``list``
fits the terminal's width instead, never cuts a number and cuts text columns only when they do not fit
(``--wide`` never cuts); ``list --json`` is for scripts.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import textwrap
import time
import warnings
from pathlib import Path

from tilejit import knobs
from tilejit.cache import maintenance
from tilejit.cache.entries import CacheEntry
from tilejit.cache.layout import CacheLayout, current_layout, refused_root
from tilejit.cache.records import as_timestamp, autotune_records
from tilejit.errors import UsageError

WIDTH = 80
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Shown first, in this order, by `show`; any other meta keys follow alphabetically.
_META_ORDER = ["key", "kernel", "signature", "arch", "threads", "shared_bytes", "registers", "spills",
               "compile_seconds", "created", "versions", "binary", "sha256"]
_CONTENT_FLAGS = {"cuda": "kernel.cu", "ir": "kernel.ir", "ptx": "kernel.ptx", "sass": "kernel.sass"}


class CliError(Exception):
    """A user-facing failure: printed as one line on stderr, exit status 1 (as is a ``UsageError`` from below, a
    knob's bad value)."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version and usage errors: keep main() returning an int
        return int(exit_.code or 0)
    if not hasattr(args, "run"):
        parser.print_help()
        return 1
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            return args.run(args)
        except (CliError, UsageError) as err:
            print(f"tilejit: {err}", file=sys.stderr)
            return 1
        except BrokenPipeError:  # `tilejit cache list | head`
            return 0


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as a command prints it: one line, without the Python file and line it was raised at (the
    console script's own, which means nothing to whoever typed the command)."""
    text = str(message)
    print(text if text.startswith("tilejit: ") else f"tilejit: warning: {text}", file=file or sys.stderr)


def _cmd_port(args: argparse.Namespace) -> int:
    from .port import NoKernels, port_source

    try:
        source = open(args.file, encoding="utf-8").read()
    except OSError as err:
        raise CliError(f"cannot read {args.file}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise CliError(f"cannot read {args.file}: not UTF-8 text (byte {err.start}), so not a Python file") from None
    try:
        text = port_source(source)
    except SyntaxError as err:
        raise CliError(f"{args.file}:{err.lineno}: not Python: {err.msg}") from None
    except NoKernels:
        raise CliError(f"{args.file} has no top-level @triton.jit function: nothing to port") from None
    except ValueError as err:  # Python 3.11: null bytes in the source
        raise CliError(f"{args.file}: not Python: {err}") from None
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as out:
                out.write(text)
        except OSError as err:
            raise CliError(f"cannot write {args.output}: {err.strerror}") from None
    else:
        sys.stdout.write(text)
    return 0


def version() -> str:
    from importlib import metadata
    try:
        return metadata.version("tilejit")
    except metadata.PackageNotFoundError:
        return "0.1.0"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tilejit", description="tilejit: a Python JIT for tensor cores.")
    parser.add_argument("--version", action="version", version=f"tilejit {version()}")
    commands = parser.add_subparsers(title="commands")

    port = commands.add_parser("port", help="print tilejit versions of a file's @triton.jit kernels",
                               description="Translate the common subset of a Python file's @triton.jit kernels "
                                           "(read with ast; Triton is not imported); lines outside it are kept "
                                           "as comments saying why.")
    port.add_argument("file", help="a Python file with @triton.jit kernels")
    port.add_argument("-o", "--output", help="write here instead of printing")
    port.set_defaults(run=_cmd_port)

    cache = commands.add_parser(
        "cache", help="inspect and maintain the compiled-kernel cache",
        description="The cache directory is $TILEJIT_CACHE_DIR, else ~/.cache/tilejit.")
    cache.set_defaults(run=lambda _: _usage(cache))
    actions = cache.add_subparsers(title="actions")

    actions.add_parser("path", help="print the cache directory").set_defaults(run=_cmd_path)

    list_ = actions.add_parser("list", help="list cached kernels and autotune records")
    list_.add_argument("--json", action="store_true", help="machine-readable output")
    list_.add_argument("--wide", action="store_true",
                       help="never cut a column (by default text columns are cut to the terminal's width)")
    list_.set_defaults(run=_cmd_list)

    show = actions.add_parser("show", help="show one entry's metadata and files",
                              description="With --cuda/--ir/--ptx/--sass, print those files only.")
    show.add_argument("key", help="the entry's key or a unique prefix of it")
    for flag, name in _CONTENT_FLAGS.items():
        show.add_argument(f"--{flag}", action="store_true", help=f"print {name}" + (
            " (else disassemble the cubin with cuobjdump/nvdisasm)" if flag == "sass" else ""))
    show.set_defaults(run=_cmd_show)

    clear = actions.add_parser("clear", help="remove every entry and autotune record")
    clear.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    clear.set_defaults(run=_cmd_clear)

    prune = actions.add_parser("prune", help="remove entries older than a given age")
    prune.add_argument("--older-than", required=True, type=parse_duration, metavar="AGE",
                       help="e.g. 30d, 12h, 45m, 90s")
    prune.set_defaults(run=_cmd_prune)

    actions.add_parser("stats", help="where this process's kernels came from, and whether the remote answers",
                       description="Kernel lookups of the process running this command by origin (memory, "
                                   "disk, remote, compiled): called in a program as tilejit.cli.main(['cache', "
                                   "'stats']), that program's; then the entries on disk and the remote cache "
                                   "($TILEJIT_REMOTE_CACHE), pinged.").set_defaults(run=_cmd_stats)

    export = actions.add_parser("export", help="write cached kernels and their autotune records to a tar",
                                description="A tar (gzip-compressed when FILE ends in .gz or .tgz) of the "
                                            "cache's entries with their meta, autotune records and extents "
                                            "hints; `tilejit cache import` on another machine fills its cache, "
                                            "and those kernels then run without compiling.")
    export.add_argument("file", help="the tar to write")
    export.add_argument("--kernel", action="append", default=[], metavar="NAME",
                        help="only this kernel's entries and records (may be repeated)")
    export.set_defaults(run=_cmd_export)

    import_ = actions.add_parser("import", help="check and add the kernels of a tar `export` wrote",
                                 description="Every entry is checked (digests, meta) before it is stored, and "
                                             "every member's name and type; each refused one is named, and the "
                                             "status is 1 when any was.")
    import_.add_argument("file", help="a tar written by `tilejit cache export`")
    import_.set_defaults(run=_cmd_import)
    return parser


# ---- commands ----------------------------------------------------------------------------------------------

def _cmd_path(args) -> int:
    _leave_a_refused_root_alone("printing", "printed nothing")
    print(current_layout().root)
    return 0


def _cmd_list(args) -> int:
    _leave_a_refused_root_alone("listing", "listed nothing")
    layout = current_layout()
    entries, records = maintenance.list_entries(layout), autotune_records(layout)
    if args.json:
        print(json.dumps({
            "root": str(layout.root),
            "entries": [{"key": e.key, "path": str(e.path), "size_bytes": e.size_bytes(), "meta": e.meta}
                        for e in entries],
            "autotune": records,
        }, indent=2, sort_keys=True, default=str))
        return 0
    now = time.time()
    width = None if args.wide else shutil.get_terminal_size((WIDTH, 24)).columns
    cut = False
    if entries:
        rows = [[e.key[:12], e.meta.get("kernel", "?"), e.meta.get("arch", "?"), e.meta.get("signature", ""),
                 format_size(e.size_bytes()), format_age(now, e.meta.get("created"))] for e in entries]
        headers = ["KEY", "KERNEL", "ARCH", "SIGNATURE", "SIZE", "AGE"]
        widths, cut = _column_widths(headers, rows, width,
                                     shrink=[("KERNEL", 24), ("SIGNATURE", 19), ("KERNEL", 12)])
        _print_table(headers, widths, rows, right={"SIZE", "AGE"})
        total = sum(e.size_bytes() for e in entries)
        print(f"{len(entries)} kernel{'s' * (len(entries) != 1)}, {format_size(total)}")
    else:
        print("no cached kernels")
    if records:
        print()
        rows = [[r.get("kernel", "?"), _compact(r.get("key", "")), _format_config(r.get("config")),
                 _best_ms(r.get("timings_ms")), format_age(now, r.get("created"))] for r in records]
        headers = ["AUTOTUNED", "KEY", "BEST CONFIG", "BEST MS", "AGE"]
        widths, cut_records = _column_widths(headers, rows, width,
                                             shrink=[("AUTOTUNED", 16), ("KEY", 16), ("BEST CONFIG", 20),
                                                     ("AUTOTUNED", 12)])
        _print_table(headers, widths, rows, right={"BEST MS", "AGE"})
        cut = cut or cut_records
    if cut:
        print(f"(cut to {width} columns; --wide shows every column whole)")
    return 0


def _column_widths(headers: list[str], rows: list[list], width: int | None,
                   shrink: list[tuple[str, int]]) -> tuple[list[int], bool]:
    """Each column as wide as its widest cell; when the table is wider than ``width``, the columns named in
    ``shrink`` (text: names, signatures, configs) give up columns in that order, each down to the minimum given
    with it. The others (keys, arches, sizes, ages, timings) are never cut. Returns the widths and whether a
    cell is cut."""
    widths = [max([len(h), *(len(str(row[i])) for row in rows)]) for i, h in enumerate(headers)]
    natural = list(widths)
    if width is not None:
        excess = sum(widths) + 2 * (len(widths) - 1) - width
        for name, minimum in shrink:
            if excess <= 0:
                break
            i = headers.index(name)
            give = min(excess, max(0, widths[i] - max(minimum, len(name))))
            widths[i] -= give
            excess -= give
    return widths, widths != natural


def _cmd_show(args) -> int:
    _leave_a_refused_root_alone("reading", "showed nothing")
    entry = _find_entry(current_layout(), args.key)
    wanted = [flag for flag in _CONTENT_FLAGS if getattr(args, flag)]
    if not wanted:
        _print_meta(entry)
        return 0
    for flag in wanted:
        if len(wanted) > 1:
            print(f"// ---- {_CONTENT_FLAGS[flag]} ----")
        text = _sass(entry) if flag == "sass" else _read_stored(entry, _CONTENT_FLAGS[flag])
        print(text, end="" if text.endswith("\n") else "\n")
    return 0


def _cmd_clear(args) -> int:
    _leave_a_refused_root_alone("clearing", "removed nothing")
    layout = current_layout()
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError("not clearing without --yes (standard input is not a terminal)")
        answer = input(f"remove every entry under {layout.root}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 0
    removed = maintenance.clear(layout)
    print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} (kernels and autotune records)")
    return 0


def _cmd_prune(args) -> int:
    _leave_a_refused_root_alone("pruning", "removed nothing")
    removed = maintenance.prune(current_layout(), args.older_than)
    print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} older than "
          f"{format_age_limit(args.older_than)}")
    return 0


def _cmd_stats(args) -> int:
    from tilejit.cache import kernel_cache, remote

    counts = kernel_cache.origin_counts()
    print("kernel lookups in this process: " + ", ".join(f"{origin} {n}" for origin, n in counts.items()))
    unused = _unused_root()
    if unused is None:
        layout = current_layout()
        print(f"entries on disk: {len(layout.entry_dirs())} in {layout.root}")
    else:
        print(f"entries on disk: none used; the cache directory {unused[0]} {unused[1]}")
    print(f"remote cache: {remote.status()}")
    return 0


def _cmd_export(args) -> int:
    import tarfile

    from tilejit.cache import bundle, default_cache

    _leave_a_refused_root_alone("exporting", f"wrote no {args.file}")
    try:
        n_entries, n_records = bundle.export_bundle(default_cache(), Path(args.file), args.kernel)
    except (OSError, tarfile.TarError) as err:
        raise CliError(f"cannot write {args.file}: {getattr(err, 'strerror', None) or err}") from None
    print(f"wrote {n_entries} entries and {n_records} autotune records to {args.file}")
    return 0


def _cmd_import(args) -> int:
    import tarfile

    from tilejit.autotuner import record_problem
    from tilejit.backend_cuda.nvrtc import record_imported_versions
    from tilejit.cache import bundle, default_cache
    from tilejit.compiler import check_meta

    _leave_a_refused_root_alone("importing into", "imported nothing")
    try:
        report = bundle.import_bundle(default_cache(), Path(args.file), check_meta, record_problem)
    except (OSError, EOFError, tarfile.TarError) as err:
        raise CliError(f"cannot read {args.file} as a tar: {getattr(err, 'strerror', None) or err}") from None
    record_imported_versions(report.nvrtc_versions)
    for name, why in report.refused:
        print(f"tilejit: refused {name}: {why}", file=sys.stderr)
    print(f"imported {len(report.entries)} entries, {report.autotune_records} autotune records and "
          f"{report.extents_hints} extents hints from {args.file}" + (
              f"; refused {len(report.refused)}" if report.refused else ""))
    return 1 if report.refused else 0


def _unused_root() -> tuple[Path, str, str, str, str] | None:
    """``(the configured root, its state, why, what tilejit does instead, what to fix)`` when the cache does not use the
    configured root: it is a file (nothing is cached on disk), or refused (a private stand-in serves this one
    process); None when it is used."""
    configured = knobs.cache_dir()
    if configured.exists() and not configured.is_dir():
        return (configured, "is not a directory", "it is not a directory", "tilejit caches nothing on disk (kernels stay in memory)",
                "set TILEJIT_CACHE_DIR to a directory, or move the file away")
    refused = refused_root()
    if refused is None:
        return None
    root, at_fault, why = refused
    return (root, f"is refused: {why}", why,
            "tilejit refuses it (kernels compile into a private stand-in that lasts one process)",
            f"fix the owner or mode of {at_fault}, or set TILEJIT_CACHE_DIR to a directory of your own")


def _leave_a_refused_root_alone(doing: str, outcome: str) -> None:
    """A CliError when the cache does not use the configured root (``_unused_root``): acting on the stand-in
    (empty, fresh) would report the user's cache listed, cleaned or exported when nothing of it was read."""
    unused = _unused_root()
    if unused is None:
        return
    root, _, why, instead, fix = unused
    raise CliError(f"not {doing} the cache directory {root}: {why}, so {instead} and {outcome}; {fix}, and run "
                   "this again")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 1


# ---- helpers -----------------------------------------------------------------------------------------------

def parse_duration(text: str) -> float:
    """Seconds in "30d", "12h", "45m", "90s", "2w" (a bare number is seconds): finite and not negative."""
    stripped = text.strip().lower()
    match = _DURATION_RE.fullmatch(stripped)
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)] if match else math.nan
    if not math.isfinite(seconds):
        shown = repr(text) if len(text) <= 40 else repr(text[:20] + "..." + text[-8:])
        raise argparse.ArgumentTypeError(f"bad duration {shown}{_why_bad_duration(stripped, match)}: use e.g. "
                                         "30d, 12h, 45m or 90s")
    return seconds


def _why_bad_duration(stripped: str, match: re.Match | None) -> str:
    """What is wrong with a duration that is no number of seconds, when more can be said than "bad"."""
    if match:
        return " (too long: more seconds than a float holds)"
    try:
        number = float(stripped.rstrip("smhdw"))
    except ValueError:
        return ""
    if number < 0:
        return " (an age cannot be negative)"
    return " (not a finite number)" if not math.isfinite(number) else ""


def format_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def format_age(now: float, created) -> str:
    then = as_timestamp(created)
    return "?" if then is None else format_duration(now - then)


def format_duration(seconds: float) -> str:
    """Whole units, largest first: "45s", "3m", "2h", "5d"."""
    if not math.isfinite(seconds):
        return "?"
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def format_age_limit(seconds: float) -> str:
    """An age given on the command line, exactly, in the largest unit that shows it in a few digits: "90s",
    "1.5h", "30d", "86399s"; past a million weeks (no cache is that old) in seconds, rounded: "1e+30s"."""
    if seconds >= 1e6 * _UNIT_S["w"]:
        return f"{seconds:g}s"
    for unit in ("d", "h", "m"):
        shown = f"{seconds / _UNIT_S[unit]:g}"
        if seconds >= _UNIT_S[unit] and float(shown) * _UNIT_S[unit] == seconds:
            return f"{shown}{unit}"
    return f"{seconds:.15g}s"


def _fit(text, width: int) -> str:
    text = str(text)
    return text if len(text) <= width else text[: width - 3] + "..."


def _print_table(headers: list[str], widths: list[int], rows: list[list], right: set[str]) -> None:
    def line(cells):
        parts = [(_fit(c, w).rjust(w) if h in right else _fit(c, w).ljust(w))
                 for c, w, h in zip(cells, widths, headers)]
        return "  ".join(parts).rstrip()
    print(line(headers))
    for row in rows:
        print(line(row))


def _compact(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)


def _format_config(config) -> str:
    if not isinstance(config, dict):
        return _compact(config)
    flat = {}
    for name, value in config.items():
        flat.update(value if isinstance(value, dict) else {name: value})
    return " ".join(f"{name}={value}" for name, value in flat.items())


def _best_ms(timings) -> str:
    if isinstance(timings, dict):
        timings = list(timings.values())
    if isinstance(timings, (int, float)):
        timings = [timings]
    numbers = [t for t in timings or [] if isinstance(t, (int, float))]
    return f"{min(numbers):.4g}" if numbers else "?"


def _find_entry(layout: CacheLayout, prefix: str) -> CacheEntry:
    matches = maintenance.find(layout, prefix) if re.fullmatch(r"[0-9a-fA-F]{1,64}", prefix) else []
    if not matches:
        raise CliError(f"no cache entry with key {prefix!r} (see `tilejit cache list`)")
    if len(matches) > 1:
        raise CliError(f"key prefix {prefix!r} matches {len(matches)} entries; give more characters")
    return matches[0]


def _print_meta(entry: CacheEntry) -> None:
    meta = dict(entry.meta, key=entry.key)
    names = [n for n in _META_ORDER if n in meta] + sorted(n for n in meta if n not in _META_ORDER)
    label_width = max(len(n) for n in names) + 1
    now = time.time()
    for name in names:
        value = meta[name]
        if name == "created" and as_timestamp(value) is not None:
            try:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
            except (ValueError, OverflowError, OSError):  # beyond what the platform's time functions take
                stamp = str(value)
            value = f"{stamp} ({format_age(now, value)} ago)"
        elif isinstance(value, dict):
            value = " ".join(f"{k}={v}" for k, v in sorted(value.items()))
        print(textwrap.fill(str(value), WIDTH, initial_indent=name.ljust(label_width),
                            subsequent_indent=" " * label_width, break_long_words=True))
    print("files in:")
    print(entry.path)
    for name in entry.file_names():
        print(f"  {_fit(name, 40):<40}  {format_size(_size(entry.path / name)):>10}")


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _read_stored(entry: CacheEntry, name: str) -> str:
    try:
        return entry.read_text(name)
    except FileNotFoundError:
        hint = " (built with TILEJIT_KEEP_PTX=0?)" if name.endswith(".ptx") else ""
        raise CliError(f"entry {entry.key[:12]} has no {name}{hint}") from None
    except (OSError, UnicodeDecodeError) as error:  # damaged, replaced by a link or FIFO, not the user's
        raise CliError(f"entry {entry.key[:12]}: cannot read {name}: {error}") from None


def _sass(entry: CacheEntry) -> str:
    """The stored SASS (when meta.json lists it), else a disassembly of the cubin by whichever NVIDIA tool is
    installed. The tool is given a private copy of the cubin as read and checked by the cache (never followed,
    never blocking), not the file in the entry, which could be a link or a FIFO by now."""
    from .backend_cuda.sass import DisassemblyError, disassemble

    if "kernel.sass" in entry.meta.get("files", {}):
        return _read_stored(entry, "kernel.sass")
    try:
        cubin = entry.binary
    except (OSError, ValueError) as error:
        raise CliError(f"entry {entry.key[:12]}: cannot read its cubin: {error}") from None
    try:
        text = disassemble(cubin)
    except DisassemblyError as e:
        raise CliError(f"{e} on {entry.key[:12]}") from None
    if text is None:
        raise CliError("no stored SASS and no cuobjdump/nvdisasm; pip install nvidia-cuda-cuobjdump")
    return text


if __name__ == "__main__":
    sys.exit(main())
