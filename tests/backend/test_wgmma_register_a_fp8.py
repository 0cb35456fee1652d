"""The float8 A fragment of wgmma m64nNk32 gathered from a tile in the accumulator layout
(tilejit/backend_cuda/lower_wgmma_rs.py): on ints, every byte of every word lands where the PTX fragment table
puts it, and a kernel whose float8 A operand is such a tile takes the lowering."""
from __future__ import annotations

import torch

import tilejit
import tilejit.language as T
from tilejit.backend_cuda.lower_wgmma_rs import FP8_A_SELECT, fp8_a_word_sources
from tilejit.ir.layouts import WgmmaLayout


def test_every_byte_is_the_ptx_fragment_element():
    """Word 4 c + 2 h + r of lane 4 g + t holds (row g + 8 r, k 32 c + 16 h + 4 t + byte) for byte 0..3 (PTX ISA
    9.7.15.5.1, 8-bit A of m64nNk32: a0 (row g, k 4t..4t+3), a1 (row g + 8), a2 (k + 16), a3 (both)); the
    source lane's element there is read off the accumulator layout's own formula."""
    k = 128
    layout = WgmmaLayout((64, k), 1)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for word in range(layout.regs // 4):
            c, h, r = word >> 2, (word >> 1) & 1, word & 1
            sources = fp8_a_word_sources(lane, word)
            assert {src >> 2 for src, _ in sources} == {g}  # from the lane's own quad: one shuffle each
            for byte, (src, element) in enumerate(sources):
                assert layout.coords(src, element) == [g + 8 * r, 32 * c + 16 * h + 4 * t + byte], (lane, word)


def test_byte_perm_selectors_keep_the_low_or_the_high_pairs():
    def byte_perm(x, y, selector):  # PTX prmt default mode: result byte i = byte (selector >> 4 i) & 7 of {y, x}
        data = x | (y << 32)
        return sum(((data >> (8 * ((selector >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))

    x, y = 0x03020100, 0x07060504
    assert byte_perm(x, y, FP8_A_SELECT[0]) == 0x05040100
    assert byte_perm(x, y, FP8_A_SELECT[1]) == 0x07060302


@tilejit.kernel
def _p_at_v(Q, K, Vt, O, D: T.constexpr):
    s = T.gemm(Q[0:128, 0:D], K[0:128, 0:D], T.zeros((128, 128), T.float32), transpose_b=True, precision="fast")
    p = T.exp2(s - T.max(s, 1)[:, None]).to(T.float8_e4m3fn)
    O[0:128, 0:D] = T.gemm(p, Vt[0:D, 0:128], T.zeros((128, D), T.float32), transpose_b=True, precision="fast")


def test_a_float8_tile_in_the_accumulator_layout_feeds_wgmma_from_registers():
    f8 = torch.empty(128, 128, dtype=torch.float8_e4m3fn, device="meta")
    out = torch.empty(128, 128, dtype=torch.float32, device="meta")
    stages = _p_at_v.compile(f8, f8, f8, out, D=128, num_warps=8, arch="sm_90a", stop_after="cuda")
    impls = [line.split("impl = ")[1].split("}")[0] for line in stages.final_ir.splitlines() if "tj.gemm" in line]
    assert impls == ["wgmma_m64nNk32_fp8", "wgmma_rs_m64nNk32_fp8"]
    assert "unsigned tj_pa[16];  // A's fragment, four float8 elements gathered across the quad" in stages.cuda
