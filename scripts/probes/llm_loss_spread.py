"""How far apart 200 training steps of examples/llm land when only rounding differs: tilejit's operators twice
(is the run repeatable?), the bf16 torch twin twice (torch's bf16 backward is not bit-repeatable), and the
float32 twin. Prints each run's mean loss over the last 20 steps and the largest per-step gap to the first run.
The setting is tests/gpu/test_gpu_llm_model.py's (8 layers, width 1024, batch 8 x 512, lr 1e-3), whose tolerance
rests on these spreads. Measured on an H200: tilejit 2.0795 both times (bit-equal losses); the twin 2.0817 and
2.0852 (per-step gaps up to 0.11); float32 2.1021.

    python scripts/probes/llm_loss_spread.py [--steps 200]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "llm"))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

import data  # noqa: E402
import model as llm_model  # noqa: E402
import train  # noqa: E402

BATCH, SEQ = 8, 512


def run(backend: str, dtype: torch.dtype, steps: int) -> list[float]:
    net = llm_model.LlamaModel(llm_model.LlamaConfig(), backend=backend, seed=0).to("cuda", dtype)
    sampler = data.BatchSampler(data.load_corpus(), BATCH, SEQ, seed=0)
    losses, _ = train.train_steps(net, sampler, steps, lr=1e-3, device="cuda")
    return losses


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    steps = ap.parse_args().steps
    print(torch.cuda.get_device_name(), flush=True)
    runs = [("tilejit bf16", "tilejit", torch.bfloat16), ("tilejit bf16, again", "tilejit", torch.bfloat16),
            ("torch bf16", "torch", torch.bfloat16), ("torch bf16, again", "torch", torch.bfloat16),
            ("torch float32", "torch", torch.float32)]
    first = None
    for label, backend, dtype in runs:
        losses = run(backend, dtype, steps)
        first = first or losses
        tail = sum(losses[-20:]) / 20
        gap = max(abs(a - b) for a, b in zip(losses, first))
        print(f"| {label} | step 0 {losses[0]:.4f} | last-20 mean {tail:.4f} | largest step gap to the first run "
              f"{gap:.4f} |", flush=True)


if __name__ == "__main__":
    main()
