"""The Llama-style model of examples/llm, trained and served: tilejit's operators against eager torch,
torch.compile and Liger Kernel.

    python -m benchmarks.llm [--batch 8] [--seq 1024] [--steps 20] [--decode-batches 1,32] [--prompt 512]
                             [--new-tokens 128] [--skip-train] [--skip-decode] [--out DIR]

Training (bf16 parameters, activations and AdamW state; one step = forward, backward, gradient clipping and
AdamW): tokens per second over ``--steps`` steps after ``--warmup`` steps (compiles, autotuning and CUDA graph
recording happen there) and the peak of ``torch.cuda.max_memory_allocated`` over the timed steps (parameters and
optimizer state included). Implementations: the torch twin eager, under ``torch.compile`` (default and
``mode="max-autotune"``), with Liger Kernel's RMSNorm, RoPE, SwiGLU and fused linear cross-entropy (attention
stays SDPA, as Liger leaves it; skipped, saying so, when ``import liger_kernel`` fails), and tilejit's operators
eager and under ``torch.compile`` (the glue between the custom operators compiled). max-autotune replays CUDA
graphs; its like are the "+ CUDA graph" rows, tilejit's and the eager torch twin's whole step (forward, backward,
clipping, a capturable AdamW) replayed from one graph (``examples/llm/train.GraphedTrainStep``). Every variant
starts from the same weights and batches; its first loss is printed next to its numbers.

Decode (bf16): prefill of ``--prompt`` random tokens, then ``--new-tokens`` greedy decode steps over a paged KV
cache; tokens per second over the decode steps at each batch of ``--decode-batches``. tilejit's step
(``decode_attention`` over the pages) captured in one CUDA graph, against ``torch.compile(mode="reduce-overhead")``
of the torch twin's step (the same paged cache, read by gathering its pages), and both eager.

Every number is printed with the GPU it ran on; the table comes last, and the results go to ``--out``/llm.json.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import DEFAULT_OUT, machine_stamp, markdown_table, write_json

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llm"
sys.path.insert(0, str(EXAMPLE))
from data import BatchSampler, load_corpus  # noqa: E402
from generate import Decoder  # noqa: E402
from model import TORCH_OPS, LlamaConfig, LlamaModel, PagedKVCache  # noqa: E402
from train import GraphedTrainStep, make_optimizer, train_step  # noqa: E402

HEADERS = ["workload", "implementation", "tokens/s", "peak GiB", "vs reference", "device"]


def liger_ops():
    """The model's operators with Liger Kernel's RMSNorm, RoPE, SwiGLU and fused linear cross-entropy; None (and
    a line saying so) when liger_kernel does not import."""
    try:
        from liger_kernel.transformers.functional import (liger_fused_linear_cross_entropy, liger_rms_norm,
                                                          liger_rope, liger_swiglu)
    except ImportError as exc:
        print(f"Liger Kernel is not installed ({exc}): its row is left out (pip install liger-kernel)")
        return None
    import torch.nn.functional as F

    def rms_norm(x, weight, *, eps=1e-6, residual=None):
        s = x if residual is None else x + residual
        y = liger_rms_norm(s.reshape(-1, s.shape[-1]), weight, eps).view(s.shape)
        return y if residual is None else (y, s)

    def rotary_embedding(q, k, cos, sin, *, positions=None):
        seq = q.shape[1]  # Liger's RoPE takes (B, H, S, D) and full-width (1, S, D) tables, HF style
        cos_full = torch.cat([cos[:seq], cos[:seq]], -1).to(q.dtype).unsqueeze(0)
        sin_full = torch.cat([sin[:seq], sin[:seq]], -1).to(q.dtype).unsqueeze(0)
        q, k = liger_rope(q.transpose(1, 2), k.transpose(1, 2), cos_full, sin_full)
        return q.transpose(1, 2), k.transpose(1, 2)

    def swiglu_linear(x, w_gate, w_up):
        return liger_swiglu(F.linear(x, w_gate), F.linear(x, w_up))

    def linear_cross_entropy(h, weight, targets, *, ignore_index=-100, reduction="mean"):
        return liger_fused_linear_cross_entropy(h, weight, targets, ignore_index=ignore_index, reduction=reduction)

    return type(TORCH_OPS)(**{**vars(TORCH_OPS), "rms_norm": rms_norm, "rotary_embedding": rotary_embedding,
                              "swiglu_linear": swiglu_linear, "linear_cross_entropy": linear_cross_entropy})


def _fresh_model(backend: str, ops=None) -> LlamaModel:
    gc.collect()  # the previous variant's model, optimizer state and graphs, before the peak is reset
    torch.cuda.empty_cache()
    model = LlamaModel(LlamaConfig(), backend=backend, seed=0).to("cuda", torch.bfloat16)
    if ops is not None:
        model.ops = ops
    return model


def time_training(name: str, backend: str, compile_mode, args, corpus, ops=None, graph: bool = False) -> dict:
    """Tokens/s and peak memory of ``args.steps`` training steps of one implementation; ``graph``: each step
    replayed from one CUDA graph (``GraphedTrainStep``, after its eager warm-up steps)."""
    torch._dynamo.reset()
    model = _fresh_model(backend, ops)
    optimizer = make_optimizer(model, lr=1e-3, capturable=graph)
    forward = model if compile_mode is None else torch.compile(
        model, **({} if compile_mode == "default" else {"mode": compile_mode}))
    sampler = BatchSampler(corpus, args.batch, args.seq, seed=0)
    graphed = GraphedTrainStep(model, optimizer, forward) if graph else None
    warmup = max(args.warmup, graphed.warmup + 1) if graph else args.warmup  # a graph's steps: eager, then capture
    batches = [sampler.next("cuda") for _ in range(warmup + args.steps)]

    def step(tokens, targets):
        return graphed(tokens, targets) if graph else train_step(model, optimizer, tokens, targets, forward)

    first_loss = step(*batches[0]).item()
    eager_peak = 0
    for index, (tokens, targets) in enumerate(batches[1:warmup], start=1):
        last_eager = graph and index == graphed.warmup - 1  # the last eager step: what the graph's pool holds
        if last_eager:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        step(tokens, targets)
        if last_eager:
            torch.cuda.synchronize()
            eager_peak = torch.cuda.max_memory_allocated()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for tokens, targets in batches[warmup:]:
        step(tokens, targets)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    # A replay allocates nothing: its activations live in the graph's private pool, which the allocator counts
    # as reserved, not allocated. The peak of the same step run eagerly is the graph row's memory.
    peak = max(eager_peak, torch.cuda.max_memory_allocated())
    if args.profile:
        _print_profile(name, step, batches[-1])
    row = {"workload": f"train B={args.batch} S={args.seq}", "implementation": name,
           "tokens_per_s": args.batch * args.seq * args.steps / elapsed,
           "peak_gib": peak / 2**30, "first_loss": first_loss,
           "device": torch.cuda.get_device_name()}
    print(f"{name}: {row['tokens_per_s']:.0f} tokens/s, peak {row['peak_gib']:.2f} GiB, first loss "
          f"{first_loss:.4f} on {row['device']}", flush=True)
    return row


def _print_profile(name: str, step, batch, steps: int = 1) -> None:
    """The GPU time of ``steps`` more steps by kernel and their host time by operator (torch.profiler), the
    largest first: a step whose host time exceeds its GPU time leaves the GPU waiting."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step(*batch)
        host_ms = (time.perf_counter() - start) * 1e3
        torch.cuda.synchronize()
    averages = prof.key_averages()
    print(f"GPU time of {steps} {name} step(s) by kernel:")
    print(averages.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=90))
    print(f"host time of {steps} {name} step(s) by operator ({host_ms:.1f} ms to issue them, profiled):")
    print(averages.table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=90))


def time_decode(name: str, backend: str, how: str, batch: int, args) -> dict:
    """Decode tokens/s of one implementation at ``batch``: ``how`` is "graph" (our CUDA graph of the step),
    "reduce-overhead" (torch.compile of the step) or "eager"."""
    torch._dynamo.reset()
    model = _fresh_model(backend)
    config = model.config
    generator = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, config.vocab_size, (batch, args.prompt), generator=generator).cuda()
    cache = PagedKVCache(config, batch, args.prompt + args.new_tokens + 4, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        first = model.prefill(prompts, cache).argmax(-1)
        decoder = Decoder(model, cache, batch, prompts.device, use_graph=how == "graph")
        decoder.tokens.copy_(first)
        decoder.positions.fill_(args.prompt)
        if how == "reduce-overhead":
            for tensor in (cache.keys, cache.values, cache.block_table):
                torch._dynamo.mark_static_address(tensor)
            compiled = torch.compile(lambda t, p: model.decode_step(t, p, cache), mode="reduce-overhead")

            def run():
                torch.compiler.cudagraph_mark_step_begin()
                return compiled(decoder.tokens, decoder.positions)
        else:
            run = decoder.run
        for _ in range(3):  # compiles, autotunes, captures; writes positions the timed steps write again
            decoder.tokens.copy_(run().argmax(-1))
        decoder.positions.fill_(args.prompt)
        decoder.tokens.copy_(first)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.new_tokens):
            decoder.tokens.copy_(run().argmax(-1))
            decoder.positions += 1
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if args.profile:  # three more steps: the cache keeps 4 spare slots past the timed ones
            _print_profile(f"{name} decode B={batch}", lambda: decoder.tokens.copy_(run().argmax(-1)), (), steps=3)
    row = {"workload": f"decode B={batch} ctx {args.prompt}+{args.new_tokens}", "implementation": name,
           "tokens_per_s": batch * args.new_tokens / elapsed, "peak_gib": None,
           "device": torch.cuda.get_device_name()}
    if how == "reduce-overhead":  # torch.compile falls back to no graph when it cannot capture one: say so
        skips = torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0)
        if skips:
            row["implementation"] += f" ({skips} CUDA graph skips: run with TORCH_LOGS=perf_hints for why)"
    print(f"{row['implementation']}, batch {batch}: {row['tokens_per_s']:.1f} tokens/s on {row['device']}",
          flush=True)
    return row


def measured(timer, name: str, *args) -> dict:
    """``timer(name, *args)``'s row; an implementation that fails gets a row without numbers saying so, and the
    benchmark goes on with the others."""
    try:
        return timer(name, *args)
    except Exception as exc:  # noqa: BLE001 - one failing implementation must not lose the others' numbers
        print(f"{name} failed: {type(exc).__name__}: {exc}", flush=True)
        workload = (f"train B={args[2].batch} S={args[2].seq}" if timer is time_training
                    else f"decode B={args[2]} ctx {args[3].prompt}+{args[3].new_tokens}")
        return {"workload": workload,
                "implementation": f"{name} (failed: {type(exc).__name__})", "tokens_per_s": None,
                "peak_gib": None, "device": torch.cuda.get_device_name()}
    finally:
        gc.collect()
        torch.cuda.empty_cache()


def _with_ratios(rows: list[dict], reference: str) -> None:
    base = next((r["tokens_per_s"] for r in rows if r["implementation"].startswith(reference)), None)
    for r in rows:
        ok = base and r["tokens_per_s"]
        r["vs_reference"] = f"{r['tokens_per_s'] / base:.2f}x {reference}" if ok else None


def _rounded(value, digits):
    return None if value is None else round(value, digits or None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--decode-batches", default="1,32")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--only", help="comma-separated implementations to run (default: all), e.g. "
                        "'eager torch,tilejit'")
    parser.add_argument("--profile", action="store_true",
                        help="after timing, print the GPU time by kernel of one more training step and of three more "
                        "decode steps (torch.profiler)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    only = None if args.only is None else {name.strip() for name in args.only.split(",")}
    if not torch.cuda.is_available():
        parser.error("benchmarks.llm times CUDA: no GPU is visible")
    args.warmup = max(args.warmup, 1)
    meta = machine_stamp()
    train_rows, decode_rows = [], []
    if not args.skip_train:
        corpus = load_corpus()
        # Cheapest first, so that a run cut short still has tilejit next to eager and torch.compile; max-autotune's
        # tuning takes minutes and comes last.
        # max-autotune replays CUDA graphs: the "+ CUDA graph" rows are its like (the whole step in one graph).
        variants = [("eager torch", "torch", None, None, False), ("torch.compile", "torch", "default", None, False),
                    ("tilejit", "tilejit", None, None, False), ("tilejit + CUDA graph", "tilejit", None, None, True),
                    ("eager torch + CUDA graph", "torch", None, None, True),
                    ("tilejit + torch.compile", "tilejit", "default", None, False)]
        liger = liger_ops()
        if liger is not None:
            variants.append(("Liger Kernel", "torch", None, liger, False))
        variants.append(("torch.compile max-autotune", "torch", "max-autotune", None, False))
        for name, backend, mode, ops, graph in variants:
            if only is not None and name not in only:
                continue
            train_rows.append(measured(time_training, name, backend, mode, args, corpus, ops, graph))
        _with_ratios(train_rows, "torch.compile max-autotune")
        eager_peak = next((r["peak_gib"] for r in train_rows if r["implementation"] == "eager torch"), None)
        for r in train_rows:
            if eager_peak and r["peak_gib"]:
                r["vs_reference"] = f"{r['vs_reference'] or 'n/a'}, {r['peak_gib'] / eager_peak:.2f}x eager's memory"
    if not args.skip_decode:
        for batch in (int(b) for b in args.decode_batches.split(",")):
            decoders = [("torch eager", "torch", "eager"),
                        ("torch.compile reduce-overhead", "torch", "reduce-overhead"),
                        ("tilejit eager", "tilejit", "eager"), ("tilejit CUDA graph", "tilejit", "graph")]
            rows = [measured(time_decode, name, backend, how, batch, args) for name, backend, how in decoders
                    if only is None or name in only]
            _with_ratios(rows, "torch.compile reduce-overhead")
            decode_rows += rows
    rows = train_rows + decode_rows
    write_json(args.out / "llm.json", {"meta": meta, "args": vars(args) | {"out": str(args.out)}, "rows": rows})
    print(f"\nwrote {args.out / 'llm.json'}\n")
    print(markdown_table(HEADERS, [[r["workload"], r["implementation"], _rounded(r["tokens_per_s"], 0),
                                    _rounded(r["peak_gib"], 2), r.get("vs_reference"), r["device"]] for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
