"""Is a file's content an ELF shared object this process can ``dlopen`` without reading past its end?

The compiled launcher (``native.py``) is loaded from bytes that match a recorded digest, but a digest file can be
rewritten to match damaged bytes. ``dlopen`` maps the file's segments as their program headers say; a segment
that reaches past the end of a truncated file maps pages with nothing behind them, and the first touch kills the
process with SIGBUS, before any Python error can be raised. So, before loading, the ELF header (gABI "ELF
Header": magic, class, byte order, version, type, machine) must describe a shared object for the machine that
runs this interpreter, and the program header and section header tables and every segment's file range (gABI
"Program Header") must lie inside the bytes.
"""
from __future__ import annotations

import functools
import struct
import sys

_MAGIC = b"\x7fELF"
_EI_CLASS, _EI_DATA, _EI_VERSION = 4, 5, 6
_IDENT_SIZE = 16
_ET_DYN = 3
_PT_LOAD, _PT_DYNAMIC = 1, 2
# Per class (1: 32-bit, 2: 64-bit): the header fields after e_ident, then the program header's (p_type,
# p_offset, p_filesz, p_memsz) positions in its unpacked tuple, and the section header size.
_HEADER = {1: "HHIIIIIHHHHHH", 2: "HHIQQQIHHHHHH"}
_PROGRAM_HEADER = {1: ("IIIIIIII", (0, 1, 4, 5)), 2: ("IIQQQQQQ", (0, 2, 5, 6))}
_SECTION_HEADER_SIZE = {1: 40, 2: 64}


@functools.cache
def host_identity() -> tuple[int, int, int] | None:
    """(class, byte order, machine) of the ELF file running this process (the interpreter), or None where it is
    not ELF or cannot be read."""
    for path in ("/proc/self/exe", sys.executable):
        try:
            with open(path, "rb") as f:
                head = f.read(_IDENT_SIZE + 4)
        except (OSError, TypeError):
            continue
        if len(head) == _IDENT_SIZE + 4 and head.startswith(_MAGIC) and head[_EI_DATA] in (1, 2):
            order = "<" if head[_EI_DATA] == 1 else ">"
            return head[_EI_CLASS], head[_EI_DATA], struct.unpack_from(order + "H", head, _IDENT_SIZE + 2)[0]
    return None


def loading_problem(data: bytes, host: tuple[int, int, int] | None) -> str | None:
    """Why ``data`` must not be given to ``dlopen`` on a host whose ``host_identity()`` is ``host`` (None: it may
    be)."""
    if len(data) < _IDENT_SIZE or not data.startswith(_MAGIC):
        return "it is not an ELF file (no ELF magic number)"
    elf_class, byte_order = data[_EI_CLASS], data[_EI_DATA]
    if elf_class not in _HEADER or byte_order not in (1, 2) or data[_EI_VERSION] != 1:
        return f"its ELF identification is invalid (class {elf_class}, data {byte_order}, version {data[_EI_VERSION]})"
    if host is not None and (elf_class, byte_order) != host[:2]:
        return (f"it is a {32 * elf_class}-bit {'little' if byte_order == 1 else 'big'}-endian ELF file; this "
                f"process is {32 * host[0]}-bit {'little' if host[1] == 1 else 'big'}-endian")
    order = "<" if byte_order == 1 else ">"
    header = struct.Struct(order + _HEADER[elf_class])
    if len(data) < _IDENT_SIZE + header.size:
        return f"it is {len(data)} bytes, shorter than an ELF header"
    (e_type, e_machine, _version, _entry, e_phoff, e_shoff, _flags, e_ehsize, e_phentsize, e_phnum, e_shentsize,
     e_shnum, _shstrndx) = header.unpack_from(data, _IDENT_SIZE)
    if e_type != _ET_DYN:
        return f"it is not a shared object (ELF type {e_type})"
    if host is not None and e_machine != host[2]:
        return f"it is built for ELF machine {e_machine}, and this process runs on machine {host[2]}"
    program_format, fields = _PROGRAM_HEADER[elf_class]
    program = struct.Struct(order + program_format)
    if e_ehsize != _IDENT_SIZE + header.size or e_phentsize != program.size or e_phnum == 0:
        return "its ELF header gives the wrong header sizes or no program headers"
    problem = (_table_problem("program header table", e_phoff, e_phnum, e_phentsize, len(data))
               or (_table_problem("section header table", e_shoff, e_shnum or 1, e_shentsize, len(data)) if e_shoff
                   else None))
    if problem is None and e_shoff and e_shentsize != _SECTION_HEADER_SIZE[elf_class]:
        problem = f"its section headers are {e_shentsize} bytes, not {_SECTION_HEADER_SIZE[elf_class]}"
    if problem is not None:
        return problem
    kinds = set()
    for index in range(e_phnum):
        entry = program.unpack_from(data, e_phoff + index * e_phentsize)
        p_type, p_offset, p_filesz, p_memsz = (entry[i] for i in fields)
        kinds.add(p_type)
        if p_offset + p_filesz > len(data):
            return (f"its segment {index} (type {p_type}) spans bytes {p_offset}..{p_offset + p_filesz} of a "
                    f"{len(data)}-byte file (truncated?)")
        if p_type == _PT_LOAD and p_filesz > p_memsz:
            return f"its loadable segment {index} is larger in the file than in memory"
    if not {_PT_LOAD, _PT_DYNAMIC} <= kinds:
        return "it has no loadable or no dynamic segment"
    return None


def _table_problem(what: str, offset: int, count: int, entry_size: int, size: int) -> str | None:
    end = offset + count * entry_size
    if end > size:
        return f"its {what} ends at byte {end} of a {size}-byte file (truncated?)"
    return None

