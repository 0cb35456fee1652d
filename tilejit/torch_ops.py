"""``tilejit.torch_op``: a tilejit launch wrapped as a PyTorch custom operator, so a model that calls it compiles
with ``torch.compile(fullgraph=True)`` without a graph break.

TorchDynamo cannot trace into a tilejit launch (it runs Python the compiler has not seen, and a C launcher), so
the launch goes inside an opaque ``torch.library.custom_op``; torch.compile then needs the op's output metadata,
which a *fake* implementation gives (shapes, dtypes and devices of the outputs, computed without running anything).

    @tilejit.torch_op("mylib::splitk_matmul", fake=lambda A, B, split_k: A.new_empty(A.shape[0], B.shape[1],
                                                                                   dtype=torch.float32))
    def splitk_matmul(A: torch.Tensor, B: torch.Tensor, split_k: int) -> torch.Tensor:
        C = torch.zeros(A.shape[0], B.shape[1], device=A.device, dtype=torch.float32)
        matmul_splitk[grid](A, B, C, ...)
        return C

    model = torch.compile(lambda a, b: splitk_matmul(a, b, 4).relu(), fullgraph=True)

This is ``torch.library.custom_op(name, mutates_args=...)`` plus ``register_fake``; the function must carry type
annotations (torch derives the op's schema from them) and must not return one of its inputs or a view of one
(return a fresh tensor, or declare the written argument in ``mutates_args`` and return None). Autotuned kernels
work the same way: the launch inside the op chooses its config as usual. Under ``TILEJIT_INTERPRET=1`` the op runs
on CPU tensors through the interpreter, which is how the CPU tests exercise torch.compile.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable


def torch_op(name: str, *, fake: Callable[..., Any] | None = None, mutates_args: Iterable[str] | str = (),
             device_types: str | Iterable[str] | None = None) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: make ``fn`` (a function that launches tilejit kernels) the PyTorch operator ``name``
    ("namespace::op_name").

    - ``fake``: ``f(*args) -> outputs`` of the right shapes/dtypes/devices (e.g. ``A.new_empty(...)``), for
      torch.compile's tracing; an op that returns nothing needs none. Can also be registered later with
      ``op.register_fake``.
    - ``mutates_args``: names of tensor arguments the kernel writes in place.
    - ``device_types``: restrict the implementation to these devices (default: any).

    Returns the operator; call it like the function.
    """
    import torch

    if not isinstance(name, str) or "::" not in name:
        raise ValueError(f"tilejit.torch_op needs a name 'namespace::op_name', got {name!r}")
    mutated = (mutates_args,) if isinstance(mutates_args, str) else tuple(mutates_args)

    def decorator(fn: Callable[..., Any]) -> Any:
        op = torch.library.custom_op(name, mutates_args=mutated, device_types=device_types)(fn)
        if fake is not None:
            op.register_fake(fake)
        return op

    return decorator
