"""A small Llama-style language model built from tilejit's PyTorch operators, and its plain-torch twin.

One module, two sets of operators: ``LlamaModel(config, backend="tilejit")`` runs ``tilejit.ops`` (embedding
lookup, its backward a one-hot GEMM over the 256 bytes, fused RMSNorm with the residual add, in-place rotary
embedding, fused attention, SwiGLU, fused linear + cross-entropy that never builds the logits, paged decode
attention); ``backend="torch"`` runs the same math in torch operators (``F.scaled_dot_product_attention``,
RMSNorm written out in float32, ...). Both read the same parameters, so ``model.backend = "torch"`` (or a copy
made from the same state dict) is the twin the tests and the benchmark compare against. A third set of operators
can be plugged in with ``model.ops = ...`` (benchmarks/llm.py does so for Liger Kernel).

Architecture: byte-level vocabulary of 256 (no special tokens: the corpus is bytes), grouped-query attention with
rotary embeddings (half-split, theta 10000), pre-norm RMSNorm blocks, SwiGLU MLP, untied input embedding and
output head. Every product has no bias.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    """The model's shape. ``LlamaConfig()`` is the full example (8 layers, width 1024, 16 query / 4 key-value
    heads of 64, about 90M parameters); ``LlamaConfig.toy()`` runs on CPU through the interpreter in seconds."""
    vocab_size: int = 256
    dim: int = 1024
    n_layers: int = 8
    n_heads: int = 16
    n_kv_heads: int = 4
    ffn_dim: int = 2816          # 8/3 * dim rounded up to a multiple of 256, as Llama sizes it
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"dim {self.dim} must split into n_heads {self.n_heads} heads, and n_heads into "
                             f"n_kv_heads {self.n_kv_heads} groups")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for the rotary embedding")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @classmethod
    def toy(cls) -> "LlamaConfig":
        return cls(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=128)

    def as_dict(self) -> dict:
        return asdict(self)


def _torch_rms_norm(x, weight, *, eps=1e-6, residual=None):
    s = x if residual is None else x + residual
    s32 = s.float()
    y = (s32 * torch.rsqrt(s32.square().mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
    return y if residual is None else (y, s)


def _rotate(x, cos, sin, positions):
    """Half-split rotary embedding of x (B, S, H, D) at positions (B, S), in float32."""
    batch, seq = x.shape[:2]
    pos = torch.arange(seq, device=x.device).expand(batch, seq) if positions is None else positions.long()
    c, s = cos[pos].unsqueeze(2), sin[pos].unsqueeze(2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def _torch_rotary_embedding(q, k, cos, sin, *, positions=None):
    return _rotate(q, cos, sin, positions), _rotate(k, cos, sin, positions)


def _torch_attention(q, k, v, *, causal=False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def _torch_swiglu_linear(x, w_gate, w_up):
    return F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)


def _torch_linear_cross_entropy(h, weight, targets, *, ignore_index=-100, reduction="mean"):
    return F.cross_entropy(F.linear(h, weight).float(), targets, ignore_index=ignore_index, reduction=reduction)


def paged_decode_attention_torch(q, k_cache, v_cache, cache_seqlens, block_table):
    """Decode attention over a paged cache in torch operators: the pages of each sequence gathered through the
    block table, keys at or past ``cache_seqlens[b]`` masked off. No host sync (usable under CUDA graphs)."""
    keys = k_cache[block_table.long()].flatten(1, 2).transpose(1, 2)      # (B, Hkv, pages * page_size, D)
    values = v_cache[block_table.long()].flatten(1, 2).transpose(1, 2)
    visible = torch.arange(keys.shape[2], device=q.device) < cache_seqlens.unsqueeze(1)
    out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=visible[:, None, None, :],
                                         enable_gqa=q.shape[1] != keys.shape[1])
    return out.squeeze(2)


#: The plain-torch operators, with the signatures of tilejit.ops.
TORCH_OPS = SimpleNamespace(embedding=F.embedding, rms_norm=_torch_rms_norm,
                            rotary_embedding=_torch_rotary_embedding, linear=F.linear,
                            attention=_torch_attention, swiglu_linear=_torch_swiglu_linear,
                            linear_cross_entropy=_torch_linear_cross_entropy,
                            decode_attention=paged_decode_attention_torch)


def tilejit_ops() -> SimpleNamespace:
    """tilejit's operators (imported when first asked for, so the torch twin runs without them)."""
    from tilejit import ops

    return SimpleNamespace(embedding=ops.embedding, rms_norm=ops.rms_norm,
                           rotary_embedding=ops.rotary_embedding, linear=ops.linear, attention=ops.attention,
                           swiglu_linear=ops.swiglu_linear, linear_cross_entropy=ops.linear_cross_entropy,
                           decode_attention=ops.decode_attention)


def rope_tables(config: LlamaConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (max_seq_len, head_dim // 2), float32: the rotation angles pos * theta^(-2i / head_dim)."""
    half = config.head_dim // 2
    inv_freq = config.rope_theta ** (-torch.arange(half, dtype=torch.float64) / half)
    angles = torch.arange(config.max_seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)


class Block(nn.Module):
    """Pre-norm attention and SwiGLU MLP; the residual adds happen inside the next norm (``rms_norm(...,
    residual=...)``), so a block takes the stream and the previous branch's output and returns both updated."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        c = config
        self.attn_norm = nn.Parameter(torch.ones(c.dim))
        self.wqkv = nn.Parameter(torch.empty((c.n_heads + 2 * c.n_kv_heads) * c.head_dim, c.dim))
        self.wo = nn.Parameter(torch.empty(c.dim, c.n_heads * c.head_dim))
        self.mlp_norm = nn.Parameter(torch.ones(c.dim))
        self.w_gate = nn.Parameter(torch.empty(c.ffn_dim, c.dim))
        self.w_up = nn.Parameter(torch.empty(c.ffn_dim, c.dim))
        self.w_down = nn.Parameter(torch.empty(c.dim, c.ffn_dim))
        self.config = config

    def split_heads(self, qkv):
        """(B, S, (Hq + 2 Hkv) * D) -> q (B, S, Hq, D), k, v (B, S, Hkv, D): views of the one projection."""
        c = self.config
        qkv = qkv.unflatten(-1, (c.n_heads + 2 * c.n_kv_heads, c.head_dim))
        return qkv.split([c.n_heads, c.n_kv_heads, c.n_kv_heads], dim=2)

    def forward(self, ops, stream, branch, rope, attend):
        """(stream, branch) -> (stream, branch): ``rope`` is (cos, sin, positions or None); ``attend(q, k, v)``
        maps the rotated q (B, S, Hq, D), k, v (B, S, Hkv, D) to the heads' outputs (B, S, Hq * D)."""
        eps = self.config.norm_eps
        if branch is None:
            y = ops.rms_norm(stream, self.attn_norm, eps=eps)
        else:
            y, stream = ops.rms_norm(branch, self.attn_norm, eps=eps, residual=stream)
        q, k, v = self.split_heads(ops.linear(y, self.wqkv))
        cos, sin, positions = rope
        q, k = ops.rotary_embedding(q, k, cos, sin, positions=positions)  # in place for tilejit: use the returned
        branch = ops.linear(attend(q, k, v), self.wo)
        y, stream = ops.rms_norm(branch, self.mlp_norm, eps=eps, residual=stream)
        return stream, ops.linear(ops.swiglu_linear(y, self.w_gate, self.w_up), self.w_down)


class LlamaModel(nn.Module):
    """The language model; ``backend`` ("tilejit" or "torch") picks the operators ``forward`` and the decoding
    methods run. Parameters are created in float32 on CPU from ``seed``, so every device and backend starts
    from the same weights; move and cast with ``.to(device, dtype)`` (the rotary tables stay float32)."""

    def __init__(self, config: LlamaConfig, backend: str = "tilejit", seed: int = 0):
        super().__init__()
        self.config = config
        self.embed = nn.Parameter(torch.empty(config.vocab_size, config.dim))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.final_norm = nn.Parameter(torch.ones(config.dim))
        self.head = nn.Parameter(torch.empty(config.vocab_size, config.dim))
        cos, sin = rope_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._init_weights(seed)
        self.backend = backend

    def _init_weights(self, seed: int):
        generator = torch.Generator().manual_seed(seed)
        out_std = 0.02 / math.sqrt(2 * self.config.n_layers)  # the residual branches' outputs, GPT-2 style
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = out_std if name.endswith(("wo", "w_down")) else 0.02
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=generator) * std)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.rope_cos, self.rope_sin = self.rope_cos.float(), self.rope_sin.float()
        return self

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, name: str):
        if name not in ("tilejit", "torch"):
            raise ValueError(f"backend must be 'tilejit' or 'torch', got {name!r}")
        self._backend = name
        self.ops = tilejit_ops() if name == "tilejit" else TORCH_OPS

    def _layers(self, tokens, positions, attend):
        """Runs every block over token ids (B, S) and returns the final normed hidden states (B, S, dim);
        ``attend(layer, q, k, v)`` is the attention of each layer."""
        ops = self.ops
        rope = (self.rope_cos, self.rope_sin, positions)
        stream, branch = ops.embedding(tokens, self.embed), None
        for layer, block in enumerate(self.blocks):
            stream, branch = block(ops, stream, branch, rope, lambda q, k, v: attend(layer, q, k, v))
        y, _ = ops.rms_norm(branch, self.final_norm, eps=self.config.norm_eps, residual=stream)
        return y

    def _causal_attention(self, q, k, v):
        out = self.ops.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        return out.transpose(1, 2).flatten(2)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean next-byte cross-entropy (float32 scalar) of ``targets`` (B, S) given ``tokens`` (B, S)."""
        y = self._layers(tokens, None, lambda layer, q, k, v: self._causal_attention(q, k, v))
        return self.ops.linear_cross_entropy(y.flatten(0, 1), self.head, targets.flatten())

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """The next-byte logits (B, S, vocab), float32, of token ids (B, S): the full logits, for checks."""
        y = self._layers(tokens, None, lambda layer, q, k, v: self._causal_attention(q, k, v))
        return self.ops.linear(y, self.head).float()

    # --- serving: prefill and one decode step over a paged KV cache (generate.py) ---

    def prefill(self, tokens: torch.Tensor, cache: "PagedKVCache") -> torch.Tensor:
        """Runs the prompts ``tokens`` (B, S) with causal attention, writes their keys and values into ``cache``
        at positions 0..S-1 and returns the logits (B, vocab) of the last position, in float32."""
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape)
        slots = cache.slots(positions)

        def attend(layer, q, k, v):
            cache.write(layer, slots, k, v)
            return self._causal_attention(q, k, v)

        y = self._layers(tokens, None, attend)
        return self.ops.linear(y[:, -1], self.head).float()

    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: "PagedKVCache") -> torch.Tensor:
        """One token per sequence: ``tokens`` (B,) at ``positions`` (B,) int64. Writes their keys and values into
        ``cache``, attends over positions 0..positions[b] and returns the next-token logits (B, vocab), float32.
        No host sync and no shape that depends on values: capturable in a CUDA graph."""
        seqlens = (positions + 1).to(torch.int32)
        pos = positions.unsqueeze(1)
        slots = cache.slots(pos)

        def attend(layer, q, k, v):
            cache.write(layer, slots, k, v)
            out = self.ops.decode_attention(q[:, 0], cache.keys[layer], cache.values[layer], seqlens,
                                            cache.block_table)
            return out.flatten(1).unsqueeze(1)

        y = self._layers(tokens.unsqueeze(1), pos, attend)
        return self.ops.linear(y[:, 0], self.head).float()


class PagedKVCache:
    """Keys and values of every layer in pages of ``page_size`` positions: ``keys[layer]`` is (num_pages,
    page_size, Hkv, D), and ``block_table`` (B, pages_per_seq) int32 names the page holding each sequence's
    positions [i * page_size, (i + 1) * page_size). Pages are handed out in a shuffled order (from ``seed``), so
    nothing relies on a sequence's pages being adjacent."""

    def __init__(self, config: LlamaConfig, batch: int, max_len: int, page_size: int = 16, *, dtype, device,
                 seed: int = 0):
        if max_len > config.max_seq_len:
            raise ValueError(f"max_len {max_len} is past the model's max_seq_len {config.max_seq_len}")
        self.page_size = page_size
        pages_per_seq = -(-max_len // page_size)
        num_pages = batch * pages_per_seq
        shape = (config.n_layers, num_pages, page_size, config.n_kv_heads, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
        self.block_table = order.view(batch, pages_per_seq).to(device=device, dtype=torch.int32)

    def slots(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(page, slot in the page) of positions (B, S): where ``write`` stores them, the same in every layer, so
        a step finds them once (no host sync)."""
        page = torch.gather(self.block_table, 1, (positions // self.page_size).to(torch.int64)).long()
        return page, positions % self.page_size

    def write(self, layer: int, slots: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor):
        """Stores k, v (B, S, Hkv, D) at ``slots`` (``slots(positions)``) by torch indexing (no host sync)."""
        page, slot = slots
        self.keys[layer][page, slot] = k
        self.values[layer][page, slot] = v
