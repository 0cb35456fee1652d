"""Tensor-list arguments at launch: checking a list, its specialization, and its table on the device.

A kernel parameter given a list or tuple of torch tensors (one dtype, one rank, one device) is a tensor list.
The kernel receives the address of a small int64 table on that device (row ``g``: tensor ``g``'s data pointer,
sizes and strides; ``backend_cuda/lower_lists.py`` reads it) and the list's length.

Tables are cached by the layout they describe: the device and, per tensor, its pointer, shape and strides. A
launch with the same tensors (or others with the same layout) finds the table and copies nothing. A table's
contents depend on nothing else, so a hit is always right, whatever became of the tensors it was built for.

CUDA graphs: a captured launch bakes the table's address into the graph, so a table a capture has used is
never evicted (it lives as long as this process's cache). A table missing during a capture is written by a
copy from pinned host memory recorded in the graph (the copy runs at each replay, the kernel after it); such a
table is written on the device only when the graph replays, so an ordinary launch that finds it writes a table
of its own first. Launching once before capturing, as CUDA graphs want anyway, avoids this.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .. import dtypes as D
from ..errors import ArgumentError, ArgumentValueError
from ..frontend.spec import TensorListSpec

_CAPACITY = 1024  # tables kept (besides those a capture used); each is one small device allocation


def is_tensor_list(value: Any) -> bool:
    """A list or tuple: what a tensor-list parameter takes (checked by :func:`tensor_list_spec`)."""
    return type(value) is list or type(value) is tuple


def tensor_list_spec(name: str, items: Sequence[Any], tensor_type: type) -> TensorListSpec:
    """The specialization of the tensor list ``items`` given for parameter ``name``; raises a usage error
    naming the first item that breaks a rule (not a tensor, another dtype, rank or device, 0-d)."""
    kind = type(items).__name__
    if not items:
        raise ArgumentValueError(f"argument '{name}' is an empty {kind}; a tensor list needs at least one tensor")
    for i, t in enumerate(items):
        if not isinstance(t, tensor_type):
            raise ArgumentError(
                f"argument '{name}' has type {kind}, whose item {i} is a {type(t).__name__}: kernels take torch "
                "tensors, ints, floats, bools and lists or tuples of tensors (tensor lists); mark compile-time "
                "parameters with T.constexpr (a tuple of numbers then works)")
    first = items[0]
    try:
        dtype = D.from_torch(first.dtype)
    except TypeError as e:
        raise ArgumentError(f"argument '{name}'[0]: {e}") from None
    for i, t in enumerate(items):
        if t.dtype != first.dtype:
            raise ArgumentError(f"argument '{name}': the tensors of a tensor list share one dtype; item 0 is "
                                f"{first.dtype}, item {i} is {t.dtype}")
        if t.dim() != first.dim():
            raise ArgumentValueError(f"argument '{name}': the tensors of a tensor list share one rank; item 0 is "
                                     f"{first.dim()}-d, item {i} is {t.dim()}-d")
        if t.device != first.device:
            raise ArgumentValueError(f"argument '{name}': the tensors of a tensor list are on one device; item 0 "
                                     f"is on {first.device}, item {i} on {t.device}")
    if first.dim() == 0:
        raise ArgumentValueError(f"argument '{name}' is a list of 0-d tensors; pass 1-element 1-d tensors")
    rank = first.dim()
    return TensorListSpec(dtype, rank, tuple(d for d in range(rank) if all(t.stride(d) == 1 for t in items)))


def table_words(items: Sequence[Any]) -> list[int]:
    """The table of ``items``: per tensor its data pointer, sizes and strides (``lower_lists.table_row_words``)."""
    words: list[int] = []
    for t in items:
        words.append(t.data_ptr())
        words += t.shape
        words += t.stride()
    return words


def upload_table(words: list[int], device: int, capturing: bool) -> Any:
    """A device int64 tensor holding ``words`` (kept with whatever must outlive it, as ``.tj_keep``).

    Outside a capture the copy is finished on return, so the table is valid on every stream. During a capture
    the copy is recorded in the graph from a pinned host buffer that lives as long as the table."""
    import torch

    host = torch.tensor(words, dtype=torch.int64)
    table = torch.empty(len(words), dtype=torch.int64, device=torch.device("cuda", device))
    if capturing:
        host = host.pin_memory()
        table.copy_(host, non_blocking=True)
        table.tj_keep = host
    else:
        table.copy_(host)  # from pageable memory: returns once the copy is done
    return table


@dataclass
class _Table:
    address: int               # where an ordinary launch reads it
    storage: Any               # the device buffer at ``address``
    written: bool              # the table is on the device now (False: written at graph replays only)
    keep: list = field(default_factory=list)  # older buffers a captured graph still reads


class TensorListTables:
    """Device tables of tensor lists, by layout; ``builds`` counts the tables written (for tests and stats).

    ``upload(words, device, capturing)`` returns an object with ``data_ptr()`` (the default writes a torch
    tensor on the device); a test passes a fake one and runs on any machine.
    """

    def __init__(self, upload: Callable[[list[int], int, bool], Any] = upload_table,
                 capacity: int = _CAPACITY) -> None:
        self._upload = upload
        self._capacity = capacity
        self._tables: OrderedDict[tuple, _Table] = OrderedDict()
        self._captured: dict[tuple, _Table] = {}   # used by a capture: never evicted
        self._lock = threading.Lock()
        self.builds = 0

    def __len__(self) -> int:
        return len(self._tables) + len(self._captured)

    def address(self, items: Sequence[Any], device: int, capturing: bool = False) -> int:
        """The device address of the table of ``items`` (tensors on GPU ``device``), written if missing."""
        key = (device, tuple((t.data_ptr(), t.shape, t.stride()) for t in items))
        with self._lock:
            table = self._captured.get(key)
            if table is None:
                table = self._tables.get(key)
                if table is not None:
                    self._tables.move_to_end(key)
            if table is not None and table.written:
                if capturing and key not in self._captured:
                    self._captured[key] = self._tables.pop(key)
                return table.address
            storage = self._upload(table_words(items), device, capturing)
            self.builds += 1
            if table is not None:
                # Written only when an earlier capture's graph replays: this launch (ordinary, or another
                # capture) writes a buffer of its own; the graph keeps reading the old one.
                table.keep.append(table.storage)
                table.storage, table.address, table.written = storage, storage.data_ptr(), not capturing
                return table.address
            table = _Table(storage.data_ptr(), storage, not capturing)
            if capturing:
                self._captured[key] = table
            else:
                self._tables[key] = table
                if len(self._tables) > self._capacity:
                    self._tables.popitem(last=False)
            return table.address

    def clear(self) -> None:
        """Forget every table not used by a capture."""
        with self._lock:
            self._tables.clear()


TABLES = TensorListTables()


def capturing() -> bool:
    """Whether torch's current stream is being captured into a CUDA graph."""
    import torch

    return torch.cuda.is_current_stream_capturing()
