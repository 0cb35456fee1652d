"""Kernels written in tilejit's language, as PyTorch operators: importable after ``pip install`` and usable under
``torch.compile(fullgraph=True)`` and autograd.

- ``attention(q, k, v, *, causal, sm_scale, lens, out, bwd_config, **config)``: fused attention (operator
  ``tilejit::attention_fwd``, its backward ``tilejit::attention_bwd``); GQA, variable lengths, sliding windows
  (``window=(left, right)``) and logit softcaps (``softcap=c``).
- ``attention_forward`` / ``attention_backward``: the two passes as plain launches into preallocated tensors
  (the forward also writes the base-2 log-sum-exp the backward reads).
- ``fp8_blockscaled_matmul(a, a_scales, b, b_scales)`` and ``fp8_blockscaled_grouped_matmul(..., group_offsets)``:
  DeepSeek-V3's block-scaled float8 products (1x128 activation and 128x128 weight scales), dense and MoE-grouped
  (operators ``tilejit::fp8_blockscaled_mm`` / ``tilejit::fp8_blockscaled_grouped_mm``).

The compiler never imports this package (tests/ir/test_import_graph.py): it is a user of the language.
"""
from tilejit.ops.fp8_blockscaled import fp8_blockscaled_grouped_matmul, fp8_blockscaled_matmul
from tilejit.ops.fused_attention import attention, attention_backward, attention_forward

__all__ = ["attention", "attention_forward", "attention_backward", "fp8_blockscaled_matmul",
           "fp8_blockscaled_grouped_matmul"]
