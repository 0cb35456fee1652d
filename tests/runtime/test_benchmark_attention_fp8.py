"""benchmarks/attention_fp8.py without a GPU: its rows' ratios and errors, and ``benchmarks.attention --mode fp8``
reaching its arguments."""
from __future__ import annotations

import pytest

from benchmarks import attention as bench_attention
from benchmarks import attention_fp8


def test_table_row_gives_ratios_to_bf16_and_cudnn_and_every_error():
    row = {"dim": 128, "seq": 4096, "batch": 4, "scales": "block", "causal": True, "fp8": 900.0,
           "config": "128x128 w8 ws s3", "fp8 + transpose": 870.0, "bf16 attention()": 600.0,
           "SDPA cuDNN bf16": 450.0, "SDPA flash bf16": None, "fp8 err": 0.05, "fp8 err deq": 0.02,
           "bf16 attention() err": 0.003, "SDPA cuDNN bf16 err": 0.004}
    cells = attention_fp8.table_row(row)
    assert len(cells) == len(attention_fp8.HEADERS)
    named = dict(zip(attention_fp8.HEADERS, cells))
    assert named["fp8 / bf16 attention()"] == "1.50" and named["fp8 / cuDNN"] == "2.00"  # two decimals in the table
    assert named["causal"] == "yes" and named["SDPA flash bf16"] is None
    assert named["fp8 err deq"] == 0.02 and named["cuDNN err"] == 0.004


def test_tflops_halves_for_causal():
    full = attention_fp8._tflops(4, 16, 4096, 128, False, 1.0)
    assert full == pytest.approx(4.0 * 4 * 16 * 4096 ** 2 * 128 / 1e-3 / 1e12)
    assert attention_fp8._tflops(4, 16, 4096, 128, True, 1.0) == pytest.approx(full / 2)


def test_attention_mode_fp8_takes_the_fp8_arguments(capsys):
    with pytest.raises(SystemExit) as info:
        bench_attention.main(["--mode", "fp8", "--help"])
    assert info.value.code == 0
    assert "--scales" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--scales takes tensor and/or block, not 'rows'"):
        bench_attention.main(["--mode", "fp8", "--scales", "rows"])


def test_config_space_on_hopper_adds_warp_specialized_rings(monkeypatch):
    monkeypatch.setattr(attention_fp8.torch.cuda, "get_device_capability", lambda *a: (9, 0))
    configs = attention_fp8._configs(128, "all")
    assert len(configs) == 3 * len(attention_fp8.fa.CONFIGS[128])
    assert {c.get("STAGES") for c in configs} == {None, 2, 3}
    assert attention_fp8._configs(128, "default") == [attention_fp8.fa.default_config(128, hopper=True)]
    monkeypatch.setattr(attention_fp8.torch.cuda, "get_device_capability", lambda *a: (8, 9))
    assert not any(c.get("warp_specialize") for c in attention_fp8._configs(128, "all"))
