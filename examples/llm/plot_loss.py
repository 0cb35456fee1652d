"""Draws loss curves from the JSON logs train.py writes: ``python examples/llm/plot_loss.py a.json [b.json ...]
-o loss.png`` (one curve per log, labelled by its backend and device). Needs matplotlib."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def plot(logs: list[Path], png: Path) -> bool:
    """Writes ``png`` with one curve per log; returns False (and says so) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no {png} (the losses are in {', '.join(map(str, logs))}; "
              "pip install matplotlib, then run examples/llm/plot_loss.py on them)")
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for path in logs:
        run = json.loads(Path(path).read_text())
        ax.plot(range(len(run["losses"])), run["losses"], label=f"{run['backend']} ({run['device_name']})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_title("byte-level Llama on the Python standard library's sources")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    print(f"wrote {png}")
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("logs", nargs="+", type=Path, help="JSON logs written by train.py")
    parser.add_argument("-o", "--out", type=Path, default=Path("loss.png"))
    args = parser.parse_args(argv)
    raise SystemExit(0 if plot(args.logs, args.out) else 1)


if __name__ == "__main__":
    main()
