"""Kernels written in tilejit's language, as PyTorch operators: importable after ``pip install`` and usable under
``torch.compile(fullgraph=True)`` and autograd.

- ``attention(q, k, v, *, causal, sm_scale, lens, out, bwd_config, **config)``: fused attention (operator
  ``tilejit::attention_fwd``, its backward ``tilejit::attention_bwd``); GQA, variable lengths, sliding windows
  (``window=(left, right)``) and logit softcaps (``softcap=c``).
- ``decode_attention(q, k_cache, v_cache, cache_seqlens, block_table, *, sm_scale, window, softcap, k_scale,
  v_scale)``: one query token per sequence over a paged (or contiguous) KV cache, split-KV with a combine step,
  GQA, fp8 caches (operator ``tilejit::decode_attention``; ``decode_attention_forward`` is the plain launch).
- ``attention_forward`` / ``attention_backward``: the two passes as plain launches into preallocated tensors
  (the forward also writes the base-2 log-sum-exp the backward reads).

The compiler never imports this package (tests/ir/test_import_graph.py): it is a user of the language.
"""
from tilejit.ops.decode_attention import decode_attention, decode_attention_forward
from tilejit.ops.fused_attention import attention, attention_backward, attention_forward

__all__ = ["attention", "attention_forward", "attention_backward", "decode_attention", "decode_attention_forward"]
