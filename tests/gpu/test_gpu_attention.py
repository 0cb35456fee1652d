"""The attention example on the GPU against float64 SDPA: every config of its space, causal and not, ragged
sequence lengths, GQA and variable lengths; NaN-poisoned outputs."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("tilejit_examples_attention_gpu", ROOT / "examples" / "attention.py")
attention = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(attention)

CASES = [(dim, bm, bn, w) for dim, configs in attention.CONFIGS.items() for bm, bn, w in configs]


def _inputs(batch, heads, seq, dim, group, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, heads // group, seq, dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, heads // group, seq, dim, device="cuda", dtype=dtype)
    return q, k, v


def _check(out, ref, rows=None):
    assert not torch.isnan(out).any(), "some outputs were never written"
    if rows is not None:
        for b, n in enumerate(rows):
            torch.testing.assert_close(out[b, :, :n].double(), ref[b, :, :n], rtol=2e-2, atol=2e-2)
        return
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim, bm, bn, warps", CASES, ids=[f"d{d}-{m}x{n}-w{w}" for d, m, n, w in CASES])
def test_every_config(dim, bm, bn, warps, causal):
    q, k, v = _inputs(2, 4, 1000, dim, 2, seed=dim + bm + bn + causal)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, BM=bm, BN=bn, num_warps=warps)
    _check(out, attention.reference(q, k, v, causal))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seq", [1, 17, 4097])
@pytest.mark.parametrize("causal", [False, True])
def test_ragged_lengths_and_dtypes(seq, causal, dtype):
    q, k, v = _inputs(1, 2, seq, 128, 1, dtype=dtype, seed=seq)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out)
    _check(out, attention.reference(q, k, v, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_variable_lengths(causal):
    q, k, v = _inputs(3, 4, 300, 64, 4, seed=5)
    lens = torch.tensor([300, 1, 129], dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, lens=lens)
    _check(out, attention.reference(q, k, v, causal, lens=lens), rows=lens.tolist())


def test_scores_with_large_magnitudes_stay_finite():
    """The online softmax rescales: scores of +-60 after scaling neither overflow nor lose the maximum row."""
    q, k, v = _inputs(1, 2, 256, 64, 1, seed=9)
    q = (q * 30).to(q.dtype)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, out=out)
    _check(out, attention.reference(q, k, v, False))
