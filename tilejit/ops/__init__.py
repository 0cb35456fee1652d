"""Kernels written in tilejit's language, as PyTorch operators: importable after ``pip install`` and usable under
``torch.compile(fullgraph=True)`` and autograd.

- ``attention(q, k, v, *, causal, sm_scale, lens, out, bwd_config, **config)``: fused attention (operator
  ``tilejit::attention_fwd``, its backward ``tilejit::attention_bwd``); GQA, variable lengths, sliding windows
  (``window=(left, right)``) and logit softcaps (``softcap=c``).
- ``attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, sm_scale,
  window, softcap, block_table)``: attention of packed variable-length sequences in ``flash_attn_varlen_func``'s
  conventions (operator ``tilejit::attention_varlen_fwd``, backward ``tilejit::attention_varlen_bwd``), and the
  forward over a paged key/value cache (``block_table``).
- ``attention_forward`` / ``attention_backward``: the two passes as plain launches into preallocated tensors
  (the forward also writes the base-2 log-sum-exp the backward reads).

The compiler never imports this package (tests/ir/test_import_graph.py): it is a user of the language.
"""
from tilejit.ops.fused_attention import attention, attention_backward, attention_forward
from tilejit.ops.varlen_attention import attention_varlen

__all__ = ["attention", "attention_forward", "attention_backward", "attention_varlen"]
