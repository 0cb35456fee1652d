"""Disassembling cubins with NVIDIA's tools (cuobjdump or nvdisasm), when one is installed."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def find_tool(name: str) -> str | None:
    """``name`` on PATH, else inside an NVIDIA pip wheel (nvidia/<package>/bin/), which is not on PATH."""
    found = shutil.which(name)
    if found:
        return found
    for entry in sys.path:
        for candidate in sorted(Path(entry or ".").glob(f"nvidia/*/bin/{name}")):
            if candidate.is_file():
                return str(candidate)
    return None


class DisassemblyError(RuntimeError):
    pass


def disassemble_file(path: Path) -> str | None:
    """SASS of the cubin at ``path``; None when no disassembler is installed."""
    for tool, flags in (("cuobjdump", ["-sass"]), ("nvdisasm", [])):
        exe = find_tool(tool)
        if exe is None:
            continue
        done = subprocess.run([exe, *flags, str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["failed"])[-1]
            raise DisassemblyError(f"{tool} failed: {last}")
        return done.stdout
    return None


def disassemble(cubin: bytes) -> str | None:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return disassemble_file(Path(f.name))
