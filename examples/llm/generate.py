"""Serves the model of model.py: prefill of the prompt with ``attention``, then one decode step per token with
``decode_attention`` over a paged KV cache, the step captured once in a CUDA graph and replayed per token.

    python examples/llm/generate.py --checkpoint llm-tilejit.pt --prompt "def " --new-tokens 200
    python examples/llm/generate.py --checkpoint llm-tilejit.pt --no-graph        # eager decode steps
    python examples/llm/generate.py --toy --device cpu --new-tokens 4             # CPU, through the interpreter

Without ``--checkpoint`` the model has its initial (untrained) weights. Sampling is greedy unless
``--temperature`` > 0; it runs outside the graph, on the logits the step leaves in its static output.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import LlamaConfig, LlamaModel, PagedKVCache  # noqa: E402
from train import build_model, default_device, device_name, use_interpreter_on_cpu  # noqa: E402


class Decoder:
    """One decode step over static tensors: ``tokens`` and ``positions`` (B,) in, ``logits`` (B, vocab) out, the
    KV cache written in place. With ``use_graph`` (CUDA only) the step is captured once and replayed."""

    def __init__(self, model: LlamaModel, cache: PagedKVCache, batch: int, device, use_graph: bool):
        if use_graph and torch.device(device).type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device: pass --no-graph on CPU")
        self.model, self.cache = model, cache
        self.tokens = torch.zeros(batch, dtype=torch.int64, device=device)
        self.positions = torch.zeros(batch, dtype=torch.int64, device=device)
        self.logits = None
        self.graph = None
        self.use_graph = use_graph

    def _step(self):
        return self.model.decode_step(self.tokens, self.positions, self.cache)

    def capture(self):
        """Warms the step up on a side stream (kernels compile, autotune and allocate there), then captures it.
        The warm-up writes the cache at the current position, which the first replay writes again."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._step()

    def run(self) -> torch.Tensor:
        if not self.use_graph:
            self.logits = self._step()
        else:
            if self.graph is None:
                self.capture()
            self.graph.replay()
        return self.logits


def sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """Next tokens (B,) int64: the argmax, or a draw from softmax(logits / temperature)."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


@torch.no_grad()
def generate(model: LlamaModel, prompts: torch.Tensor, new_tokens: int, *, temperature: float = 0.0,
             use_graph: bool = True, page_size: int = 16, seed: int = 0) -> tuple[torch.Tensor, float]:
    """``new_tokens`` tokens after each prompt of ``prompts`` (B, S) int64: (tokens (B, new_tokens), decode
    tokens per second over the decode steps, prefill excluded)."""
    batch, prompt_len = prompts.shape
    device = prompts.device
    dtype = next(model.parameters()).dtype
    cache = PagedKVCache(model.config, batch, prompt_len + new_tokens, page_size, dtype=dtype, device=device,
                         seed=seed)
    generator = torch.Generator(device=device).manual_seed(seed)
    decoder = Decoder(model, cache, batch, device, use_graph)
    decoder.tokens.copy_(sample(model.prefill(prompts, cache), temperature, generator))
    decoder.positions.fill_(prompt_len)
    if use_graph:
        decoder.capture()
    out = [decoder.tokens.clone()]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(new_tokens - 1):
        decoder.tokens.copy_(sample(decoder.run(), temperature, generator))
        decoder.positions += 1
        out.append(decoder.tokens.clone())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    steps = max(new_tokens - 1, 0)
    return torch.stack(out, dim=1), (batch * steps / elapsed if steps else 0.0)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", default="def ")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1, help="the prompt repeated over a batch")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--no-graph", action="store_true", help="eager decode steps instead of a CUDA graph")
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--toy", action="store_true")
    parser.add_argument("--backend", choices=("tilejit", "torch"), default="tilejit")
    parser.add_argument("--checkpoint", type=Path, default=None, help="a state dict saved by train.py --save")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None) -> torch.Tensor:
    args = parse_args(argv)
    use_interpreter_on_cpu(args.device)
    use_graph = not args.no_graph and torch.device(args.device).type == "cuda"
    if not args.no_graph and not use_graph:
        print("no CUDA device: decoding without CUDA graphs")
    config = LlamaConfig.toy() if args.toy else LlamaConfig()
    model = build_model(config, args.backend, args.device, args.seed)
    if args.checkpoint is not None:
        model.load_state_dict(torch.load(args.checkpoint, map_location=args.device))
    prompt = torch.tensor(list(args.prompt.encode()), dtype=torch.int64, device=args.device)
    if prompt.numel() == 0:
        raise SystemExit("--prompt must not be empty")
    tokens, rate = generate(model, prompt.expand(args.batch, -1).contiguous(), args.new_tokens,
                            temperature=args.temperature, use_graph=use_graph, page_size=args.page_size,
                            seed=args.seed)
    text = bytes(tokens[0].tolist()).decode("utf-8", errors="replace")
    print(f"{args.prompt}{text}")
    print(f"-- {args.backend}, {'CUDA graph' if use_graph else 'eager'} decode on {device_name(args.device)}: "
          f"{rate:.1f} tokens/s at batch {args.batch}")
    return tokens


if __name__ == "__main__":
    main()
