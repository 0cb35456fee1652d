"""Trains the byte-level Llama of model.py on the Python standard library's sources with AdamW, logs the loss of
every step to a JSON file and draws the loss curve (PNG; needs matplotlib, else plot_loss.py draws it later).

    python examples/llm/train.py --steps 200                     # GPU: full model, bf16, tilejit's operators
    python examples/llm/train.py --steps 200 --backend torch     # the same model in plain torch operators
    python examples/llm/train.py --steps 200 --cuda-graph        # each step replayed from one CUDA graph
    python examples/llm/train.py --toy --steps 3 --device cpu    # toy size on CPU, through the interpreter

On a GPU the parameters, activations and AdamW's state are bfloat16 (the losses float32); on CPU float32.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import BatchSampler, corpus_digest, load_corpus  # noqa: E402
from model import LlamaConfig, LlamaModel  # noqa: E402
from plot_loss import plot  # noqa: E402


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def use_interpreter_on_cpu(device: str):
    """tilejit's operators run CPU tensors through the IR interpreter only when TILEJIT_INTERPRET=1."""
    if torch.device(device).type == "cpu":
        os.environ.setdefault("TILEJIT_INTERPRET", "1")


def device_name(device: str) -> str:
    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"


def build_model(config: LlamaConfig, backend: str, device: str, seed: int = 0) -> LlamaModel:
    """The model from ``seed`` on ``device``: bfloat16 on a GPU, float32 on CPU."""
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return LlamaModel(config, backend=backend, seed=seed).to(device=device, dtype=dtype)


def make_optimizer(model: torch.nn.Module, lr: float, capturable: bool = False) -> torch.optim.AdamW:
    """AdamW; the norms' weights are not decayed. ``capturable``: its state and learning rate (a tensor, set with
    ``set_lr``) live on the GPU, so that its step can be captured in a CUDA graph (``GraphedTrainStep``)."""
    decayed = [p for p in model.parameters() if p.dim() >= 2]
    kept = [p for p in model.parameters() if p.dim() < 2]
    rate = torch.tensor(lr, device=next(model.parameters()).device) if capturable else lr
    return torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1}, {"params": kept, "weight_decay": 0.0}],
                             lr=rate, betas=(0.9, 0.95), capturable=capturable)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The learning rate of every group: written into the tensor of a capturable optimizer (a graph captured
    before reads the new value), else replaced."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def train_step(model: LlamaModel, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, targets: torch.Tensor,
               forward=None) -> torch.Tensor:
    """One step: loss, backward, gradients clipped to norm 1, the optimizer's update; returns the loss (detached,
    not waited for). ``forward(tokens, targets)`` replaces ``model(tokens, targets)`` (e.g. a compiled model)."""
    loss = (model if forward is None else forward)(tokens, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


class GraphedTrainStep:
    """``train_step`` replayed from one CUDA graph: the whole step (forward, backward, clipping, AdamW's update)
    issued by one launch, so the step runs at the GPU's speed whatever the host's. Called like ``train_step``'s
    ``(tokens, targets)``, each call one real step on its batch: the first ``warmup`` calls run eagerly on a side
    stream (they compile and autotune the kernels, which capture cannot), the next captures the step and replays
    it, later ones copy their batch into the captured inputs and replay. The batch shape must stay that of the
    first call, the optimizer must be capturable (``make_optimizer(..., capturable=True)``), and the returned
    loss is the captured output tensor, overwritten by the next call (``.item()`` or clone it before)."""

    def __init__(self, model: LlamaModel, optimizer: torch.optim.Optimizer, forward=None, warmup: int = 3):
        if not all(group.get("capturable") for group in optimizer.param_groups):
            raise ValueError("GraphedTrainStep needs a capturable optimizer: make_optimizer(model, lr, "
                             "capturable=True)")
        self.model, self.optimizer, self.forward, self.warmup = model, optimizer, forward, warmup
        self.graph = None
        self.calls = 0

    def __call__(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.graph is not None:
            if tokens.shape != self.tokens.shape or targets.shape != self.targets.shape:
                raise ValueError(f"GraphedTrainStep captured batches of shape {tuple(self.tokens.shape)}, got "
                                 f"{tuple(tokens.shape)}: make a new one for another shape")
            self.tokens.copy_(tokens)
            self.targets.copy_(targets)
            self.graph.replay()
            return self.loss
        if self.calls <= self.warmup:  # eagerly, on a side stream as capture will be (its memory pool warms up)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loss = train_step(self.model, self.optimizer, tokens, targets, self.forward)
            torch.cuda.current_stream().wait_stream(side)
            return loss
        self.tokens, self.targets = tokens.clone(), targets.clone()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = train_step(self.model, self.optimizer, self.tokens, self.targets, self.forward)
        self.graph.replay()  # capture only recorded the step: this call's step runs now
        return self.loss


def train_steps(model: LlamaModel, sampler: BatchSampler, steps: int, lr: float, device: str,
                warmup: int | None = None, step_fn=None,
                cuda_graph: bool = False) -> tuple[list[float], list[float]]:
    """Runs ``steps`` AdamW steps (linear warm-up over ``warmup`` steps, default a tenth, then constant ``lr``;
    gradients clipped to norm 1) and returns (loss of each step before its update, seconds of each step).
    ``step_fn(tokens, targets)`` replaces ``model(tokens, targets)`` (e.g. a compiled model); ``cuda_graph``
    replays the step from a CUDA graph (``GraphedTrainStep``) after three eager ones."""
    optimizer = make_optimizer(model, lr, capturable=cuda_graph)
    graphed = GraphedTrainStep(model, optimizer, step_fn) if cuda_graph else None
    warmup = max(1, steps // 10) if warmup is None else max(1, warmup)
    losses, seconds = [], []
    for step in range(steps):
        set_lr(optimizer, lr * min(1.0, (step + 1) / warmup))
        tokens, targets = sampler.next(device)
        start = time.perf_counter()
        loss = graphed(tokens, targets) if graphed else train_step(model, optimizer, tokens, targets, step_fn)
        losses.append(loss.item())  # waits for the step: the time below is the step's own
        seconds.append(time.perf_counter() - start)
    return losses, seconds


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--toy", action="store_true", help="2 layers of width 64 (CPU-sized)")
    parser.add_argument("--backend", choices=("tilejit", "torch"), default="tilejit")
    parser.add_argument("--batch", type=int, default=None, help="default 8 (toy: 2)")
    parser.add_argument("--seq", type=int, default=None, help="default 1024 (toy: 32)")
    parser.add_argument("--lr", type=float, default=None, help="default 1e-3 (toy: 1e-2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus-bytes", type=int, default=None, help="default 16 MiB (toy: 256 KiB)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON log path (default llm-<backend>-loss.json); the PNG goes next to it")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="replay each step from one CUDA graph (GPU; the first three steps run eagerly)")
    parser.add_argument("--save", type=Path, default=None, help="save the trained state dict here (generate.py "
                        "--checkpoint reads it)")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    use_interpreter_on_cpu(args.device)
    config = LlamaConfig.toy() if args.toy else LlamaConfig()
    batch = args.batch or (2 if args.toy else 8)
    seq = args.seq or (32 if args.toy else 1024)
    lr = args.lr or (1e-2 if args.toy else 1e-3)
    corpus = load_corpus(args.corpus_bytes or ((256 << 10) if args.toy else (16 << 20)))
    model = build_model(config, args.backend, args.device, args.seed)
    sampler = BatchSampler(corpus, batch, seq, seed=args.seed)
    if args.cuda_graph and torch.device(args.device).type != "cuda":
        raise SystemExit("--cuda-graph needs a CUDA device")
    losses, seconds = train_steps(model, sampler, args.steps, lr, args.device, cuda_graph=args.cuda_graph)
    timed = seconds[1:] or seconds  # the first step compiles kernels
    run = {"backend": args.backend, "device": args.device, "device_name": device_name(args.device),
           "dtype": str(next(model.parameters()).dtype), "config": config.as_dict(), "batch": batch,
           "seq_len": seq, "lr": lr, "seed": args.seed, "cuda_graph": args.cuda_graph, "corpus_bytes": corpus.numel(),
           "corpus_digest": corpus_digest(corpus), "losses": losses, "step_seconds": seconds,
           "tokens_per_s": batch * seq * len(timed) / sum(timed)}
    out = args.out or Path(f"llm-{args.backend}-loss.json")
    out.write_text(json.dumps(run, indent=1))
    print(f"{args.backend} on {run['device_name']}: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {args.steps} "
          f"steps, {run['tokens_per_s']:.0f} tokens/s; log {out}")
    plot([out], out.with_suffix(".png"))
    if args.save is not None:
        torch.save(model.state_dict(), args.save)
        print(f"saved the weights to {args.save}")
    return run


if __name__ == "__main__":
    main()
