"""Kernels written in tilejit's language, as PyTorch operators: importable after ``pip install`` and usable under
``torch.compile(fullgraph=True)`` and autograd.

- ``attention(q, k, v, *, causal, sm_scale, lens, out, bwd_config, **config)``: fused attention (operator
  ``tilejit::attention_fwd``, its backward ``tilejit::attention_bwd``); GQA, variable lengths, sliding windows
  (``window=(left, right)``) and logit softcaps (``softcap=c``).
- ``attention_fp8(q, k, v, *, q_scale, k_scale, v_scale, causal, sm_scale, out_dtype)``: the forward on e4m3
  inputs with per-tensor or per-block scales (operator ``tilejit::attention_fp8``; ``tilejit.ops.fp8_attention``).
- ``decode_attention(q, k_cache, v_cache, cache_seqlens, block_table, *, sm_scale, window, softcap, k_scale,
  v_scale)``: one query token per sequence over a paged (or contiguous) KV cache, split-KV with a combine step,
  GQA, fp8 caches (operator ``tilejit::decode_attention``; ``decode_attention_forward`` is the plain launch;
  kernels, ``reference`` and ``paged_cache`` in ``tilejit.ops.paged_decode``).
- ``attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, sm_scale,
  window, softcap, block_table)``: attention of packed variable-length sequences in ``flash_attn_varlen_func``'s
  conventions (operator ``tilejit::attention_varlen_fwd``, backward ``tilejit::attention_varlen_bwd``), and the
  forward over a paged key/value cache (``block_table``).
- ``attention_forward`` / ``attention_backward``: the two passes as plain launches into preallocated tensors
  (the forward also writes the base-2 log-sum-exp the backward reads).
- ``rms_norm(x, weight, *, eps, residual)``: RMSNorm over the last dim, optionally fused with the residual add
  (then ``(y, x + residual)``); operators ``tilejit::rms_norm_fwd`` / ``tilejit::rms_norm_bwd``.
- ``rotary_embedding(q, k, cos, sin, *, positions)``: half-split rotary embedding of q and k, in place when no
  gradient is recorded, else into fresh tensors (differentiable); operators ``tilejit::rotary_embedding_`` (in
  place) and ``tilejit::rotary_embedding``.
- ``linear(x, weight)``, ``swiglu_linear(x, w_gate, w_up)`` and ``linear_cross_entropy(h, weight, targets)``:
  the GEMM ops of a transformer, forward and backward (``linear_ops``; kernels in ``linear_kernels``).
- ``embedding(tokens, weight)``: the rows of ``weight`` that int32/int64 ``tokens`` name, differentiable in
  weight (the backward is a one-hot GEMM for small 16-bit vocabularies, else adds repeated tokens' rows with
  float32 atomics); operators ``tilejit::embedding_fwd`` / ``tilejit::embedding_bwd``.
- ``fp8_blockscaled_matmul(a, a_scales, b, b_scales)`` and ``fp8_blockscaled_grouped_matmul(..., group_offsets)``:
  DeepSeek-V3's block-scaled float8 products (1x128 activation and 128x128 weight scales), dense and MoE-grouped
  (operators ``tilejit::fp8_blockscaled_mm`` / ``tilejit::fp8_blockscaled_grouped_mm``).
- ``mxfp8_matmul(a, a_scales, b, b_scales)``: the microscaled (OCP MX) float8 product, e8m0 scales per 32 of K
  (operator ``tilejit::mxfp8_mm``).

The compiler never imports this package (tests/ir/test_import_graph.py): it is a user of the language.
"""
from tilejit.ops.embedding_lookup import embedding
from tilejit.ops.paged_decode import decode_attention, decode_attention_forward
from tilejit.ops.fp8_attention import attention_fp8
from tilejit.ops.fp8_blockscaled import fp8_blockscaled_grouped_matmul, fp8_blockscaled_matmul
from tilejit.ops.fused_attention import attention, attention_backward, attention_forward
from tilejit.ops.linear_ops import linear, linear_cross_entropy, swiglu_linear
from tilejit.ops.mxfp8 import mxfp8_matmul
from tilejit.ops.norm import rms_norm
from tilejit.ops.rotary import rotary_embedding
from tilejit.ops.varlen_attention import attention_varlen

__all__ = ["attention", "attention_forward", "attention_backward", "attention_varlen", "attention_fp8",
           "decode_attention", "decode_attention_forward", "rms_norm", "rotary_embedding", "linear", "swiglu_linear",
           "linear_cross_entropy", "embedding", "fp8_blockscaled_matmul", "fp8_blockscaled_grouped_matmul",
           "mxfp8_matmul"]
