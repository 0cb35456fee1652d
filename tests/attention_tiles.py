"""Attention tiles for the CPU tests of tilejit.ops: small enough that their short sequences span several key and
query blocks (the interpreter's speed), as ``**config`` (forward) and ``bwd_config`` (backward); and the forward
kernel's arguments as meta tensors, for compiles."""
import torch

SMALL_ATTENTION_FWD = dict(BM=32, BN=16, num_warps=4)
SMALL_ATTENTION_BWD = {"dkdv": dict(BM=16, BN=32, num_warps=4), "dq": dict(BM=32, BN=16, num_warps=4)}


def fwd_meta_args(dim: int, seq: int = 1000, heads: int = 4, group: int = 2):
    """``attn_fwd``'s arguments up to ``H``: bf16 (2, heads, seq, dim) q and out, k and v with heads // group
    heads, the LSE and lengths, on the meta device."""
    q = torch.empty(2, heads, seq, dim, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(2, heads // group, seq, dim, dtype=torch.bfloat16, device="meta")
    lens = torch.empty(2, dtype=torch.int32, device="meta")
    lse = torch.empty(2, heads, seq, dtype=torch.float32, device="meta")
    return (q, kv, kv, q, lse, lens, 0.125, heads)
