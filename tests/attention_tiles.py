"""Attention tiles for the CPU tests of tilejit.ops: small enough that their short sequences span several key and
query blocks (the interpreter's speed), as ``**config`` (forward) and ``bwd_config`` (backward)."""

SMALL_ATTENTION_FWD = dict(BM=32, BN=16, num_warps=4)
SMALL_ATTENTION_BWD = {"dkdv": dict(BM=16, BN=32, num_warps=4), "dq": dict(BM=32, BN=16, num_warps=4)}
