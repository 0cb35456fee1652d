"""What every benchmark shares: the machine stamp, TFLOP/s arithmetic, Markdown tables and the run log."""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any, Sequence

# Every run appends its table here; benchmarks/RESULTS.md holds the current table of each workload, kept by hand.
RUN_LOG_PATH = Path(__file__).resolve().parent / "history" / "runs.md"
DEFAULT_OUT = Path(__file__).resolve().parent / "out"

_RUN_LOG_HEADER = """# Benchmark runs, as appended

Every run of `python -m benchmarks.matmul` and `python -m benchmarks.launch` appends its table here, with the GPU,
driver and versions it ran with. Numbers from different GPUs or runs are not comparable; the current figure of
each workload is in `benchmarks/RESULTS.md`.
"""


def gpu_name() -> str:
    """torch's name of the current CUDA device, or "no GPU"."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except Exception:  # noqa: BLE001 - a stamp must never stop a benchmark
        pass
    return "no GPU"


def driver_version() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _package_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, str | None]:
    """Versions of everything that moves the numbers (None: not installed)."""
    import tilejit

    try:
        import torch

        torch_version, cuda_runtime = torch.__version__, torch.version.cuda
    except ImportError:
        torch_version = cuda_runtime = None
    try:
        from tilejit.backend_cuda.nvrtc import nvrtc_version

        nvrtc = "%d.%d" % nvrtc_version()
    except Exception:  # noqa: BLE001 - no NVRTC is worth reporting, not failing on
        nvrtc = None
    return {
        "tilejit": tilejit.__version__,
        "torch": torch_version,
        "torch_cuda": cuda_runtime,
        "triton": _package_version("triton"),
        "cuda-bindings": _package_version("cuda-bindings", "cuda-python"),
        "nvrtc": nvrtc,
        "python": platform.python_version(),
    }


def machine_stamp() -> dict[str, Any]:
    """GPU, driver, CPU, versions and the UTC date: stored next to every result."""
    return {
        "gpu": gpu_name(),
        "driver": driver_version(),
        "cpu": cpu_name(),
        "versions": versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def stamp_line(meta: dict[str, Any]) -> str:
    """One line naming the machine and software of a result."""
    parts = [f"GPU: {meta.get('gpu', '?')}", f"driver {meta.get('driver') or '?'}"]
    if meta.get("cpu"):
        parts.append(f"CPU: {meta['cpu']}")
    parts += [f"{name} {value}" for name, value in (meta.get("versions") or {}).items() if value]
    parts.append(meta.get("date", ""))
    return " · ".join(p for p in parts if p)


def bar_chart(path: Path, title: str, meta: dict[str, Any], labels: Sequence[str],
              bars: dict[str, Sequence[float]], ratios: dict[str, Sequence[float]], width: float,
              ratio_width: float, per_label: float = 0.5) -> Path | None:
    """Grouped bars of TFLOP/s (``bars``: series name -> one value per label) over ratios against 1.0 (``ratios``;
    a single series names the y axis, several get a legend), titled with the machine stamp; None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(min(24, max(8, per_label * len(labels) + 2)), 8), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    for i, (name, values) in enumerate(bars.items()):
        top.bar([x + (i - (len(bars) - 1) / 2) * width for x in range(len(labels))], values, width, label=name)
    top.set_ylabel("TFLOP/s")
    top.legend(fontsize=8)
    stamp = "\n".join(textwrap.wrap(stamp_line(meta), 120))
    top.set_title(f"{title} on {meta['gpu']}\n{stamp}", fontsize=8)
    for i, (name, values) in enumerate(ratios.items()):
        bottom.bar([x + (i - (len(ratios) - 1) / 2) * ratio_width for x in range(len(labels))], values, ratio_width,
                   label=name)
    bottom.axhline(1.0, color="gray", linewidth=0.8)
    if len(ratios) == 1:
        bottom.set_ylabel(next(iter(ratios)))
    else:
        bottom.legend(fontsize=8)
    bottom.set_xticks(range(len(labels)))
    bottom.set_xticklabels(labels, rotation=60, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def matmul_tflops(m: int, n: int, k: int, ms: float) -> float:
    """Throughput of an M x N x K matmul (2*M*N*K flops) that took ``ms`` milliseconds."""
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def fmt(value: Any, digits: int = 1) -> str:
    """A table cell: numbers rounded (to ``digits`` decimals; below 0.1, to 3 significant digits, so that errors
    and small ratios keep their figures), None as "n/a", strings as they are."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3g}" if 0 < abs(value) < 0.1 else f"{value:.{digits}f}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table; cells go through ``fmt`` and "|" is escaped."""
    def cell(value: Any) -> str:
        return fmt(value).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "| " + " | ".join("---" for _ in headers) + " |"]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {list(row)} has {len(row)} cells; the table has {len(headers)} columns")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)


def append_results(section_title: str, markdown_table_text: str, meta: dict[str, Any],
                   path: Path | str | None = None, notes: Sequence[str] = ()) -> Path:
    """Append a section (heading with the GPU name, stamp line, table, bulleted notes) to the run log."""
    path = Path(path) if path is not None else RUN_LOG_PATH
    text = path.read_text() if path.exists() else _RUN_LOG_HEADER
    if not text.endswith("\n"):
        text += "\n"
    section = [f"\n## {section_title} — {meta.get('gpu', 'unknown GPU')} ({meta.get('date', '')[:10]})\n",
               f"_{stamp_line(meta)}_\n\n", markdown_table_text.rstrip() + "\n"]
    if notes:
        section.append("\n" + "".join(f"- {note}\n" for note in notes))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "".join(section))
    return path


def write_json(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    tmp.replace(path)
    return path
