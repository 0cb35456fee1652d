"""thread_local_permutation: a layout conversion that is a renaming of registers, checked on every thread."""
from __future__ import annotations

import pytest

from tilejit.ir.layouts import BlockedLayout, MmaLayout, SliceLayout, WgmmaLayout, thread_local_permutation


def _holds(layout, tid, i):
    return tuple(int(c) for c in layout.coords(tid, i))


@pytest.mark.parametrize("src, dst, threads", [
    (SliceLayout(WgmmaLayout((64, 64), 1), 1), SliceLayout(WgmmaLayout((64, 128), 1), 1), 128),
    (SliceLayout(WgmmaLayout((128, 128), 2), 1), SliceLayout(WgmmaLayout((128, 64), 2), 1), 256),
    (SliceLayout(MmaLayout((128, 64), 8, 1), 1), SliceLayout(MmaLayout((128, 128), 8, 1), 1), 256),
    (MmaLayout((64, 64), 2, 2), MmaLayout((64, 64), 2, 2), 128),
])
def test_renaming_found_and_exact(src, dst, threads):
    perm = thread_local_permutation(src, dst, threads)
    assert perm is not None and len(perm) == dst.regs
    for tid in range(threads):
        for i, j in enumerate(perm):
            assert _holds(dst, tid, i) == _holds(src, tid, j)


@pytest.mark.parametrize("src, dst, threads", [
    # the row statistics of a 2x2 warp grid live in other warps than those of a 1x4 grid
    (SliceLayout(MmaLayout((64, 64), 2, 2), 1), SliceLayout(MmaLayout((64, 256), 1, 4), 1), 128),
    (BlockedLayout((64, 64), 128, 2), MmaLayout((64, 64), 2, 2), 128),
    (MmaLayout((64, 64), 2, 2), MmaLayout((64, 64), 4, 1), 128),
])
def test_conversions_that_move_data_between_threads_are_refused(src, dst, threads):
    assert thread_local_permutation(src, dst, threads) is None
