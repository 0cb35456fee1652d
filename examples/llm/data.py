"""Training text every machine has offline: the Python standard library's own source files, as bytes.

The files are those under the standard library's directory (``sysconfig.get_paths()["stdlib"]``) ending in
``.py``, installed packages (``site-packages``, ``dist-packages``) left out, sorted by their path relative to it
and concatenated (each followed by a NUL byte), up to ``max_bytes``. Tokens are the bytes themselves (vocabulary
256). The same Python version gives the same corpus; ``corpus_digest`` names it in logs.
"""
from __future__ import annotations

import functools
import hashlib
import sysconfig
from pathlib import Path

import torch

_INSTALLED = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def source_files(root: Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files in a fixed order (sorted relative paths)."""
    return list(_source_files(stdlib_dir() if root is None else Path(root)))


@functools.lru_cache(maxsize=4)
def _source_files(root: Path) -> tuple[Path, ...]:
    found = [p for p in root.rglob("*.py") if not _INSTALLED & set(p.relative_to(root).parts) and p.is_file()]
    if not found:
        raise FileNotFoundError(f"no .py files under {root}: this Python has no standard library sources to "
                                "train on")
    return tuple(sorted(found, key=lambda p: p.relative_to(root).as_posix()))


def load_corpus(max_bytes: int = 16 << 20, root: Path | None = None) -> torch.Tensor:
    """The concatenated sources as a uint8 tensor of at most ``max_bytes`` bytes."""
    chunks, size = [], 0
    for path in source_files(root):
        data = path.read_bytes() + b"\0"
        chunks.append(data[: max_bytes - size])
        size += len(chunks[-1])
        if size >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


def corpus_digest(corpus: torch.Tensor) -> str:
    """A short SHA-256 of the corpus bytes, to tell two runs' data apart."""
    return hashlib.sha256(corpus.numpy().tobytes()).hexdigest()[:16]


class BatchSampler:
    """Random windows of ``seq_len + 1`` bytes, drawn from a generator seeded with ``seed``: batch ``i`` is the
    same on every machine with the same corpus, whatever device the batches go to."""

    def __init__(self, corpus: torch.Tensor, batch: int, seq_len: int, seed: int = 0):
        if corpus.numel() <= seq_len + 1:
            raise ValueError(f"the corpus ({corpus.numel()} bytes) is shorter than one window ({seq_len + 1})")
        self.corpus, self.batch, self.seq_len = corpus, batch, seq_len
        self.generator = torch.Generator().manual_seed(seed)

    def next(self, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, targets): int64 (batch, seq_len); targets are the tokens shifted by one byte."""
        starts = torch.randint(0, self.corpus.numel() - self.seq_len - 1, (self.batch,), generator=self.generator)
        windows = torch.stack([self.corpus[s: s + self.seq_len + 1] for s in starts.tolist()]).long()
        return windows[:, :-1].to(device), windows[:, 1:].to(device)
