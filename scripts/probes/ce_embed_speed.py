"""How long the cross-entropy and embedding ops of the example LLM take, next to torch (a probe, not a benchmark).

    python scripts/probes/ce_embed_speed.py [--rows 8192] [--dim 1024] [--vocabs 256,32000]

Rows of the table, per vocabulary (bf16, ``tilejit.testing.do_bench``: median of single runs after an L2 flush):

- ``ce chunk kernel``: ``cross_entropy_chunk`` on (rows, V) logits (loss and dlogits in place), against torch's
  ``F.cross_entropy`` forward and backward on the same logits;
- ``linear_cross_entropy``: the chunked op forward and backward (GEMMs included), against ``F.linear`` then
  ``F.cross_entropy``, forward and backward;
- ``embedding fwd`` / ``embedding fwd+bwd``: ``tilejit.ops.embedding`` of ``rows`` tokens, against
  ``F.embedding`` (the op's backward takes the one-hot GEMM for V <= 1024, else the atomic kernel);
- ``embedding bwd one-hot GEMM`` / ``embedding bwd atomic``: each backward kernel alone at every vocabulary,
  whichever the op would take (the atomic one with its zero fill and float32-to-bf16 cast), against
  ``aten.embedding_dense_backward``.

Every tilejit result is checked against torch before it is timed.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import tilejit
from tilejit.ops import embedding_lookup as emb
from tilejit.ops import linear_kernels as kernels
from tilejit.testing import do_bench


def _ce_chunk(rows, vocab):
    logits = (torch.randn(rows, vocab, device="cuda") * 2).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,), device="cuda")
    loss_rows = torch.empty(rows, device="cuda")
    scale = torch.tensor([1.0 / rows], device="cuda")
    expected = F.cross_entropy(logits.float(), targets)
    work = logits.clone()
    kernels.cross_entropy_chunk(work, targets, loss_rows, scale, -100)
    assert abs(loss_rows.mean().item() - expected.item()) <= 1e-3 * expected.item(), "ce chunk: wrong loss"
    leaf = logits.clone().requires_grad_()

    def torch_ce():
        leaf.grad = None
        F.cross_entropy(leaf, targets).backward()

    # the kernel overwrites the logits by their gradient: later runs read finite values of the same size
    return (do_bench(lambda: kernels.cross_entropy_chunk(work, targets, loss_rows, scale, -100)),
            do_bench(torch_ce))


def _linear_ce(rows, dim, vocab):
    h = (torch.randn(rows, dim, device="cuda") * 0.5).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(vocab, dim, device="cuda") * dim ** -0.5).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, vocab, (rows,), device="cuda")
    got = tilejit.ops.linear_cross_entropy(h, w, targets)
    expected = F.cross_entropy(F.linear(h, w).float(), targets)
    assert abs(got.item() - expected.item()) <= 2e-2 * expected.item(), "linear_cross_entropy: wrong loss"

    def run(loss_fn):
        def step():
            h.grad = w.grad = None
            loss_fn().backward()
        return step

    return (do_bench(run(lambda: tilejit.ops.linear_cross_entropy(h, w, targets))),
            do_bench(run(lambda: F.cross_entropy(F.linear(h, w).float(), targets))))


def _embedding(rows, dim, vocab):
    tokens = torch.randint(0, vocab, (rows,), device="cuda")
    weight = torch.randn(vocab, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    d_out = torch.randn(rows, dim, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(tilejit.ops.embedding(tokens, weight), F.embedding(tokens, weight)), "embedding: wrong rows"
    tilejit.ops.embedding(tokens, weight).backward(d_out)
    got, weight.grad = weight.grad, None
    F.embedding(tokens, weight).backward(d_out)
    err = (got.float() - weight.grad.float()).abs().max().item()
    assert err <= 1e-2 * weight.grad.float().abs().max().item(), f"embedding: dW off by {err}"

    def both(op):
        def step():
            weight.grad = None
            op(tokens, weight).backward(d_out)
        return step

    with torch.no_grad():
        forward = (do_bench(lambda: tilejit.ops.embedding(tokens, weight)),
                   do_bench(lambda: F.embedding(tokens, weight)))
    return forward, (do_bench(both(tilejit.ops.embedding)), do_bench(both(F.embedding)))


def _embedding_backward_kernels(rows, dim, vocab):
    """(one-hot GEMM, torch), (atomic, torch): each backward kernel alone, checked against torch first."""
    tokens = torch.randint(0, vocab, (rows,), device="cuda")
    d_out = torch.randn(rows, dim, device="cuda", dtype=torch.bfloat16)
    onehot_config = emb.onehot_launch_config(vocab, dim)
    onehot_grid = (tilejit.cdiv(vocab, onehot_config["BV"]), tilejit.cdiv(dim, onehot_config["BD"]))
    atomic_config = emb.launch_config(dim)
    atomic_grid = emb._grid(rows, dim, atomic_config)
    d_weight = torch.empty(vocab, dim, device="cuda", dtype=torch.bfloat16)

    def onehot():
        emb.embedding_bwd_onehot[onehot_grid](tokens, d_out, d_weight, **onehot_config)
        return d_weight

    def atomic():
        summed = torch.zeros(vocab, dim, device="cuda")
        emb.embedding_bwd[atomic_grid](tokens, d_out, summed, **atomic_config)
        return summed.to(torch.bfloat16)

    def torch_bwd():
        return torch.ops.aten.embedding_dense_backward(d_out, tokens, vocab, -1, False)

    expected = torch_bwd().float()
    for name, fn in (("one-hot GEMM", onehot), ("atomic", atomic)):
        err = (fn().float() - expected).abs().max().item()
        assert err <= 1e-2 * expected.abs().max().item(), f"embedding bwd {name}: dW off by {err}"
    theirs = do_bench(torch_bwd)
    return (do_bench(onehot), theirs), (do_bench(atomic), theirs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--vocabs", default="256,32000")
    args = parser.parse_args()
    vocabs = [int(v) for v in args.vocabs.split(",")]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, tilejit {tilejit.__version__}, bf16, "
          f"{args.rows} rows, dim {args.dim}\n")
    print("| what | vocab | tilejit ms | torch ms | torch / tilejit |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for vocab in vocabs:
        forward, both = _embedding(args.rows, args.dim, vocab)
        rows = [("ce chunk kernel (loss + dlogits) vs F.cross_entropy fwd+bwd", _ce_chunk(args.rows, vocab)),
                ("linear_cross_entropy fwd+bwd vs F.linear + F.cross_entropy", _linear_ce(args.rows, args.dim, vocab)),
                ("embedding fwd", forward), ("embedding fwd+bwd", both)]
        onehot, atomic = _embedding_backward_kernels(args.rows, args.dim, vocab)
        rows += [("embedding bwd one-hot GEMM kernel vs aten.embedding_dense_backward", onehot),
                 ("embedding bwd atomic kernel (+ zero fill, cast) vs aten.embedding_dense_backward", atomic)]
        for what, (ours, theirs) in rows:
            print(f"| {what} | {vocab} | {ours:.4f} | {theirs:.4f} | {theirs / ours:.2f} |")


if __name__ == "__main__":
    main()
