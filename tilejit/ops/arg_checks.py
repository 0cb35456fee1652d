"""The argument checks the entry points of ``tilejit.ops`` share.

A mistake in a call to an op is refused before anything is compiled or launched, with a typed error that names
the op, the argument and what to pass: ``ArgumentError`` (a ``TypeError``) for what an argument is (not a
tensor, a dtype the kernels do not take, a string where a number goes), ``ArgumentValueError`` (a
``ValueError``) for its shape, device or value. The checks read shapes, dtypes and devices, never a tensor's
values: they cost no host sync, so the ops they guard stay capturable in CUDA graphs. The two error classes are
reachable here (``arg_checks.ArgumentValueError``) for the checks that stay in an op's own module.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from tilejit import knobs
from tilejit.errors import ArgumentError, ArgumentValueError

#: The activation dtypes of the ops' tensor-core kernels (float32 runs as tf32 products).
FLOATS = (torch.float16, torch.bfloat16, torch.float32)
#: The head dims the padded attention kernels take (README: "head dims up to 256").
MAX_HEAD_DIM = 256


def dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    """``float16, bfloat16 or float32``."""
    names = [str(d).removeprefix("torch.") for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def tensors(op: str, **named) -> None:
    """Each of ``named`` is a tensor (optional ones: :func:`optional_tensors`)."""
    for name, value in named.items():
        if not isinstance(value, torch.Tensor):
            raise ArgumentError(f"{op}: {name} must be a torch.Tensor, got {type(value).__name__}")


def optional_tensors(op: str, **named) -> None:
    """Each of ``named`` is a tensor or None."""
    for name, value in named.items():
        if value is not None and not isinstance(value, torch.Tensor):
            raise ArgumentError(f"{op}: {name} must be a torch.Tensor or None, got {type(value).__name__}")


def dtype(op: str, name: str, t: torch.Tensor, allowed: Iterable[torch.dtype]) -> None:
    allowed = tuple(allowed)
    if t.dtype not in allowed:
        raise ArgumentError(f"{op}: {name} is {t.dtype}; the kernels take {dtype_names(allowed)}")


def same_dtype(op: str, **named: torch.Tensor) -> None:
    """Every tensor of ``named`` has the first one's dtype."""
    (first, ref), *rest = named.items()
    for name, t in rest:
        if t.dtype != ref.dtype:
            raise ArgumentError(f"{op}: {name} is {t.dtype} but {first} is {ref.dtype}; {', '.join(named)} must "
                                f"share one dtype")


def rank(op: str, name: str, t: torch.Tensor, layout: tuple[str, ...], hint: str = "") -> None:
    """``t`` has one dim per name of ``layout`` (``("batch", "heads", "seq", "head_dim")``)."""
    if t.dim() != len(layout):
        raise ArgumentValueError(f"{op}: {name} must be {len(layout)}-D ({', '.join(layout)}), got shape "
                                 f"{tuple(t.shape)}{hint}")


def same_device(op: str, **named: torch.Tensor | None) -> None:
    """Every tensor of ``named`` (None skipped) is on the first one's device."""
    (first, ref), *rest = named.items()
    for name, t in rest:
        if t is not None and t.device != ref.device:
            raise ArgumentValueError(f"{op}: {name} is on {t.device} but {first} is on {ref.device}; move them to "
                                     f"one device")


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor  # (torch's own; imported when a CPU tensor comes by)

    return isinstance(t, FakeTensor)


def runs_on(op: str, name: str, t: torch.Tensor, launches: bool | None = None) -> None:
    """``t`` is where the op's kernels run: a CUDA tensor, a meta one (shapes only, as torch.compile traces), or a
    CPU tensor under the interpreter (``TILEJIT_INTERPRET=1``). A call that launches nothing (``launches``; by
    default, when ``t`` is empty) passes on any device: its empty or zero result needs no kernel. Checked after
    the shapes, so that a wrong shape is named first. A fake tensor (``FakeTensorMode``, torch.compile's tracing)
    passes on any device: the operator's shape function answers it, and no kernel runs."""
    launches = t.numel() > 0 if launches is None else launches
    if t.device.type not in ("cuda", "meta") and launches and not knobs.interpret() and not _is_fake(t):
        raise ArgumentValueError(f"{op}: {name} is on {t.device}; {op} runs on CUDA tensors (CPU tensors only "
                                 f"through the interpreter, TILEJIT_INTERPRET=1)")


def number(op: str, name: str, value, *, default: float | None = None) -> float | None:
    """A finite real number as a float (``default`` for None); a bool or a string is not one."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentError(f"{op}: {name} must be a number or None, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ArgumentValueError(f"{op}: {name} must be finite, got {value!r}")
    return float(value)


def sm_scale(op: str, value, head_dim: int) -> float:
    """The softmax scale: a finite number > 0, or None for 1 / sqrt(head_dim). The kernels take each row's running
    max of the unscaled scores and scale it after, which keeps the order of the scores only for a positive scale (a
    negative or zero one gave NaN)."""
    scale = number(op, "sm_scale", value, default=1.0 / math.sqrt(max(head_dim, 1)))
    if not scale > 0.0:
        raise ArgumentValueError(f"{op}: sm_scale must be a finite number > 0 (None: 1 / sqrt(head_dim)), got "
                                 f"{value!r}")
    return scale


def window(op: str, value) -> tuple[int, int]:
    """flash_attn's ``window=(left, right)``: two ints >= -1 (-1 unbounded), or None (both unbounded)."""
    if value is None:
        return -1, -1
    if not isinstance(value, (tuple, list)):
        raise ArgumentError(f"{op}: window must be (left, right), two ints >= -1 (-1: unbounded), or None; got "
                            f"{type(value).__name__} {value!r}")
    if len(value) != 2 or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in value):
        raise ArgumentValueError(f"{op}: window must be (left, right), two ints >= -1 (-1: unbounded), got "
                                 f"{value!r}")
    return int(value[0]), int(value[1])


def softcap(op: str, value) -> float:
    """The logit softcap: a finite number >= 0, 0 or None meaning off."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ArgumentError(f"{op}: softcap must be a number (0 or None: off), got {type(value).__name__} "
                            f"{value!r}")
    if value is not None and not (value >= 0 and math.isfinite(value)):
        raise ArgumentValueError(f"{op}: softcap must be a finite number > 0 (0 or None: off), got {value!r}")
    return float(value or 0.0)


def out_dtype(op: str, value, allowed: Iterable[torch.dtype]) -> None:
    allowed = tuple(allowed)
    if not isinstance(value, torch.dtype) or value not in allowed:
        got = f"{type(value).__name__} {value!r}" if not isinstance(value, torch.dtype) else str(value)
        raise ArgumentError(f"{op}: out_dtype must be one of {', '.join(map(str, allowed))}, got {got}")


def like(op: str, name: str, t, shape: tuple[int, ...], dtypes: Iterable[torch.dtype], device: torch.device,
         what: str = "") -> None:
    """A tensor argument the op writes or reads whole (``out=``, a gradient, a scratch buffer): a tensor of
    ``shape``, one of ``dtypes``, on ``device``. ``what`` says what it is shaped like (``"like q"``)."""
    tensors(op, **{name: t})
    dtypes = tuple(dtypes)
    shape = tuple(shape)
    if tuple(t.shape) != shape or t.dtype not in dtypes or t.device != device:
        want = f"{dtype_names(dtypes)} of shape {shape} on {device}" + (f" ({what})" if what else "")
        raise ArgumentValueError(f"{op}: {name} must be {want}, got {t.dtype} of shape {tuple(t.shape)} on "
                                 f"{t.device}")


def attention_operands(op: str, q, k, v, *, dtypes: Iterable[torch.dtype] = FLOATS,
                       max_head_dim: int = MAX_HEAD_DIM) -> int:
    """q (batch, heads, seq, head_dim) and k, v (batch, kv_heads, seq, head_dim) of the padded attention kernels,
    one dtype of ``dtypes``, on one device; returns the GQA group (heads // kv_heads). The kernels attend over
    ``seq`` keys: k and v have q's sequence length. (Whether that device runs the kernels, :func:`runs_on`, is
    the caller's last check.)"""
    tensors(op, q=q, k=k, v=v)
    layout = ("batch", "heads", "seq", "head_dim")
    hint = ("; packed (tokens, heads, head_dim) sequences go to attention_varlen, one query token per sequence to "
            "decode_attention" if q.dim() == 3 else "")
    rank(op, "q", q, layout, hint)
    rank(op, "k", k, ("batch", "kv_heads", "seq", "head_dim"))
    rank(op, "v", v, ("batch", "kv_heads", "seq", "head_dim"))
    dtype(op, "q", q, dtypes)
    same_dtype(op, q=q, k=k, v=v)
    same_device(op, q=q, k=k, v=v)
    batch, heads, seq, dim = q.shape
    if k.shape != v.shape:
        raise ArgumentValueError(f"{op}: k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape")
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, seq, dim):
        raise ArgumentValueError(f"{op}: k and v {tuple(k.shape)} must be (batch, kv_heads, seq, head_dim) with "
                                 f"q's batch {batch}, seq {seq} and head_dim {dim}; q is {tuple(q.shape)}")
    kv_heads = k.shape[1]
    if heads == 0 and kv_heads == 0:
        return 1
    if kv_heads == 0 or heads % kv_heads:
        raise ArgumentValueError(f"{op}: query heads {heads} must be a multiple of key/value heads {kv_heads} "
                                 f"(q {tuple(q.shape)}, k {tuple(k.shape)})")
    if not 1 <= dim <= max_head_dim:
        raise ArgumentValueError(f"{op}: head_dim must be from 1 to {max_head_dim}, got {dim} (q {tuple(q.shape)})")
    return heads // kv_heads
